"""Alerts resolve themselves: each kind's clearing condition, and the evaluator that checks them.

``CLEARING`` is the one table of every alert kind raised in the code: what must hold for an
alert of that kind to have cleared, and the function that answers it for a batch of one
tenant's unresolved alerts of the kind (one query per batch, not per alert). A check takes
``(tenant_id, alerts, now)`` and returns ``{alert id: why it cleared}`` for those that have.

The checks about the DLQ's rows and the scheduler's health live with the apps that own them
(``dlq.entries.selectors``, ``observability.scheduler``), which sit above alerts (.importlinter): the
table names every check by its dotted path, as django-q2 schedules name their tasks.

``alerts_resolve_cleared`` — the schedule "alerts: resolve what has cleared", every minute —
walks the open and acknowledged alerts and resolves those whose condition has cleared, as
``system``, with when (``resolved_at``) and why (``resolution_note``). Acknowledging only
silences an alert; an acknowledged alert is resolved here too. A recurrence after that opens
a new alert (``alerts.services.alert_raise``: the dedup key carries the episode). A kind not
in the table keeps manual resolution. A check that fails for a batch is retried alert by
alert, so one poisoned alert is skipped (logged, by id) and the rest are still resolved.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from alerts.models import Alert
from alerts.services import alert_resolve_cleared
from ledger.models import AdapterRevision, Operation, OperationStatus, Provider
from ledger.platform.passes import PASS_ROW_FAILURES
from ledger.recovery.sweeper import STUCK_STATE_GROUPS

log = logging.getLogger("onceguard.alerts")

Check = Callable[[int, list[Alert], datetime], dict[int, str]]


@dataclass(frozen=True)
class Clearing:
    # Dotted path of the check (see the module's docstring for its signature).
    check: str
    # What must hold for the alert to clear, in words (docs, the console).
    condition: str


CLEARING: dict[str, Clearing] = {
    # dlq.ingest.services: a new dead-letter entry; dlq.replays.services: one pending again after a
    # failed replay.
    "dlq_new": Clearing(
        "dlq.entries.selectors.alerts_cleared_dlq_new",
        "the entry is no longer pending or replaying (replayed, resolved, …)",
    ),
    # review.retention.purge: a pending entry past its record TTL was discarded (a notice).
    "retention_discarded": Clearing(
        "dlq.entries.selectors.alerts_cleared_retention_discarded", "the discard it announces is done"
    ),
    # ledger.recovery.sweeper and ledger.execution.polling: an operation went to review.
    "review_needed": Clearing("alerts.clearing.alerts_cleared_review_needed", "the operation is no longer in review"),
    # ledger.recovery.sweeper.alert_stuck: an open operation has not moved for STUCK_ALERT_SECONDS.
    "operation_stuck": Clearing(
        "alerts.clearing.alerts_cleared_operation_stuck", "the operation finished or moved within STUCK_ALERT_SECONDS"
    ),
    # ledger.protocol.services.provider_pause: a 401/403 paused the provider.
    "provider_paused": Clearing("alerts.clearing.alerts_cleared_provider_paused", "the provider was resumed"),
    # ledger.providers.canary: the canary watch rolled a failing adapter revision back.
    "provider_canary_rolled_back": Clearing(
        "alerts.clearing.alerts_cleared_canary_rolled_back", "a new adapter revision was saved since the rollback"
    ),
    # ledger.providers.canary: a canary gate beyond the failure rate paused the canary (ADR 0020).
    "provider_canary_paused": Clearing(
        "alerts.clearing.alerts_cleared_canary_paused", "the canary was resumed, promoted or rolled back"
    ),
    # observability.scheduler: no django-q2 task finished for SCHEDULER_STALE_SECONDS.
    "scheduler_stale": Clearing(
        "observability.scheduler.alerts_cleared_scheduler_stale", "a django-q2 task finished within the threshold"
    ),
    # observability.scheduler: the sweeper has not completed a pass for SWEEPER_STALE_SECONDS.
    "sweeper_stale": Clearing(
        "observability.scheduler.alerts_cleared_sweeper_stale", "the sweeper completed a pass within the threshold"
    ),
}


# --- The ledger's kinds (alerts may read the ledger; the others live with their apps) ------


def alerts_cleared_review_needed(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``review_needed`` (ref: the operation's key) clears once the operation left review."""
    status = dict(
        Operation.objects.filter(tenant_id=tenant_id, key__in={a.ref for a in alerts}).values_list("key", "status")
    )
    return {
        alert.pk: f"cleared: operation {alert.ref} left review ({status.get(alert.ref, 'deleted')})"
        for alert in alerts
        if status.get(alert.ref) != OperationStatus.REVIEW
    }


def alerts_cleared_operation_stuck(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``operation_stuck`` (ref: the key) clears once the operation finished or moved: it is
    no longer in a stuck state, or it changed within STUCK_ALERT_SECONDS."""
    cutoff = now - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
    stuck_states = {state for group in STUCK_STATE_GROUPS for state in group}
    rows = {
        key: (status, updated_at)
        for key, status, updated_at in Operation.objects.filter(
            tenant_id=tenant_id, key__in={a.ref for a in alerts}
        ).values_list("key", "status", "updated_at")
    }
    cleared = {}
    for alert in alerts:
        status, updated_at = rows.get(alert.ref, ("deleted", None))
        if status not in stuck_states:
            cleared[alert.pk] = f"cleared: operation {alert.ref} is {status}"
        elif updated_at is not None and updated_at >= cutoff:
            cleared[alert.pk] = f"cleared: operation {alert.ref} moved ({status} since {updated_at:%Y-%m-%d %H:%M:%S})"
    return cleared


def alerts_cleared_provider_paused(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``provider_paused`` (ref: the provider's slug) clears once the provider was resumed."""
    paused = dict(
        Provider.objects.filter(tenant_id=tenant_id, slug__in={a.ref for a in alerts}).values_list("slug", "paused_at")
    )
    cleared = {}
    for alert in alerts:
        if alert.ref not in paused:
            cleared[alert.pk] = f"cleared: provider {alert.ref} no longer exists"
        elif paused[alert.ref] is None:
            cleared[alert.pk] = f"cleared: provider {alert.ref} resumed"
    return cleared


def alerts_cleared_canary_rolled_back(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``provider_canary_rolled_back`` (ref: the slug) clears once someone saved a new adapter
    revision after the (last) rollback: the fix is in, whether it is a canary or stable yet."""
    since = min(alert.last_raised_at for alert in alerts)
    newest: dict[str, tuple[int, datetime]] = {}
    for slug, number, created_at in AdapterRevision.objects.filter(
        tenant_id=tenant_id, provider__slug__in={a.ref for a in alerts}, created_at__gt=since
    ).values_list("provider__slug", "number", "created_at"):
        if slug not in newest or number > newest[slug][0]:
            newest[slug] = (number, created_at)
    return {
        alert.pk: f"cleared: provider {alert.ref} has a new adapter revision ({newest[alert.ref][0]})"
        for alert in alerts
        if alert.ref in newest and newest[alert.ref][1] > alert.last_raised_at
    }


def alerts_cleared_canary_paused(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``provider_canary_paused`` (ref: the slug) clears once the provider has no paused canary:
    an operator resumed it, promoted it or rolled it back."""
    paused = set(
        Provider.objects.filter(
            tenant_id=tenant_id, slug__in={a.ref for a in alerts}, canary_paused_at__isnull=False
        ).values_list("slug", flat=True)
    )
    return {
        alert.pk: f"cleared: provider {alert.ref} has no paused canary" for alert in alerts if alert.ref not in paused
    }


# --- The evaluator -------------------------------------------------------------------------


def _check(kind: str) -> Check:
    return import_string(CLEARING[kind].check)


def _cleared(kind: str, tenant_id: int, alerts: list[Alert], now: datetime, counts: Counter[str]) -> dict[int, str]:
    """The check for a batch; when it fails, alert by alert, skipping the one that fails."""
    try:
        # A savepoint: a failed query must not abort the pass's other statements (PostgreSQL).
        with transaction.atomic():
            return _check(kind)(tenant_id, alerts, now)
    except Exception as exc:
        if len(alerts) > 1:
            cleared: dict[int, str] = {}
            for alert in alerts:
                cleared |= _cleared(kind, tenant_id, [alert], now, counts)
            return cleared
        # Ids and the exception's class only: a message may quote a key or a payload.
        log.warning("alert_clearing_failed alert=%s kind=%s error=%s", alerts[0].pk, kind, type(exc).__name__)
        PASS_ROW_FAILURES.labels(job="alert_clearing").inc()
        counts["failed"] += 1
        return {}


def alerts_resolve_cleared(*, now: datetime | None = None, batch: int = 500) -> dict[str, int]:
    """Resolve every open or acknowledged alert whose condition has cleared (module docstring).

    Returns counts: ``resolved``, ``held`` (still holds), ``manual`` (a kind without a
    condition), ``failed`` (a check that raised)."""
    now = now or timezone.now()
    counts: Counter[str] = Counter()
    after = 0
    while True:
        # Keyset over the unresolved alerts' partial index (alert_unresolved_idx).
        rows = list(Alert.objects.filter(resolved_at__isnull=True, pk__gt=after).order_by("pk")[:batch])
        if not rows:
            break
        after = rows[-1].pk
        groups: dict[tuple[int, str], list[Alert]] = defaultdict(list)
        for alert in rows:
            groups[(alert.tenant_id, alert.kind)].append(alert)
        for (tenant_id, kind), alerts in groups.items():
            if kind not in CLEARING:
                counts["manual"] += len(alerts)
                continue
            cleared = _cleared(kind, tenant_id, alerts, now, counts)
            for alert in alerts:
                if alert.pk not in cleared:
                    continue
                if alert_resolve_cleared(
                    alert_id=alert.pk, raised_at=alert.last_raised_at, note=cleared[alert.pk], now=now
                ):
                    counts["resolved"] += 1
            counts["held"] += len(alerts) - len(cleared)
    if counts["resolved"]:
        log.info("alerts_cleared resolved=%s held=%s failed=%s", counts["resolved"], counts["held"], counts["failed"])
    return dict(counts)
