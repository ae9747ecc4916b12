"""The few SQL spellings that differ between PostgreSQL and SQLite, for the raw queries
outside ``ledger/queries.sql`` (metrics, admission counters, tests that move a row's clock).

Every time here is the database's clock, never the app server's. Literal percent signs are
written ``%%`` because every statement runs with a parameter list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
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


def db_now() -> datetime:
    """The database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now()}", [])
        value = cursor.fetchone()[0]
    result = to_datetime(value)
    assert result is not None
    return result


@contextmanager
def planned_per_call() -> Iterator[None]:
    """Run the reads inside planned for the values of each call (PostgreSQL's
    ``plan_cache_mode = force_custom_plan``, for this transaction only).

    psycopg prepares a statement after PG_PREPARE_THRESHOLD uses and PostgreSQL may then
    settle on a generic plan, one that cannot see the parameters: right for the ledger's hot
    statements, whose best plan is the same for every key, wrong for a list whose filter may
    match nothing for one tenant and millions for another — there a generic plan can walk the
    whole table (issue 16). Lists and console pages run inside this; planning one costs about
    a millisecond, a wrong generic plan seconds.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan", [])
        yield
