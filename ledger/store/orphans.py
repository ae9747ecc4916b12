"""Rows that name a parent the database no longer holds, for the references that have no
database constraint (ADR 0019): an operation's tenant and provider, whose constraint checks
locked the one tenant row every claim names; the search rows' operation (ADR 0018); the
attempts' and events' operation (ADR 0023), whose checks locked the operation row.

The application keeps them whole — the ORM's PROTECT refuses deleting a tenant or provider that
has operations, retention deletes an operation's search rows with it — and this check says so
every night (``ledger.schedules.orphans_task``; ``manage.py ledger_orphans`` by hand). Each
reference is read in id ranges of ``CHUNK`` rows, one short statement each (an anti-join on
the parent's primary key), so no pass holds one snapshot over the whole table.
"""

from __future__ import annotations

import logging

from django.db import connection

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
    if any(found.values()):
        log.warning("orphans_found %s", " ".join(f"{k}={v}" for k, v in found.items() if v))
    return found
