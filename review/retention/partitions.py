"""Retention by the month: a past month of attempts and events is dropped whole (PostgreSQL;
DESIGN §12, *Partitions*) when nothing in it may be kept — every row belongs to an operation
past its tenant's record TTL, on no legal hold, referenced by nothing. The first step of every
purge pass (review.retention.purge); a month that keeps something is left to the tenants'
batches, row by row.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import connection

from ledger.models import TERMINAL_STATES, Tenant
from ledger.platform import partitions
from ledger.platform.passes import row_isolated
from ledger.store import sql
from review.models import RecordType
from review.retention.batches import JOB
from review.retention.policies import _policies

log = logging.getLogger("onceguard.retention")


def _operation_cutoffs(now: datetime) -> dict[int, datetime]:
    """Tenant → the time before which its finished operations are past their record TTL, for
    every tenant whose operations may be deleted at all (a TTL, no legal hold)."""
    cutoffs = {}
    for tenant_id in Tenant.objects.values_list("pk", flat=True):
        policy = _policies(tenant_id).get(RecordType.OPERATIONS)
        if policy is not None and policy.record_ttl is not None and not policy.legal_hold:
            cutoffs[tenant_id] = now - policy.record_ttl
    return cutoffs


def _partition_keeps_something(
    part: partitions.Partition, cutoffs: dict[int, datetime], *, bounds: tuple[int, int] | None = None
) -> bool:
    """Whether a row of ``part`` belongs to an operation this purge would keep: one of a tenant
    with no record TTL or on legal hold, not finished, not past its tenant's TTL, or still
    referenced (a DLQ entry, an operation it superseded) — the rules of _delete_operations.

    Only operations whose ids lie between the least and greatest the partition names can have
    a row in it (both ends off its operation_id index; ``bounds`` overrides them for a
    measurement); each candidate kept is probed in the partition's index, newest first, and
    the first hit answers. A month that may be dropped is answered only after every operation
    of its range is read, so the per-operation work is kept to one heap row: the tenant's
    cutoff is a ``CASE`` (no join per row) and the two references are read once for the whole
    range into hashed sets (no index probe per row)."""
    bounds = bounds or partitions.partition_operation_range(part)
    if bounds is None:
        return False
    cutoff = "CASE o.tenant_id " + " ".join(["WHEN %s THEN %s::timestamptz"] * len(cutoffs)) + " END"
    if not cutoffs:
        cutoff = "NULL::timestamptz"
    states = sorted(TERMINAL_STATES)
    low, high = bounds
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM ledger_operation o CROSS JOIN LATERAL (SELECT {cutoff} AS cutoff) r"
            " WHERE o.id BETWEEN %s AND %s"
            " AND (r.cutoff IS NULL OR o.updated_at >= r.cutoff OR o.done_at IS NULL OR o.done_at >= r.cutoff"
            f" OR o.status NOT IN ({', '.join(['%s'] * len(states))})"
            " OR o.id IN (SELECT f.operation_id FROM dlq_failedevent f WHERE f.operation_id BETWEEN %s AND %s)"
            " OR o.id IN (SELECT s.superseded_by_id FROM ledger_operation s"
            " WHERE s.superseded_by_id BETWEEN %s AND %s))"
            f" AND EXISTS (SELECT 1 FROM {part.name} p WHERE p.operation_id = o.id)"
            " ORDER BY o.id DESC LIMIT 1",
            [*[v for item in cutoffs.items() for v in item], low, high, *states, low, high, low, high],
        )
        return cursor.fetchone() is not None


def retention_drop_partitions(*, now: datetime | None = None) -> list[str]:
    """Drop every past month of attempts and events in which nothing may be kept (PostgreSQL;
    DESIGN §12, *Partitions*): every row in it belongs to an operation past the TTL of its
    tenant's policy, on no legal hold, or to none left. Runs before the tenants' batches, which
    then find those rows gone; a month that keeps something is left to them, row by row, as
    before. The policies are locked (SHARE) from the check to the drop, so a legal hold or a
    longer TTL saved meanwhile waits for it and is seen by the next pass."""
    if connection.vendor != "postgresql":
        return []
    now = now or sql.db_now()
    horizon = partitions.month_start(now)
    dropped = []
    for table in partitions.PARTITIONED:
        for part in partitions.partitions(table):
            # Only months wholly past: the current one still takes rows.
            if part.is_default or part.upper is None or part.upper > horizon:
                continue
            # One transaction per partition: DROP locks the partitioned table (every claim
            # writes to it) until the commit right after it, never while the next one is checked.
            # One month that cannot be checked or dropped is left for the next pass (ledger.platform.passes).
            with row_isolated(job=JOB, ref=f"partition={part.name}"):
                with connection.cursor() as cursor:
                    cursor.execute("LOCK TABLE review_retentionpolicy IN SHARE MODE")
                if not _partition_keeps_something(part, _operation_cutoffs(now)) and partitions.partition_drop(part):
                    dropped.append(part.name)
    if dropped:
        log.info("retention_partitions_dropped names=%s", ",".join(dropped))
    return dropped
