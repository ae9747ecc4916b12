"""django-q2 schedules owned by the console: the retention purge (which also restarts
stalled erasure runs), the access log's checkpoints and the dashboard's activity rollup. Installed idempotently by ``manage.py schedules_install`` (which imports this
module)."""

from __future__ import annotations

from django_q.models import Schedule

from ledger.platform import env
from review.audit.accesslog import accesslog_checkpoint_all, accesslog_setting
from review.console.selectors import activity_rollup
from review.privacy.erasure import erasures_resume_stalled
from review.retention.purge import retention_purge


def retention_purge_task() -> dict[str, int]:
    runs = retention_purge(trigger="schedule")
    return {
        "tenants": len(runs),
        "redacted": sum(r.redacted for r in runs),
        "deleted": sum(r.deleted for r in runs),
        "discarded": sum(r.discarded for r in runs),
        # Erasure runs whose task died (beyond django-q2's own retries) continue at their cursor.
        "erasures_resumed": len(erasures_resume_stalled()),
    }


def accesslog_checkpoint_task() -> dict[str, int]:
    return {"checkpoints": accesslog_checkpoint_all()}


def activity_rollup_task() -> dict[str, int]:
    """The dashboard's activity chart: the hours just over read into the rollup."""
    return {"tenants": activity_rollup()}


def install_schedules() -> list[str]:
    """Create or update the console's schedules; returns their names."""
    minutes = max(1, env.read("RETENTION_INTERVAL_MINUTES"))
    Schedule.objects.update_or_create(
        name="review.retention_purge",
        defaults={
            "func": "review.schedules.retention_purge_task",
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
        },
    )
    Schedule.objects.update_or_create(
        name="review.accesslog_checkpoint",
        defaults={
            "func": "review.schedules.accesslog_checkpoint_task",
            "schedule_type": Schedule.MINUTES,
            "minutes": max(1, int(accesslog_setting("CHECKPOINT_MINUTES", 15))),
            "repeats": -1,
        },
    )
    # Every 15 minutes: an hour just over (and settled) is in the rollup within a quarter of an
    # hour; a pass with nothing to read is one query per 200 tenants.
    Schedule.objects.update_or_create(
        name="review.activity_rollup",
        defaults={
            "func": "review.schedules.activity_rollup_task",
            "schedule_type": Schedule.MINUTES,
            "minutes": 15,
            "repeats": -1,
        },
    )
    return ["review.retention_purge", "review.accesslog_checkpoint", "review.activity_rollup"]
