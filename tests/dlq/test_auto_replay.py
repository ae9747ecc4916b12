"""Scheduled automatic replay (transient failures only, opt-in targets, capped per lineage
root, within the root's lifetime) and the recovery of interrupted replays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dlq.models import FailedEvent, Replay
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from dlq.tasks import auto_replay_task, replays_recover_task
from ledger.models import Operation
from ledger.protocol import services as ledger
from ledger.protocol.transitions.claim import guarded_move

pytestmark = pytest.mark.django_db


@pytest.fixture
def auto_target(tenant, sink):
    return dlq_targets.replay_target_upsert(
        tenant=tenant, slug="auto", url=sink.url, is_default=True, auto_replay=True, timeout_seconds=2
    )


def ingest(client, event_id: str, error_class: str = "transient") -> int:
    body = {"event_id": event_id, "payload": {"n": event_id}, "error": {"class": error_class}}
    return client.post("/api/v1/dlq/events", body, format="json").json()["id"]


def allow_next_try() -> None:
    Replay.objects.update(finished_at=timezone.now() - timedelta(days=1))


def test_only_transient_entries_are_replayed_automatically(client, auto_target, sink):
    transient = ingest(client, "t")
    ingest(client, "i", "invalid_input")
    ingest(client, "a", "ambiguous")
    ingest(client, "u", "")
    assert auto_replay_task()["replayed"] == 1
    assert [r.header("Idempotency-Key") for r in sink.received()] == ["t"]
    replay = Replay.objects.get()
    assert replay.event_id == transient and replay.trigger == "auto" and replay.actor == "auto-replay"


def test_targets_must_opt_in(client, target, sink):
    ingest(client, "t")
    assert auto_replay_task()["replayed"] == 0 and sink.received() == []


def test_the_cap_counts_per_lineage_root(client, auto_target, sink, settings):
    settings.ONCEGUARD_DLQ = {"AUTO_REPLAY_MAX_PER_ROOT": 2}
    event_id = ingest(client, "t")
    sink.mode, sink.status = "status", 503
    assert auto_replay_task()["failed"] == 1
    # Backing off: not again at once.
    assert auto_replay_task() == {"replayed": 0, "failed": 0, "skipped": 1}
    allow_next_try()
    assert auto_replay_task()["failed"] == 1
    allow_next_try()
    assert auto_replay_task() == {"replayed": 0, "failed": 0, "skipped": 0}
    assert FailedEvent.objects.get(pk=event_id).auto_replay_count == 2
    assert len(sink.received()) == 2
    # A human can still replay it.
    sink.mode = "ok"
    assert client.post(f"/api/v1/dlq/events/{event_id}/replay", {}, format="json").json()["outcome"] == "succeeded"


def test_no_automatic_replay_after_an_ambiguous_or_definitive_answer(client, auto_target, sink):
    ingest(client, "t")
    sink.mode, sink.status = "status", 422
    auto_replay_task()
    allow_next_try()
    assert auto_replay_task()["replayed"] == 0 and len(sink.received()) == 1


def test_no_automatic_replay_past_the_root_s_lifetime(client, auto_target, sink, settings):
    settings.ONCEGUARD_DLQ = {"AUTO_REPLAY_LIFETIME_SECONDS": 3600}
    event_id = ingest(client, "old")
    FailedEvent.objects.filter(pk=event_id).update(failed_at=timezone.now() - timedelta(hours=2))
    assert auto_replay_task()["replayed"] == 0 and sink.received() == []


def test_an_operation_root_lives_as_long_as_its_operation(tenant, provider, auto_target, sink):
    op = ledger.operation_claim(tenant=tenant, key="k1", provider=provider, payload={"a": 1}).operation
    ledger.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient"
    )
    waiting = Operation.objects.get(pk=op.pk)
    guarded_move(operation=waiting, to="failed", actor="sweeper", reason="lifetime exhausted")
    # The operation's lifetime is over: replaying now would act after its context changed.
    Operation.objects.filter(pk=op.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert auto_replay_task()["replayed"] == 0
    Operation.objects.filter(pk=op.pk).update(expires_at=timezone.now() + timedelta(minutes=5))
    assert auto_replay_task()["replayed"] == 1
    assert sink.received()[0].header("Idempotency-Key") == "k1"


def test_a_replay_interrupted_before_the_send_returns_the_entry_to_pending(client, tenant, target):
    event_id = ingest(client, "t")
    event = FailedEvent.objects.get(pk=event_id)
    # The sender died right after allocating n.
    replay = dlq_replays._replay_begin(
        event=event, target=target, actor="t", note="", force=False, as_new=False, trigger="manual", bulk_id=None
    )
    Replay.objects.filter(pk=replay.pk).update(started_at=timezone.now() - timedelta(hours=1))
    assert replays_recover_task() == {"failed": 1}
    assert FailedEvent.objects.get(pk=event_id).status == "pending"
    assert Replay.objects.get(pk=replay.pk).outcome == "failed"


def test_a_replay_interrupted_after_the_send_is_settled_by_the_ledger_row(client, tenant, target):
    event_id = ingest(client, "t")
    event = FailedEvent.objects.get(pk=event_id)
    replay = dlq_replays._replay_begin(
        event=event, target=target, actor="t", note="", force=False, as_new=False, trigger="manual", bulk_id=None
    )
    op = ledger.operation_claim(
        tenant=tenant, key=replay.ledger_key, provider=None, mark_sent=True, via_claims=False
    ).operation
    Replay.objects.filter(pk=replay.pk).update(started_at=timezone.now() - timedelta(hours=1))
    # Lease still live: the sender may be alive; leave it.
    assert replays_recover_task() == {}
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    # Sent, answer never recorded: unknown — a human decides; the entry is theirs again.
    assert replays_recover_task() == {"ambiguous": 1}
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_a_replay_whose_success_was_recorded_by_the_ledger_is_settled_as_replayed(client, tenant, target):
    event_id = ingest(client, "t")
    event = FailedEvent.objects.get(pk=event_id)
    replay = dlq_replays._replay_begin(
        event=event, target=target, actor="t", note="", force=False, as_new=False, trigger="manual", bulk_id=None
    )
    op = ledger.operation_claim(
        tenant=tenant, key=replay.ledger_key, provider=None, mark_sent=True, via_claims=False
    ).operation
    ledger.operation_complete(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="r1")
    Replay.objects.filter(pk=replay.pk).update(started_at=timezone.now() - timedelta(hours=1))
    assert replays_recover_task() == {"succeeded": 1}
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"
