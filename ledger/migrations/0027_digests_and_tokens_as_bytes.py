"""Request fingerprints and lease tokens stored as their bytes (item 3: cheaper growth).

A fingerprint is a sha256 written as 64 hex characters (65 bytes in a varchar), a lease token
16 random bytes written as 32 (33 bytes): on PostgreSQL they become ``bytea`` holding the bytes
(33 and 17), ~64 bytes less per operation with its attempt (the operation's fingerprint and
token, the attempt's token) and 32 per tombstone. Python, the API, the console and exports keep
the hex text: ``ledger.models.HexBytesField`` converts at the boundary (DESIGN §12, *Cheaper
growth*). Any other text found in these columns (the service never writes one) is kept as
written, in the field's escaped form, so the conversion loses nothing and reverses exactly.

**Cost on an existing database (PostgreSQL): a rewrite under an exclusive lock.** ``ALTER
COLUMN … TYPE`` rewrites each table and rebuilds all its indexes while holding ACCESS EXCLUSIVE
(no reads, no writes): operations (both columns in one rewrite), every partition of attempts,
and tombstones. Nothing reads or writes the ledger meanwhile — a maintenance window of the
time PostgreSQL takes to copy the tables and build their indexes (on this machine ~1 minute at
1M operations; at 10M, several minutes; measure a restored copy before). The lock is asked with
a ``lock_timeout`` of 10 s, so a busy moment fails the migration instead of queueing every
request behind it; re-run it. An online form (a new column, backfilled in batches, written by
both versions, then swapped) would avoid the window at the cost of a release in between; not
done. SQLite keeps the text: nothing changes there.
"""

from typing import Any

from django.db import migrations

import ledger.models

# (table, column, hex digits of a canonical value)
COLUMNS = {
    "ledger_operation": [("fingerprint", 64), ("lease_token", 32)],
    "ledger_attempt": [("lease_token", 32)],
    "ledger_tombstone": [("fingerprint", 64)],
}


def _to_bytes(column: str, digits: int) -> str:
    # ledger.models.hex_to_bytes in SQL: canonical hex → its bytes; '' → empty; other text →
    # 0x00 + UTF-8 (+ 0x00 when that is exactly a canonical value's length).
    return (
        f"CASE WHEN {column} ~ '^[0-9a-f]{{{digits}}}$' THEN decode({column}, 'hex')"
        f" WHEN {column} = '' THEN ''::bytea"
        f" WHEN octet_length({column}) + 1 = {digits // 2}"
        rf" THEN '\x00'::bytea || convert_to({column}, 'UTF8') || '\x00'::bytea"
        rf" ELSE '\x00'::bytea || convert_to({column}, 'UTF8') END"
    )


def _to_text(column: str, digits: int) -> str:
    # ledger.models.bytes_to_hex in SQL.
    n = digits // 2
    return (
        f"CASE WHEN octet_length({column}) = {n} THEN encode({column}, 'hex')"
        f" WHEN octet_length({column}) = 0 THEN ''"
        f" WHEN octet_length({column}) = {n + 1} AND get_byte({column}, {n}) = 0"
        f" THEN convert_from(substring({column} FROM 2 FOR {n - 1}), 'UTF8')"
        f" ELSE convert_from(substring({column} FROM 2), 'UTF8') END"
    )


def _alter(schema_editor: Any, *, forward: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("SET LOCAL lock_timeout = '10s'")
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"ALTER COLUMN {column} TYPE bytea USING {_to_bytes(column, digits)}"
            if forward
            else f"ALTER COLUMN {column} TYPE varchar({digits}) USING {_to_text(column, digits)}"
            for column, digits in columns
        )
        # One statement per table: one rewrite of it, however many columns change.
        schema_editor.execute(f"ALTER TABLE {table} {changes}")


def forward(apps: Any, schema_editor: Any) -> None:
    _alter(schema_editor, forward=True)


def backward(apps: Any, schema_editor: Any) -> None:
    _alter(schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0026_cancellable_rows_in_list_order"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # PostgreSQL's columns change in _alter (the schema editor's own ALTER would cast the
            # text's characters to bytes); SQLite's stay varchar, as the field declares there.
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.AlterField(
                    model_name="operation",
                    name="fingerprint",
                    field=ledger.models.HexBytesField(hex_length=64),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="lease_token",
                    field=ledger.models.HexBytesField(blank=True, hex_length=32),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="lease_token",
                    field=ledger.models.HexBytesField(hex_length=32),
                ),
                migrations.AlterField(
                    model_name="tombstone",
                    name="fingerprint",
                    field=ledger.models.HexBytesField(hex_length=64),
                ),
            ],
        ),
    ]
