"""Search that finds things: case-insensitive substring search of the console over
the columns written once — key, reconciliation handle, execution and correlation ids — served
on PostgreSQL by trigram GIN indexes (pg_trgm) on exactly the expression Django's
``icontains`` compares, ``UPPER(col::text)``; partial where the column is often empty. A
completion never writes these columns, so it pays nothing for them. The provider ref, written
at completion, keeps one btree index, now with pattern ops so a prefix search can use it.
SQLite has no trigram indexes: its LIKE reads the rows (fine at embedded sizes)."""

from typing import Any

from django.db import migrations, models

# The expression is the one ``icontains`` compares on PostgreSQL, so the planner matches it.
TRIGRAM_SQL = (
    "CREATE INDEX IF NOT EXISTS {name} ON ledger_operation USING gin ((UPPER({column}::text)) gin_trgm_ops){where}"
)
PARTIAL = " WHERE {column} <> ''"
# (index name, column, partial: only rows where the column is not empty)
TRIGRAM_INDEXES = [
    ("op_key_trgm", "key", False),
    ("op_handle_trgm", "reconciliation_handle", True),
    ("op_execution_trgm", "execution_id", True),
    ("op_correlation_trgm", "correlation_id", True),
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
        ("ledger", "0009_provider_credentials_and_callback_secret_rotation"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="operation",
            name="op_ref_idx",
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(("provider_ref", ""), _negated=True),
                fields=["provider_ref"],
                name="op_ref_idx",
                opclasses=["varchar_pattern_ops"],
            ),
        ),
        # CREATE EXTENSION IF NOT EXISTS pg_trgm; a no-op on other databases.
        migrations.RunPython(create_trigram_extension, migrations.RunPython.noop),
        migrations.RunPython(create_trigram_indexes, drop_trigram_indexes),
    ]
