"""psycopg internals the ledger uses (docs/adr/0004-private-framework-apis.md).

**Column names from libpq's result** (``Cursor.pgresult``, psycopg's low-level access to
libpq's ``PGresult``, reached through Django's cursor wrapper). ``ledger.fast_rows`` builds
operation rows without ``RawQuerySet`` and needs the statement's column names once per
statement; ``cursor.description`` — the public DB-API way — builds a ``Column`` object per
column (48 for an operation row) on every call.

Measured with ``python -m bench.private_apis``: MEASUREMENT PENDING.
"""

from __future__ import annotations

from typing import Any


def result_columns(cursor: Any) -> tuple[str, ...]:
    """The column names of the result ``cursor`` (Django's, on psycopg 3) last received."""
    result = cursor.pgresult
    return tuple(result.fname(i).decode() for i in range(result.nfields))
