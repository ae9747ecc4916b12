"""The operation row's reconciliation-handle index goes (ADR 0023): ``ledger_operation`` keeps
12 indexes. The API's ``reconciliation_handle`` filter reads the search rows (ADR 0018), which
hold every handle an operation is given (the claim's joined identifiers, or a row the sent
marker appends) and which migration 0043 filled for the rows that existed before them.

**Locks, on PostgreSQL.** ``DROP INDEX CONCURRENTLY`` takes no lock that stops reads or writes
of the 10M-row table (it waits for the transactions already using the index); it cannot run in
a transaction block, hence ``atomic = False``. Reversible: the index is rebuilt
``CONCURRENTLY`` (one scan of the table, no lock on writes).
"""

from typing import Any

from django.db import migrations

INDEX = "op_handle_idx"


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


def backwards(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX {concurrently}IF NOT EXISTS {INDEX} ON ledger_operation (reconciliation_handle)"
        " WHERE NOT (reconciliation_handle = '')"
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0046_evaluation_manifests"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.RemoveIndex(model_name="operation", name=INDEX)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
