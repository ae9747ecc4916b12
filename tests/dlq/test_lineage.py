"""The ledger and the DLQ: every `failed` operation has its entry, written in the same
transaction; a successful replay supersedes the failed operation, and later claims of its key
answer with the replay's outcome."""

from __future__ import annotations

from contextlib import AbstractContextManager

import pytest

from alerts.models import Alert
from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent, FailedEventChange
from dlq.targets import services as dlq_targets
from ledger.models import IdempotencyClass, Operation, OperationEvent
from ledger.platform import hooks
from ledger.protocol import services as ledger
from ledger.protocol.transitions.claim import guarded_move
from relay.testing import start_mock_provider


def _claim(tenant, provider, key="order-1001:export:rev3", payload=None):
    return ledger.operation_claim(
        tenant=tenant, key=key, provider=provider, action="export", request={"order": 1001}, payload=payload
    ).operation


@pytest.mark.django_db(transaction=True)
def test_a_terminal_failure_writes_its_entry_with_the_operation(tenant, provider):
    op = _claim(tenant, provider, payload={"event_type": "order_export", "order": 1001})
    ledger.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class="invalid_input",
        message="422",
    )
    event = FailedEvent.objects.get(operation=op)
    assert event.event_id == f"op:{op.pk}" and event.original_key == op.key
    assert event.error_class == "invalid_input" and event.status == "pending" and event.shape == "operation"
    assert event.search_fields == {"event_type": "order_export"}
    assert Alert.objects.filter(kind="dlq_new", ref=str(event.pk)).exists()


@pytest.mark.django_db(transaction=True)
def test_an_exhausted_retry_writes_its_entry(tenant):
    provider = ledger.provider_upsert(
        tenant=tenant,
        slug="crm",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        max_attempts=2,
        base_delay_seconds=0.0,
        max_delay_seconds=0.0,
    )
    op = _claim(tenant, provider)
    first = ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient"
    )
    assert first.status == "retry_wait" and not FailedEvent.objects.exists()
    again = _claim(tenant, provider)  # due at once: a new attempt on the same row
    last = ledger.operation_fail(
        operation_id=again.pk, tenant_id=again.tenant_id, lease_token=again.lease_token, error_class="transient"
    )
    assert last.status == "failed"
    event = FailedEvent.objects.get(operation_id=op.pk)
    assert event.error_class == "transient" and event.retry_count == 1


@pytest.mark.django_db(transaction=True)
def test_the_end_of_a_retry_lifetime_writes_its_entry(tenant, provider):
    op = _claim(tenant, provider)
    waiting = ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient"
    )
    guarded_move(operation=waiting, to="failed", actor="sweeper", reason="lifetime exhausted")
    assert FailedEvent.objects.filter(operation_id=op.pk).count() == 1


def _crash_after_dlq_write() -> AbstractContextManager[None]:
    def record_then_crash(*, operation):
        dlq_ingest.failed_event_record_for_operation(operation=operation)
        # The status write and the entry (and its alert) are done; now the process "dies".
        assert Operation.objects.filter(pk=operation.pk, status="failed").exists()
        assert FailedEvent.objects.filter(operation_id=operation.pk).exists()
        raise RuntimeError("injected after the status write")

    # In place of the DLQ's own receiver of the ledger's hook.
    return hooks.operation_failed.replaced(record_then_crash)


@pytest.mark.django_db(transaction=True)
def test_an_error_after_the_status_write_rolls_back_both_the_failure_and_its_entry(tenant, provider):
    op = _claim(tenant, provider)
    with _crash_after_dlq_write(), pytest.raises(RuntimeError):
        ledger.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="invalid_input"
        )
    assert Operation.objects.get(pk=op.pk).status == "claimed"
    assert not FailedEvent.objects.exists() and not Alert.objects.exists() and not FailedEventChange.objects.exists()
    assert not OperationEvent.objects.filter(operation_id=op.pk, to_status="failed").exists()
    # The holder's retry of the report then lands both.
    ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="invalid_input"
    )
    assert Operation.objects.get(pk=op.pk).status == "failed" and FailedEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_error_after_the_status_write_of_an_exhausted_retry_rolls_back_both(tenant, provider):
    op = _claim(tenant, provider)
    waiting = ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient"
    )
    with _crash_after_dlq_write(), pytest.raises(RuntimeError):
        guarded_move(operation=waiting, to="failed", actor="sweeper", reason="lifetime exhausted")
    assert Operation.objects.get(pk=op.pk).status == "retry_wait"
    assert not FailedEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_alert_that_cannot_be_written_fails_the_transition_too(tenant, provider, monkeypatch):
    op = _claim(tenant, provider)

    def broken_alert(**kwargs):
        raise RuntimeError("alert table unavailable")

    monkeypatch.setattr(dlq_ingest, "alert_raise", broken_alert)
    with pytest.raises(RuntimeError):
        ledger.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="invalid_input"
        )
    assert Operation.objects.get(pk=op.pk).status == "claimed" and not FailedEvent.objects.exists()


@pytest.mark.django_db
def test_recording_the_same_operation_twice_is_one_entry(tenant, provider):
    op = _claim(tenant, provider)
    failed = ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="invalid_input"
    )
    assert dlq_ingest.failed_event_record_for_operation(operation=failed).pk == FailedEvent.objects.get().pk


@pytest.mark.django_db
def test_a_claim_of_the_failed_key_after_a_successful_replay_answers_the_replay(api, tenant, provider, target, sink):
    claim = api.post("/api/v1/claims", {"key": "lead-77:crm:create:v1", "provider": "stripe"}, format="json")
    assert claim.status_code == 201
    op_id, token = claim.json()["id"], claim.json()["lease_token"]
    fail = api.post(
        f"/api/v1/operations/{op_id}/fail", {"lease_token": token, "error_class": "invalid_input"}, format="json"
    )
    assert fail.json()["status"] == "failed"
    before = api.post("/api/v1/claims", {"key": "lead-77:crm:create:v1", "provider": "stripe"}, format="json")
    assert before.status_code == 200 and before.json()["status"] == "failed"

    event = FailedEvent.objects.get(operation_id=op_id)
    replayed = api.post(f"/api/v1/dlq/events/{event.pk}/replay", {}, format="json").json()
    assert replayed["outcome"] == "succeeded"
    assert sink.received()[0].header("Idempotency-Key") == "lead-77:crm:create:v1"

    after = api.post("/api/v1/claims", {"key": "lead-77:crm:create:v1", "provider": "stripe"}, format="json")
    assert after.status_code == 200 and after["Idempotent-Replayed"] == "true"
    body = after.json()
    assert body["status"] == "succeeded" and body["id"] == replayed["operation_id"]
    assert body["key"] == f"replay:{event.pk}:1" and body["provider_ref"] == "sink-1"
    # The original stays failed (history is never edited) and says what superseded it.
    original = Operation.objects.get(pk=op_id)
    assert original.status == "failed" and original.superseded_by_id == replayed["operation_id"]
    assert OperationEvent.objects.filter(operation_id=op_id, reason__startswith="replay #1").exists()


@pytest.mark.django_db
def test_a_failed_replay_of_an_operation_entry_makes_no_second_entry_and_answers_as_newest(
    api, tenant, provider, target, sink
):
    op = _claim(tenant, provider)
    ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="invalid_input"
    )
    event = FailedEvent.objects.get(operation_id=op.pk)
    sink.mode, sink.status = "status", 400
    api.post(f"/api/v1/dlq/events/{event.pk}/replay", {}, format="json")
    assert FailedEvent.objects.count() == 1
    answer = ledger.operation_claim(
        tenant=tenant, key=op.key, provider=provider, action="export", request={"order": 1001}
    )
    assert answer.replayed and answer.operation.key == f"replay:{event.pk}:1"
    assert answer.operation.status == "failed"


@pytest.mark.django_db
def test_a_key_enforced_receiver_dedups_the_replay_and_rerun_as_new_gets_through(api, tenant, provider):
    """The story of DESIGN §4 against a real key-enforced mock provider: the first try is a
    decline cached against the key, a replay with the same key gets the same decline, and
    only the confirmed "re-run as new" (a derived key) makes the effect happen — once."""
    import httpx

    mock = start_mock_provider("enforced")
    try:
        key, body = "lead-77:crm:create:v1", {"amount": 4200, "currency": "aud"}
        op = _claim(tenant, provider, key=key, payload=body)
        first = httpx.post(
            f"{mock.url}/charges", json=body, headers={"Idempotency-Key": key, "X-Mock-Outcome": "failed"}
        )
        assert first.status_code == 402
        ledger.operation_fail(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            error_class="invalid_input",
            response_status=402,
        )
        event = FailedEvent.objects.get(operation_id=op.pk)
        dlq_targets.replay_target_upsert(tenant=tenant, slug="stripe", url=f"{mock.url}/charges", is_default=True)

        same_key = api.post(f"/api/v1/dlq/events/{event.pk}/replay", {}, format="json").json()
        assert same_key["outcome"] == "failed" and same_key["response_status"] == 402
        assert mock.effects()["count"] == 0

        as_new = api.post(
            f"/api/v1/dlq/events/{event.pk}/replay",
            {"as_new": True, "confirm": True, "note": "the provider cached the decline"},
            format="json",
        ).json()
        assert as_new["outcome"] == "succeeded" and as_new["sent_key"] == f"{key}~r2"
        effects = mock.effects()
        assert effects["count"] == 1 and list(effects["by_key"]) == [f"{key}~r2"]
    finally:
        mock.stop()
