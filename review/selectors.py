"""Reads for the review queue, shared by the API and the console."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone
from django_q.models import Task

from alerts.models import Alert
from dlq.models import FailedEvent, FailedEventStatus
from dlq.selectors import failed_events_for_a_person
from ledger.models import Operation, OperationEvent, OperationMode, OperationStatus, Provider, Tenant
from ledger.selectors import operation_search
from review.models import RetentionRun


def review_item_list(
    *,
    tenant_ids: list[int] | None,
    provider: str = "",
    older_than_seconds: float | None = None,
    search: str = "",
) -> QuerySet[Operation]:
    # Attempts and events prefetched: the API renders both per item (one query each per page).
    rows = (
        Operation.objects.filter(status=OperationStatus.REVIEW)
        .select_related("provider", "tenant")
        .prefetch_related("attempt_set", "events")
    )
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if provider:
        rows = rows.filter(provider__slug=provider)
    if older_than_seconds is not None:
        rows = rows.filter(updated_at__lt=timezone.now() - timedelta(seconds=older_than_seconds))
    if search:
        # The console's search (substring of key, handle, execution and correlation ids;
        # provider ref by prefix), every arm indexed on PostgreSQL.
        rows = operation_search(rows, search)
    return rows.order_by("updated_at", "id")


# --- Dashboard ------------------------------------------------------------------------------


def _scoped(qs: QuerySet, tenant_ids: list[int] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": tenant_ids})


# The dashboard counts each state up to this many rows and shows "10,000+" past it.
DASHBOARD_COUNT_CAP = 10_000


def capped_counts(qs: QuerySet, *, tenant_ids: list[int] | None, states: list[str]) -> dict[str, int]:
    """Rows per state, each counted up to DASHBOARD_COUNT_CAP + 1 (a bounded subquery).

    A GROUP BY status over the operations reads every row (1.7 s at ten million, issue 16).
    Each count here reads at most the cap's worth of entries of a (tenant, status, …) index:
    the tenant list is spelled out for a platform admin too, so the index is usable."""
    if tenant_ids is None:
        tenant_ids = list(Tenant.objects.values_list("pk", flat=True))
    rows = qs.filter(tenant_id__in=tenant_ids).order_by()
    return {state: rows.filter(status=state)[: DASHBOARD_COUNT_CAP + 1].count() for state in states}


def shown_count(n: int) -> str:
    """A capped count as the dashboard shows it: exact, or "10,000+" at the cap."""
    return f"{DASHBOARD_COUNT_CAP:,}+" if n > DASHBOARD_COUNT_CAP else f"{n:,}"


def dashboard_numbers(*, tenant_ids: list[int] | None) -> dict[str, Any]:
    """Every number the console's front page shows, each scoped to the user's tenants."""
    now = timezone.now()
    ops = _scoped(Operation.objects.all(), tenant_ids)
    by_state = capped_counts(Operation.objects.all(), tenant_ids=tenant_ids, states=list(OperationStatus.values))
    due = Q(status__in=[OperationStatus.QUEUED, OperationStatus.RETRY_WAIT], next_attempt_at__lte=now)
    # Due work is what a worker will do: execute mode. A due guard-mode retry waits for its
    # caller to claim the key again — nobody here can do it — so it is counted apart.
    eligible = ops.filter(due, mode=OperationMode.EXECUTE).aggregate(oldest=Min("next_attempt_at"))["oldest"]
    caller = ops.filter(due, status=OperationStatus.RETRY_WAIT, mode=OperationMode.GUARD).aggregate(
        n=Count("id"), oldest=Min("next_attempt_at")
    )
    review = ops.filter(status=OperationStatus.REVIEW).aggregate(n=Count("id"), oldest=Min("updated_at"))
    dlq_by_status = capped_counts(
        FailedEvent.objects.all(), tenant_ids=tenant_ids, states=list(FailedEventStatus.values)
    )
    paused = list(
        _scoped(Provider.objects.filter(paused_at__isnull=False), tenant_ids)
        .select_related("tenant")
        .order_by("paused_at")[:20]
    )
    throttled = _scoped(Provider.objects.filter(throttled_until__gt=now), tenant_ids).count()
    last_purge = _scoped(RetentionRun.objects.all(), tenant_ids).order_by("-started_at", "-id").first()
    return {
        "now": now,
        # Each count up to the cap + 1 (shown_count says "10,000+" past it).
        "operations": [(s, label, by_state[s]) for s, label in OperationStatus.choices],
        "operations_total": shown_count(min(sum(by_state.values()), DASHBOARD_COUNT_CAP + 1)),
        "oldest_eligible_at": eligible,
        "oldest_eligible_age": (now - eligible) if eligible else None,
        "waiting_for_caller": caller["n"],
        "open_alerts": _scoped(Alert.objects.filter(resolved_at__isnull=True), tenant_ids).count(),
        "waiting_for_caller_oldest_at": caller["oldest"],
        "review_backlog": review["n"],
        "review_oldest_at": review["oldest"],
        "review_oldest_age": (now - review["oldest"]) if review["oldest"] else None,
        "dlq": [(s, label, dlq_by_status[s]) for s, label in FailedEventStatus.choices],
        "dlq_total": shown_count(min(sum(dlq_by_status.values()), DASHBOARD_COUNT_CAP + 1)),
        "paused_providers": paused,
        "throttled_providers": throttled,
        "last_purge": last_purge,
        "last_sweep": last_sweep(),
    }


def last_sweep() -> dict[str, Any] | None:
    """The sweeper's last scheduled run (django-q2's task record), if it has run."""
    task = (
        Task.objects.filter(func="ledger.schedules.sweep_task")
        .order_by("-stopped")
        .values("stopped", "success", "result")
        .first()
    )
    return task


# --- Needs attention now, and the last 24 h per provider --------------------------------------

ATTENTION_ROWS = 5


def attention_now(*, tenant_ids: list[int] | None) -> dict[str, list[Any]]:
    """The oldest of each kind of thing a person must look at, each a few rows: review items,
    DLQ entries no automatic replay will retry, paused providers, operations open too long."""
    now = timezone.now()
    # provider__tenant: a provider prints as "tenant/slug" (one query per row without it).
    ops = _scoped(Operation.objects.all(), tenant_ids).select_related("provider__tenant", "tenant")
    cutoff = now - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
    return {
        "review": list(ops.filter(status=OperationStatus.REVIEW).order_by("updated_at", "id")[:ATTENTION_ROWS]),
        "dlq": list(failed_events_for_a_person(tenant_ids=tenant_ids).select_related("tenant")[:ATTENTION_ROWS]),
        "paused": list(
            _scoped(Provider.objects.filter(paused_at__isnull=False), tenant_ids)
            .select_related("tenant")
            .order_by("paused_at")[:ATTENTION_ROWS]
        ),
        "stuck": list(
            ops.filter(
                status__in=[OperationStatus.CLAIMED, OperationStatus.UNCERTAIN, OperationStatus.QUEUED],
                updated_at__lt=cutoff,
            ).order_by("updated_at", "id")[:ATTENTION_ROWS]
        ),
    }


CHART_SERIES = ("succeeded", "failed", "dead_lettered", "reviewed")
CHART_PROVIDERS = 8


def provider_activity(*, tenant_ids: list[int] | None, hours: int = 24) -> dict[str, Any]:
    """Per provider and hour of the last ``hours``: operations that succeeded or failed, DLQ
    entries recorded, review decisions made; the busiest providers first. Every read goes
    through a (tenant, time) index: operations by ``updated_at`` (a finished row's last
    update is its finish), their review events through the operation, DLQ entries by
    ``failed_at``."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    since = now - timedelta(hours=hours)
    if tenant_ids is None:
        tenant_ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    buckets: dict[str, dict[str, list[int]]] = {}

    def add(provider: str | None, series: str, hour: Any, n: int) -> None:
        slot = int((hour - since).total_seconds() // 3600)
        if 0 <= slot < hours:
            row = buckets.setdefault(provider or "(no provider)", {name: [0] * hours for name in CHART_SERIES})
            row[series][slot] += n

    recent = Operation.objects.filter(tenant_id__in=tenant_ids, updated_at__gte=since)
    finished = (
        recent.filter(status__in=[OperationStatus.SUCCEEDED, OperationStatus.FAILED], done_at__gte=since)
        .annotate(hour=TruncHour("done_at"))
        .values("provider__slug", "status", "hour")
        .annotate(n=Count("id"))
    )
    for row in finished[:5000]:
        add(row["provider__slug"], row["status"], row["hour"], row["n"])
    reviewed = (
        OperationEvent.objects.filter(
            operation_id__in=recent.values("pk"), from_status=OperationStatus.REVIEW, at__gte=since
        )
        .exclude(to_status=OperationStatus.REVIEW)
        .annotate(hour=TruncHour("at"))
        .values("operation__provider__slug", "hour")
        .annotate(n=Count("id"))
    )
    for row in reviewed[:5000]:
        add(row["operation__provider__slug"], "reviewed", row["hour"], row["n"])
    dead = (
        FailedEvent.objects.filter(tenant_id__in=tenant_ids, failed_at__gte=since)
        .annotate(hour=TruncHour("failed_at"))
        .values("operation__provider__slug", "hour")
        .annotate(n=Count("id"))
    )
    for row in dead[:5000]:
        add(row["operation__provider__slug"] or "(posted by workflows)", "dead_lettered", row["hour"], row["n"])
    ranked = sorted(buckets.items(), key=lambda item: -sum(sum(v) for v in item[1].values()))[:CHART_PROVIDERS]
    return {"since": since, "until": now, "hours": hours, "providers": ranked}
