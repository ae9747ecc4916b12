"""The failed-attempt evidence page (ADR 0016): a member sees only their tenants' rows, filters
by provider, class and date, and exports the list as CSV whose cells no spreadsheet runs as a
formula and which hold no personal data."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from ledger.models import AttemptEvidence, ErrorClass
from ledger.protocol import services
from review.staff.roles import AUDITOR, OPERATOR
from tests.console.support import MARKERS, client_for, enforced_provider, example, page, staff

pytestmark = pytest.mark.django_db

LIST = "/admin/ledger/attemptevidence/"
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def failure(tenant, provider, key: str, message: str, error_class: str = ErrorClass.INVALID_INPUT, payload=None):
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, payload=payload).operation
    return services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=error_class, message=message
    )


@pytest.fixture
def two_tenants(tenant, other_tenant):
    crm = enforced_provider(tenant)
    mailer = enforced_provider(tenant, slug="mailer")
    theirs = enforced_provider(other_tenant, slug="theirs")
    # A contact payload whose person the CRM's answer echoes back.
    contact = example("crm-create-contact-request.json")
    failure(tenant, crm, "mine-1", '=HYPERLINK("http://127.0.0.1/x") refused Priya Raman', payload=contact)
    failure(tenant, mailer, "mine-2", "HTTP 403: permission", ErrorClass.PERMISSION)
    failure(other_tenant, theirs, "theirs-1", "theirs-only failure text")
    return tenant, other_tenant


def test_a_member_sees_only_their_tenants_evidence_in_the_list_and_the_export(two_tenants):
    mine, _ = two_tenants
    client = client_for(staff("audrey", role=AUDITOR, tenants=[mine]))

    status, body = page(client, LIST)
    assert status == 200
    assert "HTTP 403: permission" in body and "theirs-only" not in body and "theirs" not in body

    status, exported = page(client, LIST + "export.csv")
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert len(rows) == 2 and "theirs-only" not in exported
    # The other tenant's row is not even reachable by its id.
    theirs = AttemptEvidence.objects.get(provider_slug="theirs")
    assert page(client, f"{LIST}{theirs.pk}/change/")[0] in (302, 404)


def test_the_export_neutralises_formulas_and_holds_no_personal_data(two_tenants):
    mine, _ = two_tenants
    client = client_for(staff("audrey", role=AUDITOR, tenants=[mine]))

    status, exported = page(client, LIST + "export.csv")

    assert status == 200
    for row in csv.DictReader(io.StringIO(exported)):
        for column, cell in row.items():
            assert not cell.startswith(FORMULA_START) or cell.lstrip("-").isdigit(), (column, cell)
    assert "'=HYPERLINK" in exported
    assert not [marker for marker in MARKERS if marker.lower() in exported.lower()], exported


def test_the_list_filters_by_provider_class_and_date(two_tenants):
    mine, _ = two_tenants
    client = client_for(staff("olivia", role=OPERATOR, tenants=[mine]))

    by_provider = page(client, LIST + "?provider_slug=mailer")[1]
    assert "HTTP 403: permission" in by_provider and "HYPERLINK" not in by_provider
    by_class = page(client, LIST + "?error_class__exact=invalid_input")[1]
    assert "HYPERLINK" in by_class and "HTTP 403" not in by_class
    # As the date filter's own links spell it: an aware time.
    tomorrow = urlencode({"finished_at__gte": (timezone.now() + timedelta(days=1)).isoformat()})
    later = page(client, LIST + f"?{tomorrow}")[1]
    assert "HYPERLINK" not in later and "HTTP 403" not in later
