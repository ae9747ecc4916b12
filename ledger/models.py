"""Ledger tables, states and constraints. No business logic: writes live in services."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Lookup, Q
from django.db.models.fields.json import HasKey, KeyTransform, KeyTransformStartsWith

from ledger.platform.errors import DestinationNotAllowed
from ledger.platform.storable import MAX_DURATION_SECONDS
from ledger.rules.intents import intent_config_errors
from ledger.rules.outbound import outbound_check, outbound_prefixes_check
from ledger.rules.provider_checks import (
    NAMESPACE_MAX_LENGTH,
    NAMESPACE_PATTERN,
    async_config_errors,
    provider_config_errors,
    secret_namespace_choose,
)


class OperationStatus(models.TextChoices):
    # Every move out of a state is a named function in ledger.protocol.transitions (its __init__ lists
    # where each state is entered); nothing else writes a status (tests/test_state_writes.py).

    # execute mode: accepted, waiting for a worker. Out: a worker taking the lease
    # (operation_take); an operator's cancel (operation_cancel).
    QUEUED = "queued", "queued"
    # a lease is held; the effect may be under way. Out: the holder (operation_complete,
    # operation_fail, operation_wait); the sweeper once the lease has expired
    # (operation_lease_expire, operation_poll_lease_expire for a poll's lease); for a poll,
    # the poller past the lifetime (operation_poll_review) or the output check
    # (operation_output_reject).
    CLAIMED = "claimed", "claimed"
    # failed before the effect could have happened; next_attempt_at set. Out: the next
    # claim once due (guard: operation_reclaim), a worker once due (execute: operation_take),
    # the sweeper or a late claim at end of life (operation_expire_retry), an operator's
    # cancel (operation_cancel), the eligibility webhook's "not wanted" (operation_not_wanted),
    # a replay not retried in place or a run's resume (operation_replay_not_retried,
    # operation_redrive).
    RETRY_WAIT = "retry_wait", "retry wait"
    # sent to an asynchronous provider, which accepted it as a job (provider_ref holds its job
    # id); no lease is held; next_attempt_at is the next poll. Out: a worker's poll or the
    # provider's signed webhook (→ claimed under a short poll lease: operation_poll_take); the
    # sweeper when the lifetime passed and no worker polled it (→ review:
    # operation_unpolled_review). DESIGN §5, asynchronous providers.
    WAITING = "waiting", "waiting on provider"
    # outcome unknown (timeout/reset after send, lease expired after `sent`). Out: the
    # sweeper's reconciliation (operation_found_succeeded, operation_found_failed,
    # operation_found_waiting, operation_reissue, operation_not_found_failed,
    # operation_hand_to_review); the last holder's late operation_complete/operation_fail.
    UNCERTAIN = "uncertain", "uncertain"
    # a human must decide. Out: a reviewer's decision (operation_review_resolve); the last
    # holder's late operation_complete/operation_fail.
    REVIEW = "review", "review"
    # effect confirmed, provider_ref and response recorded. Terminal.
    SUCCEEDED = "succeeded", "succeeded"
    # the effect definitely did not happen and won't be retried; a DLQ entry exists.
    # Terminal (a replay creates lineage, never edits: operation_supersede records it).
    FAILED = "failed", "failed"
    # a reviewer decided not to do it, or an operator cancelled it while queued or waiting
    # for a retry. Terminal.
    ABANDONED = "abandoned", "abandoned"


S = OperationStatus
TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.ABANDONED})
OPEN_STATES = frozenset(set(S) - TERMINAL_STATES)
# States whose latest lease holder may still report a result (DESIGN §3 fencing).
REPORTABLE_STATES = frozenset({S.CLAIMED, S.UNCERTAIN, S.REVIEW})
UNRESOLVED_STATES = frozenset({S.UNCERTAIN, S.REVIEW})

# The only moves there are. Anything else is a bug and raises IllegalTransition.
ALLOWED_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({S.CLAIMED, S.QUEUED}),
    # → abandoned: an operator's cancel (operation_cancel), only while nothing is under way.
    S.QUEUED: frozenset({S.CLAIMED, S.ABANDONED}),
    # → waiting: an asynchronous provider accepted the job (or a poll found it still pending,
    # or a poll lease expired: polls change nothing at the provider).
    S.CLAIMED: frozenset({S.SUCCEEDED, S.FAILED, S.RETRY_WAIT, S.UNCERTAIN, S.REVIEW, S.WAITING}),
    S.RETRY_WAIT: frozenset({S.CLAIMED, S.FAILED, S.ABANDONED}),
    # → claimed: a poll or the provider's webhook takes it under a short lease; → review: its
    # lifetime passed while nobody polled it (the provider may still render).
    S.WAITING: frozenset({S.CLAIMED, S.REVIEW}),
    # → waiting: the sweeper's lookup found the asynchronous provider's job.
    S.UNCERTAIN: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.REVIEW, S.FAILED, S.WAITING}),
    S.REVIEW: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.ABANDONED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.ABANDONED: frozenset(),
}


class Checkpoint(models.TextChoices):
    """A step's state as its run shows it (DESIGN §3, runs): what an operator needs to know to
    resume a business transaction — done, failed (not done, and nothing will do it on its
    own), uncertain (may have happened), in progress, or pending (not yet, but it will be)."""

    PENDING = "pending", "pending"
    IN_PROGRESS = "in_progress", "in progress"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    UNCERTAIN = "uncertain", "uncertain"


# Every ledger state in exactly one checkpoint state; the runs API and console read this.
CHECKPOINT_OF: dict[str, str] = {
    S.QUEUED: Checkpoint.PENDING,
    # nothing happened yet; a worker (or, guard mode, its caller) retries it.
    S.RETRY_WAIT: Checkpoint.PENDING,
    S.CLAIMED: Checkpoint.IN_PROGRESS,
    # the provider has the job and is working on it; polls follow it.
    S.WAITING: Checkpoint.IN_PROGRESS,
    S.UNCERTAIN: Checkpoint.UNCERTAIN,
    S.REVIEW: Checkpoint.UNCERTAIN,
    S.SUCCEEDED: Checkpoint.DONE,
    S.FAILED: Checkpoint.FAILED,
    # not done, and decided so (a cancel, a reviewer, a newer version, "not wanted"): the run
    # shows why; a resume never re-drives it.
    S.ABANDONED: Checkpoint.FAILED,
}
assert set(CHECKPOINT_OF) == set(S.values), "every state needs its checkpoint state"


def sources_of(target: str) -> frozenset[str]:
    """Every state a row may move to ``target`` from, read off the table above."""
    return frozenset(s for s, targets in ALLOWED_TRANSITIONS.items() if s is not None and target in targets)


class OperationMode(models.TextChoices):
    GUARD = "guard", "guard (caller performs the effect)"
    EXECUTE = "execute", "execute (the service performs the effect)"


class ErrorClass(models.TextChoices):
    TRANSIENT = "transient", "transient"
    INVALID_INPUT = "invalid_input", "invalid input"
    PERMISSION = "permission", "permission"
    AMBIGUOUS = "ambiguous", "ambiguous"
    # The provider's output failed its checks (media type by content, size, dimensions,
    # digest: ledger.execution.outputs). Never published; no retry — with the same key a key-enforced
    # provider answers the same job, and so the same output.
    INVALID_OUTPUT = "invalid_output", "invalid output"


# Classes a holder reports through /fail. invalid_output is the service's own verdict on an
# output it fetched (ledger.execution.outputs records it with its own move), not a caller's report.
REPORTED_ERROR_CLASSES = (ErrorClass.TRANSIENT, ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION, ErrorClass.AMBIGUOUS)
# Failures that are final at once: retrying would be refused, or would fetch the same output.
NO_RETRY_ERROR_CLASSES = frozenset({ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION, ErrorClass.INVALID_OUTPUT})


class IdempotencyClass(models.TextChoices):
    # Re-issuing with the same key is safe (Stripe's Idempotency-Key, a unique constraint).
    KEY_ENFORCED = "key_enforced", "key-enforced"
    # Nothing stops a second effect (SMTP, webhooks): uncertain rows go to review.
    KEY_ADVISORY = "key_advisory", "key-advisory"


class AttemptOutcome(models.TextChoices):
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed (definitive)"
    # failed with a definitive "not done" answer; a retry is safe.
    TRANSIENT = "transient", "transient failure"
    # sent, answer unknown; stays so until reconciliation resolves it.
    AMBIGUOUS = "ambiguous", "ambiguous"
    # reconciliation established the effect did not happen.
    NOT_FOUND = "not_found", "not found at provider"
    # lease expired before anything was sent.
    EXPIRED = "expired", "lease expired before send"
    # the result arrived with a superseded token; kept here as evidence only.
    FENCED = "fenced", "fenced (superseded)"


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
        name, path, args, kwargs = super().deconstruct()
        kwargs["hex_length"] = self.hex_length
        if kwargs.get("max_length") == self.hex_length:
            del kwargs["max_length"]
        return name, path, args, kwargs

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


# ledger.platform.crypto.ENVELOPE, the one key of a sealed value (not imported: ledger.platform.crypto's hooks
# import this module).
ENVELOPE = "_enc"
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


def secret_namespace_for(slug: str, *, also_taken: tuple[str, ...] = ()) -> str:
    """The namespace a tenant created now with ``slug`` gets (ledger.rules.provider_checks)."""
    taken = list(Tenant.objects.values_list("secret_namespace", flat=True)) + list(also_taken)
    return secret_namespace_choose(slug, taken)


class TenantManager(models.Manager["Tenant"]):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Tenant]:
        # Tenant.save is not called here: each new tenant still gets its namespace, free of
        # the stored ones and of those given earlier in the batch.
        objs = list(objs)
        given: list[str] = []
        for tenant in objs:
            if not tenant.secret_namespace:
                tenant.secret_namespace = secret_namespace_for(tenant.slug, also_taken=tuple(given))
            given.append(tenant.secret_namespace)
        return super().bulk_create(objs, *args, **kwargs)


class Tenant(models.Model):
    """A customer of the service. Every field here is the platform's: only a superuser changes
    a tenant (the console's ADMIN role sees it, and may only rotate its callback secret)."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Admission limits for execute-mode submissions (None = no limit). They are checked
    # against the open rows under a per-tenant lock, never against a counter that could drift.
    max_in_flight = models.PositiveIntegerField(
        null=True, blank=True, help_text="queued + claimed + retry_wait + waiting"
    )
    max_unresolved = models.PositiveIntegerField(null=True, blank=True, help_text="uncertain + review")
    max_queued_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="request bytes not yet sent")
    budget_amount = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    budget_period_seconds = models.PositiveIntegerField(default=86400, db_default=86400)
    # Callbacks go only to URLs under one of these prefixes (scheme://host[:port]/path), each
    # allowed by the outbound policy and stored in canonical form (ledger.rules.outbound).
    callback_allow_list = models.JSONField(default=list, db_default=[], blank=True)
    # HMAC-SHA256 key signing callback bodies; generated on first use, shown once when made or
    # rotated (manage.py tenant_callback_secret, the console's rotate action), never again.
    # Sealed like payloads (ledger.platform.crypto, under the payload keys, even where payload
    # encryption is off; ledger.protocol.callbacks opens it to sign): a database dump, a replica or a
    # column lookup never holds it in clear. NULL: not made yet.
    callback_secret = SealedJSONField(null=True, blank=True, editable=False)
    # After a rotation the previous secret still signs (a second v1 signature) until
    # rotated_at + CALLBACK_SECRET_OVERLAP_SECONDS, so receivers can switch without a gap.
    callback_secret_previous = SealedJSONField(null=True, blank=True, editable=False)
    callback_secret_rotated_at = models.DateTimeField(null=True, blank=True)
    # Asked "is this still wanted?" before a retry older than its provider's recheck_after
    # (ledger.recovery.eligibility): POSTed a signed question (callback_secret), allowed by the
    # outbound policy, stored in canonical form. Empty: no recheck, retries go ahead.
    eligibility_url = models.CharField(max_length=1000, blank=True, default="", db_default="")
    # Whether new keys may hold an e-mail address or an international phone number (the
    # key rule's `personal_data`, ledger.rules.key_rules): keys are logged and shown in clear.
    # Platform-owned: only a superuser changes it (ledger.web.console.tenants.TenantAdmin).
    personal_data_in_keys_allowed = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Accept new idempotency keys that contain an e-mail address or an international phone"
        " number. Keys are logged and shown in clear: prefer hashing the value into the key.",
    )
    # Which environment variables its providers may read credentials from:
    # <PROVIDER_SECRET_PREFIX><secret_namespace>_<NAME> (ledger.providers.credentials). Assigned once
    # when the tenant is made (derived from the slug where free), never changed with the slug,
    # never on any form (ADR 0001). The database refuses a duplicate, a character outside
    # [A-Z0-9], and one namespace a prefix of another's (triggers of ledger.0032).
    secret_namespace = models.CharField(max_length=NAMESPACE_MAX_LENGTH, unique=True, editable=False)

    objects = TenantManager()

    class Meta:
        # A tenant's callback signing secret is its receivers' business: its admins may rotate
        # it without being allowed to change the tenant (whose fields are the platform's).
        permissions = [("rotate_callback_secret", "Can rotate a tenant's callback signing secret")]
        constraints = [
            models.CheckConstraint(
                condition=Q(secret_namespace__regex=NAMESPACE_PATTERN), name="tenant_secret_namespace_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Assigned once, on the first save; a later slug change keeps it.
        if not self.secret_namespace:
            self.secret_namespace = secret_namespace_for(self.slug)
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # Every allow-list entry passes the outbound policy and is kept in canonical form, so
        # the prefix check at submission compares like with like.
        try:
            self.callback_allow_list = outbound_prefixes_check(
                self.callback_allow_list, purpose="callback allow-list entry"
            )
        except DestinationNotAllowed as exc:
            raise ValidationError({"callback_allow_list": exc.detail}) from None
        if self.eligibility_url:
            try:
                self.eligibility_url = outbound_check(self.eligibility_url, purpose="eligibility webhook").url
            except DestinationNotAllowed as exc:
                raise ValidationError({"eligibility_url": exc.detail}) from None


class ApiKey(models.Model):
    """A tenant's API key. Only a sha256 of the secret is stored; the prefix identifies it."""

    # `payload`: may reveal payloads (with a reason, logged); not implied by `admin`.
    # `audit`: may read a person's data trail (review.subject_apis; implied by `admin`, not by
    # `read`: a trail is about a person).
    SCOPES = ("read", "write", "admin", "payload", "audit")

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    hashed_key = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # After this moment the key authenticates nothing (ledger.tenants.auth); empty = no expiry.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant})"


class ConfigChangeAction(models.TextChoices):
    CREATE = "create", "created"
    UPDATE = "update", "changed"
    DELETE = "delete", "deleted"


class ConfigChange(models.Model):
    """Who changed which configuration, when, from what to what (DESIGN §8, audit trail).

    Append-only: written by ``ledger.protocol.services.config_change_record`` — called by the services
    and console save paths of every app (providers, API keys, tenants and their callback
    settings here; replay targets, alert channels, retention policies, staff roles and tenant
    memberships above) in the transaction of the change; nothing updates or deletes a row,
    and the console shows them read-only. ``before``/``after`` hold only the fields that
    changed (every field on create/delete), secrets masked. Plain values, not foreign keys:
    deleting the object (or the user) must not delete its history.
    """

    # None: a platform-level change (a role's permissions, a user without tenants). No
    # database constraint: the trail outlives a deleted tenant (and never blocks deleting it).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField()
    # "user:<username>", "apikey:<prefix>", "cli:<os user>", "system".
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=8, choices=ConfigChangeAction.choices)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    # Why, where the change path asks (an adapter revision's rollout, promotion or rollback,
    # the canary watch's figures); empty for plain saves.
    reason = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        verbose_name = "configuration change"
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "at"], name="configchange_tenant_at_idx"),
            models.Index(fields=["object_type", "object_id"], name="configchange_object_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type} {self.object_repr or self.object_id}"


class ProviderKind(models.TextChoices):
    # A receiver the tenant configured; execute-mode submissions name it.
    HTTP = "http", "HTTP provider"
    # The tenant's own callback receivers: operations created by the service only.
    CALLBACK = "callback", "callbacks (internal)"


class Provider(models.Model):
    """A receiver of side effects, configured as data (DESIGN §3 execute mode)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="providers")
    slug = models.SlugField(max_length=63)
    kind = models.CharField(max_length=16, choices=ProviderKind.choices, default=ProviderKind.HTTP, db_default="http")
    # Request headers a submitter may set (case-insensitive names). Credentials never come
    # from the caller: the adapter sets `auth_header` to the provider's credential
    # (ledger.providers.credentials) — `auth_secret`, stored sealed and never shown, or else the
    # environment variable `auth_secret_env` names, which must be one of the platform's
    # declared variables for this tenant (ONCEGUARD_PROVIDER_SECRET_PREFIX + the tenant's
    # secret namespace + "_").
    forward_headers = models.JSONField(default=list, db_default=[], blank=True)
    auth_header = models.CharField(max_length=100, blank=True, default="", db_default="")
    auth_secret_env = models.CharField(max_length=100, blank=True, default="", db_default="")
    auth_secret = models.JSONField(null=True, blank=True, editable=False)
    idempotency_class = models.CharField(max_length=16, choices=IdempotencyClass.choices)
    idempotency_header = models.CharField(max_length=100, default="Idempotency-Key")
    base_url = models.URLField(max_length=500, blank=True)
    # May use {key} and {reconciliation_handle}. 200 = found, 404 = not found.
    lookup_path = models.CharField(max_length=500, blank=True)
    ref_pointer = models.CharField(max_length=200, default="/id")
    status_pointer = models.CharField(max_length=200, blank=True)
    success_values = models.JSONField(default=list, blank=True)
    lookup_settle_seconds = models.PositiveIntegerField(default=30)
    # Asynchronous providers (DESIGN §5, asynchronous providers; ledger.execution.polling). A status path
    # makes the provider asynchronous: the submit's answer names a job (ref_pointer), and the
    # operation waits on the provider, polled at base_url + poll_path ({provider_ref} = the job
    # id) with backoff from poll_initial_seconds doubling to poll_max_seconds, or moved by the
    # provider's signed webhook. The status answer's poll_status_pointer value is one of the
    # succeeded / failed / pending values; a succeeded job's output is where
    # output_url_pointer says (a path under base_url or an absolute URL), checked against the
    # announced sha256/size (pointers, optional), output_media_types, and the width/height
    # asked for (pointers into the stored request, e.g. /body/width) before it is published.
    poll_path = models.CharField(max_length=500, blank=True, default="", db_default="")
    poll_status_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    poll_succeeded_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_failed_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_pending_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_initial_seconds = models.FloatField(default=1.0, db_default=1.0)
    poll_max_seconds = models.FloatField(default=30.0, db_default=30.0)
    output_url_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_sha256_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_size_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_media_types = models.JSONField(default=list, db_default=[], blank=True)
    output_width_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_height_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    # HMAC-SHA256 key the provider signs its webhooks with (Onceguard-Signature, the callbacks'
    # scheme). Sealed and write-only like auth_secret: the provider's, not a revision's.
    webhook_secret = models.JSONField(null=True, blank=True, editable=False)
    key_ttl_seconds = models.PositiveIntegerField(default=86400)
    timeout_seconds = models.FloatField(default=10.0)
    # Retry policy (DESIGN §3): visible on every operation as a snapshot.
    max_attempts = models.PositiveIntegerField(default=4)
    lifetime_seconds = models.PositiveIntegerField(default=1800)
    base_delay_seconds = models.FloatField(default=1.0)
    max_delay_seconds = models.FloatField(default=300.0)
    unit_price = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    throttled_until = models.DateTimeField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=200, blank=True)
    # Seconds: a retry of an operation older than this (since its creation or the tenant's
    # last "still wanted") first asks the tenant's eligibility webhook (ledger.recovery.eligibility).
    # Empty: retries never ask.
    recheck_after = models.PositiveIntegerField(null=True, blank=True, help_text="seconds; empty = never recheck")
    # Rate and concurrency caps (DESIGN §5, rate and concurrency caps; ledger.providers.ratelimit). The
    # provider's, not an adapter revision's: they say what the receiver can take. Workers of
    # every process respect them through the database: in flight = this provider's claimed
    # execute-mode rows; the rate = a token bucket (ProviderRate) refilled on the database's
    # clock, lowered by 429s and climbing back while it is quiet. Empty = no cap.
    max_in_flight = models.PositiveIntegerField(
        null=True, blank=True, help_text="most calls at once, over every worker; empty = no cap"
    )
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="most calls per rate period, over every worker; empty = no rate"
    )
    rate_period_seconds = models.PositiveIntegerField(
        default=1, db_default=1, help_text="seconds: the period of the rate (1 = per second, 60 = per minute)"
    )
    rate_burst = models.PositiveIntegerField(
        default=1,
        db_default=1,
        help_text="calls that may go at once after a quiet spell (1 spaces the calls evenly); at most the rate",
    )
    # Intent envelopes (DESIGN §5, intents; ledger.rules.intents). With a schema, submissions carry
    # `intent` (named, typed, bounded values) instead of a request, and the request template
    # translates it into the provider's request when an attempt is sent. Both are adapter
    # fields: a revision holds them as a pair, so a rollback restores the schema with the
    # translation written for it. Checked on every save path (Provider.clean, provider_upsert).
    intent_schema = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text='{"fields": {"aspect_class": {"type": "enum", "values": ["square", "portrait"],'
        ' "required": true}, …}}; empty: submissions send a request (method, path, body).',
    )
    request_template = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text='The provider\'s request with placeholders: {"method": "POST", "path": "/v1/renders",'
        ' "body": {"size": "{{ size }}", "prompt": "{{ prompt:render-default }}"}, "lookups": {"size":'
        ' {"field": "aspect_class", "values": {"square": "1024x1024", …}}}}. Only {{ name }} substitutes;'
        " nothing is evaluated.",
    )
    # Adapter revisions (DESIGN §5, adapter revisions; ledger.providers.revisions, ledger.providers.canary). The
    # adapter fields above (ADAPTER_FIELDS) always hold the stable revision's snapshot;
    # `revision` points at it. A canary revision takes `canary_percent` of new operations,
    # chosen by a hash of the key, until it is promoted or rolled back. Moved only by
    # ledger.providers.canary (recorded as configuration changes), never by a form.
    revision = models.ForeignKey(
        "AdapterRevision", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False
    )
    canary_revision = models.ForeignKey(
        "AdapterRevision", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False
    )
    canary_percent = models.PositiveSmallIntegerField(default=0, db_default=0, editable=False)
    canary_started_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The console's rollout moves (ledger.providers.canary): an operator may roll a canary back in an
        # incident without being allowed to edit the provider.
        permissions = [("rollout_provider", "Can start, promote and roll back adapter revisions")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="provider_unique_slug_per_tenant"),
            models.CheckConstraint(
                condition=(Q(max_in_flight__isnull=True) | Q(max_in_flight__gte=1))
                & (Q(rate_limit__isnull=True) | Q(rate_limit__gte=1))
                & Q(rate_period_seconds__gte=1)
                & Q(rate_period_seconds__lte=86400)
                & Q(rate_burst__gte=1),
                name="provider_caps_valid",
            ),
            models.CheckConstraint(
                condition=(Q(canary_revision__isnull=True) & Q(canary_percent=0))
                | (Q(canary_revision__isnull=False) & Q(canary_percent__gte=1) & Q(canary_percent__lte=100)),
                name="provider_canary_has_percent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.slug}"

    def clean(self) -> None:
        # Checked on every save path (console forms call this; services.provider_upsert too):
        # where it sends, and which credential it may read. Checked again at send time.
        namespace = Tenant.objects.filter(pk=self.tenant_id).values_list("secret_namespace", flat=True).first() or ""
        errors, self.base_url = provider_config_errors(
            namespace=namespace,
            base_url=self.base_url,
            lookup_path=self.lookup_path,
            auth_secret_env=self.auth_secret_env,
        )
        # Durations the workers and the sweeper add to "now": bounded, so that stays a
        # datetime (a 1e300-second timeout would break every sweep, for every tenant).
        for name in ("timeout_seconds", "base_delay_seconds", "max_delay_seconds"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_DURATION_SECONDS:
                errors[name] = f"Must lie between 0 and {MAX_DURATION_SECONDS} seconds (ten years)."
        errors.update(
            provider_caps_errors(
                max_in_flight=self.max_in_flight,
                rate_limit=self.rate_limit,
                rate_period_seconds=self.rate_period_seconds,
                rate_burst=self.rate_burst,
            )
        )
        # What a submission may say and how it is translated (ledger.rules.intents): a template that
        # would evaluate anything is refused here, never at send time.
        errors.update(
            intent_config_errors(
                intent_schema=self.intent_schema,
                request_template=self.request_template,
                prompt_slots=prompt_slots_of(self.tenant_id),
            )
        )
        for name, message in async_config_errors({name: getattr(self, name) for name in ADAPTER_FIELDS}).items():
            errors.setdefault(name, message)
        # Slugs beginning with "_" are the service's own (the tenant's `_callbacks`, created
        # by ledger.protocol.callbacks): none is created, nor renamed into, from a form.
        if self.slug.startswith("_"):
            stored = Provider.objects.filter(pk=self.pk).values_list("slug", flat=True).first() if self.pk else None
            if stored != self.slug:
                errors["slug"] = "Slugs beginning with _ belong to the service's own providers; choose another."
        if errors:
            raise ValidationError(errors)


def provider_caps_errors(
    *, max_in_flight: int | None, rate_limit: int | None, rate_period_seconds: int | None, rate_burst: int | None
) -> dict[str, str]:
    """What is wrong with a provider's rate and concurrency caps, by field (empty: nothing)."""
    errors: dict[str, str] = {}
    if max_in_flight is not None and max_in_flight < 1:
        errors["max_in_flight"] = "At least 1 call in flight (empty = no cap)."
    if rate_limit is not None and rate_limit < 1:
        errors["rate_limit"] = "At least 1 call per period (empty = no rate)."
    if rate_period_seconds is None or not 1 <= rate_period_seconds <= 86400:
        errors["rate_period_seconds"] = "The rate's period lies between 1 second and a day (86400)."
    if rate_burst is None or rate_burst < 1:
        errors["rate_burst"] = "The burst is at least 1 call."
    elif rate_limit is not None and rate_burst > rate_limit:
        errors["rate_burst"] = f"The burst is at most the rate ({rate_limit} calls)."
    return errors


# The fields of a provider's rate and concurrency caps; a change of one resets its bucket.
PROVIDER_CAP_FIELDS = ("max_in_flight", "rate_limit", "rate_period_seconds", "rate_burst")


class ProviderRate(models.Model):
    """A capped provider's token bucket and effective rate (ledger.providers.ratelimit), one row per
    provider, moved only by the statements in ledger/store/queries.sql (``provider_rate_…``) on the
    database's clock. The row is also the lock takers of one provider queue on, so each one
    counts the in-flight rows the previous one committed. Not configuration: never in a form."""

    provider = models.OneToOneField(Provider, on_delete=models.CASCADE, primary_key=True, related_name="rate_state")
    # The provider's tenant: Citus distributes the bucket by it, beside that tenant's
    # operations, and every statement on the bucket names it (DESIGN §12; migration 0029).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Calls that may start now (refilled at `rate` per second up to the provider's burst).
    tokens = models.FloatField()
    # The effective rate in calls per second: the declared one, halved by a 429 and climbing
    # back a step at a time while it is quiet.
    rate = models.FloatField()
    refilled_at = models.DateTimeField()
    # The last 429 (or 503 with Retry-After) or the last step back up: the next step waits
    # for PROVIDER_RATE_RECOVERY_SECONDS after it.
    quiet_since = models.DateTimeField()
    # The last lowering: an answer to a call sent before it (the same storm) does not lower again.
    lowered_at = models.DateTimeField(null=True, blank=True)
    # When the bucket will hold a whole call again (the workers' take passes the provider over
    # until then); empty when it holds one now.
    next_take_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_providerrate"

    def __str__(self) -> str:
        return f"rate of provider {self.provider_id}"


# The adapter fields of an asynchronous provider (ledger.execution.polling): how its jobs are polled and
# its outputs found and checked.
ASYNC_ADAPTER_FIELDS = (
    "poll_path",
    "poll_status_pointer",
    "poll_succeeded_values",
    "poll_failed_values",
    "poll_pending_values",
    "poll_initial_seconds",
    "poll_max_seconds",
    "output_url_pointer",
    "output_sha256_pointer",
    "output_size_pointer",
    "output_media_types",
    "output_width_pointer",
    "output_height_pointer",
)

# How the service talks to a provider in execute mode: what an adapter revision snapshots
# (DESIGN §5, adapter revisions). Everything else on a provider — its idempotency class, retry
# policy, price, credential, pause — belongs to the provider and applies to every revision at
# once: a rollback must never bring back a credential that was replaced (it may be revoked),
# and the class says what the receiver is, not how we call it.
ADAPTER_FIELDS = (
    "base_url",
    "idempotency_header",
    "auth_header",
    "forward_headers",
    "ref_pointer",
    "status_pointer",
    "success_values",
    "timeout_seconds",
    "lookup_path",
    "lookup_settle_seconds",
    "intent_schema",
    "request_template",
    # asynchronous providers (DESIGN §5, asynchronous providers)
    *ASYNC_ADAPTER_FIELDS,
)


class AdapterRevision(models.Model):
    """One immutable snapshot of a provider's adapter configuration (``config``: the
    ``ADAPTER_FIELDS`` as JSON). Numbered 1..n per provider; written by ``ledger.providers.revisions``
    on every change of those fields, never updated or deleted (the console shows them
    read-only). Which revision is stable and which is a canary is the provider's (its
    ``revision`` and ``canary_revision``); the moves are recorded as configuration changes."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Indexed by the unique (provider, number).
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="revisions", db_index=False)
    number = models.PositiveIntegerField()
    # The adapter fields, as data: later adapter kinds add their own keys here.
    config = models.JSONField()
    # The stable revision this one was made from (its number); None for the first.
    based_on = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "ledger_adapterrevision"
        constraints = [models.UniqueConstraint(fields=["provider", "number"], name="adapterrevision_unique_number")]

    def __str__(self) -> str:
        return f"revision {self.number}"


class PromptTemplate(models.Model):
    """One immutable version of a tenant's prompt text (DESIGN §5, prompt templates;
    ledger.providers.prompts). ``text`` holds the instructions and ``{{ slot }}`` placeholders for the
    declared ``slots`` (name → ``{"max_length": n}``); a request template names the prompt
    (``{{ prompt:name }}``, the newest version, or ``{{ prompt:name@3 }}``), and user text goes
    only into the slots, fenced and capped. Numbered 1..n per tenant and name; a change is a
    new version, never an edit; the attempt that used one records it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.SlugField(max_length=63)
    version = models.PositiveIntegerField()
    text = models.TextField()
    slots = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "ledger_prompttemplate"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name", "version"], name="prompttemplate_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


def prompt_slots_of(tenant_id: int | None) -> Callable[[str, int | None], dict[str, Any] | None]:
    """A tenant's prompt templates' declared slots by name and version (None: the newest), or
    None for a prompt that does not exist: what ``intents.template_problems`` checks a request
    template's prompt references against."""

    def slots(name: str, version: int | None) -> dict[str, Any] | None:
        rows = PromptTemplate.objects.filter(tenant_id=tenant_id, name=name)
        row = rows.filter(version=version).first() if version else rows.order_by("-version").first()
        return None if row is None else dict(row.slots)

    return slots


class Operation(models.Model):
    """One row per logical side effect, unique on (tenant, key)."""

    # No single-column index: (tenant, key) and the tenant composites below cover it.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="operations", db_index=False)
    key = models.CharField(max_length=255)
    mode = models.CharField(max_length=8, choices=OperationMode.choices, default=OperationMode.GUARD)
    status = models.CharField(max_length=16, choices=OperationStatus.choices)
    # Not indexed: only deleting a provider (rare, PROTECTed) searches by it; every claim
    # would pay for the index.
    provider = models.ForeignKey(
        Provider, on_delete=models.PROTECT, null=True, blank=True, related_name="operations", db_index=False
    )
    action = models.CharField(max_length=100, blank=True)
    # sha256 of the request (services.request_fingerprint): 32 bytes stored, hex everywhere else.
    fingerprint = HexBytesField(hex_length=64)
    # execute mode only: the provider-neutral request the workers send.
    request = SealedJSONField(null=True, blank=True)
    payload = SealedJSONField(null=True, blank=True)
    # Plain text of the configured non-personal paths only (OPERATION_SEARCH_PATHS), for
    # filtering without decrypting; never a personal identifier (DESIGN §6).
    search_fields = models.JSONField(null=True, blank=True)
    attempts = Counter(default=0)
    # 429/503 answers: counted in `attempts` but not against max_attempts.
    throttled_attempts = Counter(default=0)
    max_attempts = Counter(default=4)
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The latest attempt's token (services.new_lease_token: 16 random bytes, 32 hex digits).
    # Never cleared: fencing compares against it.
    lease_token = HexBytesField(hex_length=32, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    uses_sent_marker = models.BooleanField(default=False)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, blank=True, choices=ErrorClass.choices)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = Counter(null=True, blank=True)
    response_body = SealedJSONField(null=True, blank=True)
    reconciliation_handle = models.CharField(max_length=255, blank=True)
    execution_id = models.CharField(max_length=255, blank=True)
    workflow_id = models.CharField(max_length=255, blank=True)
    workflow_version = models.CharField(max_length=100, blank=True)
    correlation_id = models.CharField(max_length=255, blank=True)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Runs (DESIGN §3, runs): operations that share a run are the ordered steps of one
    # business transaction. `run` is the explicit run id sent with the claim or submission;
    # empty, the correlation id is the run (ledger.protocol.selectors.run_operations says so once).
    run = models.CharField(max_length=255, blank=True, default="", db_default="")
    step = Counter(null=True, blank=True)
    # Versioned keys: sent as parts, the key is "{record}:{action}:v{version}" and the parts
    # are kept (not workflow_version). A newer version of the same record and action sets
    # `replaced_by` on the older ones (not superseded_by, which links DLQ replays).
    record = models.CharField(max_length=200, blank=True, default="", db_default="")
    version = Counter(null=True, blank=True)
    replaced_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Execute mode: the adapter revision this operation's next attempt runs under (assigned at
    # submission — the stable revision or, for its share of new keys, a canary — and moved
    # only while nothing is under way: ledger.providers.revisions / ledger.providers.canary). Each attempt keeps
    # its own. Not indexed: a rollback reads the open rows through op_due_idx.
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # When the tenant's eligibility webhook last answered "still wanted" for this row.
    eligibility_confirmed_at = models.DateTimeField(null=True, blank=True)
    # Execute mode: size of the stored request plus the bytes of the uploads its intent
    # references (admission's queued-bytes limit: DESIGN §11), the
    # provider's unit price at submission (the tenant's budget; refunded by failed/abandoned)
    # and where the terminal outcome is POSTed.
    request_bytes = Counter(default=0, db_default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=4, default=0, db_default=0)
    callback_url = models.CharField(max_length=1000, blank=True, default="", db_default="")
    # Asynchronous providers: polls of the current job so far (the backoff's exponent). A
    # claimed row with polls > 0 holds a poll lease, not a send's (the sweeper returns it to
    # waiting when it expires); a take for a send sets it back to 0.
    polls = Counter(default=0, db_default=0)
    # Sweeper bookkeeping.
    reconcile_until = models.DateTimeField(null=True, blank=True)
    lookup_failures = Counter(default=0)
    alerted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_operation"
        # The console's operator actions (ledger.protocol.transitions: operation_cancel / operation_retry_now).
        permissions = [("cancel_operation", "Can cancel operations and retry them now")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="operation_unique_key_per_tenant"),
            # A terminal state always has its finishing time, and only a terminal one does.
            models.CheckConstraint(
                condition=(Q(status__in=sorted(TERMINAL_STATES)) & Q(done_at__isnull=False))
                | (~Q(status__in=sorted(TERMINAL_STATES)) & Q(done_at__isnull=True)),
                name="operation_done_at_iff_terminal",
            ),
            models.CheckConstraint(condition=Q(status__in=list(S.values)), name="operation_status_valid"),
            models.CheckConstraint(
                condition=~Q(status=S.CLAIMED) | Q(lease_expires_at__isnull=False),
                name="operation_claimed_has_lease",
            ),
            # Waiting on a provider: its job id is known, no lease is held, the next poll is set.
            models.CheckConstraint(
                condition=~Q(status=S.WAITING)
                | (~Q(provider_ref="") & Q(lease_expires_at__isnull=True) & Q(next_attempt_at__isnull=False)),
                name="operation_waiting_has_job",
            ),
        ]
        indexes = [
            # The sweeper and workers read only the open rows, by state and time.
            models.Index(
                fields=["status", "lease_expires_at"],
                name="op_claimed_lease_idx",
                condition=Q(status="claimed"),
            ),
            models.Index(
                fields=["status", "next_attempt_at"],
                name="op_due_idx",
                condition=Q(status__in=["queued", "retry_wait"]),
            ),
            models.Index(
                fields=["status", "updated_at"],
                name="op_unresolved_idx",
                condition=Q(status__in=["uncertain", "review"]),
            ),
            # Open rows in list order, with the time they last moved (migration 0024): the
            # console's needs=stuck and needs=cancellable pages, the stuck count and the
            # dashboard's stuck rows read this, not the table; updated_at is a key column so
            # "not moved since" is checked on the index entry. Partial: a finished row has no
            # entry, and a completion adds none, so it holds the work under way.
            models.Index(
                fields=["id", "updated_at"],
                name="op_open_id_idx",
                condition=~Q(status__in=sorted(TERMINAL_STATES)),
            ),
            # The rows an operator can cancel (queued, waiting to retry), in list order
            # (migration 0026): the console's needs=cancellable page reads its 100 entries
            # instead of sorting every such row off the due index.
            models.Index(fields=["id"], name="op_cancellable_id_idx", condition=Q(status__in=["queued", "retry_wait"])),
            # Lists newest first, by tenant and optionally state (migration 0017 says why): read
            # straight off the index whatever the tenant or the filter.
            models.Index(fields=["tenant", "id"], name="op_tenant_id_idx"),
            # Every state but `succeeded` (migration 0021): a completion writes nothing here, and
            # entries stay few. `status=succeeded` lists read (tenant, id) and keep the 98 % that
            # match. Partial on a state: only a plan that sees the state uses it (lists are planned
            # per call, ledger.store.sql.planned_per_call).
            models.Index(
                fields=["tenant", "status", "id"],
                name="op_tenant_other_status_idx",
                condition=~Q(status="succeeded"),
            ),
            # A capped provider's calls in flight, counted at every take (ledger.providers.ratelimit):
            # only claimed execute-mode rows, so it stays as small as the work under way.
            models.Index(
                fields=["provider"],
                name="op_exec_inflight_idx",
                condition=Q(status="claimed", mode="execute"),
            ),
            # Workers take due execute-mode rows oldest first (FOR UPDATE SKIP LOCKED).
            models.Index(
                fields=["next_attempt_at", "id"],
                name="op_exec_due_idx",
                condition=Q(status__in=["queued", "retry_wait"], mode="execute"),
            ),
            # Workers take due polls of rows waiting on a provider (FOR UPDATE SKIP LOCKED).
            models.Index(
                fields=["next_attempt_at", "id"],
                name="op_waiting_due_idx",
                condition=Q(status="waiting"),
            ),
            # Admission's budget: what a tenant submitted in execute mode in the current period.
            # Partial (migration 0021): guard-mode claims, most of the ledger, write nothing here.
            models.Index(fields=["tenant", "created_at"], name="op_exec_created_idx", condition=Q(mode="execute")),
            models.Index(fields=["tenant", "updated_at", "id"], name="op_tenant_updated_idx"),
            # Identifier searches: partial, so the many rows without one cost no index write.
            models.Index(
                fields=["reconciliation_handle"], name="op_handle_idx", condition=~Q(reconciliation_handle="")
            ),
            # Pattern ops (PostgreSQL; ignored elsewhere): serves the console's prefix search
            # (LIKE 'ref%') as well as equality, whatever the database's collation.
            models.Index(
                fields=["provider_ref"],
                name="op_ref_idx",
                condition=~Q(provider_ref=""),
                opclasses=["varchar_pattern_ops"],
            ),
            models.Index(fields=["execution_id"], name="op_execution_idx", condition=~Q(execution_id="")),
            models.Index(fields=["correlation_id"], name="op_correlation_idx", condition=~Q(correlation_id="")),
            # A search by workflow name ends here: the ids of the workflows so named (WorkflowName).
            models.Index(fields=["tenant", "workflow_id"], name="op_workflow_idx", condition=~Q(workflow_id="")),
            # Deleting an operation (retention) finds the rows that point at it.
            models.Index(fields=["superseded_by"], name="op_superseded_idx", condition=Q(superseded_by__isnull=False)),
            models.Index(fields=["replaced_by"], name="op_replaced_idx", condition=Q(replaced_by__isnull=False)),
            # A run's steps, and the versions of one record and action: partial, so claims
            # without a run or a versioned key write nothing here.
            models.Index(fields=["tenant", "run", "step"], name="op_run_idx", condition=~Q(run="")),
            models.Index(
                fields=["tenant", "record", "action", "version"], name="op_record_idx", condition=~Q(record="")
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATES


class Attempt(models.Model):
    """One row per try. A fenced holder's late result is kept here, never on the operation."""

    # The table is partitioned by month of started_at (migration 0025), and a partitioned
    # table's primary key must hold its partition key. The id alone still names one row: it
    # comes from the table's one sequence (NewRowId).
    pk = models.CompositePrimaryKey("id", "started_at")
    id = models.BigIntegerField(db_default=NewRowId("ledger_attempt"))
    # The operation's tenant, copied when the row is written: Citus distributes every
    # tenant-owned table by tenant_id, co-located, and routes a statement to one node only
    # when it names the tenant, so every statement on this table does (DESIGN §12; migration
    # 0029). No foreign key of its own: on a partitioned table one cannot be added without a
    # scan of every row under a lock that stops writes (NOT VALID is refused there), and the
    # operation's key already ties the row to a tenant; on Citus it becomes
    # (tenant_id, operation_id) → (tenant_id, id). No index: every read names the operation.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    # Indexed by (operation, number).
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="attempt_set", db_index=False)
    number = Counter()
    lease_token = HexBytesField(hex_length=32)
    started_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.PENDING)
    error_class = models.CharField(max_length=16, blank=True)
    message = models.CharField(max_length=500, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = Counter(null=True, blank=True)
    response_body = SealedJSONField(null=True, blank=True)
    execution_id = models.CharField(max_length=255, blank=True)
    duration_ms = Counter(null=True, blank=True)
    # The adapter revision this attempt ran under (execute mode; copied from its operation
    # when the attempt opens). Guard-mode attempts have none.
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # The prompt template version the attempt's request was rendered with (intent envelopes
    # whose request template names a prompt: ledger.providers.prompts); set by the worker before it sends.
    prompt_template = models.ForeignKey(
        PromptTemplate, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )

    class Meta:
        db_table = "ledger_attempt"
        # Not unique: a partitioned table enforces uniqueness within a partition only, and the
        # number does not hold the partition's time (migration 0025). An attempt's number is its
        # operation's `attempts` counter, moved by the guarded UPDATE that opens it under the
        # operation's row lock, so two attempts of one operation never share one.
        indexes = [
            models.Index(fields=["operation", "number"], name="attempt_op_number_idx"),
            # The canary watch: a revision's attempts started within its window. Partial, so
            # guard-mode attempts (no revision) write nothing here. On started_at, which never
            # changes, not finished_at: a column in any index (its predicate included) makes
            # every update that changes it a non-HOT one, and finishing an attempt sets
            # finished_at (migration 0021).
            models.Index(
                fields=["adapter_revision", "started_at"],
                name="attempt_revision_start_idx",
                condition=Q(adapter_revision__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.number}"


class OperationEvent(models.Model):
    """Append-only history: every transition, its actor and its reason."""

    # Partitioned by month of `at` (migration 0025); see Attempt.pk.
    pk = models.CompositePrimaryKey("id", "at")
    id = models.BigIntegerField(db_default=NewRowId("ledger_operationevent"))
    # The operation's tenant, copied when the row is written: Citus distributes every
    # tenant-owned table by tenant_id, co-located, and routes a statement to one node only
    # when it names the tenant, so every statement on this table does (DESIGN §12; migration
    # 0029). No foreign key of its own: on a partitioned table one cannot be added without a
    # scan of every row under a lock that stops writes (NOT VALID is refused there), and the
    # operation's key already ties the row to a tenant; on Citus it becomes
    # (tenant_id, operation_id) → (tenant_id, id). No index: every read names the operation.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    # Indexed by operation alone (a history is a few rows, sorted after reading).
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="events", db_index=False)
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500, blank=True)
    attempt = Counter(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        db_table = "ledger_operationevent"
        indexes = [
            # One column, so PostgreSQL stores an operation's events as one deduplicated entry
            # (migration 0021; (operation, at) could not deduplicate).
            models.Index(fields=["operation"], name="opevent_op_idx"),
            # Review decisions by time (migration 0022), for the dashboard's activity chart:
            # partial, so only the rare event that moves a row out of review writes here.
            models.Index(
                fields=["at"],
                name="opevent_review_exit_idx",
                condition=Q(from_status="review") & ~Q(to_status="review"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.from_status or '∅'} → {self.to_status}"


class AdmissionRefusalCount(models.Model):
    """Refused admissions by tenant and reason, for metrics. Refusals store nothing about
    the request itself; this counter is all that remains of them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=64)
    count = models.PositiveBigIntegerField(default=0)
    last_at = models.DateTimeField()

    class Meta:
        db_table = "ledger_admissionrefusalcount"
        constraints = [models.UniqueConstraint(fields=["tenant", "reason"], name="admission_refusal_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.reason}={self.count}"


class Tombstone(models.Model):
    """What is left of an operation retention deleted: enough to keep answering its key.

    ``operation_claim`` never re-creates a key that has a tombstone (a NOT EXISTS guard
    inside its INSERT) and answers from this row instead (``ledger.protocol.tombstones``). Written
    and expired by the retention purge (``review.retention``).
    """

    # Indexed by the unique (tenant, key): a tenant-only index let a claim's tombstone check
    # (planned once, on an empty table) walk every tombstone of the tenant.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    operation_id = models.BigIntegerField()
    mode = models.CharField(max_length=8)
    action = models.CharField(max_length=100, blank=True)
    provider_slug = models.CharField(max_length=63, blank=True)
    fingerprint = HexBytesField(hex_length=64)
    final_status = models.CharField(max_length=16)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    done_at = models.DateTimeField()
    deleted_at = models.DateTimeField()
    keep_until = models.DateTimeField()

    class Meta:
        db_table = "ledger_tombstone"
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="tombstone_unique_key")]
        indexes = [models.Index(fields=["keep_until"], name="tombstone_keep_idx")]

    def __str__(self) -> str:
        return f"†{self.key}"


class Upload(models.Model):
    """A file a tenant uploaded (``POST /api/v1/uploads``, ledger.execution.uploads), stored outside
    the queue through the ``onceguard_objects`` storage (ledger.execution.objects). Content addressed
    per tenant: the same bytes from the same tenant are one row, one object and one key.
    Its facts are immutable: written once, after its checks passed; deleted by retention
    (never while a job that names it can still run: ``retain_until``) or by an erasure. Jobs
    refer to it by ``key`` and ``sha256``; the queue never carries the bytes."""

    # Indexed by the unique (tenant, sha256) and (tenant, created_at).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # "up_" + sha256: what a job names; readable only with an API key of this tenant.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    # Recognised from the content, never taken from the client's Content-Type.
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    # Where the bytes are in the objects storage; internal, never shown.
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    # Retention keeps the upload at least until then, whatever its TTL: raised (never lowered)
    # by each accepted job that names it, to the end of that job's lifetime plus its last
    # attempt's lease (ledger.execution.uploads.uploads_retain). Null: no job ever named it.
    retain_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_upload"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="upload_unique_digest_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "key"], name="upload_unique_key_per_tenant"),
        ]
        # Retention reads a tenant's uploads by age.
        indexes = [models.Index(fields=["tenant", "created_at"], name="upload_tenant_created_idx")]

    def __str__(self) -> str:
        return self.key


class OperationOutput(models.Model):
    """The validated output of an operation (ledger.execution.outputs): fetched into quarantine,
    checked (media type by content, size, dimensions, digest), then published here. A row
    exists only for an output that passed; one that failed was deleted and failed the
    operation as ``invalid_output``. Its own table (not columns of the hot operations
    table), tenant-scoped like every read of it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # Deleted with its operation (retention deletes the bytes first: review.retention).
    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, related_name="output")
    # "out_" + sha256: the same bytes have the same key, whichever operation made them.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ledger_operationoutput"
        indexes = [models.Index(fields=["tenant", "key"], name="opoutput_tenant_key_idx")]

    def __str__(self) -> str:
        return self.key


class WorkflowName(models.Model):
    """A name a tenant's workflow was seen with (n8n's ``$workflow.name``: sent with a claim or
    a submission, or in a failed event), so that operations, which carry only the workflow's
    id, are found by its name (ledger.protocol.selectors.operation_search, the API's ``workflow_name``).

    One row per workflow and name, written once when the name is first seen
    (ledger.tenants.workflows): a renamed workflow gains a row and stays findable by either name; the
    claim's own INSERT never writes a name, so operations pay nothing for the search. The
    name is searched by a trigram index on PostgreSQL (migration 0016)."""

    # (No index of its own: the unique constraint's leads with the tenant.)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    workflow_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    first_seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "workflow_id", "name"], name="workflowname_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (workflow {self.workflow_id})"
