"""The work queue's side table, ``ledger_open_operation`` (ADR 0017): the triggers that keep it
the mirror of the open operation rows, and its backfill.

The database writes it, in the statement that writes the operation row: an AFTER ROW trigger on
``ledger_operation`` inserts the mirror of a new open row, updates it when a move between open
states, a heartbeat or a new due time changes a mirrored column, and deletes it with the
terminal move (or the row's deletion). A trigger rather than a clause in each statement: every
writer of a state — the named statements of ``queries.sql``, the ORM's guarded updates of the
transitions, fixtures, restores — keeps it without knowing, and no write can forget it.

The backfill fills the mirror of rows that were open before the triggers existed (migration
0042 and ``manage.py open_rows_backfill``): batches of an id range, each its own short
transaction under ``lock_timeout``, locking the range's open operation rows (``FOR UPDATE``) so
that what it copies is the row as it is, and no move can commit between the read and the copy;
a move after it is the trigger's. Idempotent and resumable: a batch repeats as an upsert.
"""

from __future__ import annotations

from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import F, Q

from ledger.models import TERMINAL_STATES

TABLE = "ledger_open_operation"
COLUMNS = "id, tenant_id, status, mode, provider_id, lease_expires_at, next_attempt_at, updated_at"
_MIRRORED = ("status", "mode", "provider_id", "lease_expires_at", "next_attempt_at", "updated_at")
TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATES)) + ")"
_NEW = ", ".join(f"NEW.{c}" for c in COLUMNS.split(", "))
_SET = ", ".join(f"{c} = NEW.{c}" for c in _MIRRORED)
_CHANGED = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in _MIRRORED)
# SQLite spells the null-safe comparison `IS NOT` (IS DISTINCT FROM only from 3.39; the embedded
# mode runs on 3.35, the first with RETURNING).
_CHANGED_SQLITE = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _MIRRORED)

# PostgreSQL: one function for the three triggers. The UPDATE branch inserts when the mirror is
# missing (a row open before the triggers, not yet reached by the backfill). CREATE OR REPLACE
# TRIGGER (PostgreSQL 14+) takes a SHARE ROW EXCLUSIVE lock: it waits for the writes under way
# and lets reads go on, and an install run again replaces what it finds. DROP TRIGGER IF EXISTS
# would take ACCESS EXCLUSIVE even when there is nothing to drop, stopping every read of the
# operation table while it waits for its lock.
PG_TRIGGERS = f"""
CREATE OR REPLACE FUNCTION ledger_open_operation_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM {TABLE} WHERE id = OLD.id;
    ELSIF NEW.status IN {TERMINAL_SQL} THEN
        DELETE FROM {TABLE} WHERE id = NEW.id;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO {TABLE} ({COLUMNS}) VALUES ({_NEW});
    ELSE
        UPDATE {TABLE} SET {_SET} WHERE id = NEW.id;
        IF NOT FOUND THEN
            INSERT INTO {TABLE} ({COLUMNS}) VALUES ({_NEW}) ON CONFLICT (id) DO NOTHING;
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER ledger_open_operation_on_insert AFTER INSERT ON ledger_operation
    FOR EACH ROW WHEN (NEW.status NOT IN {TERMINAL_SQL}) EXECUTE FUNCTION ledger_open_operation_mirror();
CREATE OR REPLACE TRIGGER ledger_open_operation_on_update AFTER UPDATE OF {", ".join(_MIRRORED)} ON ledger_operation
    FOR EACH ROW WHEN ({_CHANGED}) EXECUTE FUNCTION ledger_open_operation_mirror();
CREATE OR REPLACE TRIGGER ledger_open_operation_on_delete AFTER DELETE ON ledger_operation
    FOR EACH ROW WHEN (OLD.status NOT IN {TERMINAL_SQL}) EXECUTE FUNCTION ledger_open_operation_mirror();
"""

PG_TRIGGERS_DROP = """
DROP TRIGGER IF EXISTS ledger_open_operation_on_insert ON ledger_operation;
DROP TRIGGER IF EXISTS ledger_open_operation_on_update ON ledger_operation;
DROP TRIGGER IF EXISTS ledger_open_operation_on_delete ON ledger_operation;
DROP FUNCTION IF EXISTS ledger_open_operation_mirror();
"""

# SQLite: a trigger body is statements, no branches; one trigger per case.
SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS ledger_open_operation_on_insert AFTER INSERT ON ledger_operation
    WHEN NEW.status NOT IN {TERMINAL_SQL}
    BEGIN INSERT INTO {TABLE} ({COLUMNS}) VALUES ({_NEW}); END""",
    f"""CREATE TRIGGER IF NOT EXISTS ledger_open_operation_on_update AFTER UPDATE OF {", ".join(_MIRRORED)}
    ON ledger_operation WHEN NEW.status NOT IN {TERMINAL_SQL} AND ({_CHANGED_SQLITE})
    BEGIN INSERT OR REPLACE INTO {TABLE} ({COLUMNS}) VALUES ({_NEW}); END""",
    f"""CREATE TRIGGER IF NOT EXISTS ledger_open_operation_on_finish AFTER UPDATE OF status ON ledger_operation
    WHEN NEW.status IN {TERMINAL_SQL}
    BEGIN DELETE FROM {TABLE} WHERE id = NEW.id; END""",
    f"""CREATE TRIGGER IF NOT EXISTS ledger_open_operation_on_delete AFTER DELETE ON ledger_operation
    BEGIN DELETE FROM {TABLE} WHERE id = OLD.id; END""",
]
SQLITE_TRIGGERS_DROP = [
    f"DROP TRIGGER IF EXISTS ledger_open_operation_{name}"
    for name in ("on_insert", "on_update", "on_finish", "on_delete")
]

# One batch: the open rows of ids (after, upto], locked, copied as they are now. A mirror that
# exists is overwritten with the same values (a repair, if it ever drifted).
_BACKFILL_PG = f"""
WITH src AS (
    SELECT {COLUMNS} FROM ledger_operation
    WHERE id > %(after)s AND id <= %(upto)s AND status NOT IN {TERMINAL_SQL}
    FOR UPDATE
), copied AS (
    INSERT INTO {TABLE} ({COLUMNS}) SELECT {COLUMNS} FROM src
    ON CONFLICT (id) DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in _MIRRORED)}
    RETURNING 1
)
SELECT COUNT(*) FROM copied
"""
_BACKFILL_SQLITE = f"""
INSERT OR REPLACE INTO {TABLE} ({COLUMNS})
SELECT {COLUMNS} FROM ledger_operation
WHERE id > %(after)s AND id <= %(upto)s AND status NOT IN {TERMINAL_SQL}
"""
# Mirrors whose operation is gone or finished (none, unless something wrote around the triggers).
_ORPHANS = f"""
DELETE FROM {TABLE}
WHERE id > %(after)s AND id <= %(upto)s
  AND NOT EXISTS (
      SELECT 1 FROM ledger_operation o WHERE o.id = {TABLE}.id AND o.status NOT IN {TERMINAL_SQL}
  )
"""


def triggers_install(schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_TRIGGERS)
    else:
        for statement in SQLITE_TRIGGERS:
            schema_editor.execute(statement)


def triggers_remove(schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_TRIGGERS_DROP)
    else:
        for statement in SQLITE_TRIGGERS_DROP:
            schema_editor.execute(statement)


def open_rows_backfill_batch(*, after: int, upto: int, lock_timeout_ms: int = 2000) -> int:
    """Copy the open rows of ids (after, upto] into the mirror in one short transaction; the
    number copied. Raises the database's lock-timeout error when a row stays locked longer than
    ``lock_timeout_ms`` (the caller retries the batch)."""
    with transaction.atomic(), connection.cursor() as cursor:
        params = {"after": after, "upto": upto}
        if connection.vendor == "postgresql":
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(lock_timeout_ms)}ms"])
            cursor.execute(_BACKFILL_PG, params)
            copied = int(cursor.fetchone()[0])
        else:
            cursor.execute(_BACKFILL_SQLITE, params)
            copied = max(cursor.rowcount, 0)
        cursor.execute(_ORPHANS, params)
        return copied


RETRIES = 5


def max_operation_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM ledger_operation")
        return int(cursor.fetchone()[0])


def open_rows_backfill(
    *, start_after: int = 0, span: int = 10_000, lock_timeout_ms: int = 2000, progress: Any = None
) -> int:
    """Every batch from ``start_after`` up to the highest id now; the rows copied. Rows created
    after it started are the triggers'. ``progress(upto, copied)`` is called after each batch: the
    watermark to resume from."""
    total = 0
    last = max_operation_id()
    after = start_after
    while after < last:
        upto = min(after + span, last)
        for tries_left in range(RETRIES, -1, -1):
            try:
                total += open_rows_backfill_batch(after=after, upto=upto, lock_timeout_ms=lock_timeout_ms)
                break
            except OperationalError:
                # A row of the range stayed locked past lock_timeout (a long move): the batch
                # waited no longer than that, and is tried again.
                if not tries_left:
                    raise
        if progress is not None:
            progress(upto, total)
        after = upto
    return total


def open_rows_where(**lookups: Any) -> Q:
    """Operation rows that ``lookups`` match on their work-queue mirror — whose partial indexes
    serve the query — and on the row itself. The row's own columns are what ``FOR UPDATE``
    checks again after waiting for a concurrent move (the mirror is not locked, and a join
    re-reads it as the statement first saw it), so a row that moved meanwhile is passed over
    as it was when the indexes were on the row (ADR 0017). The join names the tenant on both
    sides: the two tables are co-located by tenant (Citus routes the join to one shard)."""
    mirrored = {f"open_row__{name}": value for name, value in lookups.items()}
    return Q(**lookups) & Q(open_row__tenant_id=F("tenant_id"), **mirrored)
