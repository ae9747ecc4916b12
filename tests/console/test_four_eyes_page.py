"""The console's four-eyes flow (ADR 0013): an operator's replay becomes a request and sends
nothing; the approvals page lists it, counted in "Needs attention"; the requester sees it with
no buttons and is refused if they post anyway; a tenant admin approves it and it is sent once;
the tenant admin cannot switch a provider's requirement off; staff of another tenant never see
it. The replay target is a real HTTP server on loopback."""

from __future__ import annotations

import pytest

from dlq.models import FailedEvent
from dlq.targets import services as dlq_targets
from ledger.models import ApprovalRequest, Provider, Tenant
from ledger.protocol import services as ledger_services
from tests.console.support import client_for, enforced_provider, failed_op, staff
from tests.dlq.conftest import sink, sink_factory  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry(tenant, sink) -> FailedEvent:  # noqa: F811
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="n8n-rerun", url=f"{sink.url}/webhook/rerun", timeout_seconds=2.0, is_default=True
    )
    failed = failed_op(tenant, enforced_provider(tenant), "pay-9:charge:v1", payload={"amount": 12})
    Tenant.objects.filter(pk=tenant.pk).update(resend_approval_required=True)
    return FailedEvent.objects.get(operation=failed)


def test_an_operator_s_replay_waits_and_a_tenant_admin_approves_it_once(tenant, entry, sink) -> None:  # noqa: F811
    operator = client_for(staff("op", role="operator", tenants=[tenant]))
    answer = operator.post(
        f"/admin/dlq/failedevent/{entry.pk}/replay/", {"note": "customer says not charged", "target": ""}, follow=True
    )
    assert b"needs a second person" in answer.content
    request = ApprovalRequest.objects.get()
    assert (request.status, request.requested_by) == ("pending", "user:op")
    assert sink.received() == []

    # Needs attention: on the front page, and counted in the round.
    front = operator.get("/admin/").content.decode()
    assert 'data-testid="attention-approval"' in front and f"request #{request.pk}" in front
    listed = operator.get("/admin/ledger/approvalrequest/?state=pending").content.decode()
    assert f"/admin/ledger/approvalrequest/{request.pk}/decide/" in listed

    # The requester sees their request, no buttons; posting anyway is refused.
    url = f"/admin/ledger/approvalrequest/{request.pk}/decide/"
    detail = operator.get(f"/admin/ledger/approvalrequest/{request.pk}/change/").content.decode()
    assert f'href="{url}" data-testid="decide-link"' in detail
    own = operator.get(url).content.decode()
    assert 'data-testid="approve"' not in own
    assert operator.post(url, {"verb": "approve", "reason": "me"}).status_code == 403
    assert ApprovalRequest.objects.get().status == "pending"

    admin = client_for(staff("boss", role="admin", tenants=[tenant]))
    assert 'data-testid="approve"' in admin.get(url).content.decode()
    done = admin.post(url, {"verb": "approve", "reason": "confirmed with the PSP"}, follow=True)
    assert b"approved and sent" in done.content
    request.refresh_from_db()
    assert (request.status, request.decided_by) == ("executed", "user:boss")
    assert len(sink.received()) == 1
    # Decided: nothing more to press.
    assert 'data-testid="approve"' not in admin.get(url).content.decode()


def test_an_admin_who_asked_cannot_approve_their_own_request(tenant, entry, sink) -> None:  # noqa: F811
    admin = client_for(staff("boss", role="admin", tenants=[tenant]))
    admin.post(f"/admin/dlq/failedevent/{entry.pk}/replay/", {"note": "retry it", "target": ""})
    request = ApprovalRequest.objects.get()
    url = f"/admin/ledger/approvalrequest/{request.pk}/decide/"
    page = admin.get(url).content.decode()
    assert 'data-testid="own-request"' in page and 'data-testid="approve"' not in page
    # The server refuses, whatever the page showed.
    refused = admin.post(url, {"verb": "approve", "reason": "mine"}, follow=True)
    assert b"You asked for this re-send" in refused.content
    assert ApprovalRequest.objects.get().status == "pending" and sink.received() == []


def test_a_tenant_admin_cannot_switch_a_provider_s_requirement_off(tenant) -> None:
    provider = enforced_provider(tenant)
    ledger_services.provider_upsert(
        tenant=tenant, slug=provider.slug, platform=True, resend_approval_required=True, actor="cli:ops"
    )
    admin = client_for(staff("boss", role="admin", tenants=[tenant]))
    form = admin.get(f"/admin/ledger/provider/{provider.pk}/change/").content.decode()
    # Shown, not editable.
    assert 'name="resend_approval_required"' not in form
    admin.post(
        f"/admin/ledger/provider/{provider.pk}/change/",
        {"resend_approval_required": "", "base_url": provider.base_url, "idempotency_class": "key_enforced"},
    )
    assert Provider.objects.get(pk=provider.pk).resend_approval_required is True


def test_staff_of_another_tenant_never_see_a_request(tenant, other_tenant, entry) -> None:
    client_for(staff("op", role="operator", tenants=[tenant])).post(
        f"/admin/dlq/failedevent/{entry.pk}/replay/", {"note": "retry it", "target": ""}
    )
    request = ApprovalRequest.objects.get()
    outsider = client_for(staff("other", role="admin", tenants=[other_tenant]))
    assert "decide/" not in outsider.get("/admin/ledger/approvalrequest/").content.decode()
    assert outsider.get(f"/admin/ledger/approvalrequest/{request.pk}/decide/").status_code == 404
    assert (
        outsider.post(
            f"/admin/ledger/approvalrequest/{request.pk}/decide/", {"verb": "approve", "reason": "x"}
        ).status_code
        == 404
    )
    assert ApprovalRequest.objects.get().status == "pending"
