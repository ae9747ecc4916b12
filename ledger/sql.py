"""The few places where PostgreSQL and SQLite differ, kept in one module.

Every statement here takes the database's clock (never the app server's) for leases and
due times. Literal percent signs are written ``%%`` because every statement is executed
with a parameter list (Django's cursors then treat ``%`` as the placeholder sigil).
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import signals
from django.db.models.base import ModelState
from django.utils.dateparse import parse_datetime

from ledger.models import Operation


@functools.lru_cache(maxsize=8)
def _vendor(engine: str) -> str:
    return connections[DEFAULT_DB_ALIAS].vendor


def is_postgres() -> bool:
    # By ENGINE, not through the connection proxy (a thread-local lookup): asked several
    # times per claim.
    return _vendor(settings.DATABASES[DEFAULT_DB_ALIAS]["ENGINE"]) == "postgresql"


def now() -> str:
    return "now()" if is_postgres() else "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def now_plus_text() -> str:
    """SQL for the database's now() + one parameter (see :func:`now_plus` for its value)."""
    if is_postgres():
        return "(now() + %s * interval '1 second')"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"


def now_plus(seconds: float) -> tuple[str, list[Any]]:
    """SQL for the database's now() + ``seconds`` and its parameter."""
    if is_postgres():
        return now_plus_text(), [float(seconds)]
    return now_plus_text(), [f"{float(seconds):+.3f} seconds"]


def for_update() -> str:
    # SQLite has one writer at a time and we BEGIN IMMEDIATE, so the lock is already held.
    return " FOR UPDATE" if is_postgres() else ""


def state_literal(state: str) -> str:
    """A declared operation state as an SQL literal (never anything else: it is checked)."""
    if state not in _STATUS_VALUES:
        raise ValueError(f"not a declared operation state: {state!r}")
    return f"'{state}'"


def states_in(*states: str) -> str:
    """``('queued', 'retry_wait')`` from declared states. Rendered as literals on purpose: a
    partial index on a state predicate can only serve a query whose states the planner can
    see, which a parameter of a prepared (generic) plan hides."""
    return "(" + ", ".join(state_literal(state) for state in states) + ")"


def json_param() -> str:
    return "%s::jsonb" if is_postgres() else "%s"


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_STATUS_VALUES = frozenset(value for value, _ in Operation._meta.get_field("status").choices)

# Column list shared by every statement that returns an operation row.
OP_FIELDS = [f for f in Operation._meta.concrete_fields]
OP_COLUMNS = [f.column for f in OP_FIELDS]
OP_SELECT = ", ".join(OP_COLUMNS)
_DATETIME_COLS = {f.column for f in OP_FIELDS if f.get_internal_type() == "DateTimeField"}
_JSON_COLS = {f.column for f in OP_FIELDS if f.get_internal_type() == "JSONField"}
_BOOL_COLS = {f.column for f in OP_FIELDS if f.get_internal_type() == "BooleanField"}
_ATTNAMES = [f.attname for f in OP_FIELDS]


def to_datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


_DATETIME_IDX = [i for i, c in enumerate(OP_COLUMNS) if c in _DATETIME_COLS]
_JSON_IDX = [i for i, c in enumerate(OP_COLUMNS) if c in _JSON_COLS]
_BOOL_IDX = [i for i, c in enumerate(OP_COLUMNS) if c in _BOOL_COLS]


def operation_from_row(row: tuple[Any, ...] | list[Any]) -> Operation:
    """Build an Operation from the first len(OP_COLUMNS) values of a raw row.

    Only the columns that need it are converted: psycopg already returns aware datetimes
    and booleans (SQLite returns text and integers); both return JSON as text here (also
    :func:`fetch_one`), so every JSON column is parsed exactly once, here.
    """
    values = list(row[: len(OP_COLUMNS)])
    if not is_postgres():
        for i in _DATETIME_IDX:
            if values[i] is not None:
                values[i] = to_datetime(values[i])
        for i in _BOOL_IDX:
            if values[i] is not None:
                values[i] = bool(values[i])
    for i in _JSON_IDX:
        v = values[i]
        if isinstance(v, (str, bytes)):
            values[i] = json.loads(v)
    if signals.pre_init.has_listeners(Operation) or signals.post_init.has_listeners(Operation):
        return Operation.from_db(DEFAULT_DB_ALIAS, _ATTNAMES, values)
    # What Model.__init__ does for a full row of positional values, without its per-field
    # loop (a third of the client CPU of a replay): every field's attribute is a plain
    # instance attribute, and a fresh instance has no cached relations to invalidate.
    op = Operation.__new__(Operation)
    op.__dict__.update(zip(_ATTNAMES, values, strict=True))
    state = op._state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    return op


def _ledger_cursor(db: Any) -> Any:
    """The ledger's own cursor on ``db``'s psycopg connection, kept on the (per-thread)
    connection wrapper and made again when Django has replaced the connection."""
    cursor = getattr(db, "_ledger_cursor", None)
    if cursor is None or cursor.closed or cursor.connection is not db.connection:
        from psycopg.types.datetime import TimestamptzLoader

        # The connection's own cursor class (server- or client-side binding, as configured),
        # with psycopg's C timestamp loader instead of Django's Python one. JSON stays text,
        # as from Django's cursors: operation_from_row parses it (a JSON string value would
        # be indistinguishable from unparsed text otherwise).
        cursor = db.connection.cursor()
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        db._ledger_cursor = cursor
    return cursor


def fetch_one(statement: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Run one statement on Django's connection (so inside the caller's transaction, if any)
    and return its first row.

    The ledger's hot statements on PostgreSQL skip Django's cursor wrapper and its Python
    timestamp/JSON loaders and reuse one cursor per connection: half the client CPU of a
    claim or a completion. Database errors are still Django's (``IntegrityError`` …). When
    something observes queries (``connection.execute_wrapper``, DEBUG query logging), or on
    SQLite, Django's cursor runs it as usual so the statement is seen.
    """
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or db.execute_wrappers or db.queries_logged:
        with db.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchone()
    db.ensure_connection()
    # The checks Django's cursor() makes before every statement.
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cursor = _ledger_cursor(db)
        cursor.execute(statement, params)
        return cursor.fetchone()


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now()}", [])
        value = cursor.fetchone()[0]
    result = to_datetime(value)
    assert result is not None
    return result
