"""Django internals the ledger's claim path uses (docs/adr/0004-private-framework-apis.md).

**Database errors of a pipeline** (``connection.wrap_database_errors``). A claim-path
statement alone — the read by key every claim starts with, a claim with nothing to write
after its row, a replay — is sent in one psycopg pipeline with its planner setting
(``ledger.sql.execute_with_index_plans``): no BEGIN, restore and COMMIT round trips. Its
errors are raised when the pipeline syncs, outside the cursor's own wrapping, so they would
reach the caller as psycopg's exceptions instead of Django's (``IntegrityError`` → the
ledger's named errors, ``OperationalError`` → 503 ``database_unavailable``). Django's wrapper
converts them as its cursors do, and marks the connection for the end-of-request usability
check as its cursors do; copying that by hand would copy Django's internals instead.

Measured with ``python -m bench.private_apis``: MEASUREMENT PENDING.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from django.db import connection


def database_errors() -> AbstractContextManager[Any]:
    """Raise database errors inside as Django's exception classes, as its cursors do."""
    return connection.wrap_database_errors
