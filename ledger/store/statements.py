"""The ledger's named statements (``ledger/store/queries.sql``) and the one way they are run.

The hot transitions are static SQL with named parameters, the way procrastinate keeps
``queries.sql``: a newcomer reads the whole protocol in one file. This module only loads
that file (once per process and database kind) and runs a statement by name through
Django's cursor, so every statement joins the caller's transaction, raises Django's errors
and is seen by query observers. Rows that are operations come back as ``Operation``
instances through ``Manager.raw`` (Django maps the columns by name and applies each field's
converters), never built by hand. Every named statement reads or moves one row by a unique key
(or counts a short range of a partial index) and is sent as it is, with no planner setting
around it: the ledger's tables keep statistics that plan those look-ups with their indexes
from the first claim on (docs/adr/0010-claim-path-plans-from-statistics.md).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from ledger.models import AttemptOutcome, Operation, OperationStatus
from ledger.store import fast_rows

QUERIES = Path(__file__).with_name("queries.sql")

_NAME = re.compile(r"^-- name: (\w+) --$", re.MULTILINE)
_LITERAL = re.compile(r"\{(\w+)\}")
_NOW_PLUS = re.compile(r"ledger_now_plus\((%\(\w+\)s)\)")
_SECONDS_SINCE = re.compile(r"ledger_seconds_since\((\w+)\)")

# How the loader spells the database's clock, per database kind. Literal percent signs are
# doubled: every statement runs with a parameter mapping.
# Spelled as Django writes a datetime to SQLite (``str()`` of a naive UTC datetime: six digits
# of microseconds, none when they are zero), so a row's time written here compares equal to the
# same time written through the ORM — attempts and events are keyed by (id, time), and
# ``filter(pk=…)``, ``refresh_from_db`` and a cascade's delete compare the time as text. SQLite's
# clock has milliseconds; 'now' is one value for the whole statement.
_SQLITE_NOW = (
    "(CASE WHEN substr(strftime('%%f', 'now'), 4) = '000'"
    " THEN strftime('%%Y-%%m-%%d %%H:%%M:%%S', 'now')"
    " ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000' END)"
)
_NOW_PLUS_SQL = {
    # A NULL parameter gives NULL (no deadline); the CAST gives an untyped NULL its type.
    "postgresql": r"(now() + CAST(\1 AS double precision) * interval '1 second')",
    # SQLite's date modifiers take "<n> seconds"; NULL || text is NULL, and so is the result.
    "sqlite": r"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', \1 || ' seconds')",
}


# Seconds from a timestamp column to the database's now(), as a double.
_SECONDS_SINCE_SQL = {
    "postgresql": r"CAST(EXTRACT(EPOCH FROM (now() - \1)) AS double precision)",
    # julianday() reads both Django's and now()'s text forms; days to seconds.
    "sqlite": r"((julianday('now') - julianday(\1)) * 86400.0)",
}


def _literals() -> dict[str, str]:
    values = {state.value: f"'{state.value}'" for state in OperationStatus}
    values.update({f"attempt_{outcome.value}": f"'{outcome.value}'" for outcome in AttemptOutcome})
    return values


def parse(text: str, *, vendor: str) -> dict[str, str]:
    """Split ``queries.sql`` into named statements, spelled for ``vendor``."""
    literals = _literals()
    parts = _NAME.split(text)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";")

        def literal(match: re.Match[str], name: str = name) -> str:
            if match.group(1) not in literals:
                raise ValueError(f"{name}: {{{match.group(1)}}} is not a declared state or outcome")
            return literals[match.group(1)]

        sql = _LITERAL.sub(literal, sql)
        sql = _NOW_PLUS.sub(_NOW_PLUS_SQL[vendor], sql)
        sql = _SECONDS_SINCE.sub(_SECONDS_SINCE_SQL[vendor], sql)
        if vendor == "sqlite":
            sql = sql.replace("now()", _SQLITE_NOW)
            # SQLite's scalar min()/max() of several arguments are PostgreSQL's LEAST/GREATEST.
            sql = sql.replace("LEAST(", "MIN(").replace("GREATEST(", "MAX(")
        if name in statements:
            raise ValueError(f"statement {name!r} is declared twice")
        statements[name] = sql
    return statements


@functools.lru_cache(maxsize=4)
def _statements(vendor: str) -> dict[str, str]:
    return parse(QUERIES.read_text(encoding="utf-8"), vendor=vendor)


def combined() -> bool:
    """Whether the database runs the ``…_pg`` forms of claim and complete: PostgreSQL's
    data-modifying CTEs write a move's row, attempt and event in one statement. SQLite runs
    the portable statements one by one."""
    return connection.vendor == "postgresql" and COMBINED


# The ``…_pg`` statements in use where the database has them; tests turn it off to run the
# portable path on PostgreSQL and compare the two.
COMBINED = True


def text(name: str) -> str:
    """The statement ``name`` as it runs on the default database."""
    return _statements(connection.vendor)[name]


# Named parameters whose column stores another form than the services hold, passed in the
# form their field saves (``get_db_prep_save``: None is SQL NULL): on PostgreSQL, hex text as
# bytes (ledger.models.HexBytesField) and JSON values as bytes (ledger.models.SealedJSONField);
# on SQLite, the JSON values as JSON text.
_STORED_FORM = {
    name: Operation._meta.get_field(name)
    for name in ("fingerprint", "lease_token", "request", "payload", "response_body")
}


def _stored(params: dict[str, Any], db: Any) -> dict[str, Any]:
    names = _STORED_FORM.keys() & params.keys()
    if not names:
        return params
    stored = dict(params)
    for name in names:
        stored[name] = _STORED_FORM[name].get_db_prep_save(params[name], db)
    return stored


# Each statement reads the default database's wrapper once and hands it on (to the fields'
# conversions, the cursor, the row builder): every attribute read through
# ``django.db.connection`` is a context-local look-up of its own (1–4 µs on this 2-core
# machine), and a statement made some six of them.


def execute(name: str, params: dict[str, Any]) -> int:
    """Run a statement that returns no operation; the number of rows it touched."""
    db = connections[DEFAULT_DB_ALIAS]
    params = _stored(params, db)
    with db.cursor() as cursor:
        cursor.execute(_statements(db.vendor)[name], params)
        return cursor.rowcount


def operations(name: str, params: dict[str, Any]) -> list[Operation]:
    """Run a statement whose rows are operations (``RETURNING *`` or ``SELECT *``)."""
    db = connections[DEFAULT_DB_ALIAS]
    params = _stored(params, db)
    statement = _statements(db.vendor)[name]
    if db.vendor == "postgresql" and FAST_ROWS:
        with db.cursor() as cursor:
            cursor.execute(statement, params)
            return fast_rows.operations_from(cursor, statement, db)
    # list(): a RawQuerySet runs its statement again each time it is iterated.
    return list(Operation.objects.raw(statement, params))


# ledger.store.fast_rows on PostgreSQL; tests turn it off to compare it with Manager.raw.
FAST_ROWS = True


def operation(name: str, params: dict[str, Any]) -> Operation | None:
    """The one operation a statement returns, or None when its guard matched nothing."""
    rows = operations(name, params)
    return rows[0] if rows else None
