"""Search that finds things: the DLQ list's case-insensitive substring search over
what an entry is written with at ingest — identity, original key, execution id, workflow name,
failed node, error message — served on PostgreSQL by trigram GIN indexes (pg_trgm) on
exactly the expression Django's ``icontains`` compares, ``UPPER(col::text)``; partial where
the column is often empty. Replays and status changes never write these columns. SQLite has
no trigram indexes: its LIKE reads the rows."""

from typing import Any

from django.db import migrations

# The expression is the one ``icontains`` compares on PostgreSQL, so the planner matches it.
TRIGRAM_SQL = (
    "CREATE INDEX IF NOT EXISTS {name} ON dlq_failedevent USING gin ((UPPER({column}::text)) gin_trgm_ops){where}"
)
PARTIAL = " WHERE {column} <> ''"
# (index name, column, partial: only rows where the column is not empty)
TRIGRAM_INDEXES = [
    ("fe_event_trgm", "event_id", False),
    ("fe_key_trgm", "original_key", True),
    ("fe_execution_trgm", "source_execution_id", True),
    ("fe_workflow_name_trgm", "source_workflow_name", True),
    ("fe_node_trgm", "source_node", True),
    ("fe_error_trgm", "error_message", True),
]


def create_trigram_extension(apps: Any, schema_editor: Any) -> None:
    """CREATE EXTENSION pg_trgm on PostgreSQL only. Not TrigramExtension(): unapplied on
    SQLite it asks pg_extension whether to drop it, a table SQLite does not have. Unapplying
    leaves the extension in place (other indexes may use it)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")


def create_trigram_indexes(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, column, partial in TRIGRAM_INDEXES:
        schema_editor.execute(
            TRIGRAM_SQL.format(name=name, column=column, where=PARTIAL.format(column=column) if partial else "")
        )


def drop_trigram_indexes(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _, _ in TRIGRAM_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0006_alerts_to_their_own_app"),
    ]

    operations = [
        # CREATE EXTENSION IF NOT EXISTS pg_trgm; a no-op on other databases.
        migrations.RunPython(create_trigram_extension, migrations.RunPython.noop),
        migrations.RunPython(create_trigram_indexes, drop_trigram_indexes),
    ]
