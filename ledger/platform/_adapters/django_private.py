"""Django internals the ledger's claim path uses (docs/adr/0004-private-framework-apis.md).

**The atomic-block stack** (``connection.atomic_blocks``, kept by ``transaction.Atomic``).
``ledger.store.sql.index_plans`` turns sequential scans off for its transaction with one statement
(``set_config(…, true)``, undone by the COMMIT) when its block is the outermost one, and with
a saving statement plus a restoring one when it runs inside a caller's transaction or a
savepoint, whose later statements must not inherit the setting. Only the stack's depth tells
the two apart; the public API (``in_atomic_block``, ``get_autocommit``) is the same in both,
so without it every claim-path transaction would restore: one more statement. The block on
top of the stack also marks how long the setting is known to be in force (a reconnect
empties the stack; the next transaction is another block).

Measured with ``python -m bench.private_apis --n 1000 --rounds 5 --only "atomic stack"``
against always restoring (PostgreSQL on loopback, this 2-core machine at load average
11–12; medians of the rounds' medians, µs, private / public):

    index_plans in its own transaction  wall 298 / 1,140    thread CPU 196 / 321 (39 %)   5 of 5 rounds
    a fresh claim→complete              wall 51,936 / 75,446 thread CPU 3,023 / 3,083 (2 %) 4 of 5 rounds

The fresh op's CPU difference sits at ADR 0004's 2 % bar (its wall-time difference is mostly
the machine's load), so it stays.

**Database errors of a pipeline** (``connection.wrap_database_errors``). A claim-path
statement alone — the read by key every claim starts with, a claim with nothing to write
after its row, a replay — is sent in one psycopg pipeline with its planner setting
(``ledger.store.sql.execute_with_index_plans``): no BEGIN, restore and COMMIT round trips. Its
errors are raised when the pipeline syncs, outside the cursor's own wrapping, so they would
reach the caller as psycopg's exceptions instead of Django's (``IntegrityError`` → the
ledger's named errors, ``OperationalError`` → 503 ``database_unavailable``). Django's wrapper
converts them as its cursors do, and marks the connection for the end-of-request usability
check as its cursors do; copying that by hand would copy Django's internals instead.

Measured with ``python -m bench.private_apis --n 1000 --rounds 5`` against the public way
(``transaction.atomic()`` around the statement and its planner setting: BEGIN, set, the
statement, restore, COMMIT), PostgreSQL on loopback, this 2-core machine at load average
11–12 from other test suites; medians of the rounds' medians, µs, private / public:

    a statement alone     wall 1,993 / 2,557 (22 %)   thread CPU 349 / 518 (33 %)   4 of 5 rounds
    a replay (claim)      wall 4,910 / 6,781 (28 %)   thread CPU 503 / 777 (35 %)   4 of 5 rounds
    a fresh claim→complete wall 44,960 / 48,003 (6 %) thread CPU 3,074 / 3,612 (15 %) 3 of 5 rounds

Far above ADR 0004's 2 % bar, so it stays.

``tests/test_private_apis.py`` checks the stack holds one block per open ``atomic`` with its
identity, that the wrapper turns the driver's errors into Django's classes, and that an error
raised at a pipeline's sync reaches the caller as Django's ``DatabaseError``: a Django
upgrade that changes any of them fails there, by name.
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
