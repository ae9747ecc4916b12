"""The DLQ's django-q2 schedules, installed by `manage.py dlq_schedules` and migration 0003."""

from __future__ import annotations

from typing import Any

from django_q.models import Schedule

# name → (function, minutes between runs)
SCHEDULES: dict[str, tuple[str, int]] = {
    "dlq: automatic replay of transient failures": ("dlq.tasks.auto_replay_task", 1),
    "dlq: settle interrupted replays": ("dlq.tasks.replays_recover_task", 5),
}


def install_schedules(schedule_model: Any = Schedule) -> list[str]:
    """Create or update each schedule by name (idempotent). Takes the model so a data
    migration can pass its historical one."""
    installed = []
    for name, (func, minutes) in SCHEDULES.items():
        schedule_model.objects.update_or_create(
            name=name,
            defaults={"func": func, "schedule_type": "I", "minutes": minutes, "repeats": -1},
        )
        installed.append(name)
    return installed
