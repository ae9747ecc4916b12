"""django-q2 entry points: take ids, call a service, nothing else."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("onceguard.dlq")


def enqueue(func: str, *args: Any) -> None:
    """Hand a task to django-q2 (the ORM broker by default). Called after commit only."""
    from django_q.tasks import async_task

    async_task(func, *args, q_options={"task_name": f"{func.rsplit('.', 1)[-1]}:{':'.join(map(str, args))}"})


# Kept under a second name so tests that stub `enqueue` can still reach the real one.
_real_enqueue = enqueue


def alert_dispatch_task(tenant_id: int) -> dict[str, int]:
    from dlq.alerts import alert_dispatch

    return alert_dispatch(tenant_id=tenant_id)


def alerts_flush_task() -> dict[str, int]:
    """Schedule: alerts that waited for a rate window, and due retries."""
    from dlq.alerts import alert_dispatch

    return alert_dispatch()


def bulk_replay_run_task(bulk_id: int) -> int | None:
    from dlq.services import bulk_replay_run

    bulk = bulk_replay_run(bulk_id=bulk_id)
    return bulk.position if bulk is not None else None


def auto_replay_task() -> dict[str, int]:
    from dlq.services import auto_replay_due

    return auto_replay_due()


def replays_recover_task() -> dict[str, int]:
    from dlq.services import replays_recover

    return replays_recover()
