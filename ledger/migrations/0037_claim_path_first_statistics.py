"""The claim path's tables take their first statistics only once they hold 1,000 changed rows.

The claim path's statements each read one row by a unique key and are sent with no planner
setting (docs/adr/0010-claim-path-plans-from-statistics.md). What protects them on a fresh
deployment is the tables' own statistics: a table never analyzed is planned as ten pages at
least, where an index look-up by key costs less than a sequential scan; autovacuum's first
ANALYZE by default comes after 50 changed rows — three pages of operations, where the
sequential scan is cheaper, and a prepared statement's generic plan keeps that scan while the
table grows until the next ANALYZE, up to a minute later. With the threshold at 1,000 the first
statistics describe a table of 60 pages or more (operations; 10 or more for tombstones), where
every look-up by key plans its index; later ANALYZEs come as before (the scale factors of
migration 0021 dominate past a few tens of thousands of rows). A VACUUM writes statistics too
(the table's pages and rows): autovacuum's first one by default follows 50 dead rows — 50
completions, each of which leaves the row's old version — so its threshold moves to 1,000
as well (inserts already wait for 1,000 by default).

A storage parameter: ALTER TABLE … SET takes a SHARE UPDATE EXCLUSIVE lock, which blocks
neither reads nor writes, and rewrites nothing. ``ledger_attempt`` is partitioned (migration
0025): the parameter goes on each existing partition, and ``ledger.platform.partitions`` gives
it to the partitions it makes. SQLite has no planner statistics of this kind: nothing to do.
"""

from typing import Any

from django.db import migrations

SETTINGS = ("autovacuum_analyze_threshold", "autovacuum_vacuum_threshold")
VALUE = 1000
TABLES = ("ledger_operation", "ledger_tombstone")
PARTITIONED = ("ledger_attempt",)


def _tables(schema_editor: Any) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent::regclass::text = ANY (%s) ORDER BY c.relname",
            [list(PARTITIONED)],
        )
        return [*TABLES, *(row[0] for row in cursor.fetchall())]


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table in _tables(schema_editor):
            schema_editor.execute(f"ALTER TABLE {table} SET ({', '.join(f'{s} = {VALUE}' for s in SETTINGS)})")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table in _tables(schema_editor):
            schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0036_provider_concurrency_aimd"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
