"""Bulk replay: a dry run freezes the selection; confirming replays exactly it, paced, once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dlq.models import BulkReplay, FailedEvent, Replay
from dlq.replays import bulk as dlq_bulk
from dlq.tasks import bulk_replay_run_task
from tests.support.clocks import FakeClock


def ingest(client, n: int, prefix: str, workflow: str = "17") -> list[int]:
    ids = []
    for i in range(n):
        body = {
            "event_id": f"{prefix}-{i}",
            "idempotency_key": f"{prefix}-{i}:crm:create:v1",
            "payload": {"n": i},
            "source": {"workflow_id": workflow},
            "error": {"class": "transient"},
        }
        ids.append(client.post("/api/v1/dlq/events", body, format="json").json()["id"])
    return ids


def run_bulk(enqueued, bulk_id: int) -> None:
    """Run the enqueued bulk task (and its re-enqueues) like the cluster would."""
    for _ in range(50):
        pending = [c for c in enqueued if c == ("dlq.tasks.bulk_replay_run_task", bulk_id)]
        if not pending:
            return
        enqueued.remove(pending[0])
        bulk_replay_run_task(bulk_id)


@pytest.mark.django_db
def test_confirm_replays_exactly_the_frozen_selection_even_after_new_entries_arrive(
    client, target, sink, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    frozen = ingest(client, 5, "early")
    ingest(client, 2, "other-workflow", workflow="99")
    dry = client.post("/api/v1/dlq/replays", {"dry_run": True, "workflow": "17"}, format="json")
    assert dry.status_code == 201, dry.content
    selection = dry.json()
    assert selection["count"] == 5 and sorted(selection["event_ids"]) == sorted(frozen)
    assert selection["status"] == "draft" and sink.received() == []

    late = ingest(client, 3, "late")  # same workflow, arrive after the dry run
    with django_capture_on_commit_callbacks(execute=True):
        confirmed = client.post("/api/v1/dlq/replays", {"id": selection["id"], "count": 5}, format="json")
    assert confirmed.status_code == 202 and confirmed.json()["status"] == "running"
    run_bulk(enqueued, selection["id"])

    keys = sorted(r.header("Idempotency-Key") for r in sink.received())
    assert keys == sorted(f"early-{i}:crm:create:v1" for i in range(5))
    bulk = client.get(f"/api/v1/dlq/replays/{selection['id']}").json()
    assert bulk["status"] == "done" and bulk["succeeded"] == 5 and bulk["position"] == 5
    assert set(FailedEvent.objects.filter(pk__in=late).values_list("status", flat=True)) == {"pending"}
    assert set(Replay.objects.values_list("trigger", flat=True)) == {"bulk"}


@pytest.mark.django_db
def test_entries_closed_after_the_dry_run_are_skipped_not_replayed(
    client, target, sink, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    ids = ingest(client, 3, "e")
    selection = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    client.post(f"/api/v1/dlq/events/{ids[1]}/discard", {"note": "duplicate lead"}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/api/v1/dlq/replays", {"id": selection["id"]}, format="json")
    run_bulk(enqueued, selection["id"])
    assert len(sink.received()) == 2
    bulk = BulkReplay.objects.get(pk=selection["id"])
    assert (bulk.succeeded, bulk.skipped) == (2, 1)


@pytest.mark.django_db
def test_a_confirm_must_match_the_count_shown_and_happens_once(
    client, target, enqueued, django_capture_on_commit_callbacks
):
    ingest(client, 2, "e")
    selection = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    wrong = client.post("/api/v1/dlq/replays", {"id": selection["id"], "count": 3}, format="json")
    assert wrong.status_code == 409 and wrong.json()["code"] == "bulk_replay_not_confirmable"
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post("/api/v1/dlq/replays", {"id": selection["id"]}, format="json").status_code == 202
        twice = client.post("/api/v1/dlq/replays", {"id": selection["id"]}, format="json")
    assert twice.status_code == 409
    assert enqueued.count(("dlq.tasks.bulk_replay_run_task", selection["id"])) == 1


@pytest.mark.django_db
def test_an_expired_dry_run_cannot_be_confirmed(client, target):
    ingest(client, 1, "e")
    selection = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    BulkReplay.objects.filter(pk=selection["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.post("/api/v1/dlq/replays", {"id": selection["id"]}, format="json")
    assert response.status_code == 409 and response.json()["bulk_status"] == "expired"


@pytest.mark.django_db
def test_one_bulk_replay_runs_per_tenant_at_a_time(client, target):
    ingest(client, 2, "e")
    first = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    second = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    assert client.post("/api/v1/dlq/replays", {"id": first["id"]}, format="json").status_code == 202
    refused = client.post("/api/v1/dlq/replays", {"id": second["id"]}, format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "bulk_replay_rate_limited"
    assert refused["Retry-After"]


@pytest.mark.django_db
def test_a_bulk_replay_must_start_with_a_dry_run_and_force_needs_a_note(client, target):
    assert client.post("/api/v1/dlq/replays", {}, format="json").status_code == 400
    forced = client.post("/api/v1/dlq/replays", {"dry_run": True, "force": True}, format="json")
    assert forced.status_code == 400 and forced.json()["code"] == "note_required"
    assert client.post("/api/v1/dlq/replays", {"id": 999999}, format="json").status_code == 404


@pytest.mark.django_db
def test_sends_are_paced_at_the_configured_rate(
    client, target, sink, enqueued, settings, django_capture_on_commit_callbacks, monkeypatch
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 10}
    ingest(client, 4, "e")
    selection = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/api/v1/dlq/replays", {"id": selection["id"]}, format="json")
    # The pacing's clock (was: the wall clock, read around the run).
    clock = FakeClock()
    monkeypatch.setattr(dlq_bulk, "time", clock)
    started = clock.monotonic()
    run_bulk(enqueued, selection["id"])
    # 4 sends at 10/s: the 4th is not before 0.3 s (rounded: the pauses are float sums).
    assert round(clock.monotonic() - started, 9) >= 0.3
    assert len(sink.received()) == 4


@pytest.mark.django_db
def test_a_run_out_of_budget_hands_over_to_a_fresh_task_and_resumes(client, tenant, target, sink, enqueued, settings):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    ingest(client, 3, "e")
    bulk = dlq_bulk.bulk_replay_prepare(tenant=tenant, filters={}, actor="t")
    dlq_bulk.bulk_replay_confirm(tenant=tenant, bulk_id=bulk.pk, actor="t")
    dlq_bulk.bulk_replay_run(bulk_id=bulk.pk, budget_seconds=0)
    assert BulkReplay.objects.get(pk=bulk.pk).position == 1
    assert ("dlq.tasks.bulk_replay_run_task", bulk.pk) in enqueued
    run_bulk(enqueued, bulk.pk)
    assert len(sink.received()) == 3 and BulkReplay.objects.get(pk=bulk.pk).status == "done"


@pytest.mark.django_db(transaction=True)
def test_two_runners_of_one_bulk_replay_never_send_an_entry_twice(client, tenant, target, sink, settings):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    ingest(client, 8, "e")
    bulk = dlq_bulk.bulk_replay_prepare(tenant=tenant, filters={}, actor="t")
    dlq_bulk.bulk_replay_confirm(tenant=tenant, bulk_id=bulk.pk, actor="t")
    barrier = threading.Barrier(2, timeout=10)

    def runner() -> None:
        try:
            barrier.wait()
            dlq_bulk.bulk_replay_run(bulk_id=bulk.pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    keys = [r.header("Idempotency-Key") for r in sink.received()]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 8
    done = BulkReplay.objects.get(pk=bulk.pk)
    assert done.status == "done" and done.succeeded == 8
