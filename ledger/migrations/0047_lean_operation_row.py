"""A leaner operation row (ADR 0023), two changes:

1. The operation row's reconciliation-handle index goes: ``ledger_operation`` keeps 12 indexes.
   The API's ``reconciliation_handle`` filter reads the search rows (ADR 0018), which hold every
   handle an operation is given (the claim's joined identifiers, or a row the sent marker
   appends) and which migration 0043 filled for the rows that existed before them.
2. The attempts' and events' foreign-key constraints to ``ledger_operation`` go (PostgreSQL):
   each insert's check took a ``FOR KEY SHARE`` lock on the operation row — a Heap/LOCK record
   at the claim (its attempt) and at the completion (its event), the two per pair. The ORM's
   CASCADE still deletes them with their operation (retention deletes them explicitly or drops
   their month), and ``ledger_orphans`` reports any row left without one (ADR 0019's pattern).
   SQLite keeps its constraints (one writer, no lock records; dropping one rebuilds the table).

**Locks, on PostgreSQL.** ``DROP INDEX CONCURRENTLY`` takes no lock that stops reads or writes
of the 10M-row table (it waits for the transactions already using the index); it cannot run in
a transaction block, hence ``atomic = False``. ``DROP CONSTRAINT`` is a catalogue change, no
scan, but takes ACCESS EXCLUSIVE on the child and the operation table for that instant: it asks
with ``lock_timeout`` 2 s and retries, never queueing writes behind it for longer. Reversible:
the index is rebuilt ``CONCURRENTLY`` (one scan, no lock on writes); the constraints come back
validated as they are added (PostgreSQL refuses ``NOT VALID`` on a partitioned table): a scan
of the attempts and events under a SHARE ROW EXCLUSIVE lock that stops their writes — for tests
and emergencies, not a live 10M-row database.
"""

from typing import Any

from django.db import migrations, models
from django.db.utils import OperationalError

INDEX = "op_handle_idx"
# The partitioned children whose constraint to the operation each insert checked (and locked).
CHILDREN = ("ledger_attempt", "ledger_operationevent")


def _with_lock_timeout(schema_editor: Any, statement: str, attempts: int = 30) -> None:
    """A catalogue change that waits at most 2 s for its lock (never queueing writes behind
    it for longer), retried."""
    for attempt in range(attempts):
        try:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("SET LOCAL lock_timeout = '2s'")
                cursor.execute(statement)
                cursor.execute("COMMIT")
            return
        except OperationalError:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
            if attempt == attempts - 1:
                raise


def _foreign_keys(schema_editor: Any) -> list[tuple[str, str]]:
    """(child table, constraint) of the children's top-level constraints to the operation."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.conrelid::regclass::text, c.conname FROM pg_constraint c"
            " WHERE c.confrelid = 'ledger_operation'::regclass AND c.contype = 'f' AND c.conparentid = 0"
            " AND c.conrelid::regclass::text = ANY(%s)",
            [list(CHILDREN)],
        )
        return [(table, name) for table, name in cursor.fetchall()]


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    for table, name in _foreign_keys(schema_editor):
        _with_lock_timeout(schema_editor, f'ALTER TABLE {table} DROP CONSTRAINT IF EXISTS "{name}"')


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON ledger_operation (reconciliation_handle)"
            " WHERE NOT (reconciliation_handle = '')"
        )
        return
    present = {table for table, _ in _foreign_keys(schema_editor)}
    for table in CHILDREN:
        if table in present:
            continue
        name = f"{table}_operation_id_fk_ledger_operation_id"
        # Validated as it is added: PostgreSQL refuses NOT VALID on a partitioned table.
        schema_editor.execute(
            f'ALTER TABLE {table} ADD CONSTRAINT "{name}" FOREIGN KEY (operation_id)'
            " REFERENCES ledger_operation (id) DEFERRABLE INITIALLY DEFERRED"
        )
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON ledger_operation (reconciliation_handle)"
        " WHERE NOT (reconciliation_handle = '')"
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0046_evaluation_manifests"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="operation", name=INDEX),
                migrations.AlterField(
                    model_name="attempt",
                    name="operation",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="attempt_set",
                        to="ledger.operation",
                    ),
                ),
                migrations.AlterField(
                    model_name="operationevent",
                    name="operation",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="events",
                        to="ledger.operation",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
