"""Rows that name a parent the database no longer holds, for the references that have no
database constraint (ADR 0019): an operation's tenant and provider, whose constraint checks
locked the one tenant row every claim names; the search rows' operation (ADR 0018); the
attempts' and events' operation (ADR 0023), whose checks locked the operation row; the work
queue's mirror rows' operation (ADR 0017), and the mirror's drift from the rows it mirrors.

The application keeps them whole — the ORM's PROTECT refuses deleting a tenant or provider that
has operations, retention deletes an operation's search rows with it — and this check says so
every night (``ledger.schedules.orphans_task``; ``manage.py ledger_orphans`` by hand). Each
reference is read in id ranges of ``CHUNK`` rows, one short statement each (an anti-join on
the parent's primary key), so no pass holds one snapshot over the whole table.
"""

from __future__ import annotations

import logging

from django.db import connection
from django.db.backends.utils import CursorWrapper

from ledger.models import TERMINAL_STATES

log = logging.getLogger("onceguard.ledger")

# (child table, column, parent table): every reference without a database constraint that the
# application guarantees. The child's id ranges are walked by ``walk`` (its primary key's
# leading column).
REFERENCES = (
    ("ledger_operation", "tenant_id", "ledger_tenant", "id"),
    ("ledger_operation", "provider_id", "ledger_provider", "id"),
    ("ledger_operation_search", "operation_id", "ledger_operation", "operation_id"),
    # The attempts' and events' operation (ADR 0023): their check locked the operation row.
    ("ledger_attempt", "operation_id", "ledger_operation", "id"),
    ("ledger_operationevent", "operation_id", "ledger_operation", "id"),
    ("ledger_open_operation", "id", "ledger_operation", "id"),
)
# Open operations whose mirror row is missing or names another state, and mirror rows of
# finished operations (ADR 0017). The triggers write both rows in one statement, so this stays
# 0 — unless something wrote around them (a restore of one table, a trigger dropped by hand):
# such an operation would never be taken or swept again. `manage.py open_rows_backfill`
# repairs it. Walked by the operation's id like the references.
DRIFT = "ledger_open_operation.drift"
_DRIFT_SQL = (
    "SELECT (SELECT COUNT(*) FROM ledger_operation o WHERE o.id >= %s AND o.id < %s AND o.status NOT IN ({terminal})"
    " AND NOT EXISTS (SELECT 1 FROM ledger_open_operation m WHERE m.id = o.id AND m.status = o.status))"
    " + (SELECT COUNT(*) FROM ledger_open_operation m JOIN ledger_operation o ON o.id = m.id"
    " WHERE m.id >= %s AND m.id < %s AND o.status IN ({terminal}))"
)
CHUNK = 500_000


def orphans_count(*, chunk: int = CHUNK) -> dict[str, int]:
    """Rows whose parent is missing, per reference (``table.column``), zeros included."""
    found = {}
    with connection.cursor() as cursor:
        for table, column, parent, walk in REFERENCES:
            cursor.execute(f"SELECT COALESCE(MIN({walk}), 0), COALESCE(MAX({walk}), 0) FROM {table}")
            low, high = (int(v) for v in cursor.fetchone())
            total = 0
            for start in range(low, high + 1, chunk):
                cursor.execute(
                    f"SELECT COUNT(*) FROM {table} c WHERE c.{walk} >= %s AND c.{walk} < %s"
                    f" AND c.{column} IS NOT NULL"
                    f" AND NOT EXISTS (SELECT 1 FROM {parent} p WHERE p.id = c.{column})",
                    [start, start + chunk],
                )
                total += int(cursor.fetchone()[0])
            found[f"{table}.{column}"] = total
        found[DRIFT] = _drift(cursor, chunk)
    if any(found.values()):
        log.warning("orphans_found %s", " ".join(f"{k}={v}" for k, v in found.items() if v))
    return found


def _drift(cursor: CursorWrapper, chunk: int) -> int:
    terminal = sorted(TERMINAL_STATES)
    query = _DRIFT_SQL.format(terminal=", ".join(["%s"] * len(terminal)))
    cursor.execute("SELECT COALESCE(MIN(id), 0), COALESCE(MAX(id), 0) FROM ledger_operation")
    low, high = (int(v) for v in cursor.fetchone())
    total = 0
    for start in range(low, high + 1, chunk):
        cursor.execute(query, [start, start + chunk, *terminal, start, start + chunk, *terminal])
        total += int(cursor.fetchone()[0])
    return total
