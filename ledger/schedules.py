"""django-q2 schedules owned by the ledger: the sweeper, the sweep of objects crashes left, the fence epoch, the nightly orphan check. Entry points take nothing but
call the service; the schedule rows are installed idempotently by `schedules_install`."""

from __future__ import annotations

from django.conf import settings
from django_q.models import Schedule

from ledger.execution.objects import objects_sweep
from ledger.platform.partitions import partitions_ensure
from ledger.protocol.fencing import fence_schedule
from ledger.recovery.sweeper import sweep
from ledger.store.orphans import orphans_count


def sweep_task() -> dict[str, int]:
    return sweep().counts


def objects_sweep_task() -> dict[str, int]:
    return objects_sweep()


def partitions_ensure_task() -> list[str]:
    return partitions_ensure()


def fence_task() -> dict[str, int]:
    return fence_schedule()


def orphans_task() -> dict[str, int]:
    return orphans_count()


def install_schedules() -> list[str]:
    """Create or update the ledger's schedules; returns their names."""
    minutes = max(1, round(settings.ONCEGUARD["SWEEP_INTERVAL_SECONDS"] / 60))
    Schedule.objects.update_or_create(
        name="ledger.sweep",
        defaults={
            "func": "ledger.schedules.sweep_task",
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
        },
    )
    # What crashes left in the object storages (ledger.execution.objects): hourly is plenty.
    Schedule.objects.update_or_create(
        name="ledger.objects_sweep",
        defaults={
            "func": "ledger.schedules.objects_sweep_task",
            "schedule_type": Schedule.HOURLY,
            "repeats": -1,
        },
    )
    # Monthly partitions of attempts and events, created months ahead (ledger.platform.partitions):
    # daily, so a missed run or two changes nothing.
    Schedule.objects.update_or_create(
        name="ledger.partitions_ensure",
        defaults={
            "func": "ledger.schedules.partitions_ensure_task",
            "schedule_type": Schedule.DAILY,
            "repeats": -1,
        },
    )
    # Restore fencing (ADR 0012): the epoch advances (and the journal is read when the database is
    # behind it, and pruned past its retention) every FENCE_EPOCH_SECONDS; nothing when fencing is off.
    Schedule.objects.update_or_create(
        name="ledger.fence",
        defaults={
            "func": "ledger.schedules.fence_task",
            "schedule_type": Schedule.MINUTES,
            "minutes": max(1, round(float(settings.ONCEGUARD["FENCE_EPOCH_SECONDS"]) / 60)),
            "repeats": -1,
        },
    )
    # The references without a database constraint (ADR 0019): nightly, a report of rows whose
    # tenant, provider or operation is gone (a warning in the log; none is the expected answer).
    Schedule.objects.update_or_create(
        name="ledger.orphans",
        defaults={
            "func": "ledger.schedules.orphans_task",
            "schedule_type": Schedule.DAILY,
            "repeats": -1,
        },
    )
    return ["ledger.sweep", "ledger.objects_sweep", "ledger.partitions_ensure", "ledger.fence", "ledger.orphans"]
