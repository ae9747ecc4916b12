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

from datetime import UTC
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


# --- timestamptz read by psycopg's C loader -------------------------------------------------
#
# Django reads every ``timestamptz`` through its own loader, a Python subclass of psycopg's
# Python ``TimestamptzLoader`` that re-stamps each value with the connection's time zone
# (``django.db.backends.postgresql.psycopg_any.register_tzloader``): ~5.5 µs a value against
# ~0.5 µs for psycopg_binary's C loader (thread CPU, 100,000 loads; this machine at load ~10),
# ~30 µs for an operation row's six times — a tenth of a guard replay's client CPU. Where the
# session's TimeZone is UTC and Django's connection time zone is UTC (the service's only
# setting), both give the same aware datetime in ``datetime.UTC``; elsewhere Django's loader
# stays. ``timezone`` is the attribute Django's ``create_cursor`` compares to decide whether
# a cursor needs its loader again. ``tests/test_private_apis.py`` holds the values equal.


def _c_timestamptz_loader() -> type | None:
    try:
        from psycopg_binary import _psycopg  # the C implementation psycopg[binary] installs
    except ImportError:  # pragma: no cover - requirements.txt pins psycopg[binary]
        return None
    from psycopg.adapt import Loader

    class UtcTimestamptzLoader(Loader):
        """psycopg's C ``TimestamptzLoader`` (which cannot be subclassed) behind the
        ``timezone`` attribute Django looks for: ``load`` is the C loader's own method."""

        timezone = UTC

        def __init__(self, oid: int, context: Any = None):
            super().__init__(oid, context)
            self._c = _psycopg.TimestamptzLoader(oid, context)
            # What psycopg's transformer calls for each value: the C method itself.
            self.load = self._c.load  # type: ignore[method-assign]

        def load(self, data: Any) -> Any:  # the class's, for a caller that looks there
            return self._c.load(data)

    return UtcTimestamptzLoader


_C_TIMESTAMPTZ = _c_timestamptz_loader()


def timestamps_loaded_in_c(wrapper: Any) -> bool:
    """On a new Django connection ``wrapper`` (PostgreSQL), read ``timestamptz`` with
    psycopg's C loader when session and Django both use UTC; whether it did."""
    connection = wrapper.connection
    if (
        _C_TIMESTAMPTZ is None
        or wrapper.vendor != "postgresql"
        or wrapper.timezone is not UTC
        or connection.info.parameter_status("TimeZone") != "UTC"
    ):
        return False
    connection.adapters.register_loader("timestamptz", _C_TIMESTAMPTZ)
    return True
