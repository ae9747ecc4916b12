"""Capture the SQL a piece of code runs, and EXPLAIN a captured statement the way a prepared
statement would be planned (PostgreSQL only)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connection


@dataclass
class Statement:
    sql: str
    params: Any
    # PostgreSQL's enable_seqscan as the statement was planned: read by the server, in the
    # same transaction (and pipeline) just before the statement.
    setting: Any = None

    @property
    def enable_seqscan(self) -> str:
        if isinstance(self.setting, psycopg.Cursor):
            self.setting = self.setting.fetchone()[0]
        return self.setting


@contextmanager
def captured_statements() -> Iterator[list[Statement]]:
    """Every statement run through Django's connection inside the block (executemany once),
    with the ``enable_seqscan`` it ran under."""
    seen: list[Statement] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        # Asked on the raw connection (not seen by this wrapper); inside a pipeline its answer
        # is read after the pipeline syncs, so asking does not end its transaction early.
        setting = connection.connection.cursor().execute("SELECT current_setting('enable_seqscan')")
        seen.append(Statement(sql, params[0] if many and params else params, setting))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


def _dollar_placeholders(sql: str, params: Any) -> tuple[str, list[Any]]:
    """Django's %s (or psycopg's %(name)s) placeholders as $1, $2, … for PREPARE."""
    values: list[Any] = []
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        token = match.group()
        if token == "%%":
            return "%"
        if token == "%s":
            values.append(params[len(values)])
            return f"${len(values)}"
        name = token[2:-2]
        if name not in names:
            values.append(params[name])
            names[name] = len(values)
        return f"${names[name]}"

    return re.sub(r"%%|%s|%\(\w+\)s", number, sql), values


def explain(sql: str, params: Any, *, plan: str = "generic", enable_seqscan: str = "on") -> str:
    """The plan PostgreSQL picks for ``sql`` prepared (``generic``: what a prepared statement
    settles on after a few uses; ``custom``: planned for these values), with
    ``enable_seqscan`` as given (the app's as it ran the statement: ``Statement.enable_seqscan``).
    EXPLAIN without ANALYZE: nothing runs."""
    text, values = _dollar_placeholders(sql, params or [])
    raw = connection.connection
    with psycopg.ClientCursor(raw) as cursor:
        cursor.execute("SAVEPOINT explain_plan")
        try:
            cursor.execute(f"SET LOCAL plan_cache_mode = force_{plan}_plan")
            cursor.execute("SELECT set_config('enable_seqscan', %s, true)", [enable_seqscan])
            cursor.execute(f"PREPARE explain_plan AS {text}")
            args = f"({', '.join(['%s'] * len(values))})" if values else ""
            cursor.execute(f"EXPLAIN EXECUTE explain_plan{args}", values)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE ALL")
            cursor.execute("ROLLBACK TO SAVEPOINT explain_plan")


def sequential_scans(plan: str, tables: Sequence[str]) -> list[str]:
    """The plan's lines that read one of ``tables`` sequentially."""
    return [line.strip() for line in plan.splitlines() if any(f"Seq Scan on {t} " in line + " " for t in tables)]
