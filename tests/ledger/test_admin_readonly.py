"""The console shows operations, attempts and events but nobody edits them by hand — not even
a superuser (DESIGN §6) — and finds them by key, handle, ref, execution and correlation id."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import Attempt, Operation, OperationEvent
from ledger.protocol import services
from ledger.web.console_base import ReadOnlyPermissions
from tests.ledger.support import ledger_counts, row

pytestmark = pytest.mark.django_db

MODELS = {"operation": Operation, "attempt": Attempt, "operationevent": OperationEvent}
# Keyed (id, <time>): console pages of their own (review.console.history_pages), not ModelAdmins.
HISTORY = ("attempt", "operationevent")


@pytest.fixture
def admin_client(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser("root", "root@example.invalid", None)
    client = Client()
    client.force_login(user)
    return client


def _finished(tenant: Any, provider: Any, key: str, **fields: Any) -> Operation:
    op = services.operation_claim(
        tenant=tenant,
        key=key,
        provider=provider,
        reconciliation_handle=fields.get("handle", ""),
        execution_id=fields.get("execution_id", ""),
        correlation_id=fields.get("correlation_id", ""),
    ).operation
    return services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=fields.get("ref", "")
    )


@pytest.fixture
def ops(tenant: Any, provider: Any) -> dict[str, Operation]:
    return {
        "one": _finished(
            tenant, provider, "alpha-key", handle="pi_alpha", ref="ch_alpha", execution_id="exec-alpha",
            correlation_id="corr-alpha",
        ),
        "two": _finished(
            tenant, provider, "bravo-key", handle="pi_bravo", ref="ch_bravo", execution_id="exec-bravo",
            correlation_id="corr-bravo",
        ),
    }  # fmt: skip


def _instance(name: str, op: Operation) -> Any:
    return {"operation": op, "attempt": op.attempt_set.first(), "operationevent": op.events.first()}[name]


def _page_id(obj: Any) -> int:
    # A history row's pages name it by id (its key is (id, <time>)); an operation by its pk.
    return obj.id if obj._meta.is_composite_pk else obj.pk


def _listed(response: Any) -> list[Any]:
    """The rows a list page shows: the admin's changelist or a history page's."""
    if "cl" in response.context:
        return list(response.context["cl"].result_list)
    return list(response.context["page"].object_list)


def test_superuser_gets_403_on_add(admin_client, ops):
    before = ledger_counts()

    assert admin_client.get(reverse("admin:ledger_operation_add")).status_code == 403
    assert admin_client.post(reverse("admin:ledger_operation_add"), {"key": "forged"}).status_code == 403

    assert ledger_counts() == before


@pytest.mark.parametrize("name", HISTORY)
def test_history_tables_have_no_add_page_at_all(admin_client, ops, name):
    # Their console pages (review.console.history_pages) have a list, a detail page and an export only.
    before = ledger_counts()

    assert admin_client.get(f"/admin/ledger/{name}/add/").status_code == 404
    assert admin_client.post(f"/admin/ledger/{name}/add/", {"operation": ops["one"].pk}).status_code in (404, 405)

    assert ledger_counts() == before


@pytest.mark.parametrize("name", MODELS)
def test_superuser_gets_403_when_posting_a_change(admin_client, ops, name):
    obj = _instance(name, ops["one"])
    before = row(ops["one"].pk)
    before_obj = type(obj).objects.filter(pk=obj.pk).values().get()
    fields = {"status": "failed", "provider_ref": "forged", "outcome": "failed", "to_status": "failed"}

    response = admin_client.post(reverse(f"admin:ledger_{name}_change", args=[_page_id(obj)]), fields)

    # The operation's admin refuses it (403); the history pages take no POST at all (405).
    assert response.status_code == (403 if name == "operation" else 405)
    assert row(ops["one"].pk) == before
    assert type(obj).objects.filter(pk=obj.pk).values().get() == before_obj


@pytest.mark.parametrize("name", MODELS)
def test_superuser_gets_403_on_delete(admin_client, ops, name):
    obj = _instance(name, ops["one"])
    before = ledger_counts()
    url = f"/admin/ledger/{name}/{_page_id(obj)}/delete/"

    # The operation's admin refuses it (403); the history pages have no delete page (404).
    expected = 403 if name == "operation" else 404
    assert admin_client.get(url).status_code == expected
    assert admin_client.post(url, {"post": "yes"}).status_code in (expected, 405)

    assert ledger_counts() == before


@pytest.mark.parametrize("name", MODELS)
def test_bulk_delete_is_not_offered_and_refused(admin_client, ops, name):
    changelist = reverse(f"admin:ledger_{name}_changelist")
    obj = _instance(name, ops["one"])
    before = ledger_counts()

    page = admin_client.get(changelist)
    admin_client.post(changelist, {"action": "delete_selected", "_selected_action": [_page_id(obj)], "post": "yes"})

    assert page.status_code == 200
    assert b"delete_selected" not in page.content
    assert ledger_counts() == before


@pytest.mark.parametrize("name", MODELS)
def test_superuser_can_view_the_detail_read_only(admin_client, ops, name):
    obj = _instance(name, ops["one"])

    response = admin_client.get(reverse(f"admin:ledger_{name}_change", args=[_page_id(obj)]))

    assert response.status_code == 200
    assert b'name="_save"' not in response.content
    assert b'name="_continue"' not in response.content


def test_the_operation_page_shows_attempts_and_events_but_not_the_payload(admin_client, tenant, provider):
    op = services.operation_claim(
        tenant=tenant, key="with-payload", provider=provider, payload={"pan": "4242"}
    ).operation
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_shown"
    )

    response = admin_client.get(reverse("admin:ledger_operation_change", args=[op.pk]))

    assert response.status_code == 200
    assert b"ch_shown" in response.content
    assert b"4242" not in response.content
    assert b"claimed" in response.content and b"succeeded" in response.content


@pytest.mark.parametrize(
    "term",
    ["alpha-key", "pi_alpha", "ch_alpha", "exec-alpha", "corr-alpha"],
    ids=["key", "reconciliation_handle", "provider_ref", "execution_id", "correlation_id"],
)
def test_operation_changelist_searches_by_identifier(admin_client, ops, term):
    response = admin_client.get(reverse("admin:ledger_operation_changelist"), {"q": term})

    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    assert list(response.context["cl"].result_list) == [ops["one"]]


@pytest.mark.parametrize(
    ("term", "expected"),
    [("alpha-key", 1), ("ch_alpha", 1), ("exec-alpha", 1), ("nothing-like-it", 0)],
    ids=["key", "provider_ref", "execution_id", "no-match"],
)
def test_attempt_changelist_searches_by_identifier(admin_client, ops, term, expected):
    response = admin_client.get(reverse("admin:ledger_attempt_changelist"), {"q": term})

    assert response.status_code == 200
    results = _listed(response)
    assert len(results) == expected
    assert all(a.operation_id == ops["one"].pk for a in results)


def test_event_changelist_searches_by_operation_key(admin_client, ops):
    response = admin_client.get(reverse("admin:ledger_operationevent_changelist"), {"q": "bravo-key"})

    assert response.status_code == 200
    results = _listed(response)
    # The list shows stored rows: the pair's claim is kept on the operation row (ADR 0024).
    assert len(results) == 1
    assert {e.operation_id for e in results} == {ops["two"].pk}
    # …and says so, so that an auditor does not take the list for every move.
    assert "is kept on the operation itself" in response.content.decode()


@pytest.mark.parametrize("name", MODELS)
def test_changelists_render_with_their_filters(admin_client, ops, name):
    response = admin_client.get(reverse(f"admin:ledger_{name}_changelist"))

    assert response.status_code == 200
    if name == "operation":
        assert response.context["cl"].result_count >= 2
        assert response.context["cl"].has_filters
    else:
        assert response.context["count"] >= 2 and len(_listed(response)) == response.context["count"]
        assert [f["title"] for f in response.context["filters"]] == (
            ["outcome", "error class"] if name == "attempt" else ["to status", "from status"]
        )


def test_staff_without_superuser_cannot_edit_either(django_user_model, ops):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("ops", "ops@example.invalid", None, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="ledger"))
    client = Client()
    client.force_login(user)
    before = row(ops["one"].pk)

    assert client.get(reverse("admin:ledger_operation_add")).status_code == 403
    assert (
        client.post(reverse("admin:ledger_operation_change", args=[ops["one"].pk]), {"status": "x"}).status_code == 403
    )
    assert (
        client.post(reverse("admin:ledger_operation_delete", args=[ops["one"].pk]), {"post": "yes"}).status_code == 403
    )
    assert row(ops["one"].pk) == before


def _registered_admin_classes() -> list[type]:
    """Every console ModelAdmin class and every inline class they show."""
    from django.apps import apps
    from django.contrib import admin

    found: list[type] = []
    for model in apps.get_models():
        if admin.site.is_registered(model):
            model_admin = admin.site.get_model_admin(model)
            found.append(type(model_admin))
            found.extend(model_admin.inlines)
    return found


def _only_returns_false(function: Any) -> bool:
    reference = ReadOnlyPermissions.has_add_permission.__code__
    code = getattr(function, "__code__", None)
    return code is not None and (code.co_code, code.co_consts) == (reference.co_code, reference.co_consts)


def test_read_only_permissions_are_declared_once_and_mixed_in_everywhere():
    """A console page that refuses add, change and delete takes them from ReadOnlyPermissions;
    a class that spells out all three again is the copy this mixin replaced."""
    names = ("has_add_permission", "has_change_permission", "has_delete_permission")
    copies = {
        f"{klass.__module__}.{klass.__qualname__}"
        for admin_class in _registered_admin_classes()
        for klass in admin_class.__mro__
        if klass is not ReadOnlyPermissions and all(_only_returns_false(vars(klass).get(n)) for n in names)
    }
    assert copies == set()
    read_only = [c for c in _registered_admin_classes() if issubclass(c, ReadOnlyPermissions)]
    # The ledger's, the DLQ's and review's read-only pages and inlines all use it.
    assert {c.__module__.split(".")[0] for c in read_only} >= {"ledger", "dlq", "review"}
