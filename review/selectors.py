"""Reads for the review queue, shared by the API and the console."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from django_q.models import Task

from dlq.models import FailedEvent, FailedEventStatus
from ledger.models import Operation, OperationStatus, Provider
from review.models import RetentionRun


def review_item_list(
    *,
    tenant_ids: list[int] | None,
    provider: str = "",
    older_than_seconds: float | None = None,
    search: str = "",
) -> QuerySet[Operation]:
    rows = Operation.objects.filter(status=OperationStatus.REVIEW).select_related("provider", "tenant")
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if provider:
        rows = rows.filter(provider__slug=provider)
    if older_than_seconds is not None:
        rows = rows.filter(updated_at__lt=timezone.now() - timedelta(seconds=older_than_seconds))
    if search:
        # Exact matches only: every one of these columns is indexed.
        rows = rows.filter(
            Q(key=search)
            | Q(reconciliation_handle=search)
            | Q(provider_ref=search)
            | Q(execution_id=search)
            | Q(correlation_id=search)
        )
    return rows.order_by("updated_at", "id")


# --- Dashboard ------------------------------------------------------------------------------


def _scoped(qs: QuerySet, tenant_ids: list[int] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": tenant_ids})


def dashboard_numbers(*, tenant_ids: list[int] | None) -> dict[str, Any]:
    """Every number the console's front page shows, each scoped to the user's tenants."""
    now = timezone.now()
    ops = _scoped(Operation.objects.all(), tenant_ids)
    by_state = dict(ops.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    eligible = ops.filter(
        status__in=[OperationStatus.QUEUED, OperationStatus.RETRY_WAIT], next_attempt_at__lte=now
    ).aggregate(oldest=Min("next_attempt_at"))["oldest"]
    review = ops.filter(status=OperationStatus.REVIEW).aggregate(n=Count("id"), oldest=Min("updated_at"))
    dlq = _scoped(FailedEvent.objects.all(), tenant_ids)
    dlq_by_status = dict(dlq.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    paused = list(
        _scoped(Provider.objects.filter(paused_at__isnull=False), tenant_ids)
        .select_related("tenant")
        .order_by("paused_at")[:20]
    )
    throttled = _scoped(Provider.objects.filter(throttled_until__gt=now), tenant_ids).count()
    last_purge = _scoped(RetentionRun.objects.all(), tenant_ids).order_by("-started_at", "-id").first()
    return {
        "now": now,
        "operations": [(s, label, by_state.get(s, 0)) for s, label in OperationStatus.choices],
        "operations_total": sum(by_state.values()),
        "oldest_eligible_at": eligible,
        "oldest_eligible_age": (now - eligible) if eligible else None,
        "review_backlog": review["n"],
        "review_oldest_at": review["oldest"],
        "review_oldest_age": (now - review["oldest"]) if review["oldest"] else None,
        "dlq": [(s, label, dlq_by_status.get(s, 0)) for s, label in FailedEventStatus.choices],
        "dlq_total": sum(dlq_by_status.values()),
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
