"""One trigram index for the console's substring search instead of four.

``op_key_trgm``, ``op_handle_trgm``, ``op_execution_trgm`` and ``op_correlation_trgm`` (migration
0010) each held the trigrams of one column; ``op_search_trgm`` holds those of the four columns
joined by a control character (``ledger.protocol.selectors.SearchText``, the expression the search
compares: a test holds that the search's plan uses this index): one GIN entry list per row instead of up to four, trigrams the columns share
(an execution and a correlation id of the same run) stored once — 130 → 96 bytes per operation
on the bench fill — and one GIN insertion per claim instead of four. The search reads one
bitmap instead of four. A match never spans two columns: the separator is chr(1), and a search
text holding it is compared column by column instead.

CONCURRENTLY on PostgreSQL (no lock on writes), so not atomic; an invalid index left by an
interrupted run is rebuilt. SQLite has no trigram indexes: nothing to do there.
"""

from typing import Any

from django.db import migrations

NEW = "op_search_trgm"
# Django's icontains over ledger.protocol.selectors.SearchText renders UPPER((…)::text): the same tree.
EXPRESSION = (
    "(UPPER((key || chr(1) || reconciliation_handle || chr(1) || execution_id || chr(1) || correlation_id)::text))"
)
# (index, column, partial) as migration 0010 made them.
OLD = [
    ("op_key_trgm", "key", False),
    ("op_handle_trgm", "reconciliation_handle", True),
    ("op_execution_trgm", "execution_id", True),
    ("op_correlation_trgm", "correlation_id", True),
]


def _valid(schema_editor: Any, name: str) -> bool | None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    valid = _valid(schema_editor, NEW)
    if valid is False:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NEW}")
    if not valid:
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {NEW} ON ledger_operation USING gin ({EXPRESSION} gin_trgm_ops)"
        )
    for name, _, _ in OLD:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, column, partial in OLD:
        where = f" WHERE {column} <> ''" if partial else ""
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON ledger_operation"
            f" USING gin ((UPPER({column}::text)) gin_trgm_ops){where}"
        )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NEW}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0027_digests_and_tokens_as_bytes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
