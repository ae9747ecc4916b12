"""django-q2 entry points: take ids, call a service, nothing else."""

from __future__ import annotations

from alerts import clearing, services


def alert_dispatch_task(tenant_id: int) -> dict[str, int]:
    return services.alert_dispatch(tenant_id=tenant_id)


def alerts_flush_task() -> dict[str, int]:
    """Schedule: alerts that waited for a rate window, and due retries."""
    return services.alert_dispatch()


def alerts_resolve_cleared_task() -> dict[str, int]:
    """Schedule: resolve the alerts whose condition has cleared."""
    return clearing.alerts_resolve_cleared()
