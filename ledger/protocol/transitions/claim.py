"""A key becomes an operation, or a claim takes it again — and what finishing one sets off.

- ``operation_claim``: (new key) → ``claimed`` (guard mode) or ``queued`` (execute mode); a
  known key is answered from its row, which may ``operation_reclaim`` it (``retry_wait`` →
  ``claimed``) or, past its lifetime, ``operation_expire_retry`` it (``retry_wait`` → ``failed``).
- ``operation_cancel``: ``queued``/``retry_wait`` → ``abandoned`` (an operator, or a newer
  version of a record replacing this one).
- ``after_terminal``: a finished operation with a callback URL claims its callback operation
  (``callback_enqueue``) — which is why claims and finishing share this module's floor: a
  claim may itself finish older rows.

Not split further: a new version's claim cancels the older ones, a cancel is a
``guarded_move``, whose terminal move claims a callback — one knot two modules would import
both ways. (A worker's take is the holder's: ``holder.operation_take``.)

Above ``trace``; ``holder`` and ``recovery`` build on it.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from ledger.models import (
    TERMINAL_STATES,
    Attempt,
    ErrorClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationSearch,
    OperationStatus,
    Provider,
    Tenant,
)
from ledger.platform import hooks, tracing
from ledger.platform.crypto import payload_indexing_needed, payload_written
from ledger.platform.errors import (
    DomainError,
    InvalidKey,
    KeyReusedWithDifferentRequest,
    LeaseLost,
    OperationInProgress,
    OperationManagedByService,
    OperationNeedsReconciliation,
    OperationNotCancellable,
    OperationNotFound,
    OperationRetryScheduled,
    OperationVersionSuperseded,
    ValidationFailed,
)
from ledger.protocol import callbacks, fencing
from ledger.protocol.inputs import (
    claim_key_check,
    clamp_lease,
    new_lease_token,
    request_fingerprint,
    reserved_key_check,
    validate_run,
    versioned_key,
)
from ledger.protocol.selectors import operation_newest_in_lineage
from ledger.protocol.tombstones import tombstone_answer
from ledger.protocol.transitions.trace import (
    after_failed,
    check_moves,
    event_row,
    event_text,
    journal_move,
    sealed_param,
    search_append,
    seconds_param,
)
from ledger.providers.lookup import provider_by_id
from ledger.rules.search import search_values
from ledger.store import sql, statements

S = OperationStatus
log = logging.getLogger("onceguard.ledger")


# --- Results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimResult:
    operation: Operation
    # True when this call created the row or took a new attempt on it (201).
    acquired: bool
    # True when the row was already terminal and its recorded outcome is replayed (200).
    replayed: bool


def after_terminal(op: Operation, *, actor: str) -> None:
    """What follows a terminal move, in the same transaction when the caller holds one: a
    finished execute-mode operation with a callback_url gets its callback operation; then
    ``operation_finished`` (the DLQ settles a replay whose operation this is)."""
    if op.status not in TERMINAL_STATES:
        return
    if op.callback_url:
        callback_enqueue(operation=op)
    hooks.operation_finished.send(operation=op, actor=actor)


def callback_enqueue(*, operation: Operation, event: str = "") -> Operation | None:
    """Queue the callback of a finished operation, in the caller's transaction: a claim of
    the key ``callback:{id}`` (``ledger.protocol.callbacks`` says what it is claimed with), so it
    exists once, whoever finishes the operation. ``event``: a later event's callback
    (``callback:{id}:{event}``, once per event: a recalled output)."""
    arguments = callbacks.callback_claim_arguments(operation=operation, event=event)
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
    trace_context: str | None = None,
) -> ClaimResult:
    """Claim ``key`` atomically, or answer for the row that already holds it (DESIGN §5).

    New key → a row in ``claimed`` (guard) or ``queued`` (execute) with its first attempt.
    ``mark_sent`` writes the sent marker in the same commit (in-process guard, workers).
    Raises the named 409/422 errors for rows that cannot be claimed now.

    ``adapter_revision_id``: the adapter revision a new execute-mode row runs under.

    ``trace_context``: the ``traceparent`` a new row stores so later work continues its trace
    (ADR 0015); by default the current span's, when tracing is on and the trace came from the
    caller ("" otherwise: nothing stored).

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
    # A key the database does not know may be one a restore made it forget (ADR 0012).
    fencing.hold_refusal(tenant_id=tenant.pk, key=key)
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
        "request": sealed_param(request) if mode == OperationMode.EXECUTE else None,
        "payload": sealed_param(payload),
        "search_fields": sql.dumps(searchable) if searchable else None,
        "attempts": 1 if status == S.CLAIMED else 0,
        "max_attempts": provider.max_attempts if provider else 4,
        "lease_seconds": seconds_param(lease) if status == S.CLAIMED else None,
        "lease_token": new_lease_token(),
        "mark_sent": mark_sent and status == S.CLAIMED,
        "uses_sent_marker": uses_sent_marker or mark_sent,
        "deadline_seconds": seconds_param(deadline_seconds),
        "lifetime_seconds": seconds_param(provider.lifetime_seconds if provider else 1800),
        "reconciliation_handle": reconciliation_handle[:255],
        "execution_id": execution_id[:255],
        "workflow_id": workflow_id[:255],
        "workflow_version": workflow_version[:100],
        "correlation_id": correlation_id[:255],
        "run": run[:255],
        "step": step,
        "record": record[:200],
        "version": version if record else None,
        # The guard claim's move, kept on the row instead of an event row (ADR 0024).
        "claim_actor": event_text(actor=actor, reason="")["actor"] if status == S.CLAIMED else None,
        "claim_sent": mark_sent and status == S.CLAIMED,
        "request_bytes": terms.request_bytes,
        "cost": terms.cost,
        "callback_url": terms.callback_url,
        "adapter_revision_id": adapter_revision_id,
        "trace_context": (tracing.stored_context() if trace_context is None else trace_context)[
            : tracing.TRACEPARENT_LENGTH
        ],
    }
    params["search_text"] = OperationSearch.joined(
        key, params["reconciliation_handle"], params["execution_id"], params["correlation_id"]
    )
    reason = "claimed, sent" if mark_sent else ("queued" if status == S.QUEUED else "claimed")
    stored = [payload, request if mode == OperationMode.EXECUTE else None]
    # A claim that writes nothing after its row (no stored payload to index, no older
    # version to replace) is, on PostgreSQL, one statement: its own transaction, with no
    # BEGIN and COMMIT round trips around it. Anything more runs in one atomic block.
    alone = statements.combined() and not record and not payload_indexing_needed(stored)
    with nullcontext() if alone else transaction.atomic():
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


def _insert_claimed(params: dict[str, Any], *, actor: str, reason: str) -> Operation | None:
    """The new row, its first attempt (when it has one) and its event; None when the key is
    taken or tombstoned. One statement on PostgreSQL, three in the caller's transaction
    elsewhere."""
    if statements.combined():
        if params["mark_sent"]:
            # Claimed and sent in one commit, which may be this statement's own: journaled
            # before it runs (ADR 0012). A key that turns out taken is one the database knows.
            fencing.journal_move(
                tenant_id=params["tenant_id"], key=params["key"], provider_id=params["provider_id"], state=S.CLAIMED
            )
        return statements.operation("operation_claim_pg", {**params, **event_text(actor=actor, reason=reason)})
    op = statements.operation("operation_insert", params)
    if op is not None:
        search_append(op=op, text=params["search_text"])
        if op.attempts:
            statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        if op.claim_actor is None:
            event_row(op=op, old="", actor=actor, reason=reason)
        elif op.sent_at is not None:
            # A guard claim's move is on the row (ADR 0024); its journal entry is still due
            # (ADR 0012), as event_row would have written it.
            journal_move(op)
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
                current = operation_expire_retry(operation=current, actor=actor)
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
    wanted?", ledger.recovery.eligibility): it waits for a retry, its provider declares
    ``recheck_after``, and it is older than that since it was created or since the tenant
    last said yes. (The workers' take applies the same rule in SQL: ledger.execution.attempts.)"""
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
    with transaction.atomic():
        op = statements.operation(
            "operation_reclaim",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": new_lease_token(),
                "lease_seconds": seconds_param(lease_seconds),
                "mark_sent": mark_sent,
                "execution_id": execution_id[:255],
            },
        )
        if op is None:
            return None
        statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        # A new execution id this attempt brought is found by search too.
        search_append(op=op, text=execution_id[:255])
        event_row(op=op, old=S.RETRY_WAIT, actor=actor, reason="retry claimed, sent" if mark_sent else "retry claimed")
    return op


# --- The guarded move every service-side transition runs --------------------------------------


def guarded_move(
    *,
    operation: Operation,
    to: str,
    actor: str,
    reason: str,
    values: dict[str, Any] | None = None,
    attempt_values: dict[str, Any] | None = None,
    guard: Q | None = None,
) -> Operation:
    """Move an operation from the state it was read in (a guarded ORM update: these moves
    are not hot); raises LeaseLost if it moved meanwhile. Only the named moves of this
    package call it, each with the columns its move sets: ``values`` on the row (values or
    expressions such as ``Now()``), ``attempt_values`` on its latest attempt, ``guard``
    narrowing the move further (e.g. ``Q(expires_at__lte=Now())``).
    """
    check_moves((operation.status,), to)
    # The event's clock (event_insert's now()), so a finished row's times never follow its
    # terminal event's: updated_after reads those events (ADR 0017).
    columns: dict[str, Any] = {"status": to, "updated_at": sql.TransactionNow(), **(values or {})}
    if to in TERMINAL_STATES:
        columns["done_at"] = sql.TransactionNow()
    rows = Operation.objects.filter(
        pk=operation.pk, tenant_id=operation.tenant_id, status=operation.status, lease_token=operation.lease_token
    )
    if guard is not None:
        rows = rows.filter(guard)
    with transaction.atomic():
        if not rows.update(**columns):
            raise LeaseLost("The operation moved before this change could be applied.")
        updated = Operation.objects.get(pk=operation.pk, tenant_id=operation.tenant_id)
        if columns.get("provider_ref"):
            search_append(op=updated, text=updated.provider_ref, ref=True)
        if attempt_values:
            Attempt.objects.filter(
                tenant_id=updated.tenant_id, operation_id=updated.pk, number=updated.attempts
            ).update(**attempt_values)
        event_row(op=updated, old=operation.status, actor=actor, reason=reason)
        if updated.status == S.FAILED:
            after_failed(updated)
        after_terminal(updated, actor=actor)
    return updated


def operation_expire_retry(*, operation: Operation, actor: str) -> Operation:
    """retry_wait → failed once the row's lifetime has ended: old work expires instead of
    acting after its context changed (nothing was sent: it waited for a retry). Found by the
    claim that came back too late, or by the sweeper when nobody came back."""
    return guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=actor,
        reason="lifetime ended while waiting for a retry",
        values={"error_class": operation.error_class or ErrorClass.TRANSIENT},
        guard=Q(expires_at__lte=Now()),
    )


# --- Operator actions: cancel and retry now (console) ------------------------------------------

CANCELLABLE_STATES = (S.QUEUED, S.RETRY_WAIT)


def operator_target(*, operation_id: int, tenant_ids: list[int] | None) -> Operation:
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
    review. The move is ``guarded_move`` (status and lease token
    as read): a worker that took the row meanwhile wins and the cancel is refused. Later
    claims of the key answer ``200`` with the abandoned outcome; a callback is queued as for
    any finished row. ``tenant_ids`` limits which tenants' rows the caller may cancel.
    """
    reason = " ".join((reason or "").split())
    if not reason:
        raise ValidationFailed("Say why the operation is cancelled.")
    op = operator_target(operation_id=operation_id, tenant_ids=tenant_ids)
    if op.status not in CANCELLABLE_STATES:
        raise OperationNotCancellable(
            f"The operation is {op.status}; only queued or retry_wait operations can be cancelled.",
            extra={"status": op.status},
        )
    try:
        moved = guarded_move(
            operation=op,
            to=S.ABANDONED,
            actor=actor,
            reason=f"cancelled: {reason}",
            values={"next_attempt_at": None},
        )
    except LeaseLost as exc:
        raise OperationNotCancellable("The operation moved (a worker may have taken it); reload it.") from exc
    log.info("operation_cancelled operation=%s actor=%s", moved.pk, actor)
    return moved
