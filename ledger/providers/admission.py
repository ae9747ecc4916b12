"""Admission control for execute-mode submissions (issue: per-tenant limits).

Runs only once the key is known to be new, so a replay is never refused. Every limit is
derived from the open rows themselves, read under a per-tenant lock (the tenant row, FOR
UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers) in the same
transaction as the insert, so concurrent submissions can't both squeeze under a limit and
there is no counter to drift after a crash. A refusal raises before anything is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Count, Q, Sum

from ledger.models import (
    AdmissionRefusalCount,
    Operation,
    OperationMode,
    OperationStatus,
    ProviderKind,
    Tenant,
)
from ledger.platform.errors import AdmissionRefused
from ledger.store import sql
from ledger.store.open_rows import open_rows_where

S = OperationStatus
log = logging.getLogger("onceguard.admission")

IN_FLIGHT_STATES = [S.QUEUED, S.CLAIMED, S.RETRY_WAIT, S.WAITING]
QUEUED_STATES = [S.QUEUED, S.RETRY_WAIT]
UNRESOLVED_STATES = [S.UNCERTAIN, S.REVIEW]
# The budget is refunded when the effect definitely did not happen.
REFUNDED_STATES = [S.FAILED, S.ABANDONED]


class TenantInFlightLimit(AdmissionRefused):
    code, title = "tenant_in_flight_limit", "Too many operations in flight"


class TenantUnresolvedLimit(AdmissionRefused):
    code, title = "tenant_unresolved_limit", "Too many operations awaiting reconciliation or review"


class TenantQueuedBytesLimit(AdmissionRefused):
    code, title = "tenant_queued_bytes_limit", "Too many queued request bytes"


class TenantBudgetExhausted(AdmissionRefused):
    code, title = "tenant_budget_exhausted", "Spend budget for this period exhausted"


REASONS = [
    TenantInFlightLimit.code,
    TenantUnresolvedLimit.code,
    TenantQueuedBytesLimit.code,
    TenantBudgetExhausted.code,
]


def tenant_has_limits(tenant: Tenant) -> bool:
    return any(
        v is not None
        for v in (tenant.max_in_flight, tenant.max_unresolved, tenant.max_queued_bytes, tenant.budget_amount)
    )


@dataclass(frozen=True)
class Usage:
    in_flight: int
    unresolved: int
    queued_bytes: int
    spent: Decimal
    period_start: datetime | None


def period_start(*, now: datetime, period_seconds: int) -> datetime:
    """Budget periods are fixed windows aligned to the epoch (a day starts at 00:00 UTC)."""
    period = max(1, int(period_seconds))
    epoch = int(now.timestamp())
    return datetime.fromtimestamp(epoch - epoch % period, tz=UTC)


def tenant_usage(*, tenant: Tenant, with_budget: bool = True) -> Usage:
    """What a tenant's execute-mode work holds right now (callbacks are the service's own)."""
    rows = Operation.objects.filter(tenant_id=tenant.pk, mode=OperationMode.EXECUTE).exclude(
        provider__kind=ProviderKind.CALLBACK
    )
    spent = Decimal(0)
    start = None
    # Planned for this call's values: both reads go through partial indexes — open states of
    # the work queue's (tenant, status, id) (ADR 0017), execute mode of (tenant, created_at) —
    # whose predicates a prepared statement's generic plan cannot see (`status IN ($2, …)`, `mode = $3`).
    with sql.planned_per_call():
        open_rows = rows.filter(open_rows_where(status__in=IN_FLIGHT_STATES + UNRESOLVED_STATES)).aggregate(
            in_flight=Count("id", filter=Q(status__in=IN_FLIGHT_STATES)),
            unresolved=Count("id", filter=Q(status__in=UNRESOLVED_STATES)),
            queued_bytes=Sum("request_bytes", filter=Q(status__in=QUEUED_STATES)),
        )
        if with_budget and tenant.budget_amount is not None:
            start = period_start(now=sql.db_now(), period_seconds=tenant.budget_period_seconds)
            rows = rows.filter(created_at__gte=start).exclude(status__in=REFUNDED_STATES)
            spent = Decimal(str(rows.aggregate(s=Sum("cost"))["s"] or 0))
    return Usage(
        in_flight=open_rows["in_flight"] or 0,
        unresolved=open_rows["unresolved"] or 0,
        queued_bytes=int(open_rows["queued_bytes"] or 0),
        spent=spent,
        period_start=start,
    )


def lock_tenant(tenant: Tenant) -> Tenant:
    """Serialise this tenant's admissions until the transaction ends; returns fresh limits."""
    return Tenant.objects.select_for_update().get(pk=tenant.pk)


def admission_check(*, tenant: Tenant, request_bytes: int, cost: Decimal) -> Usage:
    """Raise the refusal for the first limit a new operation would break. Call under
    :func:`lock_tenant` in the transaction that inserts the operation."""
    assert connection.in_atomic_block, "admission must run in the inserting transaction"
    usage = tenant_usage(tenant=tenant, with_budget=tenant.budget_amount is not None)
    # A review backlog gets its own limit so it cannot starve new work (nor hide behind it).
    if tenant.max_unresolved is not None and usage.unresolved >= tenant.max_unresolved:
        raise TenantUnresolvedLimit(
            f"{usage.unresolved} operations await reconciliation or review (limit {tenant.max_unresolved}).",
            retry_after=60,
            extra={"limit": tenant.max_unresolved, "current": usage.unresolved},
        )
    if tenant.max_in_flight is not None and usage.in_flight + 1 > tenant.max_in_flight:
        raise TenantInFlightLimit(
            f"{usage.in_flight} operations are in flight (limit {tenant.max_in_flight}).",
            retry_after=1,
            extra={"limit": tenant.max_in_flight, "current": usage.in_flight},
        )
    if tenant.max_queued_bytes is not None and usage.queued_bytes + request_bytes > tenant.max_queued_bytes:
        raise TenantQueuedBytesLimit(
            f"{usage.queued_bytes} request bytes are queued; this request adds {request_bytes}"
            f" (limit {tenant.max_queued_bytes}).",
            retry_after=1,
            extra={"limit": tenant.max_queued_bytes, "current": usage.queued_bytes},
        )
    if tenant.budget_amount is not None and usage.spent + cost > tenant.budget_amount:
        assert usage.period_start is not None
        ends = usage.period_start.timestamp() + max(1, tenant.budget_period_seconds)
        raise TenantBudgetExhausted(
            f"This period's budget of {tenant.budget_amount} is spent ({usage.spent}).",
            retry_after=max(1, int(ends - sql.db_now().timestamp())),
            extra={"limit": str(tenant.budget_amount), "current": str(usage.spent)},
        )
    return usage


def admission_refusal_record(*, tenant_id: int, reason: str) -> None:
    """Count a refusal for the metrics (outside the refused request's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_admissionrefusalcount (tenant_id, reason, count, last_at)"
            f" VALUES (%s, %s, 1, {sql.now()}) ON CONFLICT (tenant_id, reason)"
            f" DO UPDATE SET count = ledger_admissionrefusalcount.count + 1, last_at = {sql.now()}",
            [tenant_id, reason],
        )
    log.info("admission_refused tenant=%s reason=%s", tenant_id, reason)


def admission_refusals_by_reason() -> dict[str, int]:
    """Totals since the start, by reason (every reason present, zeros included)."""
    totals = dict.fromkeys(REASONS, 0)
    for row in AdmissionRefusalCount.objects.values("reason").annotate(n=Sum("count")):
        totals[row["reason"]] = int(row["n"] or 0)
    return totals
