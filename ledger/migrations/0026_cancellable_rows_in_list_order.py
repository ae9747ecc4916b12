"""The rows an operator can cancel, in the console's list order.

``needs=cancellable`` (queued or waiting to retry) is newest first by id. It read the due
index — (status, next_attempt_at) over the same rows, whose statistics at ten million rows
put 106 rows where there were 10,000 — and sorted every one of them for a page of 100; read
off the open rows' index it would filter several open rows for each it shows. This index
holds those rows only, in id order: the page reads its 100 entries, its capped count a range
of entries. Only rows in these two states have an entry (a guard-mode claim and its
completion add none): it holds the work waiting to run.

CONCURRENTLY on PostgreSQL (no lock on writes), so not atomic; a valid index left by an
interrupted run is kept, an invalid one rebuilt. Elsewhere the schema editor's own.
"""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

INDEX = models.Index(fields=["id"], name="op_cancellable_id_idx", condition=Q(status__in=["queued", "retry_wait"]))


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, INDEX)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [INDEX.name])
        row = cursor.fetchone()
    if row and row[0]:
        return
    if row:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")
    schema_editor.add_index(model, INDEX, concurrently=True)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")
    else:
        schema_editor.remove_index(apps.get_model("ledger", "Operation"), INDEX)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0025_partition_attempts_and_events"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="operation", index=INDEX)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
