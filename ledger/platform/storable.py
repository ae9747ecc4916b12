"""What an input value must be so that, once accepted, it is readable forever (design: bad input loses nothing).

Every value the service stores is later rendered by lists, detail pages, CSV exports,
replays, callbacks and metrics, in any display time zone, from SQLite or PostgreSQL. A
value one of them cannot handle must be refused at the door (a 400), never stored: once
stored it would answer 500 on every read, for good. The rules, one function each:

- ``json_problem``: what ``json.loads`` accepts but cannot be written back as JSON or UTF-8
  (non-finite numbers, lone surrogates) or walked without recursion trouble (depth);
- ``nul_problem``: U+0000, which PostgreSQL stores neither in ``text`` nor in ``jsonb``;
- ``timestamp_problem``: a time outside ``EARLIEST``…``LATEST``; a time near year 1 or 9999
  overflows when shifted into a display time zone;
- ``query_time_problem``: a time a query compares against (filter, cursor) too near the ends
  of Python's datetime to be converted to UTC or a display zone;
- ``MAX_DURATION_SECONDS``: the longest delay, age or deadline that ``now ±`` it stays a
  datetime in every zone;
- ``MAX_COUNT``: the largest counter an integer column holds on both databases.

Body-level rules (JSON) run in the API's parser (config.parsers) and the DLQ's parser
(dlq.ingest.parsing); field rules in the serializers. This module imports no app.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from typing import Any

# Deeper than any real request; far below the interpreter's recursion limit, so parsing,
# fingerprinting (canonical JSON) and storing a body can never raise RecursionError.
MAX_JSON_DEPTH = 64
# Failure times, replay times and cursor positions: a generous window around "now" that
# stays a valid datetime after any time-zone shift (±26 h) and after adding MAX_DURATION.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)
# Any time a query compares against (a filter, a cursor): two days inside the ends of
# Python's datetime, so converting it to UTC for the database, or to a display time zone,
# never overflows. Wider than EARLIEST..LATEST: a filter may reach before or after any row.
FIRST_QUERYABLE = datetime(1, 1, 3, tzinfo=UTC)
LAST_QUERYABLE = datetime(9999, 12, 29, tzinfo=UTC)
# Ten years: beyond any lease, retry delay, deadline or age the service deals in.
MAX_DURATION_SECONDS = 10 * 366 * 86400
# PostgreSQL `integer` (Django's IntegerField and PositiveIntegerField there).
MAX_COUNT = 2**31 - 1

NUL_MESSAGE = "NUL characters (U+0000) are not allowed."


class NotStorable(ValueError):
    """Raised by :func:`loads` with the reason a body cannot be stored."""


def json_problem(value: Any) -> str | None:
    """Why a parsed JSON value cannot be stored, or None. Walked without recursion.

    json.loads accepts numbers that overflow to infinity (1e400) and lone surrogate escapes
    ("\\ud800"); neither can be written back as JSON or UTF-8 (jsonb, encryption, logs).
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
            stack.extend((k, depth) for k in item.keys())
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, float) and not math.isfinite(item):
            return "JSON numbers must be finite."
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "JSON strings must be valid Unicode (no lone surrogates)."
    return None


def nul_problem(value: Any) -> str | None:
    """NUL_MESSAGE when any string (or object key) in ``value`` holds U+0000, else None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return NUL_MESSAGE
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def loads(raw: bytes) -> Any:
    """A JSON body as a value that can be stored; NotStorable with the reason otherwise.

    An empty body is refused, like any other text that is not JSON: a failure report that
    says nothing cannot be told apart from a broken client.
    """
    if not raw.strip():
        raise NotStorable("The body is empty; send the report as JSON.")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise NotStorable("The body is not UTF-8.") from exc
    except RecursionError as exc:
        raise NotStorable(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from exc
    except ValueError as exc:
        # JSONDecodeError, and the interpreter's refusal of integers over 4300 digits.
        raise NotStorable("The body is not valid JSON.") from exc
    problem = json_problem(value)
    if problem is not None:
        raise NotStorable(problem)
    return value


def timestamp_problem(value: datetime) -> str | None:
    """Why a time cannot be stored and shown in every time zone, or None."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        inside = EARLIEST <= aware <= LATEST
    except OverflowError:
        inside = False
    if not inside:
        return f"Times must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC)."
    return None


def query_time_problem(value: datetime | date) -> str | None:
    """Why a time (or a date, taken as its midnight) cannot be compared against in a query,
    or None."""
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        inside = FIRST_QUERYABLE <= aware <= LAST_QUERYABLE
    except OverflowError:
        inside = False
    if not inside:
        return f"Times in a query must lie between {FIRST_QUERYABLE:%Y-%m-%d} and {LAST_QUERYABLE:%Y-%m-%d}."
    return None
