"""The ledger's own column types and lookups: ``NewRowId`` (the id of a new row of a history
table keyed on ``(id, <time>)``), ``Counter`` (a non-negative integer without a CHECK),
``HexBytesField`` (hex text stored as bytes on PostgreSQL) and ``SealedJSONField`` (a sealed
JSON value stored as bytes on PostgreSQL) with its ``has_key`` and ``sealed_under`` lookups,
and the conversions between their Python and stored forms.

Migrations name each by the package (``ledger.models.Counter``, as Django's own deconstruct to
``django.db.models.<Name>``): their ``deconstruct()`` says so, so a move inside the package
changes no migration."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Lookup
from django.db.models.fields.json import HasKey, KeyTransform, KeyTransformStartsWith

from ledger.platform.crypto import ENVELOPE


class NewRowId(models.Func):
    """The id the database gives a new row of ``table``, as a field's ``db_default``, for the
    history tables whose primary key is ``(id, <time>)`` (a ``CompositePrimaryKey``: Django
    allows an AutoField only as the whole primary key, fields.E100).

    Django sends ``DEFAULT`` for it where the backend has that keyword (PostgreSQL: the column's
    identity, the sequence the raw statements of ``queries.sql`` also draw from) and this
    expression where it has not (SQLite, whose table keeps ``id integer PRIMARY KEY`` — a rowid
    alias — so NULL there asks for the next rowid). Either way the insert returns the id
    (``RETURNING``), so a created row knows its primary key. Migrations never write it as a
    column default: the columns already have their own (ledger migration 0030).
    """

    allowed_default = True
    output_field = models.BigIntegerField()

    def __init__(self, table: str) -> None:
        super().__init__()
        self.table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NewRowId) and other.table == self.table

    def __hash__(self) -> int:
        return hash((type(self), self.table))

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return "ledger.models.NewRowId", (self.table,), {}

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        # The identity's sequence by the column, not by name: a sequence recreated by a
        # migration may be named otherwise. (Only a schema change would compile this.)
        return f"nextval(pg_get_serial_sequence('{self.table}', 'id'))", []

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        return "NULL", []


class Counter(models.IntegerField):
    """A non-negative integer of the hot ledger tables, written only by the services' SQL.

    Unlike PositiveIntegerField it has no database CHECK (validators and forms still say
    ``>= 0``): PostgreSQL rebuilds every CHECK expression of a table from its stored text on
    each INSERT and UPDATE statement, and these ten trivial ones cost a claim→complete about
    a tenth of its database CPU. The state machine's invariants keep their CHECKs.
    """

    default_validators = [MinValueValidator(0)]

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "ledger.models.Counter", args, kwargs

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"min_value": 0, **kwargs})


_LOWER_HEX = re.compile(r"[0-9a-f]*")


class HexBytesField(models.CharField):
    """A digest or token: lowercase hex text in Python — services, API, console, exports all
    see the text — and its bytes in PostgreSQL (``bytea``: a 64-character fingerprint in 33
    bytes instead of 65, a 32-character lease token in 17 instead of 33; the cheaper growth
    of docs/explanation/scale.md). SQLite keeps the text. This is the one place the two forms meet: the ORM converts
    through these methods, and ``ledger.store.statements`` (the named statements' ``fingerprint`` and
    ``lease_token`` parameters) and the tombstone writer through ``get_db_prep_value``.

    Text that is not ``hex_length`` lowercase hex digits — never written by the service, but a
    client may send any lease token, and a hand-written row may hold anything — is stored as a
    0x00 byte and its UTF-8 (one more 0x00 if that would make it exactly as long as a hex
    value's bytes), so it reads back as written and never equals a hex value's bytes. ``''``
    is empty bytes. Text holding NUL cannot be stored (PostgreSQL's text never could)."""

    def __init__(self, *args: Any, hex_length: int, **kwargs: Any) -> None:
        self.hex_length = hex_length
        kwargs.setdefault("max_length", hex_length)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        kwargs["hex_length"] = self.hex_length
        if kwargs.get("max_length") == self.hex_length:
            del kwargs["max_length"]
        return name, "ledger.models.HexBytesField", args, kwargs

    def db_type(self, connection: Any) -> str | None:
        return "bytea" if connection.vendor == "postgresql" else super().db_type(connection)

    def cast_db_type(self, connection: Any) -> str | None:
        return self.db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        value = super().get_db_prep_value(value, connection, prepared)
        if connection.vendor != "postgresql" or value is None or isinstance(value, (bytes, memoryview)):
            return value
        return hex_to_bytes(str(value), self.hex_length)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, (bytes, memoryview)):
            return bytes_to_hex(bytes(value), self.hex_length)
        return value


def hex_to_bytes(text: str, hex_length: int) -> bytes:
    """The stored form of ``text`` (HexBytesField)."""
    if len(text) == hex_length and _LOWER_HEX.fullmatch(text):
        return bytes.fromhex(text)
    if not text:
        return b""
    if "\x00" in text:
        raise ValueError("a digest or token cannot hold NUL")
    raw = b"\x00" + text.encode()
    return raw + b"\x00" if len(raw) == hex_length // 2 else raw


def bytes_to_hex(raw: bytes, hex_length: int) -> str:
    """The text ``raw`` was stored from (HexBytesField)."""
    if len(raw) == hex_length // 2:
        return raw.hex()
    if not raw:
        return ""
    text = raw[1:]
    if len(raw) == hex_length // 2 + 1 and text.endswith(b"\x00"):
        text = text[:-1]
    return text.decode()


# SealedJSONField's stored forms (PostgreSQL): the first byte says which.
STORED_JSON = 0
STORED_SEALED = 1
# A sealed envelope's text: "<version>:<key id>" (ledger.platform.crypto), then its nonce and ciphertext
# as canonical urlsafe base64 (padded). Only such text is stored as its bytes.
_ENVELOPE_TEXT = re.compile(
    r"([A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{1,32}):((?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?)"
)


class SealedJSONField(models.JSONField):
    """A JSON value that is usually a sealed envelope (``{"_enc": "v2:<key id>:<base64>"}``,
    ledger.platform.crypto): the operation's payload, request and recorded response, the attempt's
    response. Python — services, API, console, exports, erasure, rotation, the DLQ — sees the
    JSON value, exactly as a JSONField gives it; PostgreSQL stores ``bytea`` (the cheaper growth of
    docs/explanation/scale.md): an envelope as a 0x01 byte, the length of its ``<version>:<key id>``, that text and
    the raw nonce and ciphertext — no base64, no jsonb header, ~40 bytes less per value — and
    any other value (plain, with encryption off; a redaction marker; an envelope whose text is
    not canonical) as a 0x00 byte and its compact UTF-8 JSON, read back as written (keys in the
    order written, not jsonb's). SQL NULL stays NULL. SQLite keeps JSON text: nothing changes
    there. This is the one place the forms meet: the ORM converts through these methods, and
    ``ledger.store.statements`` (the named statements' ``request``, ``payload`` and ``response_body``)
    and the retention purge's batched update through ``get_db_prep_value``.

    On PostgreSQL the column answers ``isnull``, ``has_key`` and ``sealed_under`` (sealed under
    a ``<version>:<key id>``: key rotation) only; JSON paths and containment are not
    available there (nothing filters on what a sealed value holds: it cannot be read in SQL)."""

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "ledger.models.SealedJSONField", args, kwargs

    def db_type(self, connection: Any) -> str | None:
        return "bytea" if connection.vendor == "postgresql" else super().db_type(connection)

    def cast_db_type(self, connection: Any) -> str | None:
        return self.db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if connection.vendor != "postgresql":
            return super().get_db_prep_value(value, connection, prepared)
        if not prepared:
            value = self.get_prep_value(value)
        if isinstance(value, (bytes, memoryview)) or hasattr(value, "as_sql"):
            return value
        return sealed_to_bytes(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, (bytes, memoryview)):
            return bytes_to_sealed(bytes(value))
        return super().from_db_value(value, expression, connection)


def sealed_to_bytes(value: Any) -> bytes:
    """The stored form of a JSON value (SealedJSONField, PostgreSQL)."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(ENVELOPE), str):
        match = _ENVELOPE_TEXT.fullmatch(value[ENVELOPE])
        if match:
            raw = base64.urlsafe_b64decode(match[2])
            # Canonical only (no stray bits in the last character): it must read back as written.
            if base64.urlsafe_b64encode(raw).decode() == match[2]:
                head = match[1].encode()
                return bytes((STORED_SEALED, len(head))) + head + raw
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return bytes((STORED_JSON,)) + text.encode()


def bytes_to_sealed(raw: bytes) -> Any:
    """The JSON value ``raw`` was stored from (SealedJSONField)."""
    kind = raw[:1]
    if kind == bytes((STORED_SEALED,)):
        end = 2 + raw[1]
        return {ENVELOPE: f"{raw[2:end].decode()}:{base64.urlsafe_b64encode(raw[end:]).decode()}"}
    if kind == bytes((STORED_JSON,)):
        return json.loads(raw[1:])
    raise ValueError(f"not a stored JSON value (first byte {raw[:1]!r})")


@SealedJSONField.register_lookup
class SealedHasKey(Lookup):
    """``has_key`` (the JSONField lookup) on the stored form: an envelope has only its own key."""

    lookup_name = "has_key"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return compiler.compile(HasKey(self.lhs, self.rhs))

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, params = self.process_lhs(compiler, connection)
        sealed = "TRUE" if self.rhs == ENVELOPE else "FALSE"
        return (
            f"(CASE get_byte({lhs}, 0) WHEN {STORED_SEALED} THEN {sealed}"
            f" ELSE convert_from(substring({lhs} FROM 2), 'UTF8')::jsonb ? %s END)",
            [*params, *params, str(self.rhs)],
        )


@SealedJSONField.register_lookup
class SealedUnder(Lookup):
    """Sealed under ``<version>:<key id>`` (key rotation's rows already under the current key):
    the envelope's text starts with it and a colon."""

    lookup_name = "sealed_under"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return compiler.compile(KeyTransformStartsWith(KeyTransform(ENVELOPE, self.lhs), f"{self.rhs}:"))

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, params = self.process_lhs(compiler, connection)
        head = str(self.rhs).encode()
        prefix = bytes((STORED_SEALED, len(head))) + head
        return f"substring({lhs} FROM 1 FOR {len(prefix)}) = %s", [*params, prefix]
