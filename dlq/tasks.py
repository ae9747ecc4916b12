"""django-q2 entry points: take ids, call a service, nothing else."""

from __future__ import annotations

from dlq.ingest import fetch as dlq_fetch
from dlq.replays import automatic as dlq_automatic
from dlq.replays import bulk as dlq_bulk
from dlq.replays import recovery as dlq_recovery


def bulk_replay_run_task(bulk_id: int) -> int | None:
    bulk = dlq_bulk.bulk_replay_run(bulk_id=bulk_id)
    return bulk.position if bulk is not None else None


def auto_replay_task() -> dict[str, int]:
    return dlq_automatic.auto_replay_due()


def replays_recover_task() -> dict[str, int]:
    return dlq_recovery.replays_recover()


def n8n_payload_fetch_task(event_id: int) -> str:
    """Lead capture of an n8n Error Trigger entry (enqueued after its ingestion commits)."""
    event = dlq_fetch.failed_event_n8n_fetch(event_pk=event_id)
    return event.payload_fetch if event is not None else "gone"
