"""Operations from a cursor on PostgreSQL, without ``RawQuerySet``'s set-up per statement.

A speed-up off the framework's usual path, kept under ADR 0004's rule: it is isolated here,
``tests/ledger/test_statements.py`` holds that it loads exactly what ``Manager.raw`` loads,
and docs/explanation/benchmarks.md gives the rounds that show what it buys.

``Operation.objects.raw()`` resolves the statement's columns against the model's fields and
builds the converters of every column again for each statement it runs — about 0.2 ms of
CPU for the ledger's 48-column rows, a fifth of a replay's app CPU. The ledger's statements
return whole rows (``RETURNING *`` / ``SELECT *``) whose layout never changes, so this
module resolves a layout once per column list and then does what ``RawQuerySet`` does per
row: each field's documented ``from_db_value`` converter, then ``Model.from_db`` (which runs
``Model.__init__``). PostgreSQL's backend declares no converters of its own (SQLite's do:
its text timestamps and integer booleans), so elsewhere ``ledger.store.statements`` keeps
``Manager.raw``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from ledger.models import Operation
from ledger.platform._adapters.django_private import loaded_instance, plain_fields
from ledger.platform._adapters.psycopg_private import result_columns, result_shape

Converter = Callable[[Any, Any, Any], Any]


class Layout:
    """Where each of the model's fields sits in a row, and the fields that convert."""

    def __init__(self, columns: Sequence[str]):
        fields = Operation._meta.concrete_fields
        position = {name: i for i, name in enumerate(columns)}
        if len(position) != len(columns) or set(position) != {f.column for f in fields}:
            # Not a whole operation row: only Manager.raw knows what to do with it.
            raise ValueError(f"not the columns of an operation row: {sorted(columns)}")
        self.attnames = [f.attname for f in fields]
        self.positions = [position[f.column] for f in fields]
        # (index in the model's field order, the field's converter)
        self.converters: list[tuple[int, Converter]] = [
            (i, f.from_db_value) for i, f in enumerate(fields) if hasattr(f, "from_db_value")
        ]
        # Whether assigning each field's value does no more than store it.
        self.plain = plain_fields(Operation, self.attnames)


_LAYOUTS: dict[tuple[str, ...], Layout] = {}
# Layouts by (statement text, column count, last column's name): a named statement returns
# whole rows (``*``) whose columns are those of the table, so its layout is resolved once per
# process instead of reading every column's name from each result (~20 µs a row). A column
# added or dropped under a running process changes the count or the last name (ADD COLUMN
# appends), and the layout is resolved again (and refused, as before, if it is not a whole
# operation row).
_STATEMENT_LAYOUTS: dict[tuple[Any, ...], Layout] = {}


def _layout(cursor: Any, statement: str | None) -> Layout:
    if statement is not None:
        key = (statement, *result_shape(cursor))
        layout = _STATEMENT_LAYOUTS.get(key)
        if layout is None:
            layout = _STATEMENT_LAYOUTS.setdefault(key, _layout(cursor, None))
        return layout
    columns = result_columns(cursor)
    layout = _LAYOUTS.get(columns)
    if layout is None:
        layout = _LAYOUTS.setdefault(columns, Layout(columns))
    return layout


def operations_from(cursor: Any, statement: str | None = None, db: Any = None) -> list[Operation]:
    """The rows left on ``cursor`` (a statement returning whole operation rows) as
    ``Operation`` instances, exactly as ``Operation.objects.raw`` builds them. ``statement``:
    the text the cursor ran, when it is a named statement (its layout is then kept by it).
    ``db``: the database wrapper the cursor belongs to, when the caller holds it (else the
    default database's)."""
    rows = cursor.fetchall()
    if not rows:
        return []
    layout = _layout(cursor, statement)
    if db is None:
        db = connections[DEFAULT_DB_ALIAS]
    alias = db.alias
    out = []
    for row in rows:
        values = [row[i] for i in layout.positions]
        for i, convert in layout.converters:
            values[i] = convert(values[i], None, db)
        out.append(loaded_instance(Operation, alias, layout.attnames, values, plain=layout.plain))
    return out
