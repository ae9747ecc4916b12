"""django-q2 entry points: take ids, call a service, nothing else."""

from __future__ import annotations

from dlq import services


def bulk_replay_run_task(bulk_id: int) -> int | None:
    bulk = services.bulk_replay_run(bulk_id=bulk_id)
    return bulk.position if bulk is not None else None


def auto_replay_task() -> dict[str, int]:
    return services.auto_replay_due()


def replays_recover_task() -> dict[str, int]:
    return services.replays_recover()


def n8n_payload_fetch_task(event_id: int) -> str:
    """Lead capture of an n8n Error Trigger entry (enqueued after its ingestion commits)."""
    event = services.failed_event_n8n_fetch(event_pk=event_id)
    return event.payload_fetch if event is not None else "gone"
