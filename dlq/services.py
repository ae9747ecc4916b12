"""Every write to the dead-letter queue (DESIGN §4). Keyword-only, typed, one per action.

Status changes are guarded UPDATEs (zero rows → someone else moved the entry first → a
named error) and each leaves a FailedEventChange row in the same transaction. A replay is
three short commits around the HTTP call, never a transaction held across it:

1. allocate n: the guarded ``pending→replaying`` UPDATE (+ the Replay lineage row);
2. claim ``replay:{event id}:{n}`` in the ledger with the sent marker (we send right after);
3. send; then record the outcome in the ledger, on the Replay row and on the entry
   (``replayed``, or back to ``pending``), and point the original failed operation at the
   replay (``superseded_by``) — one transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.db.models.functions import Now
from django.utils import timezone

from alerts.services import alert_raise
from dlq.entries import selectors, transitions
from dlq.entries.payloads import index_payload, is_redacted, open_payload, seal_payload
from dlq.ingest.parsing import (
    ParsedFailure,
    error_class_for_status,
    failed_item_index,
    failed_request_key,
    parse_failure,
)
from dlq.models import (
    BUSINESS_KEY_SOURCES,
    FE_OPEN_STATES,
    FE_TERMINAL_STATES,
    BulkReplay,
    BulkReplayStatus,
    FailedEvent,
    FailedEventAlias,
    FailedEventOccurrence,
    FailedEventShape,
    FailedEventStatus,
    KeySource,
    N8nConnection,
    PayloadFetch,
    PayloadSource,
    Replay,
    ReplayAck,
    ReplayOutcome,
    ReplayTarget,
    ReplayTrigger,
    n8n_base_url_check,
    n8n_timeout_check,
    replay_target_url_check,
)
from dlq.n8n import client as n8n
from dlq.rules.conf import dlq_setting
from dlq.rules.errors import (
    BulkReplayNotConfirmable,
    BulkReplayNotFound,
    BulkReplayRateLimited,
    BulkReplayTooLarge,
    ConfirmationRequired,
    EventTooLarge,
    FailedEventBusy,
    FailedEventClosed,
    KeyNotSettable,
    NoteRequired,
    ReplayInProgress,
    ReplayNeedsDecision,
    ReplayNeedsForce,
    ReplayOriginalInFlight,
    ReplayOriginalUnsettled,
)
from ledger.execution.attempts import operation_submit, operation_translated
from ledger.models import (
    TERMINAL_STATES,
    ConfigChangeAction,
    ErrorClass,
    IdempotencyClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    Provider,
    ProviderKind,
    Tenant,
)
from ledger.platform import storable, tasks
from ledger.platform.crypto import open_json
from ledger.platform.errors import DomainError, InvalidKey, ValidationFailed
from ledger.platform.passes import failure_text, row_isolated
from ledger.platform.redaction import scrub
from ledger.protocol import services as ledger_services
from ledger.protocol import transitions as ledger_transitions
from ledger.protocol.selectors import provider_slug
from ledger.providers import adapters
from ledger.providers.adapters import SIGNATURE_HEADER, sign, verify_signature
from ledger.providers.credentials import (
    sealed_credential,
    secret_open,
    signing_secret_summary,
    signing_secrets_now,
    stored_credential_value,
)
from ledger.rules.key_rules import MAX_KEY_LENGTH, key_check, key_header_value, key_usable
from ledger.rules.outbound import OutboundBlocked, outbound_client, outbound_refusal
from ledger.rules.search import search_values
from ledger.tenants.config_changes import config_change_of, config_change_record, config_snapshot
from ledger.tenants.workflows import workflow_name_note
from ledger.web.failures import transport_error_text

FE = FailedEventStatus
# The ledger key guarding replay n of an entry: replay:{entry id}:{n}.
REPLAY_KEY_PREFIX = "replay:"


def replay_ledger_key(event_pk: int, number: int) -> str:
    return f"{REPLAY_KEY_PREFIX}{event_pk}:{number}"


log = logging.getLogger("onceguard.dlq")

MAX_NOTE = 500


def _note(note: str | None) -> str:
    return ledger_services.sanitize_message(note)[:MAX_NOTE]


def _alert_new(event: FailedEvent) -> None:
    # Ids and the class only: error messages and payloads may carry personal data.
    where = f" in workflow {event.source_workflow_id}" if event.source_workflow_id else ""
    alert_raise(
        tenant_id=event.tenant_id,
        kind="dlq_new",
        ref=str(event.pk),
        summary=f"new dead-letter entry ({event.error_class or 'unclassified'}, {event.shape}){where}",
    )


# --- Automatic: terminally failed operations ------------------------------------------------


def failed_event_record_for_operation(*, operation: Operation) -> FailedEvent:
    """The DLQ entry of a terminally failed operation, written in the caller's transaction.

    The payload is the operation's payload (execute mode: its request), so an operator can
    inspect and replay it; the identity is ``op:{id}``, so a second call is a no-op. The
    ledger operation guarding a replay (``replay:{event id}:{n}``) belongs to the entry it
    replays: its failure is recorded on that entry's Replay row, not as a new entry.
    """
    if operation.key.startswith(REPLAY_KEY_PREFIX):
        replay = (
            Replay.objects.filter(
                tenant_id=operation.tenant_id, ledger_key=operation.key, event__tenant_id=operation.tenant_id
            )
            .select_related("event")
            .first()
        )
        if replay is not None:
            return replay.event
    linked = FailedEvent.objects.filter(tenant_id=operation.tenant_id, operation=operation).first()
    if linked is not None:
        # An entry already stands for this operation (a replay of it took the claim over,
        # ADR 0007): the same failure, not a second entry.
        return linked
    now = timezone.now()
    stored = operation.payload if operation.payload is not None else operation.request
    # The operation's value may be sealed already; search paths need the plaintext.
    plain = open_payload(stored)
    event, created = FailedEvent.objects.get_or_create(
        tenant_id=operation.tenant_id,
        event_id=f"op:{operation.pk}",
        defaults={
            "shape": FailedEventShape.OPERATION,
            "payload": seal_payload(plain),
            "search_fields": search_values(plain, dlq_setting("SEARCH_PATHS")),
            "error_message": operation.last_error,
            "error_class": operation.error_class,
            "failed_at": now,
            "last_seen_at": now,
            "retry_count": max(0, operation.attempts - 1),
            "original_key": operation.key,
            "operation": operation,
            "source_execution_id": operation.execution_id,
            "source_workflow_id": operation.workflow_id,
            "quarantine_reason": quarantine_reason_of(operation),
            "adapter_revision_id": operation.adapter_revision_id,
        },
    )
    if created:
        index_payload(tenant_id=event.tenant_id, event_pk=event.pk, plain=plain, source=operation.action)
        transitions.change_row(
            event_pk=event.pk,
            tenant_id=event.tenant_id,
            old="",
            new=FE.PENDING,
            actor="ledger",
            note=f"operation {operation.pk} failed",
        )
        _alert_new(event)
        log.info("dlq_recorded event=%s operation=%s key=%s", event.pk, operation.pk, operation.key)
    return event


def failed_events_note_rollback(
    *, tenant_id: int, provider_id: int, revision_id: int, number: int, actor: str, reason: str
) -> None:
    """An adapter revision was rolled back (``ledger.platform.hooks.adapter_revision_rolled_back``, in
    the move's transaction): each pending entry that failed under it gets a note naming the
    revision. Nothing is re-sent: the provider received and rejected these; an operator
    replays them, under the revision stable now, once the cause is understood."""
    pending = FailedEvent.objects.filter(
        tenant_id=tenant_id, adapter_revision_id=revision_id, status=FE.PENDING
    ).values_list("pk", flat=True)
    note = f"adapter revision {number} was rolled back by {actor}: not re-sent automatically ({reason})"
    for event_pk in pending[:10_000]:
        transitions.change_row(
            event_pk=event_pk, tenant_id=tenant_id, old=FE.PENDING, new=FE.PENDING, actor=actor, note=note
        )


# --- Quarantine: invalid input, with its reason in words ---------------------------------------

# Where receivers usually put the words of a validation error in a JSON answer, in order.
_WORD_PATHS = (
    ("error", "message"),
    ("error", "detail"),
    ("message",),
    ("detail",),
    ("error_description",),
    ("error",),
    ("title",),
)


def _words_of(body: Any) -> str:
    """The human-readable reason in a receiver's refusal, if it gave one."""
    if isinstance(body, str):
        return body
    if not isinstance(body, dict):
        return ""
    for path in _WORD_PATHS:
        value: Any = body
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str) and value.strip():
            return value
    errors = body.get("errors")
    if isinstance(errors, list):
        texts = [e if isinstance(e, str) else _words_of(e) for e in errors[:5] if isinstance(e, (str, dict))]
        return "; ".join(t for t in texts if t.strip())
    return ""


# Failures a replay as is would meet again: the receiver refused the input, or the provider's
# output failed its checks (with the same key it answers the same job, so the same output).
QUARANTINED_CLASSES = (ErrorClass.INVALID_INPUT, ErrorClass.INVALID_OUTPUT)


def _quarantine_reason(error_class: str, words: str) -> str:
    if error_class not in QUARANTINED_CLASSES:
        return ""
    return ledger_services.sanitize_message(words or "the receiver refused the input (no reason given)")


def quarantine_reason_of(operation: Operation) -> str:
    """Why the receiver refused an operation's input, in words, masked like every error text
    (``sanitize_message``: a receiver's 422 often quotes the address it refused). Empty unless
    the failure is ``invalid_input``. Execute mode: the provider's own words from its answer
    (``error.message``, ``message``, ``detail``, ``errors[]``…), else the status; guard mode:
    the message the caller reported with ``/fail``. An ``invalid_output`` failure (ledger.execution.outputs)
    is quarantined too: a replay under the same key would fetch the same output."""
    if operation.error_class not in QUARANTINED_CLASSES:
        return ""
    if operation.error_class == ErrorClass.INVALID_OUTPUT:
        slug = provider_slug(operation.provider_id) or "the provider"
        return _quarantine_reason(
            operation.error_class, f"the output of {slug} failed its checks: {operation.last_error}"
        )
    if operation.mode == OperationMode.EXECUTE:
        slug = provider_slug(operation.provider_id) or "the provider"
        words = _words_of(open_json(operation.response_body)) or operation.last_error
        status = f" (HTTP {operation.response_status})" if operation.response_status else ""
        return _quarantine_reason(operation.error_class, f"{slug} refused the input{status}: {words}")
    return _quarantine_reason(operation.error_class, operation.last_error)


# --- Ingest ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestResult:
    event: FailedEvent
    # "created"; "repost" (the same report again); "retry" (an n8n retry of a known execution);
    # "occurrence" (another failure of a business key whose entry is open).
    outcome: str

    @property
    def created(self) -> bool:
        return self.outcome == "created"


def failed_event_ingest(
    *,
    tenant: Tenant,
    raw: bytes,
    actor: str,
    replay_target: str = "",
    explicit_key: str = "",
) -> IngestResult:
    """Store a reported failure once, by its identity (DESIGN §4); unknown shapes are kept raw.

    ``explicit_key`` (an Idempotency-Key header) is the original key when the body names none.
    A report with a business key (the envelope's, the header's, or the failed request's in an
    n8n Error Trigger report) is one entry per key, tenant and target while that entry is open:
    a second failure is another occurrence of it; after it closed, a new entry linked to it.
    """
    limit = int(dlq_setting("MAX_EVENT_BYTES"))
    if len(raw) > limit:
        raise EventTooLarge(f"The event exceeds the limit of {limit} bytes.", extra={"limit": limit})
    # The tenant's waiver of the personal-data key rule holds here as for a claim (ledger.rules.key_rules).
    allowed = tenant.personal_data_in_keys_allowed
    parsed = parse_failure(raw, personal_data_allowed=allowed)
    # An entry is never refused for its key: one that breaks the key rule is "no usable key"
    # ("" — a replay then sends the entry's identity, encoded, ledger.rules.key_rules).
    explicit_key = key_usable(explicit_key, personal_data_allowed=allowed) if explicit_key else ""
    if explicit_key:
        reported = parsed.key_source in (KeySource.REPORTED, KeySource.REPORTED_WITH_ID)
        if reported and parsed.original_key != explicit_key:
            raise InvalidKey("The body's idempotency_key and the Idempotency-Key header disagree.")
        if not reported:
            parsed.key_source = KeySource.REPORTED_WITH_ID if parsed.explicit_identity else KeySource.REPORTED
        parsed.original_key, parsed.key_note = explicit_key, ""
    if replay_target:
        parsed.replay_target_slug = replay_target[:63]
    # A concurrent report of the same failure (or of the same open key) may win an insert;
    # the next round finds it: a repost or an occurrence.
    for round_ in range(3):
        try:
            with transaction.atomic():
                result = _ingest_once(tenant=tenant, parsed=parsed, actor=actor)
        except IntegrityError:
            if round_ == 2:
                raise
            continue
        log.info(
            "dlq_ingested tenant=%s event=%s outcome=%s shape=%s weak=%s key_source=%s",
            tenant.slug,
            result.event.pk,
            result.outcome,
            parsed.shape,
            parsed.weak,
            parsed.key_source or "identity",
        )
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _occurrence_record(*, event: FailedEvent, parsed: ParsedFailure, number: int) -> None:
    FailedEventOccurrence.objects.create(
        tenant_id=event.tenant_id,
        event=event,
        number=number,
        identity=parsed.identity,
        source_workflow_id=parsed.source.get("workflow_id", ""),
        source_execution_id=parsed.source.get("execution_id", ""),
        error_message=parsed.error_message,
        error_class=parsed.error_class,
    )


def _occurrence_add(*, event: FailedEvent, parsed: ParsedFailure, now: datetime, actor: str, why: str) -> FailedEvent:
    """Another failure the (locked) entry stands for: counted, its error kept as the last one,
    its execution kept on an occurrence row and in the history."""
    number = event.occurrence_count + 1
    sets: dict[str, Any] = {"last_seen_at": now, "occurrence_count": number, "updated_at": now}
    if parsed.error_message:
        sets["error_message"] = parsed.error_message
    if parsed.error_class:
        sets["error_class"] = parsed.error_class
    FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).update(**sets)
    _occurrence_record(event=event, parsed=parsed, number=number)
    execution = parsed.source.get("execution_id", "")
    transitions.change_row(
        event_pk=event.pk,
        tenant_id=event.tenant_id,
        old=event.status,
        new=event.status,
        actor=actor,
        note=f"occurrence {number} ({why})" + (f": execution {execution}" if execution else f": {parsed.identity}"),
    )
    event.refresh_from_db()
    return event


def _ingest_once(*, tenant: Tenant, parsed: ParsedFailure, actor: str) -> IngestResult:
    now = timezone.now()
    existing = selectors.failed_event_find(tenant_id=tenant.pk, identity=parsed.identity)
    if existing is not None:
        FailedEvent.objects.filter(pk=existing.pk).update(last_seen_at=now, seen_count=F("seen_count") + 1)
        existing.refresh_from_db()
        return IngestResult(existing, "repost")
    if parsed.retry_of:
        root = selectors.failed_event_find(tenant_id=tenant.pk, identity=parsed.retry_of)
        if root is not None:
            # The same failure again: count the retry, remember the retry's own identity.
            FailedEventAlias.objects.create(tenant=tenant, identity=parsed.identity, event=root)
            root = FailedEvent.objects.select_for_update().get(pk=root.pk, tenant_id=tenant.pk)
            FailedEvent.objects.filter(pk=root.pk).update(retry_count=F("retry_count") + 1)
            root = _occurrence_add(event=root, parsed=parsed, now=now, actor=actor, why="an n8n retry")
            return IngestResult(root, "retry")
    previous: FailedEvent | None = None
    if parsed.key_source in BUSINESS_KEY_SOURCES:
        same_key = selectors.failed_events_of_key(
            tenant_id=tenant.pk, key=parsed.original_key, target_slug=parsed.replay_target_slug
        )
        held = (
            same_key.filter(status__in=FE_OPEN_STATES, key_source__in=BUSINESS_KEY_SOURCES).select_for_update().first()
        )
        if held is not None:
            # The same business key failing again while its entry is open (the caller re-sent
            # the webhook, n8n retried the execution): one entry, one replay, one effect.
            FailedEventAlias.objects.create(tenant=tenant, identity=parsed.identity, event=held)
            return IngestResult(
                _occurrence_add(event=held, parsed=parsed, now=now, actor=actor, why="the same key failed again"),
                "occurrence",
            )
        # Closed (replayed, resolved, discarded): a new entry, linked to the latest one.
        previous = same_key.exclude(status__in=FE_OPEN_STATES).order_by("-id").first()
    source = parsed.source
    # Lead capture (dlq.n8n.client): an Error Trigger report names the failed execution, not its
    # items; with the tenant's n8n connection they are fetched after commit. A report that
    # carries the failed request holds the failed item already.
    fetch = (
        parsed.shape == FailedEventShape.N8N_EXECUTION
        and not parsed.from_request
        and bool(source.get("execution_id"))
        and selectors.n8n_connection_active(tenant_id=tenant.pk)
    )
    key_note = parsed.key_note
    if previous is not None:
        key_note = (key_note + " " if key_note else "") + f"The same key failed before: entry {previous.pk}."
    event = FailedEvent.objects.create(
        tenant=tenant,
        event_id=parsed.identity,
        weak_identity=parsed.weak,
        shape=parsed.shape,
        source_workflow_id=source.get("workflow_id", ""),
        source_workflow_name=source.get("workflow_name", ""),
        source_execution_id=source.get("execution_id", ""),
        source_execution_url=source.get("execution_url", ""),
        source_node=source.get("node", ""),
        source_mode=source.get("mode", ""),
        payload=seal_payload(parsed.payload),
        search_fields=search_values(parsed.payload, dlq_setting("SEARCH_PATHS")),
        error_message=parsed.error_message,
        error_class=parsed.error_class,
        failed_at=parsed.failed_at or now,
        last_seen_at=now,
        retry_count=parsed.retry_count,
        original_key=parsed.original_key or key_usable(parsed.identity),
        key_source=parsed.key_source,
        key_note=_note(key_note),
        key_field=parsed.key_field,
        request_headers=parsed.request_headers,
        previous=previous,
        replay_target_slug=parsed.replay_target_slug,
        quarantine_reason=_quarantine_reason(parsed.error_class, parsed.error_message),
        payload_fetch=PayloadFetch.PENDING if fetch else PayloadFetch.NONE,
    )
    _occurrence_record(event=event, parsed=parsed, number=1)
    if fetch:
        # In the cluster, after commit: ingestion never waits on n8n.
        transaction.on_commit(
            lambda: tasks.enqueue("dlq.tasks.n8n_payload_fetch_task", event.pk),
            robust=True,
        )
    if parsed.retry_of:
        # The execution this one retried, if it is reported later, is this failure too.
        FailedEventAlias.objects.create(tenant=tenant, identity=parsed.retry_of, event=event)
    index_payload(tenant_id=tenant.pk, event_pk=event.pk, plain=parsed.payload, source=parsed.shape)
    # The workflow's name, so its operations are found by it too (n8n reports it; claims may not).
    workflow_name_note(tenant_id=tenant.pk, workflow_id=event.source_workflow_id, name=event.source_workflow_name)
    transitions.change_row(
        event_pk=event.pk,
        tenant_id=event.tenant_id,
        old="",
        new=FE.PENDING,
        actor=actor,
        note=f"ingested ({parsed.shape})" + (f", after entry {previous.pk} of the same key" if previous else ""),
    )
    _alert_new(event)
    return IngestResult(event, "created")


# --- n8n connection and lead capture (dlq.n8n.client) ------------------------------------------------

# Masked in the configuration trail (the console's saves: review.changes.AUDITED).
N8N_SECRET_FIELDS = ("api_key_secret",)
N8N_ACTOR = "n8n lead capture"
# What n8n's keys look like (JWTs; older `n8n_api_…` keys): printable, no spaces, bounded.
_N8N_API_KEY = re.compile(r"^[\x21-\x7e]{1,4096}$")


def n8n_api_key_check(api_key: str) -> str:
    api_key = api_key.strip()
    if not _N8N_API_KEY.match(api_key):
        raise ValidationFailed("The n8n API key must be 1–4096 printable characters without spaces.")
    return api_key


def n8n_connection_save(
    *,
    tenant: Tenant,
    base_url: str,
    api_key: str | None = None,
    timeout_seconds: float | None = None,
    active: bool | None = None,
    actor: str,
) -> N8nConnection:
    """Create or update the tenant's n8n connection (``manage.py n8n_connect``; the console's
    form does the same through the model). The URL passes the outbound policy and is stored
    canonical; ``api_key`` is sealed (None keeps the stored one; a new connection needs one).
    The change is recorded in the configuration trail with the key masked."""
    url = n8n_base_url_check(base_url)
    if api_key is not None:
        api_key = n8n_api_key_check(api_key)
    if timeout_seconds is not None:
        timeout_seconds = n8n_timeout_check(timeout_seconds)
    with transaction.atomic():
        connection = N8nConnection.objects.select_for_update().filter(tenant_id=tenant.pk).first()
        before = config_snapshot(connection) if connection is not None else None
        if connection is None:
            if not api_key:
                raise ValidationFailed("A new n8n connection needs the n8n API key.")
            connection = N8nConnection(tenant=tenant)
        connection.base_url = url
        if api_key:
            connection.api_key_secret = sealed_credential(api_key)
            connection.api_key_set_at = timezone.now()
        if timeout_seconds is not None:
            connection.timeout_seconds = float(timeout_seconds)
        if active is not None:
            connection.active = active
        connection.save()
        config_change_of(
            connection,
            actor=actor,
            action=ConfigChangeAction.CREATE if before is None else ConfigChangeAction.UPDATE,
            before=before,
            secret_fields=N8N_SECRET_FIELDS,
        )
    log.info("n8n_connection_saved tenant=%s key_replaced=%s active=%s", tenant.slug, bool(api_key), connection.active)
    return connection


def n8n_connection_delete(*, tenant: Tenant, actor: str) -> bool:
    """Remove the tenant's n8n connection and its key; False when there was none."""
    with transaction.atomic():
        connection = N8nConnection.objects.select_for_update().filter(tenant_id=tenant.pk).first()
        if connection is None:
            return False
        config_change_of(connection, actor=actor, action=ConfigChangeAction.DELETE, secret_fields=N8N_SECRET_FIELDS)
        connection.delete()
    log.info("n8n_connection_deleted tenant=%s", tenant.slug)
    return True


def failed_event_n8n_fetch(*, event_pk: int, sleep: Callable[[float], None] = time.sleep) -> FailedEvent | None:
    """Lead capture, the after-commit task of an n8n Error Trigger entry (``dlq.tasks``):
    fetch the failed execution from the tenant's n8n and store the failed node's input items
    as the entry's payload (sealed, search paths, subject index — as ingestion stores one),
    recording where it came from. Any failure leaves the entry's payload as it was and says
    why on the entry. Runs once per entry (``payload_fetch`` pending → fetched | failed); no
    transaction is held across the HTTP calls, which are bounded (dlq.n8n.client)."""
    event = FailedEvent.objects.filter(pk=event_pk).first()
    if event is None or event.payload_fetch != PayloadFetch.PENDING:
        return event
    connection = N8nConnection.objects.filter(tenant_id=event.tenant_id).first()
    if connection is None or not connection.active:
        return _payload_fetch_failed(event, "the tenant's n8n connection was removed or switched off before the fetch")
    api_key, why = stored_credential_value(connection.api_key_secret)
    if api_key is None:
        return _payload_fetch_failed(event, f"the stored n8n API key cannot be used: {why or 'none is stored'}")
    try:
        found = n8n.fetch_failed_items(
            base_url=connection.base_url,
            api_key=api_key,
            execution_id=event.source_execution_id,
            node_hint=event.source_node,
            timeout=connection.timeout_seconds,
            sleep=sleep,
        )
    except n8n.FetchFailed as exc:
        return _payload_fetch_failed(event, exc.reason)
    held = n8n.items_payload(found, item_index=failed_item_index(open_payload(event.payload)))
    payload = held.payload
    if storable.nul_problem(payload) is not None:
        return _payload_fetch_failed(event, "the failed node's input items hold a NUL character, which is not stored")
    size, limit = n8n.payload_bytes(payload), int(dlq_setting("MAX_EVENT_BYTES"))
    if size > limit:
        return _payload_fetch_failed(
            event,
            f"the failed node's input items are {size} bytes; an entry holds at most {limit} (DLQ_MAX_EVENT_BYTES)",
        )
    return _payload_fetched(event, found, held)


def _fetched_key(event: FailedEvent, held: n8n.HeldItems) -> dict[str, Any]:
    """The key columns once the failed item is known: the declared field's value in it (an
    entry whose report named no request had no key to look for); unchanged when none is found
    or the key is held open by another entry of the key (the console links them)."""
    if event.key_source != KeySource.MISSING:
        return {}
    if held.item is None:
        return {"key_note": _note(held.note)}
    if not event.key_field:
        return {}
    derived = failed_request_key(
        headers={},
        body=held.item,
        key_field=event.key_field,
        personal_data_allowed=event.tenant.personal_data_in_keys_allowed,
    )
    if not derived.key:
        return {"key_note": _note(derived.note)}
    held_open = (
        selectors.failed_events_of_key(tenant_id=event.tenant_id, key=derived.key, target_slug=event.replay_target_slug)
        .filter(status__in=FE_OPEN_STATES, key_source__in=BUSINESS_KEY_SOURCES)
        .exclude(pk=event.pk)
        .values_list("pk", flat=True)
        .first()
    )
    if held_open is not None:
        return {"key_note": _note(f"The fetched item's key is held open by entry {held_open}: the same failure.")}
    return {"original_key": derived.key, "key_source": derived.source, "key_note": _note(derived.note)}


def _payload_fetched(event: FailedEvent, found: n8n.FailedItems, held: n8n.HeldItems) -> FailedEvent:
    payload = held.payload
    binary = f"; {found.with_binary} carried binary data, which is not fetched" if found.with_binary else ""
    count = len(found.items)
    note = ledger_services.sanitize_message(
        f"{count} input item{'s' if count != 1 else ''} of node “{found.node[:100]}”{binary}."
    )[:MAX_NOTE]
    # The report's search values stay (workflow, execution, node); the first item's are added.
    searchable = {**search_values(found.items[0], dlq_setting("SEARCH_PATHS")), **(event.search_fields or {})}
    now = timezone.now()
    sets: dict[str, Any] = {
        "payload": seal_payload(payload),
        "search_fields": searchable,
        "payload_source": PayloadSource.N8N_EXECUTION_FETCH,
        "payload_source_ref": found.execution_id[:255],
        "payload_fetch": PayloadFetch.FETCHED,
        "payload_fetch_note": note,
        "payload_fetched_at": now,
        "updated_at": now,
    }
    key = _fetched_key(event, held)
    with transaction.atomic():
        # Only an entry nobody has acted on yet: a replay or a decision was made on what the
        # entry held then, which must stay the evidence.
        pending = FailedEvent.objects.filter(
            pk=event.pk, payload_fetch=PayloadFetch.PENDING, status=FE.PENDING, replay_count=0
        )
        try:
            with transaction.atomic():
                moved = pending.update(**sets, **key)
        except IntegrityError:
            # A report of the same key opened its entry since _fetched_key looked
            # (failedevent_one_open_per_key): this one keeps no key of its own.
            held_by = "The fetched item's key is held open by another entry since: the same failure."
            moved = pending.update(**sets, key_note=_note(held_by))
        if moved:
            index_payload(
                tenant_id=event.tenant_id, event_pk=event.pk, plain=payload, source=PayloadSource.N8N_EXECUTION_FETCH
            )
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=FE.PENDING,
                new=FE.PENDING,
                actor=N8N_ACTOR,
                note=f"payload fetched from n8n execution {found.execution_id}: {note}",
            )
    if not moved:
        return _payload_fetch_failed(
            event,
            "the entry was replayed, resolved or discarded before the fetch finished; its payload stays as it was",
        )
    log.info("dlq_n8n_fetched event=%s execution=%s items=%s", event.pk, found.execution_id, count)
    event.refresh_from_db()
    return event


def _payload_fetch_failed(event: FailedEvent, reason: str) -> FailedEvent:
    """The entry keeps its payload; why the fetch failed is recorded on it (our words, masked)."""
    reason = ledger_services.sanitize_message(reason)[:MAX_NOTE]
    now = timezone.now()
    with transaction.atomic():
        moved = FailedEvent.objects.filter(
            pk=event.pk, tenant_id=event.tenant_id, payload_fetch=PayloadFetch.PENDING
        ).update(payload_fetch=PayloadFetch.FAILED, payload_fetch_note=reason, payload_fetched_at=now, updated_at=now)
        if moved:
            status = (
                FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id)
                .values_list("status", flat=True)
                .get()
            )
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=status,
                new=status,
                actor=N8N_ACTOR,
                note=f"payload not fetched from n8n: {reason}",
            )
    log.warning("dlq_n8n_fetch_failed event=%s execution=%s reason=%s", event.pk, event.source_execution_id, reason)
    event.refresh_from_db()
    return event


# --- Replay ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetAnswer:
    ok: bool
    status: int | None
    body: Any
    error_class: str
    message: str
    duration_ms: int
    provider_ref: str = ""


def derive_new_key(key: str, n: int) -> str:
    """ "Re-run as new": ``{key}~r{n}``, shortened from the left of the suffix to fit 255."""
    suffix = f"~r{n}"
    return key[: MAX_KEY_LENGTH - len(suffix)] + suffix


def _read_answer(response: httpx.Response) -> Any:
    keep = int(dlq_setting("RESPONSE_KEEP_BYTES"))
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > keep:
            break
    if not data:
        return None
    try:
        value = storable.loads(data[:keep])
    except storable.NotStorable:
        pass
    else:
        if storable.nul_problem(value) is None:
            return value
    # Kept as text, as it can be stored: no NUL (PostgreSQL), no lone surrogate (replaced).
    return {"text": data[:keep].decode("utf-8", errors="replace").replace("\x00", "")[:2000]}


# The replay's identity (its ledger key, ``replay:{entry}:{n}``), and the receiver's positive
# acknowledgement of it: ``v1=<hex HMAC-SHA256(signing secret, "ack." + id)>`` (ADR 0007).
REPLAY_ID_HEADER = "Onceguard-Replay-Id"
ACK_HEADER = "Onceguard-Ack"


def replay_ack_value(*, secret: str, replay_id: str) -> str:
    """What an acknowledging receiver answers in ``Onceguard-Ack`` for the replay (or lookup)
    whose ``Onceguard-Replay-Id`` it was sent: ``v1=`` and the hex HMAC-SHA256 under the
    target's signing secret of ``"ack." + id``. Only a receiver holding the secret that ran
    the step computing it can answer it — never n8n's own default answer, an echo server or
    a proxy's error page."""
    return "v1=" + hmac.new(secret.encode(), f"ack.{replay_id}".encode(), hashlib.sha256).hexdigest()


def replay_ack_verify(*, keys: list[str], replay_id: str, header: str | None) -> bool:
    """Whether ``header`` acknowledges ``replay_id`` under one of ``keys`` (during a
    rotation's overlap the receiver may still hold the previous secret)."""
    if not header:
        return False
    given = [part.strip() for part in header.split(",") if part.strip()]
    return any(
        hmac.compare_digest(replay_ack_value(secret=secret, replay_id=replay_id), candidate)
        for secret in keys
        for candidate in given
    )


def _unacknowledged(target: ReplayTarget, status: int, header: str | None) -> str:
    """Why a 2xx of an ``echo`` target is not a delivery, in words."""
    why = "without Onceguard-Ack" if not header else "with an Onceguard-Ack that is not over this replay's id"
    return (
        f"not acknowledged: HTTP {status} {why} (target {target.slug} answers an acknowledgement from its last"
        " step; a receiver that stopped before it, or n8n's own answer for such a workflow, sends none): the"
        " work may or may not have been done"
    )


def send_to_target(*, target: ReplayTarget, payload: Any, key: str, event_pk: int, number: int) -> TargetAnswer:
    """POST the stored payload with the key in the target's idempotency header, and classify
    the answer by DESIGN §3's table (a 409 "key in use" is transient). To an ``echo`` target
    a 2xx is a delivery only with the receiver's acknowledgement of this replay's id; without
    it the outcome is unknown (``ambiguous``), never a success (ADR 0007)."""
    replay_id = replay_ledger_key(event_pk, number)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Onceguard-replay",
        "X-Onceguard-Event": str(event_pk),
        "X-Onceguard-Replay": str(number),
        REPLAY_ID_HEADER: replay_id,
        # A stored key that is not printable ASCII is sent percent-encoded (ledger.rules.key_rules).
        target.idempotency_header: key_header_value(key),
    }
    content = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    started = time.monotonic()

    def elapsed() -> int:
        return int((time.monotonic() - started) * 1000)

    purpose = f"replay target {target.slug}"
    refused = outbound_refusal(target.url, purpose=purpose) or _target_url_refusal(target.url)
    if refused:
        message = f"not delivered: destination refused by the outbound policy: {refused}"
        return TargetAnswer(False, None, None, ErrorClass.INVALID_INPUT, message, elapsed())
    keys = replay_target_signing_secrets(target_id=target.pk)
    auth, why = _target_auth_headers(target, content, keys)
    if why:
        return TargetAnswer(False, None, None, ErrorClass.PERMISSION, f"not delivered: {why}", elapsed())
    headers.update(auth)
    try:
        with outbound_client(purpose=purpose, timeout=target.timeout_seconds) as client:
            with client.stream("POST", target.url, content=content, headers=headers) as response:
                status = response.status_code
                ack = response.headers.get(ACK_HEADER)
                body = _read_answer(response)
    except OutboundBlocked as exc:
        # Refused before any connection: nothing can have happened, and a retry would be too.
        return TargetAnswer(False, None, None, ErrorClass.INVALID_INPUT, f"not delivered: {exc}", elapsed())
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        # Never reached the target: nothing can have happened. The error's own words are kept
        # (scrubbed where stored): the console makes its sentence from them (ledger.web.failures).
        message = f"not delivered: {transport_error_text(exc, target.url)}"
        return TargetAnswer(False, None, None, ErrorClass.TRANSIENT, message, elapsed())
    except httpx.HTTPError as exc:
        message = f"sent, no answer: {transport_error_text(exc, target.url)}"
        return TargetAnswer(False, None, None, ErrorClass.AMBIGUOUS, message, elapsed())
    if 200 <= status < 300:
        if target.ack == ReplayAck.ECHO and not replay_ack_verify(keys=keys, replay_id=replay_id, header=ack):
            return TargetAnswer(
                False, status, body, ErrorClass.AMBIGUOUS, _unacknowledged(target, status, ack), elapsed()
            )
        ref = body.get("id") if isinstance(body, dict) else None
        return TargetAnswer(True, status, body, "", f"HTTP {status}", elapsed(), str(ref)[:255] if ref else "")
    error_class = ErrorClass.TRANSIENT if status == 409 else error_class_for_status(status)
    return TargetAnswer(False, status, body, error_class, f"HTTP {status}", elapsed())


def _target_url_refusal(url: str) -> str | None:
    """The https rule, checked again at send time (a target stored before it, or the
    deployment's REPLAY_ALLOW_HTTP turned off since)."""
    try:
        replay_target_url_check(url)
    except DomainError as exc:
        return exc.detail
    return None


def _target_auth_headers(target: ReplayTarget, body: bytes, keys: list[str]) -> tuple[dict[str, str], str]:
    """The signature (``Onceguard-Signature: t=…,v1=…``, the callback scheme, one ``v1`` per
    secret that signs now: ``keys``) and the target's credential header; or why it cannot be
    sent."""
    headers = {SIGNATURE_HEADER: sign(secret=keys, body=body)}
    if target.credential_header:
        value, why = stored_credential_value(target.credential_secret)
        if value is None:
            return {}, f"the target's credential ({target.credential_header}) is not usable: {why}"
        headers[target.credential_header] = value
    return headers, ""


@dataclass(frozen=True)
class LookupAnswer:
    """What a target's lookup said: ``found`` (2xx), ``not_found`` (404), or ``no_answer``
    (anything else: an error, a timeout, another status) — only the first two decide."""

    state: str
    status: int | None
    body: Any
    message: str
    duration_ms: int


def replay_target_lookup(*, target: ReplayTarget, key: str) -> LookupAnswer:
    """Ask the target's lookup whether the business key already had its effect: GET the
    lookup URL with ``{key}`` filled in (percent-encoded), signed over an empty body and with
    the target's credential, like the sweeper's provider lookup (DESIGN §4)."""
    started = time.monotonic()

    def answer(state: str, message: str, status: int | None = None, body: Any = None) -> LookupAnswer:
        return LookupAnswer(state, status, body, message, int((time.monotonic() - started) * 1000))

    url = target.lookup_url.replace("{key}", quote(key, safe=""))
    purpose = f"replay target {target.slug} lookup"
    refused = outbound_refusal(url, purpose=purpose) or _target_url_refusal(url)
    if refused:
        return answer("no_answer", f"lookup not asked: {refused}")
    keys = replay_target_signing_secrets(target_id=target.pk)
    headers, why = _target_auth_headers(target, b"", keys)
    if why:
        return answer("no_answer", f"lookup not asked: {why}")
    # An ``echo`` target acknowledges a "found" as it acknowledges a replay (ADR 0007): a 2xx
    # without it — n8n's own answer for a lookup workflow that stopped — decides nothing.
    lookup_id = f"lookup:{secrets.token_urlsafe(12)}"
    headers.update(
        {
            "User-Agent": "Onceguard-replay",
            target.idempotency_header: key_header_value(key),
            REPLAY_ID_HEADER: lookup_id,
        }
    )
    timeout = min(target.timeout_seconds, float(dlq_setting("REPLAY_LOOKUP_TIMEOUT_SECONDS")))
    try:
        with outbound_client(purpose=purpose, timeout=timeout) as client:
            with client.stream("GET", url, headers=headers) as response:
                status = response.status_code
                ack = response.headers.get(ACK_HEADER)
                body = _read_answer(response)
    except Exception as exc:  # any failure: the lookup did not answer; it decides nothing
        return answer("no_answer", f"lookup gave no answer: {type(exc).__name__}")
    if 200 <= status < 300 and target.ack == ReplayAck.ECHO:
        if not replay_ack_verify(keys=keys, replay_id=lookup_id, header=ack):
            return answer(
                "no_answer", f"the target's lookup answered HTTP {status} without its acknowledgement", status
            )
    if 200 <= status < 300:
        return answer("found", f"found by the target's lookup (HTTP {status}); not sent", status, body)
    if status == 404:
        return answer("not_found", "the target's lookup did not find the key (HTTP 404)", status)
    return answer("no_answer", f"the target's lookup answered HTTP {status}", status)


def failed_event_resend_decide(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """A person's decision that a pending entry whose first try may have acted may be re-sent
    to a key-advisory target: who, when and why, in the entry's trail, in one transaction."""
    note = _note(note)
    if not note:
        raise NoteRequired('The decision "safe to resend" needs a reason.')
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    with transaction.atomic():
        moved = FailedEvent.objects.filter(pk=event.pk, tenant_id=tenant_id, status=FE.PENDING).update(
            resend_decided_by=actor[:150], resend_decided_at=timezone.now(), updated_at=timezone.now()
        )
        if not moved:
            raise _not_replayable(event.pk, force=False)
        transitions.change_row(
            event_pk=event.pk,
            tenant_id=tenant_id,
            old=FE.PENDING,
            new=FE.PENDING,
            actor=actor,
            note=f'decision "safe to resend": {note}',
        )
    event.refresh_from_db()
    return event


def failed_event_key_set(*, tenant_id: int, event_pk: int, key: str, actor: str, note: str = "") -> FailedEvent:
    """A person sets the key a pending entry with no usable key is replayed under (DESIGN §7):
    without one, its replay would go out under the entry's own identity, which no receiver
    knows. The key is a new key by the key rule (ledger.rules.key_rules, the tenant's waiver for
    personal data included), refused as the claim refuses it; an entry already replayed, or
    that has a key, keeps what it has. Who, which key and why go in the entry's trail, in
    the same transaction as the guarded UPDATE."""
    allowed = Tenant.objects.filter(pk=tenant_id, personal_data_in_keys_allowed=True).exists()
    key = key_check(key, personal_data_allowed=allowed)
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    # Not held by the open-entry constraint (a key set by hand is no report's business key), so
    # looked for here: the same key open in another entry of the target is the same failure.
    held_by = (
        selectors.failed_events_of_key(tenant_id=tenant_id, key=key, target_slug=event.replay_target_slug)
        .filter(status__in=FE_OPEN_STATES)
        .exclude(pk=event.pk)
        .values_list("pk", flat=True)
        .first()
    )
    if held_by is not None:
        raise KeyNotSettable(
            f"Entry {held_by} holds this key open for the same target: replay or close that one instead.",
            extra={"entry": held_by},
        )
    note = _note(note)
    with transaction.atomic():
        moved = FailedEvent.objects.filter(
            pk=event.pk, tenant_id=tenant_id, status=FE.PENDING, key_source=KeySource.MISSING, replay_count=0
        ).update(
            original_key=key,
            key_source=KeySource.SET_BY_PERSON,
            key_note=_note(f"Set by {actor[:150]}" + (f": {note}" if note else ".")),
            updated_at=timezone.now(),
        )
        if not moved:
            raise KeyNotSettable("Only a pending entry with no usable key, never replayed, takes a key set by hand.")
        transitions.change_row(
            event_pk=event.pk,
            tenant_id=tenant_id,
            old=FE.PENDING,
            new=FE.PENDING,
            actor=actor,
            note=f"key set to {key} (none was usable)" + (f": {note}" if note else ""),
        )
    event.refresh_from_db()
    return event


def _provider_of(event: FailedEvent) -> tuple[Operation, Provider]:
    """The execute-mode operation of an entry and its provider, for a replay to the provider."""
    op = Operation.objects.filter(pk=event.operation_id, tenant_id=event.tenant_id).first()
    if op is None or op.mode != OperationMode.EXECUTE or op.provider_id is None:
        raise ValidationFailed("Only an entry of an execute-mode operation can be replayed to its provider.")
    provider = ledger_services.provider_by_id(op.provider_id)
    if provider.kind != ProviderKind.HTTP:
        raise ValidationFailed("Callbacks are re-sent by their own retries, not replayed to a provider.")
    if adapters.is_asynchronous(provider):
        # A direct send records the provider's answer as the outcome, and an asynchronous
        # provider's answer is a job, not the effect: nothing would poll it or check its output.
        raise ValidationFailed(
            "An asynchronous provider's job is not replayed by a direct send: correct and resubmit it"
            " (the next version goes through the workers, which wait on the job and check its output)."
        )
    return op, provider


def send_to_provider(*, provider: Provider, operation: Operation) -> TargetAnswer:
    """Send a failed execute-mode operation's stored request to its provider again, under its
    original key, exactly as a worker would (ledger.providers.adapters: the provider's idempotency
    header, credential and outbound policy), and classify the answer the same way. An intent
    operation is translated first, as a worker does, under the revision ``provider`` is (its
    stable one); an intent that revision refuses is not sent."""
    envelope, _prompt, refused = operation_translated(op=operation, provider=provider)
    if refused is not None:
        return TargetAnswer(False, None, None, refused.error_class or "", refused.message, 0)
    with adapters.http_client(max_connections=1) as client:
        outcome = adapters.send(provider=provider, operation=operation, client=client, envelope=envelope)
    return TargetAnswer(
        ok=outcome.succeeded,
        status=outcome.status,
        body=outcome.body,
        error_class=outcome.error_class or "",
        message=outcome.message or (f"HTTP {outcome.status}" if outcome.status else ""),
        duration_ms=outcome.duration_ms,
        provider_ref=outcome.provider_ref,
    )


def _not_replayable(event_pk: int, *, force: bool) -> DomainError:
    status = FailedEvent.objects.filter(pk=event_pk).values_list("status", flat=True).first()
    if status == FE.REPLAYED and not force:
        return ReplayNeedsForce(
            "This entry was replayed successfully already; replaying it again needs force=true and a note."
        )
    if status in FE_TERMINAL_STATES:
        return FailedEventClosed(f"This entry is {status}; it cannot be replayed.", extra={"entry_status": status})
    return ReplayInProgress("Another replay of this entry is under way.", retry_after=1, extra={"entry_status": status})


@dataclass(frozen=True)
class Correction:
    """A replay with corrected fields (DESIGN §7, quarantine): the payload that is sent instead
    of the stored one, the next version's key it is sent under, and the paths that changed."""

    payload: Any
    sent_key: str
    fields: list[str]


def _replay_begin(
    *,
    event: FailedEvent,
    target: ReplayTarget | None,
    actor: str,
    note: str,
    force: bool,
    as_new: bool,
    trigger: str,
    bulk_id: int | None,
    provider: Provider | None = None,
    correction: Correction | None = None,
    decision: datetime | None = None,
) -> Replay:
    """Allocate n with the guarded pending→replaying UPDATE and write the lineage row, and
    settle the entry's original claim (``_original_take``; its succeeded operation, if the
    work was done meanwhile, comes back as the row's ``original_done``).
    ``decision``: the "safe to resend" this replay relies on; the UPDATE requires it still
    there (a replay that raced us used it up) and uses it up — one decision, one send."""
    # A replay goes to a replay target, or (an execute-mode step resumed) to the provider.
    slug, url = (provider.slug, provider.base_url) if provider is not None else (target.slug, target.url)  # type: ignore[union-attr]
    what = "re-run as new" if as_new else "replay"
    if correction is not None:
        what = f"corrected replay ({', '.join(correction.fields)}) as {correction.sent_key}"
    where = f"provider {slug}" if provider is not None else slug
    with transaction.atomic():
        taken = transitions.failed_event_replay_take(
            event=event,
            force=force,
            auto=trigger == ReplayTrigger.AUTO,
            clears_decision=target is not None,
            decision=decision,
            actor=actor,
            what=what,
            where=where,
            note=note,
        )
        if taken is None:
            if decision is not None and FailedEvent.objects.filter(
                pk=event.pk, tenant_id=event.tenant_id, status=FE.PENDING, resend_decided_at__isnull=True
            ):
                raise ReplayNeedsDecision(
                    'The decision "safe to resend" was used by another replay of this entry; record a new one.'
                )
            raise _not_replayable(event.pk, force=force)
        old, number = taken
        done = None if target is None else _original_take(event=event, number=number, actor=actor, force=force)
        key = event.original_key or event.event_id
        sent_key = derive_new_key(key, number) if as_new else key
        if correction is not None:
            sent_key = correction.sent_key
        replay = Replay.objects.create(
            tenant_id=event.tenant_id,
            event=event,
            number=number,
            trigger=trigger,
            as_new=as_new,
            forced=force and old == FE.REPLAYED,
            ledger_key=replay_ledger_key(event.pk, number),
            sent_key=sent_key,
            target=target,
            target_slug=slug,
            target_url=url,
            to_provider=provider is not None,
            corrected_fields=correction.fields if correction is not None else [],
            bulk_id=bulk_id,
            actor=actor[:150],
            note=note,
            started_at=timezone.now(),
        )
    # Not a column: the succeeded original this replay found (it then sends nothing).
    replay.original_done = done
    return replay


# The states of an entry's original operation in which its own workflow (or worker) holds it
# or may act on it now, and those whose outcome is being reconciled: a replay waits for both.
_ORIGINAL_IN_FLIGHT = frozenset({OperationStatus.CLAIMED, OperationStatus.QUEUED, OperationStatus.WAITING})
_ORIGINAL_UNSETTLED = frozenset({OperationStatus.UNCERTAIN, OperationStatus.REVIEW})


def _seconds_until(moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, int((moment - timezone.now()).total_seconds() + 0.999))


def _original_of(event: FailedEvent) -> Operation | None:
    """The ledger operation of the entry's business key: the one it was recorded for, else the
    claim of its original key (an entry a workflow posted for a claim it holds)."""
    if event.operation_id:
        return Operation.objects.filter(pk=event.operation_id, tenant_id=event.tenant_id).first()
    if not event.original_key:
        return None
    return Operation.objects.filter(tenant_id=event.tenant_id, key=event.original_key).first()


def _original_take(*, event: FailedEvent, number: int, actor: str, force: bool) -> Operation | None:
    """A replay to a target settles the entry's original claim (ADR 0007), in the transaction
    that hands out its number, before anything is sent. A claim waiting for its retry
    (``retry_wait``: after a 429, say) moves to ``failed`` — taken over by this replay — and
    the entry is linked to it, so the replay's outcome answers its key from then on
    (``superseded_by``) and the workflow re-sending the lead is answered from the ledger
    instead of making a second contact. A claim its workflow holds now, or one being
    reconciled, makes the replay wait (409, nothing sent). Returns the original operation when
    it succeeded meanwhile (the workflow's own retry did the work): the replay sends nothing,
    unless forced."""
    op = _original_of(event)
    if op is None:
        return None
    if op.status == OperationStatus.RETRY_WAIT:
        try:
            with transaction.atomic():
                if not FailedEvent.objects.filter(tenant_id=event.tenant_id, operation=op).exists():
                    # Linked before the move: the ledger's failed hook finds this entry instead
                    # of dead-lettering the lead a second time (failed_event_record_for_operation).
                    FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id, operation__isnull=True).update(
                        operation=op
                    )
                ledger_transitions.operation_redrive(
                    operation=op,
                    actor=actor,
                    reason=f"taken over by replay #{number} of DLQ entry {event.pk}: its outcome answers this key",
                )
        except DomainError:
            # Moved since we read it (its workflow re-claimed it): decide on what it is now.
            op = Operation.objects.get(pk=op.pk, tenant_id=op.tenant_id)
        else:
            event.operation_id = FailedEvent.objects.values_list("operation_id", flat=True).get(pk=event.pk)
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=FE.REPLAYING,
                new=FE.REPLAYING,
                actor=actor,
                note=f"replay #{number} took over operation {op.pk} ({op.key}), which waited for its retry: the"
                " replay's outcome answers that key from now on",
            )
            return None
    if op.status in _ORIGINAL_IN_FLIGHT:
        raise ReplayOriginalInFlight(
            f"The key's own operation {op.pk} is {op.status}: its workflow holds it now; a replay would"
            " do the work a second time. Nothing was sent; replay after it ends (its outcome answers the key).",
            retry_after=_seconds_until(op.lease_expires_at),
            extra={"operation_id": op.pk, "operation_status": op.status},
        )
    if op.status in _ORIGINAL_UNSETTLED:
        raise ReplayOriginalUnsettled(
            f"The key's own operation {op.pk} is {op.status}: whether its work was done is being decided."
            ' Nothing was sent; settle it in review first ("safe to retry" lets this replay take it over).',
            extra={"operation_id": op.pk, "operation_status": op.status},
        )
    if op.status == OperationStatus.SUCCEEDED and not force:
        return op
    return None


def failed_event_replay(
    *,
    tenant_id: int,
    event_pk: int,
    actor: str,
    target_slug: str = "",
    force: bool = False,
    note: str = "",
    as_new: bool = False,
    confirm: bool = False,
    trigger: str = ReplayTrigger.MANUAL,
    bulk_id: int | None = None,
    to_provider: bool = False,
    correction: Correction | None = None,
) -> Replay:
    """Send the stored payload to a ReplayTarget with the original key, once (DESIGN §4).

    Raises ``ReplayInProgress`` (409) when another replay holds the entry,
    ``ReplayNeedsForce`` for a replayed entry without force and a note. ``as_new`` derives a
    new key ``{key}~r{n}`` and needs ``confirm`` and a note. Returns the Replay row with
    its outcome; a failed replay has put the entry back to ``pending``.

    ``to_provider``: the entry's operation is an execute-mode one (a run's step); its stored
    request goes to its own provider under its original key, as a worker would send it — a
    key-enforced provider dedups it against the first try. ``correction``: the corrected
    payload is sent under the next version's key instead (``failed_event_correct``).
    """
    note = _note(note)
    if as_new and not confirm:
        raise ConfirmationRequired(
            "Re-running as new sends a new key ({key}~r{n}), so the receiver cannot dedup it against the first "
            "try; send confirm=true with a note."
        )
    if (as_new or force) and not note:
        raise NoteRequired("This replay needs a note saying why.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    if is_redacted(event.payload):
        raise FailedEventClosed("This entry's payload was redacted by retention; there is nothing to replay.")
    if correction is None and not to_provider:
        held_items(event)
    provider: Provider | None = None
    target: ReplayTarget | None = None
    looked: LookupAnswer | None = None
    decision: datetime | None = None
    if to_provider:
        original, provider = _provider_of(event)
    else:
        target = selectors.replay_target_resolve(tenant_id=tenant_id, slug=target_slug or event.replay_target_slug)
        wait = selectors.replay_wait_reason(event=event, target=target)
        if target.idempotency_class != IdempotencyClass.KEY_ENFORCED and selectors.replay_outcome_unknown(event):
            decision = event.resend_decided_at
        if target.lookup_url and not as_new and correction is None:
            # Asked first (DESIGN §4): found → settled without sending; not found → the first
            # try had no effect there, so it is sent even to a key-advisory target.
            looked = replay_target_lookup(target=target, key=event.original_key or event.event_id)
            if looked.state == "not_found":
                wait, decision = "", None
        if wait and (looked is None or looked.state != "found"):
            if looked is not None:
                wait += f" (The target's lookup decided nothing: {looked.message}.)"
            raise ReplayNeedsDecision(
                wait, extra={"waits_for": "resend_decision", "target_class": target.idempotency_class}
            )
    replay = _replay_begin(
        event=event,
        target=target,
        actor=actor,
        note=note,
        force=force,
        as_new=as_new,
        trigger=trigger,
        bulk_id=bulk_id,
        provider=provider,
        correction=correction,
        decision=decision,
    )
    tenant = Tenant.objects.get(pk=tenant_id)
    try:
        claim = ledger_transitions.operation_claim(
            tenant=tenant,
            key=replay.ledger_key,
            provider=None,
            action="dlq.replay",
            request={"event": event.pk, "replay": replay.number, "target": replay.target_slug, "key": replay.sent_key},
            mark_sent=True,
            via_claims=False,
            lease_seconds=(provider or target).timeout_seconds + 10,  # type: ignore[union-attr]
            workflow_id=event.source_workflow_id,
            execution_id=event.source_execution_id,
            correlation_id=f"dlq:{event.pk}",
            actor=actor,
        )
    except DomainError as exc:
        _replay_refused(replay=replay, actor=actor, why=type(exc).__name__)
        raise ReplayInProgress("The ledger refused the replay's key; nothing was sent.") from exc
    if not claim.acquired:
        _replay_refused(replay=replay, actor=actor, why="replay key already taken")
        raise ReplayInProgress("The ledger already holds this replay's key; nothing was sent.")
    op = claim.operation
    Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id).update(operation=op)
    try:
        if provider is not None:
            answer = send_to_provider(provider=provider, operation=original)
        elif (done := replay.original_done) is not None:
            answer = TargetAnswer(
                True,
                done.response_status,
                None,
                "",
                f"not sent: the key's own operation {done.pk} succeeded meanwhile (its workflow's retry)",
                0,
                done.provider_ref or "",
            )
        elif looked is not None and looked.state == "found":
            ref = looked.body.get("id") if isinstance(looked.body, dict) else None
            answer = TargetAnswer(
                True, looked.status, looked.body, "", looked.message, looked.duration_ms, str(ref)[:255] if ref else ""
            )
        else:
            assert target is not None
            answer = send_to_target(
                target=target,
                payload=correction.payload if correction is not None else replay_body(event),
                key=replay.sent_key,
                event_pk=event.pk,
                number=replay.number,
            )
    except Exception as exc:  # anything else mid-send: we cannot know whether it arrived
        answer = TargetAnswer(False, None, None, ErrorClass.AMBIGUOUS, f"send failed: {type(exc).__name__}", 0)
    return _replay_finish(replay=replay, event=event, op=op, answer=answer, actor=actor)


def held_items(event: FailedEvent) -> int:
    """How many fetched items an entry holds together (lead capture stored before the failed
    item was kept alone, or several items the error named none of); 1 for any other entry.
    Several are refused: a replay sends the failed item only, one request per item, and
    re-sending the items that succeeded before the failure would repeat their effects."""
    if event.payload_source != PayloadSource.N8N_EXECUTION_FETCH:
        return 1
    payload = open_payload(event.payload)
    items = payload.get("items") if isinstance(payload, dict) and set(payload) == {"items"} else None
    if isinstance(items, list) and len(items) > 1:
        raise ValidationFailed(
            f"This entry holds {len(items)} input items and the failed one cannot be told apart; replaying would"
            " re-send the items that succeeded. Replay a correction holding the failed item, or resolve it."
        )
    return 1


def replay_body(event: FailedEvent) -> Any:
    """What a replay sends: the failed item's body. An entry of lead capture stored as
    ``{"items": [item]}`` (before the failed item was kept alone) sends its one item."""
    payload = open_payload(event.payload)
    if (
        event.payload_source == PayloadSource.N8N_EXECUTION_FETCH
        and isinstance(payload, dict)
        and set(payload) == {"items"}
        and isinstance(payload["items"], list)
        and len(payload["items"]) == 1
    ):
        return payload["items"][0]
    return payload


def _replay_refused(*, replay: Replay, actor: str, why: str) -> None:
    with transaction.atomic():
        Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.PENDING).update(
            outcome=ReplayOutcome.REFUSED, error_message=why[:500], finished_at=timezone.now()
        )
        _settle_entry(replay=replay, to=FE.PENDING, actor=actor, note=f"replay #{replay.number} refused: {why}")


def _settle_entry(*, replay: Replay, to: str, actor: str, note: str) -> None:
    """replaying → replayed|pending, only for the replay that holds the entry."""
    if transitions.failed_event_replay_settle(replay=replay, to=to, actor=actor, note=note):
        if to == FE.PENDING:
            # The entry waits for an operator again: a repeat of its open alert, or, once that
            # alert was resolved (the entry had been replayed), a new one (alerts.clearing).
            alert_raise(
                tenant_id=replay.tenant_id,
                kind="dlq_new",
                ref=str(replay.event_id),
                summary=f"DLQ entry {replay.event_id} pending again: replay #{replay.number} did not succeed",
            )


def _ledger_record(*, op: Operation, answer: TargetAnswer, actor: str) -> Operation:
    """Record the target's answer on the replay's ledger operation and return the row."""
    if answer.ok:
        return ledger_transitions.operation_complete(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            provider_ref=answer.provider_ref,
            response_status=answer.status,
            response_body=answer.body,
            actor=actor,
            reason="replay delivered",
        )
    op = ledger_transitions.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=answer.error_class,
        message=answer.message,
        response_status=answer.status,
        actor=actor,
    )
    if op.status == OperationStatus.RETRY_WAIT:
        # Nobody comes back for a replay's key: the next replay is a new n, a new key.
        op = ledger_transitions.operation_replay_not_retried(operation=op, actor=actor)
    return op


def _replay_finish(*, replay: Replay, event: FailedEvent, op: Operation, answer: TargetAnswer, actor: str) -> Replay:
    with transaction.atomic():
        try:
            with transaction.atomic():
                op = _ledger_record(op=op, answer=answer, actor=actor)
        except DomainError as exc:
            # The ledger row moved meanwhile (e.g. swept): the answer is still the evidence.
            log.warning("dlq_replay_ledger_refused replay=%s error=%s", replay.pk, type(exc).__name__)
            op = Operation.objects.get(pk=op.pk, tenant_id=op.tenant_id)
        if answer.ok:
            outcome = ReplayOutcome.SUCCEEDED
        elif answer.error_class == ErrorClass.AMBIGUOUS or op.status not in TERMINAL_STATES:
            outcome = ReplayOutcome.AMBIGUOUS
        else:
            outcome = ReplayOutcome.FAILED
        Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.PENDING).update(
            outcome=outcome,
            error_class=answer.error_class,
            # A success's "HTTP 201" is the target's answer, not an error.
            # Scrubbed as every stored error text is (the operation's is, by operation_fail).
            error_message="" if answer.ok else scrub(answer.message)[:500],
            response_status=answer.status,
            response_body=seal_payload(answer.body),
            duration_ms=answer.duration_ms,
            finished_at=timezone.now(),
            operation=op,
        )
        to = FE.REPLAYED if outcome == ReplayOutcome.SUCCEEDED else FE.PENDING
        _settle_entry(replay=replay, to=to, actor=actor, note=f"replay #{replay.number} {outcome} ({answer.message})")
        _supersede_original(event=event, op=op, number=replay.number, actor=actor)
    replay = Replay.objects.get(pk=replay.pk, tenant_id=replay.tenant_id)
    log.info(
        "dlq_replayed event=%s replay=%s outcome=%s status=%s target=%s trigger=%s",
        event.pk,
        replay.number,
        replay.outcome,
        answer.status,
        replay.target_slug,
        replay.trigger,
    )
    return replay


def _supersede_original(*, event: FailedEvent, op: Operation, number: int, actor: str) -> None:
    """The entry's original failed operation now answers with its replay's outcome."""
    if not event.operation_id or op.status not in TERMINAL_STATES:
        return
    try:
        with transaction.atomic():
            ledger_transitions.operation_supersede(
                operation_id=event.operation_id,
                tenant_id=event.tenant_id,
                by_operation_id=op.pk,
                actor=actor,
                reason=f"replay #{number} of DLQ entry {event.pk}: {op.status}",
            )
    except DomainError as exc:
        log.warning("dlq_supersede_refused event=%s error=%s", event.pk, type(exc).__name__)


def replay_settle_for_operation(*, operation: Operation, actor: str) -> None:
    """A replay that came back ambiguous leaves its ledger operation uncertain. When that
    operation is settled later (a reviewer's decision, the sweeper's lookup), its Replay row
    takes the outcome, and a success marks the entry replayed — unless a newer replay of the
    entry has started since, which then owns the entry's state.

    Called by the ledger on every terminal move, in the same transaction; only keys of the
    replay:{entry}:{n} form are looked at, so other completions pay no query.
    """
    if not operation.key.startswith(REPLAY_KEY_PREFIX) or operation.status not in TERMINAL_STATES:
        return
    replay = (
        Replay.objects.filter(
            tenant_id=operation.tenant_id,
            ledger_key=operation.key,
            operation_id=operation.pk,
            outcome=ReplayOutcome.AMBIGUOUS,
            event__tenant_id=operation.tenant_id,
        )
        .select_related("event")
        .first()
    )
    if replay is None:
        return
    succeeded = operation.status == OperationStatus.SUCCEEDED
    outcome = ReplayOutcome.SUCCEEDED if succeeded else ReplayOutcome.FAILED
    note = f"replay #{replay.number} settled {operation.status} after an ambiguous answer"
    with transaction.atomic():
        if not Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.AMBIGUOUS).update(
            outcome=outcome
        ):
            return
        if succeeded:
            transitions.failed_event_replay_settled_late(replay=replay, actor=actor, note=note)
        _supersede_original(event=replay.event, op=operation, number=replay.number, actor=actor)
    log.info("dlq_replay_settled event=%s replay=%s outcome=%s", replay.event_id, replay.number, outcome)


# --- Resolve / discard -------------------------------------------------------------------------


def _close(*, tenant_id: int, event_pk: int, to: str, actor: str, note: str) -> FailedEvent:
    note = _note(note)
    if not note:
        raise NoteRequired(f"Marking an entry {to} needs a note saying why.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    for old in (FE.PENDING, FE.REPLAYED):
        if transitions.failed_event_close(
            event_pk=event.pk, tenant_id=event.tenant_id, old=old, to=to, actor=actor, note=note
        ):
            event.refresh_from_db()
            log.info("dlq_closed event=%s to=%s actor=%s", event.pk, to, actor)
            return event
    status = FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).values_list("status", flat=True).first()
    if status == FE.REPLAYING:
        raise FailedEventBusy("A replay of this entry is under way; try again when it has finished.", retry_after=1)
    raise FailedEventClosed(f"This entry is {status} already.", extra={"entry_status": status})


def failed_event_resolve(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """pending|replayed → resolved: an operator fixed it another way. The note is mandatory."""
    return _close(tenant_id=tenant_id, event_pk=event_pk, to=FE.RESOLVED, actor=actor, note=note)


def failed_event_discard(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """pending|replayed → discarded: dropped on purpose. The note is mandatory."""
    return _close(tenant_id=tenant_id, event_pk=event_pk, to=FE.DISCARDED, actor=actor, note=note)


# --- Corrections: replay with corrected fields as the next version ------------------------------

# A key in the versioned form {record}:{action}:v{version} (ledger.protocol.services.versioned_key).
_VERSIONED_KEY = re.compile(r"^(?P<record>.+):(?P<action>[^:]+):v(?P<version>\d{1,10})$")
MAX_CORRECTED_FIELDS = 50


@dataclass(frozen=True)
class CorrectionResult:
    event: FailedEvent
    key: str
    version: int
    # Execute mode: the next version, queued for the workers. Guard mode: the replay that sent
    # the corrected payload to the workflow, which claims the next version itself.
    operation: Operation | None
    replay: Replay | None


def next_version_of(*, tenant_id: int, key: str, operation: Operation | None) -> tuple[str, str, int]:
    """(record, action, version) of the next version of a failed key: one more than the newest
    version of its record and action the ledger knows. The key must be versioned — stored as
    parts, or of the form ``{record}:{action}:v{version}``."""
    if operation is not None and operation.record and operation.version is not None:
        record, action, version = operation.record, operation.action, operation.version
    else:
        match = _VERSIONED_KEY.match(key)
        if match is None:
            raise ValidationFailed(
                "Only a versioned key ({record}:{action}:v{version}) can be corrected: the correction is its next"
                " version. Use a replay re-run as new instead."
            )
        record, action, version = match["record"], match["action"], int(match["version"])
    newest = (
        Operation.objects.filter(tenant_id=tenant_id, record=record, action=action)
        .aggregate(newest=Max("version"))
        .get("newest")
    )
    return record, action, max(version, newest or 0) + 1


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise ValidationFailed(f"Field {path!r} does not lead to a value of the stored payload.")


def apply_corrections(document: Any, fields: dict[str, Any]) -> tuple[Any, list[str]]:
    """A copy of ``document`` with each dotted path of ``fields`` set to its value (the last
    segment may add a key to an existing object); the sorted paths changed. The stored value is
    never edited: it stays as evidence."""
    if not isinstance(fields, dict) or not fields:
        raise ValidationFailed("Send `fields`: an object of dotted paths and their corrected values.")
    if len(fields) > MAX_CORRECTED_FIELDS:
        raise ValidationFailed(f"At most {MAX_CORRECTED_FIELDS} fields can be corrected at once.")
    copy = json.loads(json.dumps(document))
    for path, value in fields.items():
        parts = path.split(".") if isinstance(path, str) and 0 < len(path) <= 200 else []
        if not parts or any(p == "" for p in parts):
            raise ValidationFailed(f"{path!r} is not a dotted path (e.g. body.amount).")
        node = copy
        for part in parts[:-1]:
            node = _child(node, part, path)
        last = parts[-1]
        if isinstance(node, dict):
            node[last] = value
        elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
            node[int(last)] = value
        else:
            raise ValidationFailed(f"Field {path!r} does not lead to a value of the stored payload.")
    return copy, sorted(fields)


def failed_event_correct(
    *, tenant_id: int, event_pk: int, actor: str, fields: dict[str, Any], note: str, target_slug: str = ""
) -> CorrectionResult:
    """Replay a (quarantined) entry with corrected fields as the next version of its key
    (DESIGN §7). The entry, its payload and its failed operation stay as they were — the
    evidence —, and the history says who changed which fields and why.

    Execute mode: the paths apply to the stored request (``body.amount``); the corrected
    request is submitted as the next version (``{record}:{action}:v{n+1}``, same run and step)
    for the workers, the original records it as ``replaced_by``, and the entry is resolved
    pointing at it (``corrected_operation``). Guard mode: the paths apply to the stored payload,
    which is replayed to the replay target under the next version's key (a Replay row with
    ``corrected_fields``); the workflow claims that version itself.
    """
    note = _note(note)
    if not note:
        raise NoteRequired("A correction needs a note saying why the fields change.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    if is_redacted(event.payload):
        raise FailedEventClosed("This entry's payload was redacted by retention; there is nothing to correct.")
    if event.status != FE.PENDING:
        raise _not_replayable(event.pk, force=False)
    original = Operation.objects.filter(pk=event.operation_id, tenant_id=tenant_id).first()
    record, action, version = next_version_of(
        tenant_id=tenant_id, key=event.original_key or event.event_id, operation=original
    )
    key = ledger_services.versioned_key(record=record, action=action, version=version)
    if original is not None and original.mode == OperationMode.EXECUTE:
        request, changed = apply_corrections(open_json(original.request), fields)
        what = f"corrected {', '.join(changed)} and sent again as {key}"
        with transaction.atomic():
            submitted = operation_submit(
                tenant=Tenant.objects.get(pk=tenant_id),
                key=key,
                provider=provider_slug(original.provider_id) or "",
                action=action,
                request=request,
                payload=open_json(original.payload),
                callback_url=original.callback_url,
                workflow_id=original.workflow_id,
                workflow_version=original.workflow_version,
                correlation_id=original.correlation_id,
                run=original.run,
                step=original.step,
                record=record,
                version=version,
                actor=actor,
            ).operation
            if not transitions.failed_event_correct(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                actor=actor,
                note=f"{what} (operation {submitted.pk}): {note}",
                status_note=f"{what}: {note}",
                corrected_operation=submitted,
            ):
                raise _not_replayable(event.pk, force=False)
            # The failed original points at its correction (a key of the versioned form but
            # claimed without parts is not found by the version's own replacement step).
            Operation.objects.filter(pk=original.pk, replaced_by__isnull=True).update(replaced_by=submitted)
            _correction_event(original=original, actor=actor, text=f"{what} (operation {submitted.pk}): {note}")
        event.refresh_from_db()
        log.info("dlq_corrected event=%s operation=%s key=%s", event.pk, submitted.pk, key)
        return CorrectionResult(event=event, key=key, version=version, operation=submitted, replay=None)
    payload, changed = apply_corrections(open_payload(event.payload), fields)
    replay = failed_event_replay(
        tenant_id=tenant_id,
        event_pk=event.pk,
        actor=actor,
        target_slug=target_slug,
        note=note,
        correction=Correction(payload=payload, sent_key=key, fields=changed),
    )
    if original is not None:
        _correction_event(
            original=original,
            actor=actor,
            text=f"corrected {', '.join(changed)} and replayed as {key} (replay #{replay.number}): {note}",
        )
    event.refresh_from_db()
    log.info("dlq_corrected event=%s replay=%s key=%s outcome=%s", event.pk, replay.number, key, replay.outcome)
    return CorrectionResult(event=event, key=key, version=version, operation=None, replay=replay)


def _correction_event(*, original: Operation, actor: str, text: str) -> None:
    """The original operation's history says it was corrected (it stays ``failed``)."""
    OperationEvent.objects.create(
        tenant_id=original.tenant_id,
        operation_id=original.pk,
        from_status=original.status,
        to_status=original.status,
        actor=actor[:150],
        reason=ledger_services.sanitize_message(text),
        attempt=None,
        at=Now(),
    )


# --- Bulk replay -------------------------------------------------------------------------------


def bulk_replay_prepare(
    *,
    tenant: Tenant,
    filters: dict[str, Any],
    actor: str,
    target_slug: str = "",
    force: bool = False,
    note: str = "",
    event_pks: list[int] | None = None,
) -> BulkReplay:
    """Dry run: freeze the selection (ids + count + digest); nothing is sent.

    Without a status filter the selection is the replayable entries: pending (and replayed
    ones with ``force``). ``event_pks`` (the console's ticked rows) narrows it further.
    """
    note = _note(note)
    if force and not note:
        raise NoteRequired("A forced bulk replay needs a note saying why.")
    if target_slug:
        selectors.replay_target_resolve(tenant_id=tenant.pk, slug=target_slug)
    query = dict(filters)
    if not query.get("status"):
        query["status"] = [FE.PENDING, FE.REPLAYED] if force else [FE.PENDING]
    qs = selectors.failed_event_list(tenant_id=tenant.pk, **query)
    if event_pks is not None:
        qs = qs.filter(pk__in=event_pks)
    limit = int(dlq_setting("BULK_MAX_SELECTION"))
    ids = list(qs.order_by("id").values_list("id", flat=True)[: limit + 1])
    if len(ids) > limit:
        raise BulkReplayTooLarge(f"The selection has more than {limit} entries; narrow the filters.")
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    bulk = BulkReplay.objects.create(
        tenant=tenant,
        filters=selectors.filters_as_json(query),
        event_ids=ids,
        count=len(ids),
        digest=digest,
        target_slug=target_slug,
        force=force,
        note=note,
        created_by=actor[:150],
        expires_at=timezone.now() + timedelta(seconds=int(dlq_setting("BULK_DRY_RUN_TTL_SECONDS"))),
    )
    log.info("dlq_bulk_prepared bulk=%s tenant=%s count=%s", bulk.pk, tenant.slug, bulk.count)
    return bulk


def bulk_replay_confirm(
    *,
    tenant: Tenant,
    bulk_id: int,
    actor: str,
    count: int | None = None,
    target_slug: str | None = None,
    note: str | None = None,
) -> BulkReplay:
    """draft → running (guarded); the runner replays exactly the frozen ids, paced.

    ``count`` (what the operator was shown) must match the frozen count. ``target_slug`` and
    ``note`` may still be chosen at confirm time; the selection itself cannot change. One
    bulk replay runs per tenant at a time (a second confirm answers 429).
    """
    options: dict[str, Any] = {}
    if target_slug:
        selectors.replay_target_resolve(tenant_id=tenant.pk, slug=target_slug)
        options["target_slug"] = target_slug
    if note:
        options["note"] = _note(note)
    with transaction.atomic():
        # Serialises confirms of one tenant, so the one-at-a-time check cannot race.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        bulk = BulkReplay.objects.filter(pk=bulk_id, tenant=tenant).first()
        if bulk is None:
            raise BulkReplayNotFound("No such bulk replay.")
        if count is not None and count != bulk.count:
            raise BulkReplayNotConfirmable(
                f"The frozen selection has {bulk.count} entries, not {count}.", extra={"count": bulk.count}
            )
        running = BulkReplay.objects.filter(tenant=tenant, status=BulkReplayStatus.RUNNING).exclude(pk=bulk.pk)
        if running.exists():
            raise BulkReplayRateLimited("Another bulk replay is running for this tenant.", retry_after=30)
        now = timezone.now()
        moved = BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.DRAFT, expires_at__gt=now).update(
            status=BulkReplayStatus.RUNNING, confirmed_by=actor[:150], confirmed_at=now, **options
        )
        if moved:
            transaction.on_commit(lambda: _enqueue_bulk(bulk.pk), robust=True)
    if not moved:
        # Outside the transaction above, so the expiry is recorded even though we refuse.
        if BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.DRAFT).update(status=BulkReplayStatus.EXPIRED):
            raise BulkReplayNotConfirmable("The dry run expired; run it again.", extra={"bulk_status": "expired"})
        bulk.refresh_from_db()
        raise BulkReplayNotConfirmable(f"This bulk replay is {bulk.status}.", extra={"bulk_status": bulk.status})
    bulk.refresh_from_db()
    log.info("dlq_bulk_confirmed bulk=%s count=%s actor=%s", bulk.pk, bulk.count, actor)
    return bulk


def _enqueue_bulk(bulk_id: int) -> None:
    tasks.enqueue("dlq.tasks.bulk_replay_run_task", bulk_id)


def bulk_replay_run(*, bulk_id: int, budget_seconds: float | None = None) -> BulkReplay | None:
    """Work through a confirmed selection at BULK_REPLAY_PER_SECOND, resumably.

    Each position is taken with a guarded UPDATE before its entry is replayed, so two runners
    (a re-delivered task) never replay the same entry twice. Entries that are no longer
    replayable (resolved meanwhile, being replayed) are counted as skipped.
    """
    bulk = BulkReplay.objects.filter(pk=bulk_id).first()
    if bulk is None or bulk.status != BulkReplayStatus.RUNNING:
        return bulk
    rate = max(1.0, float(dlq_setting("BULK_REPLAY_PER_SECOND")))
    budget = float(budget_seconds if budget_seconds is not None else dlq_setting("BULK_TASK_BUDGET_SECONDS"))
    started = time.monotonic()
    sent = 0
    while True:
        position = BulkReplay.objects.filter(pk=bulk.pk).values_list("position", flat=True).get()
        if position >= bulk.count:
            BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.RUNNING).update(
                status=BulkReplayStatus.DONE, finished_at=timezone.now()
            )
            break
        if sent and time.monotonic() - started > budget:
            # Stay under django-q2's task timeout: a fresh task picks up at `position`.
            _enqueue_bulk(bulk.pk)
            break
        wait = started + sent / rate - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 1.0))
        taken = BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.RUNNING, position=position).update(
            position=position + 1
        )
        if not taken:
            break
        counter = "skipped"
        try:
            replay = failed_event_replay(
                tenant_id=bulk.tenant_id,
                event_pk=bulk.event_ids[position],
                actor=bulk.confirmed_by,
                target_slug=bulk.target_slug,
                force=bulk.force,
                note=bulk.note or f"bulk replay #{bulk.pk}",
                trigger=ReplayTrigger.BULK,
                bulk_id=bulk.pk,
            )
            counter = "succeeded" if replay.outcome == ReplayOutcome.SUCCEEDED else "failed"
        except DomainError as exc:
            log.info("dlq_bulk_skipped bulk=%s event=%s reason=%s", bulk.pk, bulk.event_ids[position], exc.code)
        BulkReplay.objects.filter(pk=bulk.pk).update(**{counter: F(counter) + 1})
        sent += 1
    bulk.refresh_from_db()
    return bulk


# --- Automatic replay and recovery -------------------------------------------------------------


def _root_deadline(event: FailedEvent) -> datetime:
    """A lineage root lives as long as its operation did, else the configured lifetime."""
    lifetime = event.failed_at + timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    if event.operation_id:
        expires = Operation.objects.filter(pk=event.operation_id).values_list("expires_at", flat=True).first()
        if expires is not None:
            return expires
    return lifetime


def auto_replay_due(*, limit: int | None = None) -> dict[str, int]:
    """Replay pending transient failures to targets that opted in, capped per lineage root.

    Never after an ambiguous or non-transient replay outcome (that one is for a human), never
    past the root's lifetime, and with a doubling pause after each automatic try.
    """
    cap = int(dlq_setting("AUTO_REPLAY_MAX_PER_ROOT"))
    base = float(dlq_setting("AUTO_REPLAY_BASE_DELAY_SECONDS"))
    now = timezone.now()
    oldest = now - timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    candidates = FailedEvent.objects.filter(
        status=FE.PENDING, error_class=ErrorClass.TRANSIENT, failed_at__gte=oldest, auto_replay_count__lt=cap
    ).order_by("failed_at")[: limit or int(dlq_setting("AUTO_REPLAY_BATCH"))]
    counts = {"replayed": 0, "failed": 0, "skipped": 0}
    for event in candidates:
        # One entry that raises does not stop the others (ledger.platform.passes): it records the error
        # and spends one of its automatic tries, so it backs off and, at the cap, waits for a
        # human. Replays are HTTP calls: no transaction is held across them (atomic=False).
        with row_isolated(
            job=AUTO_REPLAY_JOB, ref=f"event={event.pk}", on_failure=_auto_replay_failed(event), atomic=False
        ):
            counts[_auto_replay_one(event, now=now, cap=cap, base=base)] += 1
    return counts


AUTO_REPLAY_JOB = "dlq_auto_replay"


def _auto_replay_failed(event: FailedEvent) -> Callable[[BaseException], None]:
    def record(exc: BaseException) -> None:
        FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).update(
            auto_replay_count=F("auto_replay_count") + 1,
            status_note=failure_text(AUTO_REPLAY_JOB, exc),
            updated_at=timezone.now(),
        )

    return record


def _auto_replay_one(event: FailedEvent, *, now: datetime, cap: int, base: float) -> str:
    """One candidate: "replayed", "failed" or "skipped"."""
    if _root_deadline(event) <= now:
        return "skipped"
    try:
        target = selectors.replay_target_resolve(tenant_id=event.tenant_id, slug=event.replay_target_slug)
    except DomainError:
        return "skipped"
    last = event.replays.filter(tenant_id=event.tenant_id).order_by("-number").first()
    if not target.auto_replay or (
        last is not None
        and (
            last.outcome != ReplayOutcome.FAILED
            or last.error_class != ErrorClass.TRANSIENT
            or (last.finished_at and now < last.finished_at + timedelta(seconds=base * 2**event.auto_replay_count))
        )
    ):
        return "skipped"
    try:
        replay = failed_event_replay(
            tenant_id=event.tenant_id,
            event_pk=event.pk,
            actor="auto-replay",
            note=f"automatic replay {event.auto_replay_count + 1} of {cap}",
            trigger=ReplayTrigger.AUTO,
        )
    except DomainError:
        return "skipped"
    return "replayed" if replay.outcome == ReplayOutcome.SUCCEEDED else "failed"


def replays_recover(*, stale_seconds: float | None = None) -> dict[str, int]:
    """Settle replays whose sender died between allocating n and recording the answer.

    The ledger row says what is known: succeeded → replayed; a definitive failure (or no
    claim at all: nothing was sent) → pending; otherwise the outcome is unknown → the Replay
    is marked ambiguous and the entry goes back to pending for a human to decide.
    """
    stale = float(stale_seconds if stale_seconds is not None else dlq_setting("REPLAYING_STALE_SECONDS"))
    cutoff = timezone.now() - timedelta(seconds=stale)
    counts: dict[str, int] = {}
    for replay in Replay.objects.filter(outcome=ReplayOutcome.PENDING, started_at__lt=cutoff).select_related("event"):
        op = Operation.objects.filter(tenant_id=replay.event.tenant_id, key=replay.ledger_key).first()
        if (
            op is not None
            and op.status == OperationStatus.CLAIMED
            and op.lease_expires_at
            and op.lease_expires_at > (timezone.now())
        ):
            continue
        if op is None:
            outcome, to, why = ReplayOutcome.FAILED, FE.PENDING, "sender stopped before the send"
        elif op.status == OperationStatus.SUCCEEDED:
            outcome, to, why = ReplayOutcome.SUCCEEDED, FE.REPLAYED, "recorded by the ledger"
        elif op.status in (OperationStatus.FAILED, OperationStatus.RETRY_WAIT):
            outcome, to, why = ReplayOutcome.FAILED, FE.PENDING, "recorded by the ledger"
        else:
            outcome, to, why = ReplayOutcome.AMBIGUOUS, FE.PENDING, f"sender stopped; ledger row {op.status}"
        with transaction.atomic():
            done = Replay.objects.filter(
                pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.PENDING
            ).update(outcome=outcome, error_message=why, finished_at=timezone.now(), operation=op)
            if done:
                _settle_entry(replay=replay, to=to, actor="recovery", note=f"replay #{replay.number} {outcome}: {why}")
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


# --- Configuration -------------------------------------------------------------------------------


def replay_target_upsert(
    *,
    tenant: Tenant,
    slug: str,
    url: str,
    idempotency_header: str | None = None,
    timeout_seconds: float | None = None,
    is_default: bool | None = None,
    auto_replay: bool | None = None,
    active: bool | None = None,
    idempotency_class: str | None = None,
    lookup_url: str | None = None,
    credential_header: str | None = None,
    credential_value: str | None = None,
    ack: str | None = None,
    actor: str = "system",
) -> ReplayTarget:
    """Create or update a tenant's replay target; ``is_default`` moves the default to it.
    Each target changed is recorded (ledger.tenants.config_changes, secrets masked).

    ``idempotency_class``: declaring it confirms it; a target created without one is
    key-advisory and unconfirmed, as migrated ones are (the console and the command require
    it for new targets). ``credential_value``: None keeps the stored one, "" removes it; it is
    stored sealed. A new target gets its signing secret, returned in clear once as the
    instance's ``new_signing_secret`` ("" for an update).

    ``ack`` (ReplayAck, ADR 0007): declaring it confirms it. A new target created without one
    is ``echo`` when its URL is on the tenant's n8n (its n8n connection's origin: an n8n
    receiver), else ``status``, and unconfirmed either way, listed for the operator."""
    # The model fields' own rules (a slug's shape, lengths): what the console's form says,
    # said the same way to the command (ADR 0006), and never a database error.
    for name, value in (("slug", slug), ("idempotency_header", idempotency_header)):
        if value is not None:
            try:
                ReplayTarget._meta.get_field(name).clean(value, None)
            except DjangoValidationError as exc:
                raise ValidationFailed("; ".join(exc.messages), extra={"field": name}) from None
    # Checked and stored in canonical form (ledger.rules.outbound, https unless loopback): the URL
    # replays will be sent to.
    fields: dict[str, Any] = {"url": replay_target_url_check(url)}
    if idempotency_class is not None:
        if idempotency_class not in IdempotencyClass.values:
            raise ValidationFailed(
                f"idempotency_class must be one of {', '.join(IdempotencyClass.values)}.",
                extra={"field": "idempotency_class"},
            )
        fields.update(idempotency_class=idempotency_class, class_confirmed=True)
    if ack is not None:
        if ack not in ReplayAck.values:
            raise ValidationFailed(f"ack must be one of {', '.join(ReplayAck.values)}.", extra={"field": "ack"})
        fields.update(ack=ack, ack_confirmed=True)
    if lookup_url is not None:
        fields["lookup_url"] = replay_target_url_check(lookup_url, lookup=True) if lookup_url else ""
    if credential_header is not None:
        if credential_header and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}", credential_header):
            raise ValidationFailed(
                "credential_header must be an HTTP header name.", extra={"field": "credential_header"}
            )
        fields["credential_header"] = credential_header
    if credential_value is not None:
        if credential_value and not credential_value.isprintable():
            raise ValidationFailed("The credential must be printable text.", extra={"field": "credential"})
        fields["credential_secret"] = sealed_credential(credential_value) if credential_value else None
    for name, value in (
        ("idempotency_header", idempotency_header),
        ("timeout_seconds", timeout_seconds),
        ("is_default", is_default),
        ("auto_replay", auto_replay),
        ("active", active),
    ):
        if value is not None:
            fields[name] = value
    with transaction.atomic():
        if is_default:
            for other in (
                ReplayTarget.objects.select_for_update().filter(tenant=tenant, is_default=True).exclude(slug=slug)
            ):
                before = config_snapshot(other)
                other.is_default = False
                other.save(update_fields=["is_default", "updated_at"])
                config_change_of(other, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
        existing = ReplayTarget.objects.select_for_update().filter(tenant=tenant, slug=slug).first()
        before = config_snapshot(existing) if existing is not None else None
        fresh = ""
        if existing is None:
            fresh = secrets.token_urlsafe(32)
            fields["signing_secret"] = sealed_credential(fresh)
            if idempotency_class is None:
                fields.update(idempotency_class=IdempotencyClass.KEY_ADVISORY, class_confirmed=False)
            if ack is None:
                fields.update(ack=_undeclared_ack(tenant_id=tenant.pk, url=fields["url"]), ack_confirmed=False)
        target, created = ReplayTarget.objects.update_or_create(tenant=tenant, slug=slug, defaults=fields)
        # The only clear copy, for the caller to show once (the command, the console).
        target.new_signing_secret = fresh
        config_change_of(
            target,
            actor=actor,
            action=ConfigChangeAction.CREATE if created else ConfigChangeAction.UPDATE,
            before=before,
        )
    return target


def _undeclared_ack(*, tenant_id: int, url: str) -> str:
    """The acknowledgement a new target gets when none is declared: ``echo`` for a URL on the
    tenant's n8n (the n8n connection's scheme, host and port — an n8n receiver, which can
    send it and whose bare 2xx may be n8n's own), else ``status`` (what targets did before)."""
    base = N8nConnection.objects.filter(tenant_id=tenant_id).values_list("base_url", flat=True).first()
    if base and _origin(url) == _origin(base):
        return ReplayAck.ECHO
    return ReplayAck.STATUS


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def replay_target_signing_secret(*, target_id: int, rotate: bool = False, actor: str = "system") -> tuple[str, bool]:
    """(the target's current signing secret, whether it was just made). Made on first use
    (a guarded update: two racing first uses agree on one). ``rotate`` makes a new one and
    keeps the old one signing for DLQ ``REPLAY_SECRET_OVERLAP_SECONDS`` — the scheme of
    ``ledger.protocol.callbacks.tenant_callback_secret``. Callers show it only when it was just made."""
    fresh = secrets.token_urlsafe(32)
    sealed = sealed_credential(fresh)
    with transaction.atomic():
        if rotate:
            # The sealed value moves as it is: the previous secret is never opened here.
            changed = ReplayTarget.objects.filter(pk=target_id).update(
                signing_secret_previous=F("signing_secret"),
                signing_secret=sealed,
                signing_secret_rotated_at=timezone.now(),
            )
        else:
            changed = ReplayTarget.objects.filter(pk=target_id, signing_secret__isnull=True).update(
                signing_secret=sealed
            )
        if changed:
            target = ReplayTarget.objects.get(pk=target_id)
            config_change_record(
                tenant_id=target.tenant_id,
                actor=actor,
                action=ConfigChangeAction.UPDATE,
                object_type=target._meta.label_lower,
                object_id=target_id,
                object_repr=str(target),
                before={"signing_secret": (target.signing_secret_previous if rotate else None) or ""},
                after={"signing_secret": sealed},
                secret_fields=("signing_secret",),
            )
    if changed:
        return fresh, True
    return secret_open(ReplayTarget.objects.values_list("signing_secret", flat=True).get(pk=target_id)), False


def replay_target_signing_secrets(*, target_id: int) -> list[str]:
    """The secrets a replay is signed with now: the current one, and the previous one while
    the rotation's overlap lasts (one ``v1=`` each, current first)."""
    current, _made = replay_target_signing_secret(target_id=target_id)
    previous, rotated_at = ReplayTarget.objects.values_list("signing_secret_previous", "signing_secret_rotated_at").get(
        pk=target_id
    )
    return signing_secrets_now(
        current=current, previous=previous, rotated_at=rotated_at, overlap_seconds=_replay_overlap_seconds()
    )


def _replay_overlap_seconds() -> float:
    return float(dlq_setting("REPLAY_SECRET_OVERLAP_SECONDS"))


def replay_target_secret_summary(target: ReplayTarget) -> str:
    """What the console says about a target's signing secret instead of showing it."""
    return signing_secret_summary(
        current=target.signing_secret,
        previous=target.signing_secret_previous,
        rotated_at=target.signing_secret_rotated_at,
        overlap_seconds=_replay_overlap_seconds(),
        unset="not made yet (made at the first replay; rotate to get one you can copy)",
    )


def replay_signature_verify(*, keys: list[str], body: bytes, header: str, tolerance_seconds: int = 300) -> bool:
    """What a replay receiver does with ``Onceguard-Signature`` (docs/secrets.md): the ``t=``
    timestamp is at most ``tolerance_seconds`` away from now and one ``v1=`` is
    HMAC-SHA256(secret, "<t>." + body) under one of the secrets it holds (during a rotation:
    the new and the old one). A tampered body, a stale timestamp or an unknown secret fail."""
    return any(
        verify_signature(secret=secret, body=body, header=header, tolerance_seconds=tolerance_seconds)
        for secret in keys
    )


def event_too_large(length: int) -> EventTooLarge | None:
    """The 413 for a declared body length over the DLQ limit (checked before reading it)."""
    limit = int(dlq_setting("MAX_EVENT_BYTES"))
    if length > limit:
        return EventTooLarge(f"The event exceeds the limit of {limit} bytes.", extra={"limit": limit})
    return None
