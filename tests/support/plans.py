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


@dataclass(frozen=True)
class Statement:
    sql: str
    params: Any


@contextmanager
def captured_statements() -> Iterator[list[Statement]]:
    """Every statement run through Django's connection inside the block (executemany once)."""
    seen: list[Statement] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(Statement(sql, params[0] if many and params else params))
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


def explain(sql: str, params: Any, *, plan: str = "generic") -> str:
    """The plan PostgreSQL picks for ``sql`` prepared (``generic``: what a prepared statement
    settles on after a few uses; ``custom``: planned for these values). EXPLAIN without
    ANALYZE: nothing runs."""
    text, values = _dollar_placeholders(sql, params or [])
    raw = connection.connection
    with psycopg.ClientCursor(raw) as cursor:
        cursor.execute("SAVEPOINT explain_plan")
        try:
            cursor.execute(f"SET LOCAL plan_cache_mode = force_{plan}_plan")
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
