"""Four-eyes approval of re-sends (ADR 0013): where a tenant or a provider requires it, every
re-send is a pending request that a second person approves (then it is sent, once, in their
name) or rejects (nothing is sent); the requester cannot decide it; requests expire; automatic
replay is off; the setting is the platform's. Receivers are real HTTP servers on loopback."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from dlq.models import BulkReplay, FailedEvent, FailedEventChange, Replay
from dlq.replays.automatic import AUTO_OFF_NOTE, auto_replay_due
from dlq.targets import services as dlq_targets
from dlq.tasks import bulk_replay_run_task
from ledger.models import ApprovalRequest, ConfigChange, OperationStatus, Provider, Tenant
from ledger.platform.errors import PlatformOwnedSetting
from ledger.protocol import services as ledger_services
from ledger.recovery.sweeper import sweep
from tests.ledger.support import assert_problem
from tests.review.test_review_api import _in_review

pytestmark = pytest.mark.django_db

ENVELOPE = {
    "event_id": "pay-77",
    "idempotency_key": "pay-77:charge:v1",
    "payload": {"amount": 1200, "currency": "EUR"},
    "error": {"message": "gateway answered 503", "class": "transient"},
}


@pytest.fixture
def requester(tenant: Tenant, make_client: Any) -> Any:
    return make_client(tenant, ["read", "write"])


@pytest.fixture
def approver(tenant: Tenant, make_client: Any) -> Any:
    return make_client(tenant, ["read", "approve"])


def require_for_tenant(tenant: Tenant) -> None:
    # The platform's switch (a superuser's console save, the command line).
    Tenant.objects.filter(pk=tenant.pk).update(resend_approval_required=True)


def ingest(client: Any, body: dict[str, Any] | None = None) -> int:
    response = client.post("/api/v1/dlq/events", body or ENVELOPE, format="json")
    assert response.status_code in (200, 201), response.content
    return response.json()["id"]


def replay(client: Any, event_id: int, **body: Any) -> Any:
    return client.post(f"/api/v1/dlq/events/{event_id}/replay", body, format="json")


def approve(client: Any, approval_id: int, reason: str = "checked with the customer: not charged") -> Any:
    return client.post(f"/api/v1/approvals/{approval_id}/approve", {"reason": reason}, format="json")


def reject(client: Any, approval_id: int, reason: str = "the gateway shows the charge") -> Any:
    return client.post(f"/api/v1/approvals/{approval_id}/reject", {"reason": reason}, format="json")


def asked(client: Any, event_id: int, **body: Any) -> dict[str, Any]:
    response = replay(client, event_id, note="customer called: charge missing", **body)
    assert response.status_code == 202, response.content
    return response.json()


def entry_of_provider(client: Any, tenant: Tenant, slug: str, key: str) -> int:
    """A DLQ entry whose failed operation is of provider ``slug`` (guard mode)."""
    if not Provider.objects.filter(tenant=tenant, slug=slug).exists():
        ledger_services.provider_upsert(
            tenant=tenant, slug=slug, base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
        )
    body = {"key": key, "provider": slug, "request": {"n": 1}, "payload": {"email": "bad@"}}
    created = client.post("/api/v1/claims", body, format="json").json()
    client.post(
        f"/api/v1/operations/{created['id']}/fail",
        {"lease_token": created["lease_token"], "error_class": "invalid_input", "message": "card declined"},
        format="json",
    )
    return FailedEvent.objects.get(operation_id=created["id"]).pk


# --- a replay waits for a second person ---------------------------------------------------------


def test_a_replay_where_the_tenant_requires_approval_is_a_pending_request_and_sends_nothing(
    tenant, requester, target, sink
):
    require_for_tenant(tenant)
    event_id = ingest(requester)

    response = replay(requester, event_id, note="customer called: charge missing")

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "pending" and body["kind"] == "replay" and body["target_ids"] == [event_id]
    assert response["Location"] == f"/api/v1/approvals/{body['id']}"
    assert body["requested_by"].startswith("apikey:") and body["request_reason"] == "customer called: charge missing"
    assert sink.received() == []
    assert not Replay.objects.exists()
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_a_request_needs_a_reason_for_the_approver(tenant, requester, target, sink):
    require_for_tenant(tenant)
    event_id = ingest(requester)
    assert_problem(replay(requester, event_id), 400, "validation_error")
    assert not ApprovalRequest.objects.exists() and sink.received() == []


def test_a_second_person_s_approval_sends_it_exactly_once_in_their_name(tenant, requester, approver, target, sink):
    require_for_tenant(tenant)
    event_id = ingest(requester)
    request = asked(requester, event_id)

    response = approve(approver, request["id"])

    assert response.status_code == 200, response.content
    done = response.json()
    assert done["status"] == "executed" and "replay #1" in done["outcome"] and "succeeded" in done["outcome"]
    assert done["decided_by"].startswith("apikey:") and done["decided_by"] != done["requested_by"]
    [sent] = sink.received()
    assert sent.header("Idempotency-Key") == "pay-77:charge:v1"
    replayed = Replay.objects.get(event_id=event_id)
    assert replayed.actor == done["decided_by"]
    # The entry's trail names the request (who asked and who approved are on it; an API key's
    # prefix is masked in notes like any token-shaped text).
    note = FailedEventChange.objects.filter(event_id=event_id, to_status="replaying").get().note
    assert "four-eyes: asked by" in note and f"request #{request['id']}" in note
    # A second approval (another approver, a double click) sends nothing more.
    assert_problem(approve(approver, request["id"]), 409, "approval_not_pending")
    assert len(sink.received()) == 1


def test_the_requester_cannot_approve_their_own_request(tenant, make_client, target, sink):
    require_for_tenant(tenant)
    both = make_client(tenant, ["read", "write", "approve"])
    event_id = ingest(both)
    request = asked(both, event_id)

    problem = assert_problem(approve(both, request["id"]), 403, "approval_by_requester")
    assert problem["approval"] == request["id"]
    assert_problem(reject(both, request["id"]), 403, "approval_by_requester")

    assert sink.received() == [] and ApprovalRequest.objects.get().status == "pending"
    # The table holds it too: no statement can record the requester as the approver.
    row = ApprovalRequest.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApprovalRequest.objects.filter(pk=row.pk).update(
            status="approved", decided_by=row.requested_by, decision_reason="me", decided_at=timezone.now()
        )


def test_approving_needs_the_approve_scope_which_admin_does_not_imply(tenant, requester, make_client, target, sink):
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    admin = make_client(tenant, ["read", "write", "admin"])
    assert_problem(approve(admin, request["id"]), 403, "forbidden")
    assert_problem(approve(make_client(tenant, ["read", "write"]), request["id"]), 403, "forbidden")
    assert sink.received() == []


def test_a_rejection_needs_a_reason_and_sends_nothing(tenant, requester, approver, target, sink):
    require_for_tenant(tenant)
    event_id = ingest(requester)
    request = asked(requester, event_id)

    assert_problem(reject(approver, request["id"], reason=""), 400, "validation_error")
    response = reject(approver, request["id"])

    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert response.json()["decision_reason"] == "the gateway shows the charge"
    assert_problem(approve(approver, request["id"]), 409, "approval_not_pending")
    assert sink.received() == [] and FailedEvent.objects.get(pk=event_id).status == "pending"


def test_a_pending_request_expires_unanswered_and_can_no_longer_be_approved(
    tenant, requester, approver, target, sink, settings
):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "APPROVAL_TTL_SECONDS": 3600}
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    row = ApprovalRequest.objects.get(pk=request["id"])
    assert row.expires_at - row.requested_at == timedelta(hours=1)
    # As if the hour had passed.
    ApprovalRequest.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    # The sweeper's pass expires it (ledger.recovery.sweeper).
    assert sweep().counts["approvals_expired"] == 1

    assert_problem(approve(approver, row.pk), 409, "approval_not_pending")
    assert ApprovalRequest.objects.get(pk=row.pk).status == "expired" and sink.received() == []


def test_an_approval_that_arrives_after_expiry_but_before_the_sweep_is_refused(
    tenant, requester, approver, target, sink
):
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    ApprovalRequest.objects.filter(pk=request["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    problem = assert_problem(approve(approver, request["id"]), 409, "approval_not_pending")
    assert problem["operation_status"] == "expired" and sink.received() == []


def test_every_move_is_in_the_configuration_trail_with_who_and_why(tenant, requester, approver, target, sink):
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    approve(approver, request["id"])
    trail = list(
        ConfigChange.objects.filter(object_type="ledger.approvalrequest", object_id=str(request["id"])).order_by("id")
    )
    assert [((c.before or {}).get("status"), c.after["status"]) for c in trail] == [
        (None, "pending"),
        ("pending", "approved"),
        ("approved", "executed"),
    ]
    assert trail[0].actor == request["requested_by"] and trail[0].reason == "customer called: charge missing"
    assert trail[1].actor != trail[0].actor and trail[1].reason == "checked with the customer: not charged"
    # The trail never holds the request's parameters (a correction's values).
    assert all("params" not in (c.after or {}) for c in trail)


# --- which re-sends ask -------------------------------------------------------------------------


def test_a_provider_s_own_setting_gates_only_its_entries(tenant, requester, approver, target, sink):
    event_id = entry_of_provider(requester, tenant, "payments", "pay-1:charge:v1")
    other_id = entry_of_provider(requester, tenant, "crm", "lead-1:create:v1")
    ledger_services.provider_upsert(
        tenant=tenant, slug="payments", platform=True, resend_approval_required=True, actor="cli:ops"
    )

    request = asked(requester, event_id)
    assert request["provider"] == "payments"
    assert replay(requester, other_id).status_code == 201  # the CRM's entries replay directly
    assert [r.header("Idempotency-Key") for r in sink.received()] == ["lead-1:create:v1"]

    assert approve(approver, request["id"]).json()["status"] == "executed"
    assert [r.header("Idempotency-Key") for r in sink.received()] == ["lead-1:create:v1", "pay-1:charge:v1"]


def test_re_run_as_new_and_a_forced_replay_ask_too(tenant, requester, approver, target, sink):
    replayed_id = ingest(requester)
    assert replay(requester, replayed_id).status_code == 201  # replayed before the switch
    fresh_id = ingest(requester, ENVELOPE | {"event_id": "pay-78", "idempotency_key": "pay-78:charge:v1"})
    require_for_tenant(tenant)

    forced = asked(requester, replayed_id, force=True)
    as_new = asked(requester, fresh_id, as_new=True, confirm=True)

    assert (forced["kind"], as_new["kind"]) == ("forced_reissue", "rerun_as_new")
    assert len(sink.received()) == 1
    assert approve(approver, forced["id"]).json()["status"] == "executed"
    assert approve(approver, as_new["id"]).json()["status"] == "executed"
    assert [r.header("Idempotency-Key") for r in sink.received()[1:]] == ["pay-77:charge:v1", "pay-78:charge:v1~r1"]


def test_a_corrected_replay_waits_with_its_values_sealed_and_sends_them_once_approved(
    tenant, requester, approver, target, sink
):
    event_id = entry_of_provider(requester, tenant, "crm", "lead-77:create:v1")
    require_for_tenant(tenant)

    response = requester.post(
        f"/api/v1/dlq/events/{event_id}/correct",
        {"fields": {"email": "lead77@example.org"}, "note": "typo fixed with the sales team"},
        format="json",
    )

    assert response.status_code == 202, response.content
    request = response.json()
    assert request["kind"] == "corrected_replay" and "params" not in request
    assert sink.received() == []
    stored = ApprovalRequest.objects.filter(pk=request["id"]).values_list("params", flat=True).get()
    assert "lead77@example.org" not in str(stored)  # sealed at rest, like payloads

    assert approve(approver, request["id"]).json()["status"] == "executed"
    [sent] = sink.received()
    assert sent.header("Idempotency-Key") == "lead-77:create:v2" and sent.json() == {"email": "lead77@example.org"}


def test_the_decision_safe_to_resend_waits_for_a_second_person(tenant, requester, approver, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="crm", url=f"{sink.url}/c", idempotency_class="key_advisory", is_default=True
    )
    event_id = ingest(requester, ENVELOPE | {"error": {"message": "ETIMEDOUT after send", "class": "ambiguous"}})
    require_for_tenant(tenant)

    response = requester.post(
        f"/api/v1/dlq/events/{event_id}/resend-decision", {"note": "checked: no charge"}, format="json"
    )

    assert response.status_code == 202 and response.json()["kind"] == "safe_to_resend"
    assert FailedEvent.objects.get(pk=event_id).resend_decided_at is None
    assert approve(approver, response.json()["id"]).json()["status"] == "executed"
    entry = FailedEvent.objects.get(pk=event_id)
    assert entry.resend_decided_at is not None and entry.resend_decided_by.startswith("apikey:")
    assert sink.received() == []  # a decision sends nothing by itself


def test_a_bulk_replay_confirm_waits_and_the_approved_selection_is_sent_once(
    tenant, requester, approver, target, sink, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    ids = [ingest(requester, ENVELOPE | {"event_id": f"pay-{i}", "idempotency_key": f"pay-{i}:c:v1"}) for i in range(3)]
    require_for_tenant(tenant)
    dry = requester.post(
        "/api/v1/dlq/replays", {"dry_run": True, "note": "gateway outage of 9:00"}, format="json"
    ).json()

    confirm = requester.post("/api/v1/dlq/replays", {"id": dry["id"], "count": 3}, format="json")

    assert confirm.status_code == 202, confirm.content
    body = confirm.json()
    assert body["status"] == "draft" and body["approval"]["kind"] == "bulk_replay"
    assert sorted(body["approval"]["target_ids"]) == sorted(ids)
    # The frozen selection lives as long as its request, not the dry run's hour.
    assert BulkReplay.objects.get(pk=dry["id"]).expires_at == ApprovalRequest.objects.get().expires_at
    assert sink.received() == [] and enqueued == []

    with django_capture_on_commit_callbacks(execute=True):
        assert approve(approver, body["approval"]["id"]).json()["status"] == "executed"
    assert enqueued == [("dlq.tasks.bulk_replay_run_task", dry["id"])]
    bulk_replay_run_task(dry["id"])

    assert sorted(r.header("Idempotency-Key") for r in sink.received()) == sorted(f"pay-{i}:c:v1" for i in range(3))
    # The run is the approver's: they confirmed it.
    assert BulkReplay.objects.get(pk=dry["id"]).confirmed_by == ApprovalRequest.objects.get().decided_by


def test_a_bulk_run_confirmed_before_the_switch_sends_nothing_once_approval_is_required(
    tenant, requester, target, sink, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    for i in range(2):
        ingest(requester, ENVELOPE | {"event_id": f"pay-{i}", "idempotency_key": f"pay-{i}:c:v1"})
    dry = requester.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        assert requester.post("/api/v1/dlq/replays", {"id": dry["id"]}, format="json").status_code == 202
    require_for_tenant(tenant)

    bulk_replay_run_task(dry["id"])

    # The guard on the sending path refuses each: skipped, not sent, not a request either.
    assert sink.received() == [] and not ApprovalRequest.objects.exists()
    bulk = BulkReplay.objects.get(pk=dry["id"])
    assert (bulk.succeeded, bulk.failed) == (0, 0)


def test_automatic_replay_is_off_for_entries_that_need_approval_and_says_why(tenant, requester, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="auto", url=f"{sink.url}/a", is_default=True, auto_replay=True, timeout_seconds=2.0
    )
    event_id = ingest(requester)
    require_for_tenant(tenant)

    assert auto_replay_due() == {"replayed": 0, "failed": 0, "skipped": 1}

    assert sink.received() == [] and not ApprovalRequest.objects.exists()
    assert FailedEvent.objects.get(pk=event_id).status_note == AUTO_OFF_NOTE


def test_a_review_decision_safe_to_retry_waits_and_the_operation_stays_in_review(tenant, requester, approver):
    mailer = ledger_services.provider_upsert(
        tenant=tenant, slug="mailer", base_url="http://127.0.0.1:9", idempotency_class="key_advisory"
    )
    op = _in_review(tenant, mailer, "mail:4")
    ledger_services.provider_upsert(
        tenant=tenant, slug="mailer", platform=True, resend_approval_required=True, actor="cli:ops"
    )

    response = requester.post(
        f"/api/v1/review/items/{op.pk}/decision", {"decision": "safe_to_retry", "note": "bounced"}, format="json"
    )

    assert response.status_code == 202 and response.json()["kind"] == "safe_to_retry"
    op.refresh_from_db()
    assert op.status == OperationStatus.REVIEW
    # Confirming a success sends nothing: it needs no second person.
    assert approve(approver, response.json()["id"]).json()["status"] == "executed"
    op.refresh_from_db()
    assert op.status == OperationStatus.RETRY_WAIT


# --- the setting is the platform's -------------------------------------------------------------


def test_a_tenant_side_save_cannot_switch_a_provider_s_requirement_off(tenant):
    ledger_services.provider_upsert(
        tenant=tenant, slug="payments", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    ledger_services.provider_upsert(
        tenant=tenant, slug="payments", platform=True, resend_approval_required=True, actor="cli:ops"
    )
    with pytest.raises(PlatformOwnedSetting) as refused:
        ledger_services.provider_upsert(
            tenant=tenant, slug="payments", resend_approval_required=False, actor="user:tenant-admin"
        )
    assert (refused.value.status, refused.value.code) == (403, "platform_owned_setting")
    assert Provider.objects.get(slug="payments").resend_approval_required is True


# --- tenants see their own ----------------------------------------------------------------------


def test_another_tenant_can_neither_see_nor_decide_a_request(
    tenant, other_tenant, requester, make_client, target, sink
):
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    outsider = make_client(other_tenant, ["read", "approve"])

    assert_problem(outsider.get(f"/api/v1/approvals/{request['id']}"), 404, "approval_not_found")
    assert outsider.get("/api/v1/approvals").json()["results"] == []
    assert_problem(approve(outsider, request["id"]), 404, "approval_not_found")
    assert sink.received() == []
    mine = requester.get("/api/v1/approvals?status=pending").json()["results"]
    assert [r["id"] for r in mine] == [request["id"]]


def test_an_approved_request_whose_re_send_never_reported_back_is_failed_by_the_sweeper(
    tenant, requester, target, sink
):
    require_for_tenant(tenant)
    request = asked(requester, ingest(requester))
    # As if the approver's process died between the approval and the send, an hour ago.
    ApprovalRequest.objects.filter(pk=request["id"]).update(
        status="approved",
        decided_by="user:boss",
        decision_reason="ok",
        decided_at=timezone.now() - timedelta(hours=2),
    )

    assert sweep().counts["approvals_interrupted"] == 1

    row = ApprovalRequest.objects.get(pk=request["id"])
    assert row.status == "failed" and "did not report back" in row.outcome
    assert sink.received() == []


def test_a_run_resume_waits_and_re_drives_the_failed_step_once_approved(tenant, requester, approver, target, sink):
    ledger_services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced", max_attempts=1
    )
    steps = []
    for step, key in ((1, "lead-1:crm:v1"), (2, "lead-1:crm-note:v1")):
        body = {"key": key, "provider": "crm", "action": "create", "run": "run-9", "step": step, "payload": {"n": step}}
        steps.append(requester.post("/api/v1/claims", body, format="json").json())
    done, failing = steps
    requester.post(
        f"/api/v1/operations/{done['id']}/complete",
        {"lease_token": done["lease_token"], "provider_ref": "c1"},
        format="json",
    )
    requester.post(
        f"/api/v1/operations/{failing['id']}/fail",
        {"lease_token": failing["lease_token"], "error_class": "transient", "message": "CRM answered 503"},
        format="json",
    )
    require_for_tenant(tenant)

    answer = requester.post("/api/v1/runs/run-9/resume", {"note": "CRM is back"}, format="json")

    assert answer.status_code == 202, answer.content
    request = answer.json()
    assert (request["kind"], request["target_ref"], request["target_ids"]) == ("run_resume", "run-9", [failing["id"]])
    assert sink.received() == []
    assert approve(approver, request["id"]).json()["status"] == "executed"
    [sent] = sink.received()
    assert sent.header("Idempotency-Key") == "lead-1:crm-note:v1"
