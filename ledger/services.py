"""Every write to the ledger. One function per transition, keyword-only and typed.

The hot transitions (claim, reclaim, take, mark_sent, heartbeat, complete, fail) are named
static statements in ``ledger/queries.sql``, run by ``ledger.statements``: each is one
guarded UPDATE (or the claim's INSERT … ON CONFLICT DO NOTHING) whose guard sits in its
WHERE clause, followed in the same transaction by its attempt row and its OperationEvent
row. Zero rows means somebody else moved the row first: a named error, never an overwrite.
Cold moves (sweeper, reviewers, supersede, throttle) are guarded ORM updates.

What other apps do in the same transaction (a DLQ entry for a failed row, a replay settled,
a subject indexed, an alert) goes through the hooks in ``ledger.hooks``; the ledger imports
nothing from the apps above it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from ledger import callbacks, hooks, ratelimit, revisions, sql, statements
from ledger.auth import API_KEYS, hash_api_key
from ledger.caching import TtlCache
from ledger.config_changes import config_change_of, config_change_record, config_snapshot
from ledger.credentials import sealed_credential
from ledger.crypto import payload_indexing_needed, payload_written, seal_json
from ledger.errors import (
    DestinationNotAllowed,
    DomainError,
    IllegalTransition,
    InvalidKey,
    KeyReusedWithDifferentRequest,
    LeaseExpired,
    LeaseLost,
    OperationAlreadyFinished,
    OperationInProgress,
    OperationManagedByService,
    OperationNeedsReconciliation,
    OperationNotCancellable,
    OperationNotFound,
    OperationRetryScheduled,
    OperationVersionSuperseded,
    ReservedKey,
    ReservedProvider,
    UnknownProvider,
    ValidationFailed,
)
from ledger.intents import RequestTemplateInvalid, intent_config_errors
from ledger.key_rules import PERSONAL_DATA, key_check, key_lookup_shape, key_refusal
from ledger.logs import operation_fields
from ledger.models import (
    ADAPTER_FIELDS,
    ALLOWED_TRANSITIONS,
    NO_RETRY_ERROR_CLASSES,
    PROVIDER_CAP_FIELDS,
    REPORTABLE_STATES,
    TERMINAL_STATES,
    ApiKey,
    Attempt,
    AttemptOutcome,
    ConfigChangeAction,
    ErrorClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    Provider,
    Tenant,
    Tombstone,
    prompt_slots_of,
    provider_caps_errors,
)
from ledger.provider_checks import (
    NAMESPACE_MAX_LENGTH,
    async_config_errors,
    namespace_valid,
    provider_config_errors,
)
from ledger.redaction import scrub
from ledger.search import search_values
from ledger.selectors import operation_newest_in_lineage
from ledger.storable import MAX_DURATION_SECONDS
from ledger.tombstones import tombstone_answer

S = OperationStatus
log = logging.getLogger("onceguard.ledger")

MAX_MESSAGE_LENGTH = 500


# --- Inputs -----------------------------------------------------------------------------


def validate_key(key: Any) -> str:
    """A valid new key (ledger.key_rules: 1–255 printable ASCII characters without surrounding
    blanks), else 400 ``invalid_idempotency_key`` naming the rule broken. The key is logged, so
    it must not carry personal data."""
    return key_check(key)


def claim_key_check(*, tenant_id: int, key: Any) -> str:
    """A caller's key for a claim or submission: a valid new key, or one the ledger holds (its
    row, or its tombstone once retention deleted the row) — a key stored before the rule keeps
    being answered. Only a key that breaks the rule costs the lookup. A key with personal data
    is valid where the tenant allows it (``Tenant.personal_data_in_keys_allowed``)."""
    refusal = key_refusal(key)
    if refusal is None:
        return key
    if (
        refusal.extra["rule"] == PERSONAL_DATA
        and Tenant.objects.filter(pk=tenant_id, personal_data_in_keys_allowed=True).exists()
    ):
        return key
    if key_lookup_shape(key) and (
        Operation.objects.filter(tenant_id=tenant_id, key=key).exists()
        or Tombstone.objects.filter(tenant_id=tenant_id, key=key).exists()
    ):
        return key
    raise refusal


# Versions are integers that fit the column; newer means larger.
MAX_VERSION = 2**31 - 1


def versioned_key(*, record: str, action: str, version: int) -> str:
    """The key of a claim or submission sent as parts: ``{record}:{action}:v{version}`` (the
    n8n node builds the same string), checked like any key."""
    if not record or not action or version is None:
        raise ValidationFailed("A versioned key needs `record`, `action` and `version` together.")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValidationFailed(f"`version` must be an integer from 0 to {MAX_VERSION}.")
    # Composed only: the claim applies the key rule, after asking whether the ledger holds it.
    key = f"{record}:{action}:v{version}"
    if not key_lookup_shape(key):
        raise key_refusal(key) or InvalidKey("The versioned key cannot be stored.")
    return key


def validate_run(run: Any) -> str:
    """A run id: empty (the correlation id is the run), or 1–255 printable characters without
    surrounding blanks, like a key (it is logged and appears in URLs)."""
    if run in (None, ""):
        return ""
    if not isinstance(run, str) or len(run) > 255 or not run.isprintable() or run.strip() != run:
        raise ValidationFailed("`run` must be at most 255 printable characters without surrounding blanks.")
    return run


# The service's own key spaces: a DLQ replay's ledger key (replay:{entry}:{n}, dlq.services),
# a callback's (callback:{operation id}, ledger.callbacks) and the derived key of a "re-run as
# new" ({key}~r{n}). A caller holding one would block that replay or silently suppress that
# callback, so callers may not claim or submit them.
RESERVED_KEY_PREFIXES = ("replay:", "callback:")
_DERIVED_KEY = re.compile(r"~r[0-9]+$")


def reserved_key_check(key: str) -> str:
    """Refuse a key of the service's own key spaces with 400 ``reserved_idempotency_key``;
    for keys that come from callers (``/claims``, submissions)."""
    if key.startswith(RESERVED_KEY_PREFIXES) or _DERIVED_KEY.search(key):
        raise ReservedKey(
            "Keys starting with replay: or callback:, and keys ending in ~r<number>, belong to the service"
            " (DLQ replays, callbacks, re-runs as new); choose another key."
        )
    return key


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_fingerprint(*, mode: str, provider: str, action: str, request: Any) -> str:
    """sha256 of the canonical JSON of (mode, provider, action, request) — DESIGN §3."""
    blob = canonical_json([mode, provider, action, request])
    return hashlib.sha256(blob.encode()).hexdigest()


def clamp_lease(seconds: float | None) -> float:
    cfg = settings.ONCEGUARD
    if seconds is None:
        seconds = cfg["LEASE_DEFAULT_SECONDS"]
    return float(min(max(float(seconds), cfg["LEASE_MIN_SECONDS"]), cfg["LEASE_MAX_SECONDS"]))


def sanitize_message(message: str | None) -> str:
    """Error text is stored for operators; keep it short, single-line and free of personal
    data (ledger.redaction; masked before the cut, so no half address survives it)."""
    text = scrub(" ".join((message or "").split()))
    return text[:MAX_MESSAGE_LENGTH]


def backoff_seconds(*, attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base · 2^(attempt-1)))."""
    # Bounded whatever the provider's settings say: 2^62 keeps the product a float (never an
    # OverflowError), MAX_DURATION_SECONDS keeps now + the delay a datetime.
    ceiling = min(cap, base * (2 ** min(max(0, attempt - 1), 62)), MAX_DURATION_SECONDS)
    return (rng or random).uniform(0, ceiling)


# Providers by (tenant id, slug), for PROVIDER_CACHE_SECONDS; upserts forget their entry.
PROVIDERS: TtlCache[Provider] = TtlCache("PROVIDER_CACHE_SECONDS")


# Slugs beginning with this belong to the service's own providers (ledger.callbacks'
# ``_callbacks``): callers may neither claim under them nor create one.
RESERVED_PROVIDER_PREFIX = "_"
RESERVED_PROVIDER_DETAIL = (
    "Provider slugs beginning with _ belong to the service (its callbacks, for one): they cannot be named"
    " in a claim or a submission, nor created."
)


def provider_for(*, tenant: Tenant | int, slug: str | None) -> Provider | None:
    """A caller's provider by slug (claims, submissions, the guard); None for no slug."""
    if slug in (None, ""):
        return None
    if isinstance(slug, str) and slug.startswith(RESERVED_PROVIDER_PREFIX):
        raise ReservedProvider(RESERVED_PROVIDER_DETAIL)
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    provider = PROVIDERS.get((tenant_id, slug), lambda: Provider.objects.filter(tenant_id=tenant_id, slug=slug).first())
    if provider is None:
        raise UnknownProvider(f"No provider named {slug!r} is configured for this tenant.")
    return provider


# Providers by id, for the workers (config changes reach them within the same time).
PROVIDERS_BY_ID: TtlCache[Provider] = TtlCache("PROVIDER_CACHE_SECONDS")


def provider_by_id(provider_id: int) -> Provider:
    provider = PROVIDERS_BY_ID.get(provider_id, lambda: Provider.objects.filter(pk=provider_id).first())
    if provider is None:
        raise UnknownProvider(f"No provider with id {provider_id}.")
    return provider


def new_lease_token() -> str:
    return secrets.token_hex(16)


# --- Results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimResult:
    operation: Operation
    # True when this call created the row or took a new attempt on it (201).
    acquired: bool
    # True when the row was already terminal and its recorded outcome is replayed (200).
    replayed: bool


# --- Moves: a named statement, its attempt and its event, in one transaction --------------


def _event_text(*, actor: str, reason: str) -> dict[str, str]:
    """An event row's actor and reason as stored (cut to the column, reason scrubbed)."""
    return {"actor": actor[:150], "reason": sanitize_message(reason)}


def _event(*, op: Operation, old: str, actor: str, reason: str) -> None:
    statements.execute(
        "event_insert",
        {
            "tenant_id": op.tenant_id,
            "operation_id": op.pk,
            "from_status": old,
            "to_status": op.status,
            "attempt": op.attempts,
            **_event_text(actor=actor, reason=reason),
        },
    )


def _check_moves(from_states: tuple[str, ...], to: str) -> None:
    for source in from_states:
        if to not in ALLOWED_TRANSITIONS[source]:
            raise IllegalTransition(f"{source} → {to} is not an allowed move.")


def _seconds(value: float | None) -> float | None:
    """Seconds for ``ledger_now_plus``, in milliseconds (SQLite spells them as text)."""
    return None if value is None else round(float(value), 3)


def _sealed(value: Any) -> Any:
    # A named statement's JSON parameter: ledger.statements passes it in its stored form.
    return seal_json(value)


def _after_failed(op: Operation) -> None:
    """Every `failed` row has its DLQ entry, written in the same transaction (the DLQ
    connects to ``operation_failed``)."""
    hooks.operation_failed.send(operation=op)


def _after_terminal(op: Operation, *, actor: str) -> None:
    """What follows a terminal move, in the same transaction when the caller holds one: a
    finished execute-mode operation with a callback_url gets its callback operation; then
    ``operation_finished`` (the DLQ settles a replay whose operation this is)."""
    if op.status not in TERMINAL_STATES:
        return
    if op.callback_url:
        callback_enqueue(operation=op)
    hooks.operation_finished.send(operation=op, actor=actor)


def callback_enqueue(*, operation: Operation) -> Operation | None:
    """Queue the callback of a finished operation, in the caller's transaction: a claim of
    the key ``callback:{id}`` (``ledger.callbacks`` says what it is claimed with), so it
    exists once, whoever finishes the operation."""
    arguments = callbacks.callback_claim_arguments(operation=operation)
    if arguments is None:
        return None
    try:
        result = operation_claim(**arguments)
    except DomainError:
        # Already queued or running: the callback exists, which is all we need.
        return None
    log.info("callback_queued key=%s for=%s", result.operation.key, operation.key)
    return result.operation


# --- Claim --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecuteTerms:
    """What only an execute-mode submission stores on its new row: the request's size
    (admission's queued-bytes limit), its cost (the tenant's budget) and its callback URL."""

    request_bytes: int = 0
    cost: str = "0"
    callback_url: str = ""


def operation_claim(
    *,
    tenant: Tenant,
    key: str,
    provider: Provider | None,
    action: str = "",
    request: Any = None,
    payload: Any = None,
    mode: str = OperationMode.GUARD,
    lease_seconds: float | None = None,
    uses_sent_marker: bool = False,
    mark_sent: bool = False,
    deadline_seconds: float | None = None,
    reconciliation_handle: str = "",
    execution_id: str = "",
    workflow_id: str = "",
    workflow_version: str = "",
    correlation_id: str = "",
    run: str = "",
    step: int | None = None,
    record: str = "",
    version: int | None = None,
    actor: str = "api",
    via_claims: bool = True,
    fingerprint: str | None = None,
    execute: ExecuteTerms | None = None,
    adapter_revision_id: int | None = None,
) -> ClaimResult:
    """Claim ``key`` atomically, or answer for the row that already holds it (DESIGN §5).

    New key → a row in ``claimed`` (guard) or ``queued`` (execute) with its first attempt.
    ``mark_sent`` writes the sent marker in the same commit (in-process guard, workers).
    Raises the named 409/422 errors for rows that cannot be claimed now.

    ``adapter_revision_id``: the adapter revision a new execute-mode row runs under.

    ``run``/``step`` place the operation in a run. ``record``/``version`` (with ``action``)
    are the parts of a versioned key: the key must be their composition; an older version
    than one that succeeded (or, for a new key, than any existing one) is refused with
    ``409 operation_version_superseded``, and a new version abandons the older ones still
    ``queued`` or ``retry_wait`` and records itself as their ``replaced_by``.
    """
    key = claim_key_check(tenant_id=tenant.pk, key=key)
    if via_claims:
        reserved_key_check(key)
    if record:
        if key != versioned_key(record=record, action=action, version=version):  # type: ignore[arg-type]
            raise InvalidKey("The key is not the composition {record}:{action}:v{version} of the parts sent.")
        _refuse_older_version(tenant_id=tenant.pk, key=key, record=record, action=action, version=version or 0)
    elif version is not None:
        raise ValidationFailed("`version` needs `record` and `action`.")
    run = validate_run(run)
    provider_slug = provider.slug if provider else ""
    if fingerprint is None:
        fingerprint = request_fingerprint(mode=mode, provider=provider_slug, action=action, request=request)
    lease = clamp_lease(lease_seconds)
    # Most claims of a known key are retries: one indexed read, outside any transaction,
    # answers them (nothing is sealed or written). A new key goes on to the insert, which
    # still decides a race (ON CONFLICT DO NOTHING) and re-reads the winner.
    existing = _fetch_by_key(tenant_id=tenant.pk, key=key)
    if existing is not None:
        return _answer_existing(
            op=existing,
            fingerprint=fingerprint,
            lease=lease,
            mark_sent=mark_sent,
            via_claims=via_claims,
            actor=actor,
            execution_id=execution_id,
        )
    status = S.QUEUED if mode == OperationMode.EXECUTE else S.CLAIMED
    terms = execute or ExecuteTerms()
    # The configured non-personal paths of the payload (else the request), in plain text.
    searchable = search_values(
        payload if payload is not None else request, settings.ONCEGUARD["OPERATION_SEARCH_PATHS"]
    )
    params = {
        "tenant_id": tenant.pk,
        "key": key,
        "mode": mode,
        "status": status,
        "claimed": status == S.CLAIMED,
        "queued": status == S.QUEUED,
        "provider_id": provider.pk if provider else None,
        "action": action,
        "fingerprint": fingerprint,
        "request": _sealed(request) if mode == OperationMode.EXECUTE else None,
        "payload": _sealed(payload),
        "search_fields": sql.dumps(searchable) if searchable else None,
        "attempts": 1 if status == S.CLAIMED else 0,
        "max_attempts": provider.max_attempts if provider else 4,
        "lease_seconds": _seconds(lease) if status == S.CLAIMED else None,
        "lease_token": new_lease_token(),
        "mark_sent": mark_sent and status == S.CLAIMED,
        "uses_sent_marker": uses_sent_marker or mark_sent,
        "deadline_seconds": _seconds(deadline_seconds),
        "lifetime_seconds": _seconds(provider.lifetime_seconds if provider else 1800),
        "reconciliation_handle": reconciliation_handle[:255],
        "execution_id": execution_id[:255],
        "workflow_id": workflow_id[:255],
        "workflow_version": workflow_version[:100],
        "correlation_id": correlation_id[:255],
        "run": run[:255],
        "step": step,
        "record": record[:200],
        "version": version if record else None,
        "request_bytes": terms.request_bytes,
        "cost": terms.cost,
        "callback_url": terms.callback_url,
        "adapter_revision_id": adapter_revision_id,
    }
    reason = "claimed, sent" if mark_sent else ("queued" if status == S.QUEUED else "claimed")
    stored = [payload, request if mode == OperationMode.EXECUTE else None]
    # A claim that writes nothing after its row (no stored payload to index, no older
    # version to replace) is, on PostgreSQL, one statement: its own transaction, with no
    # BEGIN and COMMIT round trips around it. Anything more runs in one atomic block.
    alone = statements.combined() and not record and not payload_indexing_needed(stored)
    # Alone, the statement sends its planner setting with it (ledger.sql.execute_with_index_plans).
    with nullcontext() if alone else _atomic_with_index_plans():
        op = _insert_claimed(params, actor=actor, reason=reason)
        if op is not None:
            payload_written(
                tenant_id=tenant.pk,
                record_type="operations",
                record_id=op.pk,
                values=stored,
                source=f"{provider_slug}:{action}",
            )
            if record:
                _replace_older_versions(op=op, actor=actor)
            return ClaimResult(operation=op, acquired=True, replayed=False)
    # Taken, or deleted by retention: the existing row (or its tombstone) answers.
    op = _fetch_by_key(tenant_id=tenant.pk, key=key)
    if op is None:
        stone = tombstone_answer(tenant_id=tenant.pk, key=key, fingerprint=fingerprint)
        return ClaimResult(operation=stone, acquired=False, replayed=True)
    return _answer_existing(
        op=op,
        fingerprint=fingerprint,
        lease=lease,
        mark_sent=mark_sent,
        via_claims=via_claims,
        actor=actor,
        execution_id=execution_id,
    )


@contextmanager
def _atomic_with_index_plans() -> Iterator[None]:
    with transaction.atomic(), sql.index_plans():
        yield


def _insert_claimed(params: dict[str, Any], *, actor: str, reason: str) -> Operation | None:
    """The new row, its first attempt (when it has one) and its event; None when the key is
    taken or tombstoned. One statement on PostgreSQL, three in the caller's transaction
    elsewhere."""
    if statements.combined():
        return statements.operation("operation_claim_pg", {**params, **_event_text(actor=actor, reason=reason)})
    op = statements.operation("operation_insert", params)
    if op is not None:
        if op.attempts:
            statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        _event(op=op, old="", actor=actor, reason=reason)
    return op


# --- Versioned keys ------------------------------------------------------------------------


def _refuse_older_version(*, tenant_id: int, key: str, record: str, action: str, version: int) -> None:
    """409 ``operation_version_superseded`` for a version older than one that succeeded, or a
    new key older than any existing version: exporting revision 3 after revision 4 must not
    happen. An existing older row otherwise answers as usual (abandoned, in progress, …).
    A race with a newer version's first claim is settled by that claim's replacement step."""
    newer = list(
        Operation.objects.filter(tenant_id=tenant_id, record=record, action=action, version__gt=version)
        .order_by("-version", "-id")
        .values_list("pk", "version", "status")[:50]
    )
    if not newer:
        return
    succeeded = next(((pk, v) for pk, v, status in newer if status == S.SUCCEEDED), None)
    if succeeded is None:
        if _fetch_by_key(tenant_id=tenant_id, key=key) is not None:
            return
        pk, newest = newer[0][0], newer[0][1]
        detail = f"Version {newest} of this record and action exists already; version {version} is not started."
    else:
        pk, newest = succeeded
        detail = f"Version {newest} of this record and action succeeded; version {version} must not happen."
    raise OperationVersionSuperseded(detail, extra={"replaced_by": pk, "replaced_by_version": newest})


def _replace_older_versions(*, op: Operation, actor: str) -> None:
    """A new version of a record and action, in the transaction of its claim: older versions
    record it as ``replaced_by``; those still ``queued`` or ``retry_wait`` are abandoned (the
    operator's cancel, reason "replaced by version N"); claimed, uncertain and review rows
    finish their course — something may be under way for them."""
    older = Operation.objects.filter(
        tenant_id=op.tenant_id, record=op.record, action=op.action, version__lt=op.version
    ).exclude(replaced_by__version__gte=op.version)
    linked = list(older.values_list("pk", "status", "version"))
    if not linked:
        return
    Operation.objects.filter(tenant_id=op.tenant_id, pk__in=[pk for pk, _, _ in linked]).update(replaced_by=op)
    reason = f"replaced by version {op.version}"
    for pk, status, _ in linked:
        if status in CANCELLABLE_STATES:
            try:
                operation_cancel(operation_id=pk, actor=actor, reason=reason, tenant_ids=[op.tenant_id])
                continue
            except OperationNotCancellable:
                # Taken by a worker (or its caller) meanwhile: it finishes its course.
                status = Operation.objects.filter(pk=pk, tenant_id=op.tenant_id).values_list("status", flat=True).get()
        course = "" if status in TERMINAL_STATES else "; it finishes its course"
        OperationEvent.objects.create(
            tenant_id=op.tenant_id,
            operation_id=pk,
            from_status=status,
            to_status=status,
            actor=actor[:150],
            reason=f"{reason} (operation {op.pk}){course}",
            attempt=None,
            at=Now(),
        )
    log.info("operation_versions_replaced by=%s count=%s", op.pk, len(linked))


def _fetch_by_key(*, tenant_id: int, key: str) -> Operation | None:
    return statements.operation("operation_by_key", {"tenant_id": tenant_id, "key": key})


def _seconds_until(moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, int((moment - timezone.now()).total_seconds() + 0.999))


def _answer_existing(
    *,
    op: Operation,
    fingerprint: str,
    lease: float,
    mark_sent: bool,
    via_claims: bool,
    actor: str,
    execution_id: str,
) -> ClaimResult:
    # Checked before the fingerprint: the fingerprint includes the mode, so a guard claim
    # of an execute-mode key never matches it and would otherwise always answer 422.
    if via_claims and op.mode == OperationMode.EXECUTE:
        raise OperationManagedByService(
            "This key belongs to an operation the service executes; poll it instead.", extra={"operation_id": op.pk}
        )
    if op.fingerprint != fingerprint:
        raise KeyReusedWithDifferentRequest(
            "This key was first used with a different request; use a new key for a different operation.",
            extra={"operation_id": op.pk},
        )
    if op.record and op.version is not None:
        # Whether sent as parts or as the plain key: a newer version that succeeded wins.
        _refuse_older_version(
            tenant_id=op.tenant_id, key=op.key, record=op.record, action=op.action, version=op.version
        )
    if op.status in TERMINAL_STATES:
        return ClaimResult(operation=operation_newest_in_lineage(op), acquired=False, replayed=True)
    if op.status == S.CLAIMED:
        raise OperationInProgress(
            "Another holder has this operation.",
            retry_after=_seconds_until(op.lease_expires_at),
            extra={"operation_id": op.pk},
        )
    if op.status == S.QUEUED:
        raise OperationRetryScheduled("The operation is queued.", retry_after=1, extra={"operation_id": op.pk})
    if op.status in (S.UNCERTAIN, S.REVIEW):
        raise OperationNeedsReconciliation(
            "The outcome of an earlier attempt is unknown and is being reconciled; do not re-send.",
            extra={"operation_id": op.pk, "status": op.status},
        )
    # retry_wait: due rows are re-claimed by the same key in guard mode (a new attempt) —
    # unless the retry must first ask the tenant whether it is still wanted.
    if op.mode == OperationMode.GUARD and eligibility_recheck_due(op):
        raise OperationRetryScheduled(
            "This retry waits for the tenant's eligibility webhook to say it is still wanted.",
            retry_after=eligibility_ask_interval(),
            extra={"operation_id": op.pk, "waiting_for": "eligibility"},
        )
    if op.mode == OperationMode.GUARD:
        retaken = operation_reclaim(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_seconds=lease,
            mark_sent=mark_sent,
            actor=actor,
            execution_id=execution_id,
        )
        if retaken is not None:
            return ClaimResult(operation=retaken, acquired=True, replayed=False)
        current = _fetch_by_key(tenant_id=op.tenant_id, key=op.key)
        assert current is not None
        if current.status == S.RETRY_WAIT and current.expires_at is not None and current.expires_at <= sql.db_now():
            # Old work expires instead of acting after its context changed: fail it now
            # (retry_wait means nothing was sent) and answer the recorded failure.
            try:
                current = operation_transition(
                    operation=current,
                    to=S.FAILED,
                    actor=actor,
                    reason="lifetime ended while waiting for a retry",
                    changes={"error_class": current.error_class or ErrorClass.TRANSIENT},
                    guard=Q(expires_at__lte=Now()),
                )
            except LeaseLost:
                current = _fetch_by_key(tenant_id=op.tenant_id, key=op.key) or current
        if current.status != S.RETRY_WAIT:
            # Someone else moved it between our read and our update: answer its new state.
            return _answer_existing(
                op=current,
                fingerprint=fingerprint,
                lease=lease,
                mark_sent=mark_sent,
                via_claims=via_claims,
                actor=actor,
                execution_id=execution_id,
            )
        op = current
    raise OperationRetryScheduled(
        "A retry is scheduled.", retry_after=_seconds_until(op.next_attempt_at), extra={"operation_id": op.pk}
    )


def eligibility_ask_interval() -> int:
    """Seconds between two eligibility questions about one row that got no answer."""
    return max(1, int(settings.ONCEGUARD.get("ELIGIBILITY_ASK_INTERVAL_SECONDS", 30)))


def eligibility_recheck_due(op: Operation) -> bool:
    """A retry of ``op`` must first ask the tenant's eligibility webhook ("is this still
    wanted?", ledger.eligibility): it waits for a retry, its provider declares
    ``recheck_after``, and it is older than that since it was created or since the tenant
    last said yes. (The workers' take applies the same rule in SQL: ledger.execute.)"""
    if op.status != S.RETRY_WAIT or not op.provider_id:
        return False
    recheck = provider_by_id(op.provider_id).recheck_after
    if recheck is None:
        return False
    since = op.eligibility_confirmed_at or op.created_at
    return since + timedelta(seconds=recheck) <= sql.db_now()


def operation_reclaim(
    *,
    operation_id: int,
    tenant_id: int,
    lease_seconds: float,
    mark_sent: bool = False,
    actor: str,
    execution_id: str = "",
) -> Operation | None:
    """retry_wait (due) → claimed: a new attempt with a fresh token on the same operation."""
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_reclaim",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": new_lease_token(),
                "lease_seconds": _seconds(lease_seconds),
                "mark_sent": mark_sent,
                "execution_id": execution_id[:255],
            },
        )
        if op is None:
            return None
        statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        _event(op=op, old=S.RETRY_WAIT, actor=actor, reason="retry claimed, sent" if mark_sent else "retry claimed")
    return op


def operation_take(
    *, operation_id: int, tenant_id: int, from_status: str, lease_seconds: float, past_deadline: bool, actor: str
) -> Operation | None:
    """queued|retry_wait → claimed by an execute-mode worker, with a new attempt and the sent
    marker (the worker sends right after); past its deadline or lifetime, without the marker,
    so the worker fails it instead of sending. The caller holds the row locked (the take's
    SKIP LOCKED read) in its transaction."""
    _check_moves((from_status,), S.CLAIMED)
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_take",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "from_status": from_status,
                "lease_token": new_lease_token(),
                "lease_seconds": _seconds(lease_seconds),
                "past_deadline": past_deadline,
            },
        )
        if op is None:
            return None
        statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        _event(
            op=op, old=from_status, actor=actor, reason="taken past its deadline" if past_deadline else "taken, sent"
        )
    return op


# --- Asynchronous providers: waiting on the provider, polls (DESIGN §5) ----------------------


def operation_wait(
    *,
    operation_id: int,
    lease_token: str,
    tenant_id: int,
    provider_ref: str,
    poll_in_seconds: float,
    response_status: int | None = None,
    actor: str,
    reason: str,
) -> Operation:
    """claimed → waiting: the holder hands the row to an asynchronous provider that has the job
    ``provider_ref`` (the submit's answer, or a poll that found it still pending). No lease is
    held from here on; the next poll is due in ``poll_in_seconds``. A holder repeating its own
    move (a record retried after a commit that did land) gets the row back."""
    provider_ref = provider_ref[:255]
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_wait",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": lease_token,
                "provider_ref": provider_ref,
                "poll_in_seconds": _seconds(poll_in_seconds),
            },
        )
        if op is not None:
            if op.polls == 0:
                # The submit: its attempt is the job (pending until the job ends).
                statements.execute(
                    "attempt_job",
                    {
                        "tenant_id": op.tenant_id,
                        "operation_id": op.pk,
                        "number": op.attempts,
                        "provider_ref": provider_ref,
                        "response_status": response_status,
                    },
                )
            _event(op=op, old=S.CLAIMED, actor=actor, reason=reason)
            return op
    current = Operation.objects.filter(pk=operation_id, tenant_id=tenant_id).first()
    if current is not None and current.status == S.WAITING and current.lease_token == lease_token:
        if current.provider_ref == provider_ref:
            return current
    raise _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)


def operation_poll_take(
    *, operation_id: int, tenant_id: int, lease_seconds: float, actor: str, reason: str
) -> Operation | None:
    """waiting → claimed for one poll (a worker's take, which holds the row locked, or the
    provider's webhook): a new token, a short lease, no new attempt. None when the row was
    not waiting any more (someone else took it first)."""
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_poll_take",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": new_lease_token(),
                "lease_seconds": _seconds(lease_seconds),
            },
        )
        if op is not None:
            _event(op=op, old=S.WAITING, actor=actor, reason=reason)
    return op


# --- Holder calls: sent, heartbeat, complete, fail -----------------------------------------


def _diagnose_holder_refusal(*, op_id: int, token: str, tenant_id: int, allow_expired: bool = True) -> Exception:
    """After a guarded update matched nothing: name why, for the caller."""
    op = (
        Operation.objects.filter(pk=op_id, tenant_id=tenant_id)
        .only("status", "lease_token", "lease_expires_at")
        .first()
    )
    if op is None:
        return OperationNotFound("No such operation.")
    if op.lease_token != token:
        return LeaseLost("A newer attempt holds this operation; your result was kept as evidence only.")
    if op.status in TERMINAL_STATES:
        return OperationAlreadyFinished(f"The operation is already {op.status}.", extra={"status": op.status})
    if op.status == S.CLAIMED and not allow_expired:
        return LeaseExpired("Your lease has expired; do not perform the effect. Claim again.")
    return LeaseLost(f"The operation is {op.status}; this token can no longer do that.", extra={"status": op.status})


def operation_mark_sent(
    *,
    operation_id: int,
    lease_token: str,
    reconciliation_handle: str = "",
    actor: str = "api",
    tenant_id: int,
) -> Operation:
    """The marker written before the effect: from now on a crash means "possibly sent".

    Refused once the lease has expired — a holder must not start an effect it may no
    longer own.
    """
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_mark_sent",
            {
                "id": operation_id,
                "lease_token": lease_token,
                "reconciliation_handle": reconciliation_handle[:255],
                "tenant_id": tenant_id,
            },
        )
        if op is not None:
            statements.execute(
                "attempt_mark_sent", {"tenant_id": op.tenant_id, "operation_id": op.pk, "number": op.attempts}
            )
            _event(op=op, old=S.CLAIMED, actor=actor, reason="sent marker")
    if op is None:
        raise _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id, allow_expired=False)
    return op


def operation_heartbeat(
    *, operation_id: int, lease_token: str, lease_seconds: float | None = None, tenant_id: int
) -> Operation:
    """Extend a live holder's lease (claimed, same token). No event row: not a transition."""
    with transaction.atomic(), sql.index_plans():
        op = statements.operation(
            "operation_heartbeat",
            {
                "id": operation_id,
                "lease_token": lease_token,
                "lease_seconds": _seconds(clamp_lease(lease_seconds)),
                "tenant_id": tenant_id,
            },
        )
        if op is not None:
            # The attempt mirrors the row's lease exactly (its value, not a second clock read).
            Attempt.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk, lease_token=lease_token).update(
                lease_expires_at=op.lease_expires_at
            )
    if op is None:
        raise _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    return op


def _record_fenced_evidence(
    *,
    operation_id: int,
    tenant_id: int,
    lease_token: str,
    provider_ref: str = "",
    response_status: int | None = None,
    response_body: Any = None,
    error_class: str = "",
    message: str = "",
) -> None:
    """A superseded holder's late result is kept on its own Attempt, never on the row."""
    Attempt.objects.filter(tenant_id=tenant_id, operation_id=operation_id, lease_token=lease_token).update(
        outcome=AttemptOutcome.FENCED,
        provider_ref=provider_ref[:255],
        response_status=response_status,
        response_body=seal_json(response_body),
        error_class=error_class,
        message=sanitize_message(message),
        finished_at=Coalesce("finished_at", Now()),
    )


# The states a latest holder's report may move a row from, most likely first: a completion
# almost always finds its row still claimed, so it usually takes one statement.
REPORT_ORDER = (S.CLAIMED, S.UNCERTAIN, S.REVIEW)


def operation_complete(
    *,
    operation_id: int,
    lease_token: str,
    provider_ref: str = "",
    response_status: int | None = 200,
    response_body: Any = None,
    actor: str = "api",
    reason: str = "completed",
    tenant_id: int,
) -> Operation:
    """claimed|uncertain|review → succeeded, for the latest attempt's token only.

    The latest holder's result is the best evidence there is, so it is accepted even
    after the sweeper moved the row to uncertain or review (DESIGN §3 fencing).
    """
    params = {
        "id": operation_id,
        "lease_token": lease_token,
        "tenant_id": tenant_id,
        "provider_ref": provider_ref[:255],
        "response_status": response_status,
        "response_body": _sealed(response_body),
    }
    with transaction.atomic(), sql.index_plans():
        op = _complete_reported(params, actor=actor, reason=reason)
        if op is not None:
            _after_terminal(op, actor=actor)
            # DEBUG: a success needs no one's attention and its record is the event row;
            # what does (fenced, failed, uncertain, paused) is logged at INFO or above. (The
            # fields are only gathered when the line is written.)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("operation_succeeded", extra=operation_fields(op))
            return op
    error = _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    if isinstance(error, LeaseLost) and "status" not in error.extra:
        _record_fenced_evidence(
            operation_id=operation_id,
            tenant_id=tenant_id,
            lease_token=lease_token,
            provider_ref=provider_ref,
            response_status=response_status,
            response_body=response_body,
        )
    elif isinstance(error, OperationAlreadyFinished):
        current = Operation.objects.get(pk=operation_id, tenant_id=tenant_id)
        # The same holder repeating its own successful complete gets the row back.
        if (
            current.status == S.SUCCEEDED
            and current.lease_token == lease_token
            and current.provider_ref == provider_ref[:255]
        ):
            return current
    raise error


def _complete_reported(params: dict[str, Any], *, actor: str, reason: str) -> Operation | None:
    """The succeeded row, its attempt's outcome and its event, from whichever reportable
    state the row is in; None when the guard matched nothing. One statement on PostgreSQL;
    elsewhere one guarded UPDATE per source state, claimed first."""
    if statements.combined():
        return statements.operation("operation_complete_pg", {**params, **_event_text(actor=actor, reason=reason)})
    for old in REPORT_ORDER:
        op = statements.operation("operation_complete", {**params, "from_status": old})
        if op is not None:
            statements.execute(
                "attempt_succeed",
                {
                    "tenant_id": op.tenant_id,
                    "operation_id": op.pk,
                    "number": op.attempts,
                    "provider_ref": params["provider_ref"],
                    "response_status": params["response_status"],
                },
            )
            _event(op=op, old=old, actor=actor, reason=reason)
            return op
    return None


@dataclass(frozen=True)
class FailureDecision:
    to: str
    next_attempt_in: float | None
    reason: str
    attempt_outcome: str


def _decide_failure(
    *,
    op: Operation,
    error_class: str,
    throttled: bool,
    retry_after: float | None,
    now: datetime,
    has_unresolved_sent: bool,
) -> FailureDecision:
    """DESIGN §3 failure classes → the next state."""
    if error_class == ErrorClass.AMBIGUOUS:
        return FailureDecision(S.UNCERTAIN, None, "ambiguous outcome", AttemptOutcome.AMBIGUOUS)
    if error_class in NO_RETRY_ERROR_CLASSES:
        to = S.REVIEW if has_unresolved_sent else S.FAILED
        return FailureDecision(to, None, f"{error_class}: no retry", AttemptOutcome.FAILED)
    # transient: the effect did not happen; retry unless a cap is hit.
    counted = op.attempts - op.throttled_attempts - (1 if throttled else 0)
    provider = Provider.objects.filter(pk=op.provider_id).first() if op.provider_id else None
    base = provider.base_delay_seconds if provider else 1.0
    cap = provider.max_delay_seconds if provider else 300.0
    delay = backoff_seconds(attempt=max(1, counted), base=base, cap=cap)
    if retry_after is not None:
        delay = max(delay, float(retry_after))
    out_of_attempts = not throttled and counted >= op.max_attempts
    out_of_time = op.expires_at is not None and now + timedelta(seconds=delay) > op.expires_at
    past_deadline = op.deadline is not None and now + timedelta(seconds=delay) > op.deadline
    if out_of_attempts or out_of_time or past_deadline:
        why = "attempts exhausted" if out_of_attempts else "lifetime exhausted"
        to = S.REVIEW if has_unresolved_sent else S.FAILED
        return FailureDecision(to, None, f"transient: {why}", AttemptOutcome.TRANSIENT)
    return FailureDecision(S.RETRY_WAIT, delay, "transient: retry scheduled", AttemptOutcome.TRANSIENT)


def decide_unsent_expiry(op: Operation) -> tuple[str, float | None, str]:
    """A lease that expired before anything was sent is a transient failure of that attempt."""
    decision = _decide_failure(
        op=op,
        error_class=ErrorClass.TRANSIENT,
        throttled=False,
        retry_after=None,
        now=sql.db_now(),
        has_unresolved_sent=op.attempt_set.filter(tenant_id=op.tenant_id, outcome=AttemptOutcome.AMBIGUOUS).exists(),
    )
    if decision.to == S.RETRY_WAIT:
        # Due at once: nothing was sent, so there is no reason to wait.
        return S.RETRY_WAIT, 0.0, "lease expired before the sent marker"
    return decision.to, None, f"lease expired before the sent marker; {decision.reason}"


class _FencedReport(Exception):
    """A superseded holder's refusal, carried out of the transaction that found it."""

    def __init__(self, error: LeaseLost, **evidence: Any):
        super().__init__(str(error))
        self.error = error
        self.evidence = evidence


@contextmanager
def _atomic_keeping_fenced_evidence() -> Iterator[None]:
    """transaction.atomic(), except that a superseded holder's evidence is written after the
    rollback: written inside, it was rolled back together with the refusal."""
    try:
        with transaction.atomic():
            yield
    except _FencedReport as fenced:
        _record_fenced_evidence(**fenced.evidence)
        raise fenced.error from None


def operation_fail(
    *,
    operation_id: int,
    lease_token: str,
    error_class: str,
    message: str = "",
    response_status: int | None = None,
    response_body: Any = None,
    retry_after: float | None = None,
    throttled: bool = False,
    actor: str = "api",
    tenant_id: int,
) -> Operation:
    """Record a failure reported by the latest holder and apply DESIGN §3's table.

    ``throttled`` (a 429/503 answer) schedules the retry without consuming an attempt. A
    cap hit while an earlier sent attempt is unresolved lands in ``review``, never
    ``failed``: a failed row may be replayed, so "maybe sent" must never land there.
    """
    if error_class not in ErrorClass.values:
        raise ValidationFailed(f"error_class must be one of {', '.join(ErrorClass.values)}.")
    message = sanitize_message(message)
    with _atomic_keeping_fenced_evidence(), sql.index_plans():
        op = (
            Operation.objects.select_for_update()
            .filter(pk=operation_id, tenant_id=tenant_id, lease_token=lease_token, status__in=REPORTABLE_STATES)
            .first()
        )
        if op is None:
            error = _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
            if isinstance(error, LeaseLost) and "status" not in error.extra:
                raise _FencedReport(
                    error,
                    operation_id=operation_id,
                    tenant_id=tenant_id,
                    lease_token=lease_token,
                    error_class=error_class,
                    message=message,
                    response_status=response_status,
                    response_body=response_body,
                )
            raise error
        unresolved_before = op.attempt_set.filter(
            tenant_id=op.tenant_id, outcome=AttemptOutcome.AMBIGUOUS, number__lt=op.attempts
        ).exists()
        decision = _decide_failure(
            op=op,
            error_class=error_class,
            throttled=throttled,
            retry_after=retry_after,
            now=sql.db_now(),
            has_unresolved_sent=unresolved_before,
        )
        attempt = {
            "tenant_id": op.tenant_id,
            "operation_id": op.pk,
            "number": op.attempts,
            "outcome": decision.attempt_outcome,
            "error_class": error_class,
            "message": message,
            "response_status": response_status,
        }
        if decision.to == op.status or decision.to not in ALLOWED_TRANSITIONS[op.status]:
            # An ambiguous report on a row already uncertain, or one that would move a row
            # already waiting for a human (review → uncertain): evidence only.
            statements.execute("attempt_finish", attempt)
            return op
        has_response = response_status is not None or response_body is not None
        updated = statements.operation(
            "operation_fail",
            {
                "id": op.pk,
                "tenant_id": op.tenant_id,
                "from_status": op.status,
                "lease_token": lease_token,
                "to_status": decision.to,
                "terminal": decision.to in TERMINAL_STATES,
                "error_class": error_class,
                "message": message,
                "keep_response": not has_response,
                "response_status": response_status,
                "response_body": _sealed(response_body) if has_response else None,
                "throttled": 1 if throttled else 0,
                "retry_in_seconds": _seconds(decision.next_attempt_in),
            },
        )
        if updated is None:  # pragma: no cover - the row is locked above
            raise LeaseLost("The operation moved while failing.")
        statements.execute("attempt_finish", attempt)
        _event(
            op=updated,
            old=op.status,
            actor=actor,
            reason=f"{decision.reason}: {message}" if message else decision.reason,
        )
        if updated.status == S.FAILED:
            _after_failed(updated)
        _after_terminal(updated, actor=actor)
    log.info("operation_failed to=%s", updated.status, extra=operation_fields(updated, error_class=error_class))
    return updated


# --- Service-side moves (sweeper, reviewers) ------------------------------------------------


def operation_transition(
    *,
    operation: Operation,
    to: str,
    actor: str,
    reason: str,
    changes: dict[str, Any] | None = None,
    attempt_changes: dict[str, Any] | None = None,
    guard: Q | None = None,
) -> Operation:
    """Move an operation from the state it was read in (a guarded ORM update: these moves
    are not hot); raises LeaseLost if it moved meanwhile.

    ``changes`` are further column values (values or expressions such as ``Now()``),
    ``attempt_changes`` apply to its latest attempt, ``guard`` narrows the move further
    (e.g. ``Q(expires_at__lte=Now())``).
    """
    _check_moves((operation.status,), to)
    values: dict[str, Any] = {"status": to, "updated_at": Now(), **(changes or {})}
    if to in TERMINAL_STATES:
        values["done_at"] = Now()
    rows = Operation.objects.filter(
        pk=operation.pk, tenant_id=operation.tenant_id, status=operation.status, lease_token=operation.lease_token
    )
    if guard is not None:
        rows = rows.filter(guard)
    with transaction.atomic():
        if not rows.update(**values):
            raise LeaseLost("The operation moved before this change could be applied.")
        updated = Operation.objects.get(pk=operation.pk, tenant_id=operation.tenant_id)
        if attempt_changes:
            Attempt.objects.filter(
                tenant_id=updated.tenant_id, operation_id=updated.pk, number=updated.attempts
            ).update(**attempt_changes)
        _event(op=updated, old=operation.status, actor=actor, reason=reason)
        if updated.status == S.FAILED:
            _after_failed(updated)
        _after_terminal(updated, actor=actor)
    return updated


# --- Operator actions: cancel and retry now (console) ------------------------------------------

CANCELLABLE_STATES = (S.QUEUED, S.RETRY_WAIT)


def _operator_target(*, operation_id: int, tenant_ids: list[int] | None) -> Operation:
    rows = Operation.objects.filter(pk=operation_id)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    op = rows.first()
    if op is None:
        raise OperationNotFound("No such operation.")
    return op


def operation_cancel(*, operation_id: int, actor: str, reason: str, tenant_ids: list[int] | None = None) -> Operation:
    """An operator's cancel: ``queued`` or ``retry_wait`` → ``abandoned``, with a reason.

    Only rows nothing is under way for: a ``claimed`` row may be sending, an ``uncertain`` or
    ``review`` one may have happened, so those go through completion, reconciliation or
    review. The move is the guarded UPDATE of ``operation_transition`` (status and lease token
    as read): a worker that took the row meanwhile wins and the cancel is refused. Later
    claims of the key answer ``200`` with the abandoned outcome; a callback is queued as for
    any finished row. ``tenant_ids`` limits which tenants' rows the caller may cancel.
    """
    reason = " ".join((reason or "").split())
    if not reason:
        raise ValidationFailed("Say why the operation is cancelled.")
    op = _operator_target(operation_id=operation_id, tenant_ids=tenant_ids)
    if op.status not in CANCELLABLE_STATES:
        raise OperationNotCancellable(
            f"The operation is {op.status}; only queued or retry_wait operations can be cancelled.",
            extra={"status": op.status},
        )
    try:
        moved = operation_transition(
            operation=op,
            to=S.ABANDONED,
            actor=actor,
            reason=f"cancelled: {reason}",
            changes={"next_attempt_at": None},
        )
    except LeaseLost as exc:
        raise OperationNotCancellable("The operation moved (a worker may have taken it); reload it.") from exc
    log.info("operation_cancelled operation=%s actor=%s", moved.pk, actor)
    return moved


def operation_retry_now(
    *, operation_id: int, actor: str, reason: str = "", tenant_ids: list[int] | None = None
) -> Operation:
    """An execute-mode row waiting for its next attempt becomes due now (its backoff is
    skipped; attempts, lifetime and the provider's pause or throttle still apply).

    A guard-mode row is retried by its caller claiming the key again — Onceguard never sends
    it — so it is refused here. The row stays ``retry_wait``; the event row records who
    asked (``retry_wait → retry_wait``), as ``operation_supersede`` records its own change.
    """
    op = _operator_target(operation_id=operation_id, tenant_ids=tenant_ids)
    if op.status != S.RETRY_WAIT:
        raise OperationNotCancellable(
            f"The operation is {op.status}; only a retry_wait operation can be retried now.",
            extra={"status": op.status},
        )
    if op.mode != OperationMode.EXECUTE:
        raise OperationNotCancellable(
            "A guard-mode operation is retried by its caller, who claims the key again; Onceguard does not send it."
        )
    rows = Operation.objects.filter(pk=op.pk, tenant_id=op.tenant_id, status=S.RETRY_WAIT, lease_token=op.lease_token)
    with transaction.atomic():
        if not rows.update(next_attempt_at=Now(), updated_at=Now()):
            raise OperationNotCancellable("The operation moved (a worker may have taken it); reload it.")
        moved = Operation.objects.get(pk=op.pk, tenant_id=op.tenant_id)
        _event(op=moved, old=S.RETRY_WAIT, actor=actor, reason=f"retry now requested{': ' + reason if reason else ''}")
    log.info("operation_retry_now operation=%s actor=%s", moved.pk, actor)
    return moved


def operation_supersede(
    *, operation_id: int, tenant_id: int, by_operation_id: int, actor: str, reason: str = ""
) -> Operation:
    """A failed operation records the replay that supersedes it (DESIGN §4).

    The row stays `failed` (history is never edited); only ``superseded_by`` moves, to a
    newer operation than the one it points at, with an event row. Later claims of its key
    answer with the newest replay's outcome (``operation_newest_in_lineage``).
    """
    rows = (
        Operation.objects.filter(pk=operation_id, tenant_id=tenant_id, status=S.FAILED)
        .exclude(pk=by_operation_id)
        .filter(Q(superseded_by__isnull=True) | Q(superseded_by_id__lt=by_operation_id))
    )
    with transaction.atomic():
        if not rows.update(superseded_by_id=by_operation_id, updated_at=Now()):
            raise IllegalTransition("Only a failed operation can be superseded, and only by a newer one.")
        op = Operation.objects.get(pk=operation_id, tenant_id=tenant_id)
        OperationEvent.objects.create(
            tenant_id=tenant_id,
            operation_id=operation_id,
            from_status=S.FAILED,
            to_status=S.FAILED,
            actor=actor[:150],
            reason=sanitize_message(reason or f"superseded by operation {by_operation_id}"),
            attempt=None,
            at=Now(),
        )
    return op


# --- Tenants, keys, providers ----------------------------------------------------------


def tenant_create(
    *, slug: str, name: str = "", secret_namespace: str = "", actor: str = "system", **settings: Any
) -> Tenant:
    """A new tenant with its secret namespace, fixed from now on (ADR 0001): ``secret_namespace``
    when the platform names one, else derived from the slug (``acme`` → ``ACME``) or, where
    that is taken or overlaps another's, the next free one (ledger.provider_checks).
    ``settings``: its other fields (limits, budget, allow-list …), checked by the model's rules
    as the console's form checks them — the one write path of both (ADR 0006)."""
    if secret_namespace and not namespace_valid(secret_namespace):
        raise ValidationFailed(
            f"A secret namespace is 1–{NAMESPACE_MAX_LENGTH} capital letters and digits (no _): {secret_namespace[:40]!r}."
        )
    fixed = set(settings) & {*TENANT_FIXED_FIELDS, "slug", "name"}
    if fixed:
        raise ValidationFailed(f"Not a setting: {', '.join(sorted(fixed))}.")
    tenant = Tenant(slug=slug, name=name or slug, secret_namespace=secret_namespace, **settings)
    try:
        # The slug's and name's shape and length, the allow-list and eligibility URL against the
        # outbound policy (Tenant.clean); uniqueness is the insert's to decide.
        tenant.full_clean(exclude=["secret_namespace"], validate_unique=False, validate_constraints=False)
    except DjangoValidationError as exc:
        raise ValidationFailed("; ".join(exc.messages)) from exc
    try:
        with transaction.atomic():
            tenant.save(force_insert=True)
            config_change_of(tenant, actor=actor, action=ConfigChangeAction.CREATE)
            return tenant
    except IntegrityError as exc:
        if Tenant.objects.filter(slug=slug).exists():
            raise ValidationFailed(f"A tenant named {slug!r} exists already.") from exc
        raise ValidationFailed(
            f"The secret namespace {secret_namespace or 'derived from the slug'!s} is taken or overlaps another"
            " tenant's (one a prefix of the other); name a free one or try again."
        ) from exc


# Fixed when the tenant is made: its providers' variable names depend on it (ADR 0001).
TENANT_FIXED_FIELDS = ("secret_namespace",)


def tenant_update(*, tenant_id: int, actor: str, **fields: Any) -> Tenant:
    """Change a tenant's settings (limits, callback allow-list, …), recorded as a change. A
    platform action (CLI, a superuser): no tenant API calls it. A slug change keeps the
    secret namespace."""
    fixed = set(fields) & set(TENANT_FIXED_FIELDS)
    if fixed:
        raise ValidationFailed(f"Fixed when the tenant was made: {', '.join(sorted(fixed))}.")
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
        before = config_snapshot(tenant)
        for name, value in fields.items():
            setattr(tenant, name, value)
        try:
            tenant.full_clean()
        except DjangoValidationError as exc:
            raise ValidationFailed("; ".join(exc.messages)) from exc
        tenant.save(update_fields=list(fields))
        config_change_of(tenant, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    return tenant


def apikey_create(
    *,
    tenant: Tenant,
    scopes: list[str] | None = None,
    name: str = "",
    expires_at: datetime | None = None,
    actor: str = "system",
) -> tuple[Any, str]:
    """Create an API key; the secret is returned once and only its sha256 is stored. After
    ``expires_at`` (if given) it authenticates nothing."""
    scopes = scopes or ["read", "write"]
    unknown = set(scopes) - set(ApiKey.SCOPES)
    if unknown:
        raise ValidationFailed(f"Unknown scopes: {', '.join(sorted(unknown))}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("An API key's expiry must lie in the future.")
    prefix = secrets.token_hex(4)
    secret = f"og_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            hashed_key=hash_api_key(secret),
            scopes=scopes,
            expires_at=expires_at,
        )
        config_change_of(api_key, actor=actor, action=ConfigChangeAction.CREATE)
    return api_key, secret


def apikey_revoke(*, api_key_id: int, actor: str = "system") -> None:
    with transaction.atomic():
        api_key = ApiKey.objects.select_for_update().filter(pk=api_key_id, revoked_at__isnull=True).first()
        if api_key is not None:
            before = config_snapshot(api_key)
            api_key.revoked_at = timezone.now()
            api_key.save(update_fields=["revoked_at"])
            config_change_of(api_key, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    API_KEYS.forget_where(lambda found: found[1].pk == api_key_id)


# Operational state the workers and operators move (throttling, pausing), and the adapter
# rollout's pointers, which the trail records by revision number (ledger.revisions.rollout_state).
PROVIDER_STATE_FIELDS = (
    "throttled_until",
    "paused_at",
    "paused_reason",
    "revision",
    "canary_revision",
    "canary_percent",
    "canary_started_at",
)
# What ledger.provider_checks looks at on every save.
_CHECKED_FIELDS = ("base_url", "lookup_path", "auth_secret_env")


def provider_slug_check(slug: str) -> str:
    """A slug a provider may be made under: the model field's shape and length (the console's
    form says the same), and none of the service's own (``_callbacks``…)."""
    if slug.startswith(RESERVED_PROVIDER_PREFIX):
        raise ValidationFailed(RESERVED_PROVIDER_DETAIL, extra={"field": "slug"})
    try:
        Provider._meta.get_field("slug").clean(slug, None)
    except DjangoValidationError as exc:
        raise ValidationFailed("; ".join(exc.messages), extra={"field": "slug"}) from None
    return slug


def provider_upsert(
    *,
    tenant: Tenant,
    slug: str,
    actor: str = "system",
    auth_secret: str | None = None,
    webhook_secret: str | None = None,
    reason: str = "",
    canary_percent: int | None = None,
    **fields: Any,
) -> Provider:
    """Create or update a tenant's provider, checked like a console save (``Provider.clean``:
    the outbound policy for its URLs, the declared set for an environment credential) and
    recorded as a configuration change. ``auth_secret``: a new credential to store sealed
    ("" clears it; None leaves it) — never returned, never recorded in clear;
    ``webhook_secret`` likewise (the key an asynchronous provider signs its webhooks with).

    A change of the adapter fields records the next adapter revision (``ledger.revisions``):
    the stable one at once, or — with ``canary_percent`` — a canary taking that share of new
    operations while the provider keeps its stable revision (DESIGN §5, adapter revisions).
    ``reason`` says why, in the revision and the trail."""
    provider_slug_check(slug)
    if auth_secret is not None:
        fields["auth_secret"] = sealed_credential(auth_secret)
    if webhook_secret is not None:
        fields["webhook_secret"] = sealed_credential(webhook_secret)
    unknown = set(fields) & set(PROVIDER_STATE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Not configuration: {', '.join(sorted(unknown))} (see ledger.canary).")
    with transaction.atomic():
        existing = Provider.objects.select_for_update().filter(tenant=tenant, slug=slug).first()
        before = config_snapshot(existing, exclude=PROVIDER_STATE_FIELDS) if existing is not None else None
        wanted = {
            name: fields.get(name, getattr(existing, name) if existing is not None else "") or ""
            for name in _CHECKED_FIELDS
        }
        # The stored namespace, never the slug (ADR 0001); read, not taken from ``tenant``,
        # which a caller may have built with only its id.
        namespace = Tenant.objects.filter(pk=tenant.pk).values_list("secret_namespace", flat=True).first() or ""
        errors, base_url = provider_config_errors(namespace=namespace, **wanted)
        if errors:
            text = " ".join(errors.values())
            raise DestinationNotAllowed(text) if "base_url" in errors else ValidationFailed(text)
        # The intent schema and request template (ledger.intents): checked as a pair.
        intent_errors = intent_config_errors(
            **{
                name: fields[name] if name in fields else getattr(existing, name, None)
                for name in ("intent_schema", "request_template")
            },
            prompt_slots=prompt_slots_of(tenant.pk),
        )
        if intent_errors:
            raise RequestTemplateInvalid(" ".join(intent_errors.values()), extra={"fields": intent_errors})
        async_values = {
            name: fields[name] if name in fields else getattr(existing, name, Provider._meta.get_field(name).default)
            for name in ADAPTER_FIELDS
        }
        async_values = {k: (v() if callable(v) else v) for k, v in async_values.items()}
        async_errors = async_config_errors(async_values)
        if async_errors:
            raise ValidationFailed(" ".join(f"{name}: {message}." for name, message in async_errors.items()))
        if "base_url" in fields:
            # Stored in the canonical form the check saw.
            fields["base_url"] = base_url
        caps = {name: fields.get(name, getattr(existing, name, None)) for name in PROVIDER_CAP_FIELDS}
        if existing is None:
            # A new provider: what it does not say is the field's default (None: no cap).
            caps.update({name: fields.get(name, Provider._meta.get_field(name).get_default()) for name in caps})
        cap_errors = provider_caps_errors(**caps)
        if cap_errors:
            raise ValidationFailed(" ".join(cap_errors.values()))
        caps_changed = existing is not None and any(caps[name] != getattr(existing, name) for name in caps)
        if existing is None:
            if canary_percent is not None:
                raise ValidationFailed("A new provider has no stable revision to run a canary against.")
            provider = Provider.objects.create(tenant=tenant, slug=slug, **fields)
            revisions.revision_first(provider=provider, actor=actor, reason=reason)
            rollout_before: dict[str, Any] = {}
        else:
            rollout_before = revisions.rollout_state(existing)
            provider = existing
            for name, value in fields.items():
                setattr(provider, name, value)
            revisions.revision_for_save(
                candidate=provider,
                stored=Provider.objects.get(pk=existing.pk),
                actor=actor,
                reason=reason,
                canary_percent=canary_percent,
            )
            provider.save()
        # The trail records what is stored, however the caller typed it (a price of "0" from
        # the command, Decimal("0") from the console): every path writes the same row.
        provider.refresh_from_db()
        config_change_record(
            tenant_id=tenant.pk,
            actor=actor,
            action=ConfigChangeAction.CREATE if existing is None else ConfigChangeAction.UPDATE,
            object_type=provider._meta.label_lower,
            object_id=provider.pk,
            object_repr=str(provider),
            before={**before, **rollout_before} if before is not None else None,
            after={**config_snapshot(provider, exclude=PROVIDER_STATE_FIELDS), **revisions.rollout_state(provider)},
            reason=revisions.clean_reason(reason),
        )
        if caps_changed:
            ratelimit.provider_rate_reset(provider=provider)
    provider_cache_forget(provider)
    return provider


def provider_cache_forget(provider: Provider) -> None:
    """This process's cached copies of ``provider`` go (other processes' within
    PROVIDER_CACHE_SECONDS): after any change of its configuration."""
    PROVIDERS.forget((provider.tenant_id, provider.slug))
    PROVIDERS_BY_ID.forget(provider.pk)


# --- Provider throttling and pausing (execute mode) -------------------------------------------


def provider_throttle(*, provider_id: int, seconds: float) -> None:
    """A 429/503 answer: workers take none of this provider's work until ``throttled_until``
    (database clock). Only ever extends, so two workers reporting at once keep the later time."""
    until = sql.db_now() + timedelta(seconds=min(max(0.0, seconds), MAX_DURATION_SECONDS))
    Provider.objects.filter(pk=provider_id).filter(
        Q(throttled_until__isnull=True) | Q(throttled_until__lt=until)
    ).update(throttled_until=until)
    log.info("provider_throttled provider=%s seconds=%.1f", provider_id, seconds)


def provider_pause(*, provider_id: int, reason: str, actor: str = "worker") -> bool:
    """401/403 from a provider: no worker sends to it until an operator resumes it.

    Returns True when this call paused it (and raised the alert); a provider already paused
    stays paused with its first reason."""
    reason = sanitize_message(reason)[:200]
    with transaction.atomic():
        paused = Provider.objects.filter(pk=provider_id, paused_at__isnull=True).update(
            paused_at=timezone.now(), paused_reason=reason, updated_at=timezone.now()
        )
        if paused:
            provider = Provider.objects.only("id", "tenant_id", "slug").get(pk=provider_id)
            hooks.alert_raised.send(
                tenant_id=provider.tenant_id,
                kind="provider_paused",
                ref=provider.slug,
                summary=f"provider {provider.slug} paused: {reason}",
            )
    if paused:
        log.warning("provider_paused provider=%s actor=%s reason=%s", provider_id, actor, reason)
    return bool(paused)


def provider_resume(*, provider_id: int, actor: str) -> bool:
    """An operator's decision: the provider's queued work flows again. Recorded in the
    configuration trail in the same transaction, for the console's action and
    ``manage.py provider_resume`` alike (ADR 0006)."""
    with transaction.atomic():
        stored = Provider.objects.filter(pk=provider_id).first()
        before = config_snapshot(stored) if stored is not None else None
        resumed = Provider.objects.filter(pk=provider_id, paused_at__isnull=False).update(
            paused_at=None, paused_reason="", throttled_until=None, updated_at=timezone.now()
        )
        if resumed and stored is not None:
            stored.refresh_from_db()
            config_change_of(stored, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    if resumed:
        log.info("provider_resumed provider=%s actor=%s", provider_id, actor)
    return bool(resumed)
