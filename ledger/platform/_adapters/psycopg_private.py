"""psycopg internals the ledger uses (docs/adr/0004-private-framework-apis.md).

**Column names from libpq's result** (``Cursor.pgresult``, psycopg's low-level access to
libpq's ``PGresult``, reached through Django's cursor wrapper). ``ledger.store.fast_rows`` builds
operation rows without ``RawQuerySet`` and needs the statement's column names once per
statement; ``cursor.description`` — the public DB-API way — builds a ``Column`` object per
column (48 for an operation row) on every call.

Measured with ``python -m bench.private_apis --n 1000 --rounds 5`` against
``cursor.description`` (the run of ADR 0004's table: PostgreSQL on loopback,
this 2-core machine at load average 11–12; medians of the rounds' medians, µs, private /
public):

    one operation row     wall 607 / 1,717 (65 %)     thread CPU 220 / 328 (33 %)   5 of 5 rounds
    a replay (claim)      wall 10,272 / 11,038 (7 %)  thread CPU 935 / 1,036 (10 %) 3 of 5 rounds
    a fresh claim→complete wall 54,563 / 59,410 (8 %) thread CPU 3,970 / 3,882 (−2 %) 4 of 5 rounds

About 0.1 ms of CPU per operation row: a tenth of a replay, above ADR 0004's 2 % bar, so it
stays (a fresh op's CPU difference is inside that run's noise). ``tests/test_private_apis.py``
checks the names it returns are ``cursor.description``'s, in order; a psycopg upgrade that
changes ``pgresult`` fails there, by name, and ``tests/ledger/test_fast_rows.py`` holds the
rows equal to ``Manager.raw``'s.
"""

from __future__ import annotations

from typing import Any


def result_columns(cursor: Any) -> tuple[str, ...]:
    """The column names of the result ``cursor`` (Django's, on psycopg 3) last received."""
    result = cursor.pgresult
    return tuple(result.fname(i).decode() for i in range(result.nfields))


def result_shape(cursor: Any) -> tuple[int, bytes | None]:
    """The number of columns of the result ``cursor`` last received, and its last column's
    name (raw): what ``ledger.store.fast_rows`` checks before reusing a named statement's
    layout — two calls into libpq instead of one per column (48 for an operation row)."""
    result = cursor.pgresult
    count = result.nfields
    return count, result.fname(count - 1) if count else None
