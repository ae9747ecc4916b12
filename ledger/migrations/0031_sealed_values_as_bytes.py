"""Sealed values stored as their bytes (item 3: cheaper growth).

A sealed value is the jsonb ``{"_enc": "v2:<key id>:<urlsafe base64 of nonce + ciphertext>"}``
(ledger.platform.crypto): base64 adds a third to the ciphertext and jsonb its object header, ~138 bytes
for the bench's payload. On PostgreSQL the operation's ``request``, ``payload`` and
``response_body`` and the attempt's ``response_body`` become ``bytea``: an envelope as 0x01, the
length of its ``<version>:<key id>``, that text and the raw nonce + ciphertext; any other value
(plain, written with encryption off; a redaction marker; an envelope whose text is not canonical
base64) as 0x00 and its JSON text (``ledger.models.SealedJSONField``, which converts at the
boundary: Python, the API, the console and exports keep the JSON value; DESIGN §12, *Cheaper
growth*). The conversion below is ``ledger.models.sealed_to_bytes`` in SQL (a value it stores as
JSON keeps jsonb's text, spaces included: it reads back equal), and its reverse rebuilds the
same jsonb, so the migration reverses exactly.

**Cost on an existing database (PostgreSQL): a rewrite under an exclusive lock**, like 0027.
``ALTER COLUMN … TYPE`` rewrites the operations table (the three columns in one rewrite) and
every partition of attempts, and rebuilds all their indexes, holding ACCESS EXCLUSIVE (no reads,
no writes) meanwhile: a maintenance window of the time PostgreSQL takes to copy the tables,
convert each value and build their indexes (measured in DESIGN §12: about a minute at 1M
operations on this machine; at 10M, ten times that — measure a restored copy before). The lock
is asked with a ``lock_timeout`` of 10 s, so a busy moment fails the migration instead of
queueing every request behind it; re-run it. SQLite keeps its JSON text: nothing changes there.
"""

from typing import Any

from django.db import migrations

import ledger.models

COLUMNS = {
    "ledger_operation": ["request", "payload", "response_body"],
    "ledger_attempt": ["response_body"],
}
# ledger.models.fields._ENVELOPE_TEXT
_ENVELOPE_RE = "^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{1,32}:([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?$"


def _base64(raw: str) -> str:
    # urlsafe base64 of bytea ``raw``, unbroken (encode() breaks lines every 76 characters).
    return f"translate(replace(encode({raw}, 'base64'), E'\\n', ''), '+/', '-_')"


def to_bytes(column: str) -> str:
    """ledger.models.sealed_to_bytes in SQL, from jsonb. CASE tests its conditions in order, so
    nothing is decoded before its shape is known to decode. (``coalesce(…, false)``, not
    ``IS NOT TRUE``: PostgreSQL 15 fails the latter in a partitioned table's USING expression
    with "unrecognized node type".)"""
    envelope = f"({column} ->> '_enc')"
    head = f"(split_part({envelope}, ':', 1) || ':' || split_part({envelope}, ':', 2))"
    token = f"split_part({envelope}, ':', 3)"
    raw = f"decode(translate({token}, '-_', '+/'), 'base64')"
    as_json = rf"'\x00'::bytea || convert_to({column}::text, 'UTF8')"
    return (
        f"CASE WHEN {column} IS NULL THEN NULL"
        f" WHEN jsonb_typeof({column}) <> 'object' THEN {as_json}"
        f" WHEN NOT coalesce({column} - '_enc' = '{{}}'::jsonb AND jsonb_typeof({column} -> '_enc') = 'string', false)"
        f" THEN {as_json}"
        f" WHEN NOT coalesce({envelope} ~ '{_ENVELOPE_RE}', false) THEN {as_json}"
        f" WHEN {_base64(raw)} <> {token} THEN {as_json}"
        rf" ELSE '\x01'::bytea || set_byte('\x00'::bytea, 0, octet_length({head}))"
        f" || convert_to({head}, 'UTF8') || {raw} END"
    )


def to_jsonb(column: str) -> str:
    """ledger.models.bytes_to_sealed in SQL, to jsonb."""
    n = f"get_byte({column}, 1)"
    return (
        f"CASE WHEN {column} IS NULL THEN NULL"
        f" WHEN get_byte({column}, 0) = 1 THEN jsonb_build_object('_enc',"
        f" convert_from(substring({column} FROM 3 FOR {n}), 'UTF8') || ':' || {_base64(f'substring({column} FROM 3 + {n})')})"
        f" ELSE convert_from(substring({column} FROM 2), 'UTF8')::jsonb END"
    )


def _alter(schema_editor: Any, *, forward: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("SET LOCAL lock_timeout = '10s'")
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"ALTER COLUMN {column} TYPE bytea USING {to_bytes(column)}"
            if forward
            else f"ALTER COLUMN {column} TYPE jsonb USING {to_jsonb(column)}"
            for column in columns
        )
        # One statement per table: one rewrite of it, however many columns change.
        schema_editor.execute(f"ALTER TABLE {table} {changes}")


def forward(apps: Any, schema_editor: Any) -> None:
    _alter(schema_editor, forward=True)


def backward(apps: Any, schema_editor: Any) -> None:
    _alter(schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0030_attempt_event_composite_pk"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # PostgreSQL's columns change in _alter (the schema editor's own ALTER cannot cast
            # jsonb to bytea); SQLite's stay JSON text, as the field declares there.
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.AlterField(
                    model_name="operation",
                    name="request",
                    field=ledger.models.SealedJSONField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="payload",
                    field=ledger.models.SealedJSONField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="response_body",
                    field=ledger.models.SealedJSONField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="response_body",
                    field=ledger.models.SealedJSONField(blank=True, null=True),
                ),
            ],
        ),
    ]
