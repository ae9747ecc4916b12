"""The alerts' django-q2 schedules, installed by `manage.py schedules_install` (and migration
alerts.0002, which also drops the flush schedule the DLQ used to own)."""

from __future__ import annotations

from typing import Any

from django_q.models import Schedule

# name → (function, minutes between runs)
SCHEDULES: dict[str, tuple[str, int]] = {
    "alerts: flush and retries": ("alerts.tasks.alerts_flush_task", 1),
    # Open and acknowledged alerts whose condition has passed resolve themselves (alerts.clearing).
    "alerts: resolve what has cleared": ("alerts.tasks.alerts_resolve_cleared_task", 1),
}


def install_schedules(schedule_model: Any = Schedule) -> list[str]:
    """Create or update each schedule by name (idempotent). Takes the model so a data
    migration can pass its historical one."""
    for name, (func, minutes) in SCHEDULES.items():
        schedule_model.objects.update_or_create(
            name=name, defaults={"func": func, "schedule_type": "I", "minutes": minutes, "repeats": -1}
        )
    return list(SCHEDULES)
