"""Django internals the ledger's claim path uses (docs/adr/0004-private-framework-apis.md).

**The atomic-block stack** (``connection.atomic_blocks``, kept by ``transaction.Atomic``).
``ledger.sql.index_plans`` turns sequential scans off for its transaction with one statement
(``set_config(…, true)``, undone by the COMMIT) when its block is the outermost one, and with
a saving statement plus a restoring one when it runs inside a caller's transaction or a
savepoint, whose later statements must not inherit the setting. Only the stack's depth tells
the two apart; the public API (``in_atomic_block``, ``get_autocommit``) is the same in both.
Without it every claim-path transaction would restore: one more statement and round trip.
The block on top of the stack also marks how long the setting is known to be in force (a
reconnect empties the stack, a new transaction is another block).

**Database errors of a pipeline** (``connection.wrap_database_errors``). A claim-path
statement alone is sent in one psycopg pipeline with its planner setting
(``ledger.sql.execute_with_index_plans``): no BEGIN and COMMIT round trips. Its errors are
raised when the pipeline syncs, outside the cursor's own wrapping, so they would reach the
caller as psycopg's exceptions instead of Django's (``IntegrityError`` → the ledger's named
errors, ``OperationalError`` → 503 ``database_unavailable``). Django's wrapper converts them
as its cursor does, and marks the connection as having had an error.

Measured with ``python -m bench.private_apis``: MEASUREMENT PENDING.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from django.db import connection


def atomic_depth() -> int:
    """How many ``transaction.atomic`` blocks are open on the default connection (1: the
    outermost one, which began the transaction)."""
    return len(connection.atomic_blocks)


def innermost_atomic_block() -> Any:
    """The innermost open atomic block: a marker valid while it stays open."""
    return connection.atomic_blocks[-1]


def atomic_block_open(block: Any) -> bool:
    """Whether ``block`` (from ``innermost_atomic_block``) is still open on this connection."""
    return any(open_block is block for open_block in connection.atomic_blocks)


def database_errors() -> AbstractContextManager[Any]:
    """Raise database errors inside as Django's exception classes, as its cursors do."""
    return connection.wrap_database_errors
