"""django-q2 entry points: take ids, call a service, nothing else."""

from __future__ import annotations

from typing import Any

from django_q.tasks import async_task

# Modules, not their functions: dlq.services and dlq.alerts enqueue through this module, so
# either may be the one half-imported when this line runs.
from dlq import alerts, services


def enqueue(func: str, *args: Any) -> None:
    """Hand a task to django-q2 (the ORM broker by default). Called after commit only."""
    async_task(func, *args, q_options={"task_name": f"{func.rsplit('.', 1)[-1]}:{':'.join(map(str, args))}"})


def alert_dispatch_task(tenant_id: int) -> dict[str, int]:
    return alerts.alert_dispatch(tenant_id=tenant_id)


def alerts_flush_task() -> dict[str, int]:
    """Schedule: alerts that waited for a rate window, and due retries."""
    return alerts.alert_dispatch()


def bulk_replay_run_task(bulk_id: int) -> int | None:
    bulk = services.bulk_replay_run(bulk_id=bulk_id)
    return bulk.position if bulk is not None else None


def auto_replay_task() -> dict[str, int]:
    return services.auto_replay_due()


def replays_recover_task() -> dict[str, int]:
    return services.replays_recover()
