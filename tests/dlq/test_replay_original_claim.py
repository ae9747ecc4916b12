"""A replay settles its key's own claim (ADR 0007): a lead's claim waiting for its retry (after
a CRM 429) is taken over by the replay before anything is sent, so the workflow re-sending the
lead is answered from the ledger — with the replay's outcome once it has one — instead of
claiming, proceeding and making a second contact. A claim its workflow holds now, or one being
reconciled, makes the replay wait; one that succeeded meanwhile is not sent again."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from dlq.models import FailedEvent, Replay
from ledger.models import IdempotencyClass, Operation
from ledger.platform.errors import DomainError
from ledger.protocol import services as ledger_services
from ledger.protocol import transitions as ledger_transitions
from ledger.protocol.transitions.claim import guarded_move
from review.decisions.services import review_decision_record

pytestmark = pytest.mark.django_db

KEY = "call_4411:crm-contact:v1"
REQUEST = {"call_id": "call_4411"}
CONTACT = {"firstName": "Ana", "customFields": {"call_id": "call_4411"}}


def claim(tenant, provider):
    return ledger_transitions.operation_claim(
        tenant=tenant, key=KEY, provider=provider, action="crm-contact", request=REQUEST, uses_sent_marker=True
    )


@pytest.fixture
def crm(tenant):
    return ledger_services.provider_upsert(
        tenant=tenant, slug="demo-crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )


@pytest.fixture
def throttled(tenant, crm, client, target) -> tuple[Operation, int]:
    """The lead workflow's claim after the CRM's 429 (retry_wait), and its DLQ entry."""
    held = claim(tenant, crm).operation
    ledger_transitions.operation_mark_sent(operation_id=held.pk, lease_token=held.lease_token, tenant_id=tenant.pk)
    op = ledger_transitions.operation_fail(
        operation_id=held.pk,
        lease_token=held.lease_token,
        tenant_id=tenant.pk,
        error_class="transient",
        message="CRM answered 429",
        response_status=429,
        throttled=True,
    )
    assert op.status == "retry_wait"
    body = {"event_id": "dlq-4411", "idempotency_key": KEY, "payload": CONTACT, "error": {"class": "transient"}}
    response = client.post("/api/v1/dlq/events", body, format="json")
    assert response.status_code == 201, response.content
    return op, response.json()["id"]


def replay(client, event_id, **body):
    return client.post(f"/api/v1/dlq/events/{event_id}/replay", body, format="json")


def due(op: Operation) -> None:
    """The retry's time has come (the clock moved on)."""
    Operation.objects.filter(pk=op.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=5))


def test_a_replay_takes_over_the_claim_waiting_for_its_retry_and_a_re_sent_lead_is_answered_from_the_ledger(
    tenant, crm, client, throttled, sink
):
    op, event_id = throttled
    response = replay(client, event_id)
    assert response.json()["outcome"] == "succeeded", response.json()
    assert len(sink.received()) == 1
    op.refresh_from_db()
    replay_op = Operation.objects.get(key=f"replay:{event_id}:1")
    assert (op.status, op.superseded_by_id) == ("failed", replay_op.pk)
    # The entry stands for the claim now; the claim's failure was not dead-lettered again.
    assert FailedEvent.objects.get(pk=event_id).operation_id == op.pk
    assert FailedEvent.objects.count() == 1
    notes = " ".join(FailedEvent.objects.get(pk=event_id).changes.values_list("note", flat=True))
    assert f"took over operation {op.pk} ({KEY}), which waited for its retry" in notes

    # The lead re-sent once its retry would be due: the recorded outcome, nothing to do.
    due(op)
    again = claim(tenant, crm)
    assert (again.acquired, again.replayed, again.operation.pk) == (False, True, replay_op.pk)
    assert again.operation.status == "succeeded"


def test_a_replay_nobody_acknowledged_leaves_the_claim_failed_not_free_and_its_settlement_answers_the_key(
    tenant, crm, client, throttled, sink
):
    from dlq.targets import services as dlq_targets

    dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n-rerun", url=f"{sink.url}/webhook/rerun", ack="echo")
    op, event_id = throttled
    assert replay(client, event_id).json()["outcome"] == "ambiguous"
    op.refresh_from_db()
    assert (op.status, op.superseded_by_id) == ("failed", None)
    # The receiver may have created the contact: the re-sent lead does not claim it again.
    due(op)
    again = claim(tenant, crm)
    assert not again.acquired and again.operation.status == "failed"
    # A reviewer settles the replay: from then on its outcome answers the key.
    replay_op = Operation.objects.get(key=f"replay:{event_id}:1")
    if replay_op.status != "review":
        replay_op = guarded_move(operation=replay_op, to="review", actor="sweeper", reason="no lookup")
    review_decision_record(operation_id=replay_op.pk, decision="confirm_succeeded", note="CRM has it", actor="rita")
    op.refresh_from_db()
    assert op.superseded_by_id == replay_op.pk
    assert claim(tenant, crm).operation.pk == replay_op.pk
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"


def test_a_claim_its_workflow_holds_now_makes_the_replay_wait_and_nothing_is_sent(tenant, crm, client, throttled, sink):
    op, event_id = throttled
    due(op)
    retried = claim(tenant, crm)
    assert retried.acquired
    response = replay(client, event_id)
    assert response.status_code == 409
    problem = response.json()
    assert problem["code"] == "replay_original_in_flight" and problem["operation_status"] == "claimed"
    assert sink.received() == []
    event = FailedEvent.objects.get(pk=event_id)
    assert (event.status, event.replay_count, event.operation_id) == ("pending", 0, None)
    assert not Replay.objects.filter(event_id=event_id).exists()
    assert Operation.objects.get(pk=op.pk).status == "claimed"


def test_a_claim_being_reconciled_makes_the_replay_wait(tenant, crm, client, throttled, sink):
    op, event_id = throttled
    due(op)
    # Its workflow's retry was sent and its holder vanished: a person decides whether it acted.
    guarded_move(
        operation=claim(tenant, crm).operation, to="review", actor="sweeper", reason="lease expired after send"
    )
    response = replay(client, event_id)
    assert response.status_code == 409 and response.json()["code"] == "replay_original_unsettled"
    assert sink.received() == []
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_a_claim_that_succeeded_meanwhile_is_not_sent_again(tenant, crm, client, throttled, sink):
    op, event_id = throttled
    due(op)
    retried = claim(tenant, crm).operation
    ledger_transitions.operation_complete(
        operation_id=retried.pk, tenant_id=tenant.pk, lease_token=retried.lease_token, provider_ref="contact-1"
    )
    response = replay(client, event_id)
    assert response.json()["outcome"] == "succeeded"
    assert sink.received() == []
    row = Replay.objects.get(event_id=event_id)
    assert row.error_message == "" and FailedEvent.objects.get(pk=event_id).status == "replayed"
    assert "succeeded meanwhile" in FailedEvent.objects.get(pk=event_id).changes.order_by("-id").first().note


def _race(*, tenant, crm, secret: str, event_id: int, key: str, request: dict) -> tuple[Any, Any]:
    """The operator's replay of the entry and the workflow's retry of the key, released at
    once from two threads, each on its own connection."""
    barrier = threading.Barrier(2, timeout=20)

    def replay_it() -> Any:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        try:
            barrier.wait()
            return api.post(f"/api/v1/dlq/events/{event_id}/replay", {}, format="json")
        finally:
            connection.close()

    def retry_it() -> Any:
        try:
            barrier.wait()
            return ledger_transitions.operation_claim(
                tenant=tenant, key=key, provider=crm, action="crm-contact", request=request, uses_sent_marker=True
            )
        except DomainError as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        replayed, retried = pool.submit(replay_it), pool.submit(retry_it)
        return replayed.result(), retried.result()


@pytest.mark.django_db(transaction=True)
def test_a_replay_and_the_workflows_retry_racing_for_the_claim_leave_one_of_them_to_do_the_work(
    tenant, crm, client, sink, target
):
    # Both guarded UPDATEs move the claim out of retry_wait: exactly one wins, and the other
    # sends nothing — the replay answers 409, or the workflow's claim is answered from the ledger.
    from ledger.protocol import services as ledger

    secret = ledger.apikey_create(tenant=tenant, scopes=["read", "write"])[1]
    sent = 0
    for n in range(5):
        key, request = f"call_race{n}:crm-contact:v1", {"call_id": f"call_race{n}"}
        held = ledger_transitions.operation_claim(
            tenant=tenant, key=key, provider=crm, action="crm-contact", request=request, uses_sent_marker=True
        ).operation
        op = ledger_transitions.operation_fail(
            operation_id=held.pk, lease_token=held.lease_token, tenant_id=tenant.pk, error_class="transient"
        )
        due(op)
        body = {
            "event_id": f"dlq-race{n}",
            "idempotency_key": key,
            "payload": {"n": n},
            "error": {"class": "transient"},
        }
        event_id = client.post("/api/v1/dlq/events", body, format="json").json()["id"]
        replayed, retried = _race(tenant=tenant, crm=crm, secret=secret, event_id=event_id, key=key, request=request)
        workflow_works = getattr(retried, "acquired", False)
        replay_sent = replayed.status_code == 201
        assert workflow_works != replay_sent, (n, replayed.status_code, replayed.content, retried)
        if workflow_works:
            assert replayed.json()["code"] == "replay_original_in_flight"
        sent += replay_sent
    assert len(sink.received()) == sent
