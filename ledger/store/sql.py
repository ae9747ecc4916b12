"""The few SQL spellings that differ between PostgreSQL and SQLite, for the raw queries
outside ``ledger/store/queries.sql`` (metrics, admission counters, tests that move a row's clock).

Every time here is the database's clock, never the app server's. Literal percent signs are
written ``%%`` because every statement runs with a parameter list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

from ledger.models import OperationStatus

_STATUS_VALUES = frozenset(OperationStatus.values)


def now() -> str:
    if connection.vendor == "postgresql":
        return "now()"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def now_plus(seconds: float) -> tuple[str, list[Any]]:
    """SQL for the database's now() + ``seconds``, and its parameter."""
    if connection.vendor == "postgresql":
        return "(now() + %s * interval '1 second')", [float(seconds)]
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"{float(seconds):+.3f} seconds"]


def states_in(*states: str) -> str:
    """``('queued', 'retry_wait')`` from declared states. Rendered as literals on purpose: a
    partial index on a state predicate can only serve a query whose states the planner can
    see, which a parameter of a prepared (generic) plan hides."""
    for state in states:
        if state not in _STATUS_VALUES:
            raise ValueError(f"not a declared operation state: {state!r}")
    return "(" + ", ".join(f"'{state}'" for state in states) + ")"


def dumps(value: Any) -> str | None:
    """A JSON column's value as text for a raw statement (None stays SQL NULL)."""
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def to_datetime(value: Any) -> datetime | None:
    """A timestamp from a raw row: PostgreSQL gives aware datetimes, SQLite text in UTC."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def estimated_rows(queryset: Any) -> int | None:
    """PostgreSQL's estimate of how many rows ``queryset`` returns, from the tables'
    statistics (EXPLAIN: planned, not run; about a millisecond); None on SQLite. For counts a
    page shows as estimates, where an exact count would read every row it counts."""
    if connection.vendor != "postgresql":
        return None
    statement, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def capped_counts(querysets: list[Any], cap: int) -> list[int]:
    """How many rows each of ``querysets`` has, counted up to ``cap + 1`` (the first
    ``cap + 1`` of its rows: a count past ``cap`` is only "more than"), in one statement: the
    dashboard's counts per state were one round trip each (fourteen a view). Each
    queryset is compiled by the ORM and counted in a sub-select of its own, read as it would
    be alone (``SELECT COUNT(*) FROM (… LIMIT cap + 1)``)."""
    if not querysets:
        return []
    selects, params = [], []
    for n, queryset in enumerate(querysets):
        try:
            statement, own = queryset.order_by().values("pk")[: cap + 1].query.sql_with_params()
        except EmptyResultSet:
            # A queryset that can match nothing (``pk__in=[]``: a platform with no tenant yet)
            # has no SQL: Django would run none for it alone either.
            selects.append("0")
            continue
        selects.append(f"(SELECT COUNT(*) FROM ({statement}) capped_{n})")
        params += list(own)
    if all(s == "0" for s in selects):
        return [0] * len(selects)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        return [int(n) for n in cursor.fetchone()]


def db_now() -> datetime:
    """The database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now()}", [])
        value = cursor.fetchone()[0]
    result = to_datetime(value)
    assert result is not None
    return result


# Sequential scans priced out for the rest of the transaction (PostgreSQL's enable_seqscan,
# transaction-local): for the operations API's lists only (planned_per_call(indexed=True)).
# The claim path's statements, each one row by a unique key, send no setting: they plan with
# indexes from the tables' own statistics (docs/adr/0010-claim-path-plans-from-statistics.md).
INDEX_PLANS = "SELECT set_config('enable_seqscan', 'off', true)"


# planned_per_call(serial=True), for this transaction only: no parallel workers, no JIT.
SERIAL_PLANS = "SELECT set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)"


@contextmanager
def planned_per_call(*, indexed: bool = False, serial: bool = False) -> Iterator[None]:
    """Run the reads inside planned for the values of each call (PostgreSQL's
    ``plan_cache_mode = force_custom_plan``, for this transaction only).

    ``indexed``: also with sequential scans priced out (``enable_seqscan = off``), for a list
    whose every filter has an index that serves it in the list's order (the operations API:
    on a fresh database it is, with claims, what a client calls first). Not for the console's
    lists: there joins and filters without such an index got worse.

    psycopg prepares a statement after PG_PREPARE_THRESHOLD uses and PostgreSQL may then
    settle on a generic plan, one that cannot see the parameters: right for the ledger's hot
    statements, whose best plan is the same for every key, wrong for a list whose filter may
    match nothing for one tenant and millions for another — there a generic plan can walk the
    whole table (docs/explanation/scale.md). Lists and console pages run inside this; planning one costs about
    a millisecond, a wrong generic plan seconds.

    ``serial``: also without parallel workers (``max_parallel_workers_per_gather = 0``), for a
    page of many short reads that each stop after a few rows (the console's front page): at ten
    million rows the planner gave several of them a parallel plan whose workers took 35–56 ms to
    start on a busy machine, for 1–10 ms of work each (bench/results/scale-10M.md). And without
    JIT compilation: a serial plan of a page read over ten million rows is costed past
    ``jit_above_cost`` (a LIMIT's plan carries its input's cost), and the console's needs=stuck
    page then compiled for 27 ms to read 101 rows in 0.5 ms (EXPLAIN ANALYZE, fill version 10).
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                if indexed:
                    cursor.execute(f"{INDEX_PLANS}, set_config('plan_cache_mode', 'force_custom_plan', true)", [])
                else:
                    cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan", [])
                if serial:
                    cursor.execute(SERIAL_PLANS, [])
        yield


class TransactionNow(Now):
    """``now()`` as the named statements of ``queries.sql`` read it: on PostgreSQL the
    transaction's start (``CURRENT_TIMESTAMP``; Django's ``Now()`` is the statement's), on SQLite
    the statement's time as ``Now()``. A move through the ORM stamps its row with this, so its
    ``updated_at`` and ``done_at`` equal its event's ``at`` (``event_insert``) on PostgreSQL and
    never follow it on SQLite: ``updated_after`` finds a finished row by its terminal event
    (ADR 0017)."""

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="CURRENT_TIMESTAMP", **extra)
