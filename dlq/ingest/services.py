"""Entries coming in (DESIGN §4). Keyword-only, typed.

A reported failure is stored once by its identity (``failed_event_ingest``): a repost of the
same report, an n8n retry of a known execution, another occurrence of a business key whose
entry is open, or a new entry (linked to the key's closed one). A terminally failed operation
becomes an entry in the ledger's own transaction (``failed_event_record_for_operation``, its
``operation_failed`` hook). Why a receiver refused the input is kept in words (quarantine),
and a new entry raises the ``dlq_new`` alert.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from alerts.services import alert_raise
from dlq.entries import selectors, transitions
from dlq.entries.payloads import index_payload, open_payload, seal_payload
from dlq.entries.services import clean_note
from dlq.ingest.parsing import ParsedFailure, parse_failure
from dlq.models import (
    BUSINESS_KEY_SOURCES,
    FE,
    FE_OPEN_STATES,
    REPLAY_KEY_PREFIX,
    FailedEvent,
    FailedEventAlias,
    FailedEventOccurrence,
    FailedEventShape,
    KeySource,
    PayloadFetch,
    Replay,
)
from dlq.rules.conf import dlq_setting
from dlq.rules.errors import EventTooLarge
from ledger.models import ErrorClass, Operation, OperationMode, Tenant
from ledger.platform import tasks
from ledger.platform.crypto import open_json
from ledger.platform.errors import InvalidKey
from ledger.protocol import services as ledger_services
from ledger.protocol.selectors import provider_slug
from ledger.rules.key_rules import key_usable
from ledger.rules.search import search_values
from ledger.tenants.workflows import workflow_name_note

log = logging.getLogger("onceguard.dlq")


def _alert_new(event: FailedEvent) -> None:
    # Ids and the class only: error messages and payloads may carry personal data.
    where = f" in workflow {event.source_workflow_id}" if event.source_workflow_id else ""
    alert_raise(
        tenant_id=event.tenant_id,
        kind="dlq_new",
        ref=str(event.pk),
        summary=f"new dead-letter entry ({event.error_class or 'unclassified'}, {event.shape}){where}",
    )


# --- Automatic: terminally failed operations --------------------------------------------------


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


# --- Quarantine: invalid input, with its reason in words --------------------------------------

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


# --- Reports ----------------------------------------------------------------------------------


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
        key_note=clean_note(key_note),
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


def event_too_large(length: int) -> EventTooLarge | None:
    """The 413 for a declared body length over the DLQ limit (checked before reading it)."""
    limit = int(dlq_setting("MAX_EVENT_BYTES"))
    if length > limit:
        return EventTooLarge(f"The event exceeds the limit of {limit} bytes.", extra={"limit": limit})
    return None
