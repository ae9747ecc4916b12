"""Console lists answer only the lookups they offer (ledger.web.console_base): their filters, their
search, their date drill-down and Django's own list parameters. Anything else is a 400 page,
never a list filtered by it — the export included."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User

from ledger.models import Tenant
from ledger.protocol import callbacks
from ledger.web.console_base import ConsoleAdmin, ConsoleLookupsMixin
from tests.console.support import client_for, enforced_provider, failed_op, staff

pytestmark = pytest.mark.django_db


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", password="correct horse battery")


def _secret(tenant: Tenant) -> str:
    return callbacks.tenant_callback_secret(tenant_id=tenant.pk, rotate=True, actor="test")


@pytest.mark.parametrize(
    "query",
    [
        "callback_secret__startswith=",
        "callback_secret__isnull=false",
        "slug__regex=(",
        "created_at__year=99999",
        "created_at__iso_year=0",
        "name__contains=a",
    ],
)
def test_a_lookup_the_tenants_list_does_not_offer_is_a_400_page_not_a_filtered_list(tenant, root, query):
    secret = _secret(tenant)
    client = client_for(root)
    response = client.get(f"/admin/ledger/tenant/?{query}{secret[:1] if query.endswith('=') else ''}")
    assert response.status_code == 400
    body = response.content.decode()
    assert 'data-code="lookup_not_offered"' in body
    assert tenant.slug not in body.split('id="content-main"')[1]


def test_the_export_refuses_the_lookup_its_list_refuses(tenant, root):
    secret = _secret(tenant)
    response = client_for(root).get(f"/admin/ledger/tenant/export.csv?callback_secret__startswith={secret[:1]}")
    assert response.status_code == 400
    assert not getattr(response, "streaming", False)


def test_secret_columns_cannot_be_reached_through_a_relation_either(tenant, root):
    crm = enforced_provider(tenant)
    failed_op(tenant, crm, "k1")
    client = client_for(root)
    for query in (
        "tenant__callback_secret__startswith=a",
        "provider__auth_secret__isnull=false",
        "request__contains=a",
    ):
        assert client.get(f"/admin/ledger/operation/?{query}").status_code == 400, query
        assert client.get(f"/admin/ledger/operation/export.csv?{query}").status_code == 400, query


def test_the_lists_own_filters_search_ordering_and_pages_still_answer(tenant, root):
    crm = enforced_provider(tenant)
    failed_op(tenant, crm, "k1")
    client = client_for(root)
    for query in (
        "status__exact=failed",
        f"tenant__id__exact={tenant.pk}",
        "needs=stuck",
        "created_at__gte=2020-01-01&created_at__lt=2030-01-01",
        "q=k1",
        "o=1",
        "p=1",
        "all=",
        "e=1",
    ):
        assert client.get(f"/admin/ledger/operation/?{query}").status_code == 200, query


def test_the_date_drill_down_takes_years_in_range_only(tenant, root):
    client = client_for(root)
    assert client.get("/admin/review/accesslog/?at__year=2026&at__month=3").status_code == 200
    for query in ("at__year=9999", "at__year=1", "at__year=2026&at__month=13", "at__year=x", "at__month=3"):
        assert client.get(f"/admin/review/accesslog/?{query}").status_code == 400, query


def test_a_filter_given_a_value_it_cannot_take_is_a_400_page(tenant, root):
    client = client_for(root)
    assert client.get("/admin/ledger/operation/?created_at__gte=not-a-date").status_code == 400
    assert client.get("/admin/dlq/failedevent/?weak_identity__exact=maybe").status_code == 400


def test_a_page_past_the_end_or_not_a_number_is_answered_as_django_does(tenant, root):
    client = client_for(root)
    for query in ("p=999999999999999999999", "p=-1", "p=0", "p=x", "o=99", "o=x.-.--3"):
        assert client.get(f"/admin/ledger/operation/?{query}").status_code in (200, 302), query
        assert client.get(f"/admin/ledger/operation/export.csv?{query}").status_code == 200, query


def test_a_tenant_role_is_refused_the_same_way(tenant):
    _secret(tenant)
    auditor = client_for(staff("ann", role="auditor", tenants=[tenant]))
    assert auditor.get("/admin/ledger/tenant/?callback_secret__startswith=a").status_code == 400
    assert auditor.get("/admin/ledger/operation/?key__regex=(").status_code == 400


def test_history_pages_refuse_parameters_they_do_not_offer(tenant, root):
    client = client_for(root)
    assert client.get("/admin/ledger/attempt/?outcome__exact=succeeded").status_code == 200
    assert client.get("/admin/ledger/attempt/?lease_token__startswith=a").status_code == 400
    assert client.get("/admin/ledger/operationevent/export.csv?reason__regex=(").status_code == 400


def test_every_console_page_answers_only_its_offered_lookups():
    """Every ModelAdmin of the console's site takes the lookup rule, and every page this
    project writes derives from the console's base class."""
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, ConsoleLookupsMixin), model
        if type(model_admin).__module__.split(".")[0] in ("ledger", "review", "dlq", "alerts"):
            assert isinstance(model_admin, ConsoleAdmin), model


def test_a_to_field_the_list_does_not_offer_is_the_consoles_400_page(tenant, root):
    response = client_for(root).get("/admin/ledger/tenant/?_to_field=callback_secret&_popup=1")
    assert response.status_code == 400
    assert 'data-testid="bad-request"' in response.content.decode()
