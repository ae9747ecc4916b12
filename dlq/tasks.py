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
