"""Monthly partitions of attempts and events (PostgreSQL; DESIGN §12, *Partitions*).

``ledger_attempt`` is partitioned by ``started_at`` and ``ledger_operationevent`` by ``at``:
each row's time, set when it is written and never changed. One partition per calendar month
(UTC), ``<table>_pYYYY_MM``; ``<table>_legacy`` holds the rows from before the conversion
(migration ledger.0025, everything below its boundary) and ``<table>_default`` catches a row
whose month has no partition yet (a schedule that stopped), so a claim never fails for want of
one. Partitions are created ahead by the migration and by ``partitions_ensure`` (a django-q2
schedule); retention (review.retention.partitions) drops a whole partition when nothing in it may be
kept. On SQLite both tables stay plain and every function here does nothing.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction

from ledger.platform.passes import PASS_ROW_FAILURES, row_isolated

log = logging.getLogger("onceguard.partitions")
# The label of this job's failures (ledger.platform.passes).
JOB = "partition_maintenance"

# Table → the column it is partitioned by.
PARTITIONED = {"ledger_attempt": "started_at", "ledger_operationevent": "at"}
# Storage parameters of each new partition (a partitioned table has none of its own; the
# values are migration ledger.0021's, DESIGN §12 *Cheaper growth*, and for attempts 0036's first
# statistics at 1,000 rows: docs/adr/0010-claim-path-plans-from-statistics.md).
STORAGE = {
    "ledger_attempt": "fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,"
    " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02,"
    " autovacuum_analyze_threshold = 1000, autovacuum_vacuum_threshold = 1000",
    "ledger_operationevent": "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
}
MONTHS_AHEAD = 3
# DDL on a partition takes a lock on its parent: wait this long for it, then give up until the
# next run rather than queue every claim behind a long transaction.
LOCK_TIMEOUT = "3s"


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    # [lower, upper); None is MINVALUE (the legacy partition); both None for the default one.
    lower: datetime | None
    upper: datetime | None
    is_default: bool = False


def month_start(at: datetime, *, plus: int = 0) -> datetime:
    """The first instant (UTC) of ``at``'s month, ``plus`` months on."""
    at = at.astimezone(UTC)
    index = at.year * 12 + at.month - 1 + plus
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(table: str, month: datetime) -> str:
    return f"{table}_p{month.year:04d}_{month.month:02d}"


def is_partitioned(table: str) -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def _timestamp(literal: str) -> datetime:
    return datetime.fromisoformat(literal.strip("'")).astimezone(UTC)


def partitions(table: str) -> list[Partition]:
    """The table's partitions, oldest first (the default one last)."""
    if not is_partitioned(table):
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [table],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        if bound == "DEFAULT":
            found.append(Partition(table, name, None, None, is_default=True))
            continue
        # FOR VALUES FROM ('2027-01-01 00:00:00+00') TO ('…'), or FROM (MINVALUE) TO ('…')
        match = _BOUND.fullmatch(bound)
        assert match, f"unexpected partition bound {bound!r}"
        low, high = match.groups()
        found.append(Partition(table, name, None if low == "MINVALUE" else _timestamp(low), _timestamp(high)))
    found.sort(key=lambda p: (p.is_default, p.upper or datetime.max.replace(tzinfo=UTC)))
    return found


def partitions_ensure(*, now: datetime | None = None, months_ahead: int = MONTHS_AHEAD) -> list[str]:
    """Create the partitions of this month and the next ``months_ahead`` where missing; the
    names created. A month already covered (by the legacy partition) is skipped; one whose
    rows already sit in the default partition is left there and logged (creating it would
    have to move them under a lock)."""
    created: list[str] = []
    if connection.vendor != "postgresql":
        return created
    now = now or datetime.now(UTC)
    for table in PARTITIONED:
        # One table (or one month) that fails is retried by the next run; the others are
        # created all the same, and a claim never waits on this (ledger.platform.passes).
        with row_isolated(job=JOB, ref=f"table={table}", atomic=False):
            _ensure_table(table, now=now, months_ahead=months_ahead, created=created)
    return created


def _ensure_table(table: str, *, now: datetime, months_ahead: int, created: list[str]) -> None:
    if not is_partitioned(table):
        return
    existing = partitions(table)
    for plus in range(months_ahead + 1):
        lower, upper = month_start(now, plus=plus), month_start(now, plus=plus + 1)
        if any(
            not p.is_default and (p.lower is None or p.lower < upper) and p.upper is not None and p.upper > lower
            for p in existing
        ):
            continue
        name = partition_name(table, lower)
        done = False
        with row_isolated(job=JOB, ref=f"table={table} partition={name}"), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            # Literals, not parameters: DDL takes none (both are computed here).
            cursor.execute(
                f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ('{lower.isoformat()}')"
                f" TO ('{upper.isoformat()}') WITH ({STORAGE[table]})"
            )
            done = True
        if done:
            created.append(name)
            log.info("partition_created table=%s name=%s", table, name)


def partition_operation_range(partition: Partition) -> tuple[int, int] | None:
    """(least, greatest) operation id with a row in the partition; None when it is empty.
    Both ends are read off the partition's operation_id index."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT min(operation_id), max(operation_id) FROM {partition.name}")
        low, high = cursor.fetchone()
    return None if low is None else (low, high)


def partition_drop(partition: Partition) -> bool:
    """Drop one partition (its rows with it). False when its lock was not granted in time."""
    assert not partition.is_default, "the default partition is never dropped"
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(f"DROP TABLE {partition.name}")
    except Exception as exc:  # retried by the next retention pass
        PASS_ROW_FAILURES.labels(job=JOB).inc()
        log.warning("partition_not_dropped name=%s error=%s", partition.name, type(exc).__name__)
        return False
    log.info("partition_dropped table=%s name=%s", partition.table, partition.name)
    return True
