"""The open rows' index in the console's list order, replacing ``ledger.0022``'s.

``op_open_updated_idx`` (updated_at, id) served the needs=stuck count and the dashboard's
stuck rows, but the needs=stuck page is newest first (by id): at ten million rows PostgreSQL
walked the primary key and filtered 10,221 rows for a page of 100. ``op_open_id_idx`` is the
same rows (not in a terminal state) in id order, with ``updated_at`` as a second key column,
so "not moved since the cutoff" is checked on the index entry: the page reads its 100 rows,
the count a range of entries, needs=cancellable the open rows only.

CONCURRENTLY on PostgreSQL (no lock on writes), so not atomic; a valid index left by an
interrupted run is kept, an invalid one rebuilt. Elsewhere the schema editor's own.
"""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

NOT_FINISHED = ~Q(status__in=["abandoned", "failed", "succeeded"])
NEW = models.Index(fields=["id", "updated_at"], name="op_open_id_idx", condition=NOT_FINISHED)
OLD = models.Index(fields=["updated_at", "id"], name="op_open_updated_idx", condition=NOT_FINISHED)


def _valid(schema_editor: Any, name: str) -> bool | None:
    """Whether the index exists and is valid (None: it does not exist)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def _create(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, index)
        return
    valid = _valid(schema_editor, index.name)
    if valid:
        return
    if valid is False:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
    schema_editor.add_index(model, index, concurrently=True)


def _drop(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
    else:
        schema_editor.remove_index(model, index)


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    _create(schema_editor, model, NEW)
    _drop(schema_editor, model, OLD)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    _create(schema_editor, model, OLD)
    _drop(schema_editor, model, NEW)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0023_upload_retain_until"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="operation", name="op_open_updated_idx"),
                migrations.AddIndex(model_name="operation", index=NEW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
