"""Dashboard and console reads that stay on small indexes at ten million rows.

- ``op_open_updated_idx``: operations not in a terminal state, by ``(updated_at, id)``. The
  dashboard's "stuck" rows (open, not moved for STUCK_ALERT_SECONDS, oldest first) walked the
  table (1.8 s at ten million rows), and the console's needs=stuck filter counted up to 10,000
  rows by walking the primary key (2.5 s). Partial on "not finished", so its entries are the
  work under way: a claim adds one, a completion none.
- ``opevent_review_exit_idx``: events that moved a row out of review, by time, for the
  dashboard's activity chart (review decisions per hour), which otherwise read every event of
  every operation touched in the last 24 hours (1.5 s). Only review decisions write here.

Built CONCURRENTLY on PostgreSQL (no lock on writes while ten million rows are indexed), so
the migration is not atomic; a build interrupted half-way leaves an invalid index, dropped
and built again by a rerun, while a valid one is kept. Elsewhere the schema editor's plain
CREATE INDEX.
"""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

OPEN = models.Index(
    fields=["updated_at", "id"],
    name="op_open_updated_idx",
    condition=~Q(status__in=["abandoned", "failed", "succeeded"]),
)
REVIEW_EXITS = models.Index(
    fields=["at"],
    name="opevent_review_exit_idx",
    condition=Q(from_status="review") & ~Q(to_status="review"),
)
WHERE = [("Operation", OPEN), ("OperationEvent", REVIEW_EXITS)]


def _valid(schema_editor: Any, name: str) -> bool | None:
    """Whether the index exists and is valid (None: it does not exist)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def forwards(apps: Any, schema_editor: Any) -> None:
    for model_name, index in WHERE:
        model = apps.get_model("ledger", model_name)
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.add_index(model, index)
            continue
        valid = _valid(schema_editor, index.name)
        if valid:
            continue
        if valid is False:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
        schema_editor.add_index(model, index, concurrently=True)


def backwards(apps: Any, schema_editor: Any) -> None:
    for model_name, index in WHERE:
        model = apps.get_model("ledger", model_name)
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0021_cheaper_growth"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="operation", index=OPEN),
                migrations.AddIndex(model_name="operationevent", index=REVIEW_EXITS),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
