"""Is the scheduler alive? django-q2's heartbeat and the sweeper's last run, as ages.

Not readiness: a stalled scheduler must not take every web node out of the load balancer
(operations never depend on django-q2). Instead ``/metrics`` shows the ages and a stale
flag, and :func:`scheduler_watch` raises an alert when one goes stale.

- The heartbeat is the last time the cluster *finished* any task (success or failure): the
  schedules fire every minute, so this proves scheduler, broker and workers run end to end
  (django-q2's own cluster stats live in the broker's cache, which the ORM broker keeps per
  process, so another process cannot read them).
- The sweeper's last run is the last successful ``ledger.schedules.sweep_task``.
- Nothing ever ran: the age counts from when django-q2's tables were created, so a cluster
  that was never started goes stale too.

The watch must not depend on the thing it watches: it runs outside django-q2
(``manage.py scheduler_watch``, which ``make run`` starts) and hands the alert to the
channels itself instead of leaving the delivery to a django-q2 task.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Max, Min
from django.utils import timezone
from django_q.models import Task

from alerts.models import Alert, AlertChannel
from alerts.services import alert_dispatch, alert_raise

log = logging.getLogger("onceguard.scheduler")

SWEEP_FUNC = "ledger.schedules.sweep_task"


@dataclass(frozen=True)
class SchedulerAges:
    heartbeat_age_seconds: float
    sweeper_age_seconds: float
    heartbeat_stale_after: float
    sweeper_stale_after: float

    @property
    def heartbeat_stale(self) -> bool:
        return self.heartbeat_age_seconds > self.heartbeat_stale_after

    @property
    def sweeper_stale(self) -> bool:
        return self.sweeper_age_seconds > self.sweeper_stale_after


def _installed_at() -> datetime | None:
    return MigrationRecorder.Migration.objects.filter(app="django_q").aggregate(at=Min("applied"))["at"]


def stale_after_seconds() -> tuple[float, float]:
    """(heartbeat, sweeper) thresholds: SCHEDULER_STALE_SECONDS, SWEEPER_STALE_SECONDS
    (default: five sweep intervals of whole minutes, at least 300 s)."""
    sweep_minutes = max(1, round(settings.ONCEGUARD["SWEEP_INTERVAL_SECONDS"] / 60))
    heartbeat = float(getattr(settings, "SCHEDULER_STALE_SECONDS", 300))
    sweeper = getattr(settings, "SWEEPER_STALE_SECONDS", None)
    return heartbeat, float(sweeper) if sweeper else max(300.0, 5 * 60.0 * sweep_minutes)


def scheduler_ages(*, now: datetime | None = None) -> SchedulerAges:
    """How long ago the cluster last finished a task and the sweeper last ran (seconds)."""
    now = now or timezone.now()
    last = Task.objects.aggregate(any_task=Max("stopped"))["any_task"]
    swept = Task.objects.filter(func=SWEEP_FUNC, success=True).aggregate(at=Max("stopped"))["at"]
    since = _installed_at() or now
    heartbeat_after, sweeper_after = stale_after_seconds()
    return SchedulerAges(
        heartbeat_age_seconds=max(0.0, (now - (last or since)).total_seconds()),
        sweeper_age_seconds=max(0.0, (now - (swept or since)).total_seconds()),
        heartbeat_stale_after=heartbeat_after,
        sweeper_stale_after=sweeper_after,
    )


def _alert(*, kind: str, ref: str, summary: str) -> int:
    """The one place these alerts are raised: every tenant with an active channel gets it,
    and the channels are called from here (django-q2, which usually delivers alerts, is
    what is stale)."""
    tenant_ids = sorted(set(AlertChannel.objects.filter(active=True).values_list("tenant_id", flat=True)))
    for tenant_id in tenant_ids:
        alert_raise(tenant_id=tenant_id, kind=kind, ref=ref, summary=summary)
    for tenant_id in tenant_ids:
        alert_dispatch(tenant_id=tenant_id)
    return len(tenant_ids)


def scheduler_watch(*, now: datetime | None = None) -> SchedulerAges:
    """One look: alert when the heartbeat or the sweeper is stale (a raise while the alert is
    unresolved only counts a repeat, so calling this every minute is fine; once it ran again
    the alert resolves itself, alerts.clearing)."""
    ages = scheduler_ages(now=now)
    if ages.heartbeat_stale:
        log.warning(
            "scheduler_stale age_seconds=%d threshold=%d", ages.heartbeat_age_seconds, ages.heartbeat_stale_after
        )
        _alert(
            kind="scheduler_stale",
            ref="django-q2",
            summary=f"No django-q2 task finished for {int(ages.heartbeat_age_seconds)} s: is `manage.py qcluster`"
            " running and its broker reachable? Schedules (sweeper, purge, auto-replay, alerts) are not running.",
        )
    if ages.sweeper_stale:
        log.warning("sweeper_stale age_seconds=%d threshold=%d", ages.sweeper_age_seconds, ages.sweeper_stale_after)
        _alert(
            kind="sweeper_stale",
            ref="ledger.sweep",
            summary=f"The sweeper has not completed a pass for {int(ages.sweeper_age_seconds)} s: expired leases"
            " and uncertain operations are not being reconciled.",
        )
    return ages


# --- Alert clearing conditions (alerts.clearing names these) --------------------------------


def alerts_cleared_scheduler_stale(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``scheduler_stale`` clears once a django-q2 task has finished within the threshold."""
    ages = scheduler_ages(now=now)
    if ages.heartbeat_stale:
        return {}
    note = f"cleared: django-q2 finished a task {int(ages.heartbeat_age_seconds)} s ago"
    return {alert.pk: note for alert in alerts}


def alerts_cleared_sweeper_stale(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``sweeper_stale`` clears once the sweeper has completed a pass within the threshold."""
    ages = scheduler_ages(now=now)
    if ages.sweeper_stale:
        return {}
    note = f"cleared: the sweeper completed a pass {int(ages.sweeper_age_seconds)} s ago"
    return {alert.pk: note for alert in alerts}
