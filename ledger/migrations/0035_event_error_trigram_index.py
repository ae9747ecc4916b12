"""A trigram index on the error text of failure events, so operations are found by their error.

A failure (a retry, a final failure, an outcome left unknown, a hand-over to review) writes an
event whose ``reason`` holds the error text, scrubbed (``ledger.protocol.services._event_text``). Events
are append-only: the index costs one GIN insertion per failure event and nothing on the
operation row, whose ``last_error`` every completion may rewrite (an index there would make
each such update a non-HOT one, and the operation table's indexes are capped). Partial on the
failure states (``ledger.protocol.selectors.ERROR_EVENT_STATES``), so the claims', sends' and
completions' events write nothing here. ``ledger.protocol.selectors.operations_failed_with`` compares
the expression below under ``icontains``; a test holds its plan to this index.

``ledger_operationevent`` is partitioned (migration 0025), and CREATE INDEX CONCURRENTLY is
refused on a partitioned table. So: the parent's index ON ONLY (no rows read, stays invalid),
each partition's built CONCURRENTLY (no lock on writes), then attached; once every partition's
is, the parent's becomes valid, and partitions made later (``ledger.platform.partitions``) get theirs
with the table. Not atomic; re-running after an interruption drops an invalid partition index
and builds it again. SQLite has no trigram indexes: nothing to do there.
"""

from typing import Any

from django.db import migrations

TABLE = "ledger_operationevent"
NAME = "opevent_error_trgm"
# Django's icontains on the reason renders UPPER("reason"::text): the same tree.
DEFINITION = "USING gin ((UPPER((reason)::text)) gin_trgm_ops)"
PREDICATE = "WHERE to_status IN ('retry_wait', 'failed', 'uncertain', 'review')"


def _partitions(schema_editor: Any) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
            [TABLE],
        )
        return [row[0] for row in cursor.fetchall()]


def _valid(schema_editor: Any, name: str) -> bool | None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def _attached(schema_editor: Any, child: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) AND inhparent = to_regclass(%s)",
            [child, NAME],
        )
        return cursor.fetchone() is not None


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    partitioned = bool(_partitions(schema_editor))
    if not partitioned:
        # A plain table (a database that never ran migration 0025's conversion).
        if _valid(schema_editor, NAME) is False:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME} ON {TABLE} {DEFINITION} {PREDICATE}")
        return
    schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON ONLY {TABLE} {DEFINITION} {PREDICATE}")
    for partition in _partitions(schema_editor):
        child = f"{partition[:50]}_error_trgm"
        if _valid(schema_editor, child) is False:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {child}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {child} ON {partition} {DEFINITION} {PREDICATE}"
        )
        if not _attached(schema_editor, child):
            schema_editor.execute(f"ALTER INDEX {NAME} ATTACH PARTITION {child}")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    # Dropping the parent's index drops its partitions' with it.
    schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0034_tenant_keys_with_personal_data"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
