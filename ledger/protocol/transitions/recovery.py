"""Moves the service makes on an operation nobody holds: the sweeper, reconciliation,
reviewers, the eligibility webhook's answer, the poller's lifetime check, the output check,
a DLQ replay or a run's resume, and operators.

Every function here is one named move through ``claim.guarded_move`` (a guarded ORM update:
these moves are not hot): the row must still be in the state, and hold the lease token, it was
read with, else ``LeaseLost``.

Above ``claim`` and ``trace``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from ledger.models import (
    AttemptOutcome,
    ErrorClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
)
from ledger.platform.crypto import seal_json
from ledger.platform.errors import IllegalTransition, OperationNotCancellable
from ledger.protocol.inputs import sanitize_message
from ledger.protocol.transitions.claim import eligibility_ask_interval, guarded_move, operator_target
from ledger.protocol.transitions.trace import event_row
from ledger.store import sql

S = OperationStatus
log = logging.getLogger("onceguard.ledger")


def operation_retry_now(
    *, operation_id: int, actor: str, reason: str = "", tenant_ids: list[int] | None = None
) -> Operation:
    """An execute-mode row waiting for its next attempt becomes due now (its backoff is
    skipped; attempts, lifetime and the provider's pause or throttle still apply).

    A guard-mode row is retried by its caller claiming the key again — Onceguard never sends
    it — so it is refused here. The row stays ``retry_wait``; the event row records who
    asked (``retry_wait → retry_wait``), as ``operation_supersede`` records its own change.
    """
    op = operator_target(operation_id=operation_id, tenant_ids=tenant_ids)
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
        event_row(
            op=moved, old=S.RETRY_WAIT, actor=actor, reason=f"retry now requested{': ' + reason if reason else ''}"
        )
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


# --- The sweeper: claimed rows whose lease expired ----------------------------------------------

SWEEPER = "sweeper"


def _resolve_unknown_attempts(op: Operation, outcome: str) -> None:
    """Every attempt left unknown (ambiguous, or a job still pending) resolved as ``outcome``:
    the move's verdict covers them all. After the move's own event and hooks, as it always ran."""
    op.attempt_set.filter(outcome__in=[AttemptOutcome.AMBIGUOUS, AttemptOutcome.PENDING]).update(outcome=outcome)


def operation_lease_expire(
    *, operation: Operation, to: str, reason: str, next_attempt_in: float | None, attempt_outcome: str
) -> Operation:
    """claimed → ``to`` once the holder's lease expired (the sweeper): ``retry_wait`` (due in
    ``next_attempt_in`` seconds), ``failed`` or ``review`` when provably unsent (the failure
    table decides, ``holder.decide_unsent_expiry``), else ``uncertain``. The attempt ends as
    ``attempt_outcome``."""
    values: dict[str, Any] = {"lease_expires_at": None}
    if next_attempt_in is not None:
        values["next_attempt_at"] = sql.db_now() + timedelta(seconds=next_attempt_in)
    return guarded_move(
        operation=operation,
        to=to,
        actor=SWEEPER,
        reason=reason,
        values=values,
        attempt_values={"outcome": attempt_outcome, "finished_at": Now()},
        guard=Q(lease_expires_at__lt=Now()),
    )


def operation_poll_lease_expire(*, operation: Operation, reason: str) -> Operation:
    """claimed (a poll lease) → waiting, polled again now: a poll and an output fetch change
    nothing at the provider, so a lost poller left nothing uncertain (the sweeper)."""
    return guarded_move(
        operation=operation,
        to=S.WAITING,
        actor=SWEEPER,
        reason=reason,
        values={"lease_expires_at": None, "next_attempt_at": Now()},
        guard=Q(lease_expires_at__lt=Now()),
    )


def operation_unpolled_review(*, operation: Operation, overdue: datetime, reason: str) -> Operation:
    """waiting → review: its lifetime passed and no worker polled it by ``overdue`` (the
    sweeper). Not failed — the provider may still finish the job."""
    return guarded_move(
        operation=operation,
        to=S.REVIEW,
        actor=SWEEPER,
        reason=reason,
        guard=Q(next_attempt_at__lt=overdue, expires_at__lt=Now()),
    )


# --- Reconciliation: uncertain rows settled by what the provider says ----------------------------
# Each clears the row's reconciliation lease (reconcile_until), taken by the sweeper's pass.


def operation_hand_to_review(*, operation: Operation, reason: str, actor: str = SWEEPER) -> Operation:
    """uncertain → review: nothing can settle it without a human (no lookup, past the key's
    TTL, lookups keep failing, a key-advisory provider)."""
    return guarded_move(operation=operation, to=S.REVIEW, actor=actor, reason=reason, values={"reconcile_until": None})


def operation_reissue(
    *, operation: Operation, reason: str, expires_at: datetime | None = None, not_found: bool = False
) -> Operation:
    """uncertain → retry_wait, due now: a re-issue with the same key is safe (the provider
    enforces it and still remembers it). ``expires_at``: the row's lifetime ends there (the
    key's TTL); ``not_found``: the provider's lookup found nothing, so the attempts left
    unknown are resolved as not found."""
    values: dict[str, Any] = {"reconcile_until": None, "next_attempt_at": Now()}
    if expires_at is not None:
        values["expires_at"] = expires_at
    moved = guarded_move(operation=operation, to=S.RETRY_WAIT, actor=SWEEPER, reason=reason, values=values)
    if not_found:
        _resolve_unknown_attempts(moved, AttemptOutcome.NOT_FOUND)
    return moved


def operation_found_waiting(*, operation: Operation, provider_ref: str, reason: str) -> Operation:
    """uncertain → waiting: the asynchronous provider's lookup found the job; polls follow it
    like any accepted job (its state and output come from its status answer)."""
    provider_ref = provider_ref[:255]
    return guarded_move(
        operation=operation,
        to=S.WAITING,
        actor=SWEEPER,
        reason=reason,
        values={"reconcile_until": None, "provider_ref": provider_ref, "next_attempt_at": Now(), "polls": 0},
        attempt_values={"outcome": AttemptOutcome.PENDING, "provider_ref": provider_ref},
    )


def operation_found_succeeded(*, operation: Operation, provider_ref: str, body: Any, reason: str) -> Operation:
    """uncertain → succeeded: the provider's lookup found the effect done."""
    provider_ref = provider_ref[:255]
    return guarded_move(
        operation=operation,
        to=S.SUCCEEDED,
        actor=SWEEPER,
        reason=reason,
        values={
            "reconcile_until": None,
            "provider_ref": provider_ref,
            "response_status": 200,
            "response_body": seal_json(body),
            "lease_expires_at": None,
        },
        attempt_values={"outcome": AttemptOutcome.SUCCEEDED, "provider_ref": provider_ref},
    )


def operation_found_failed(
    *, operation: Operation, provider_ref: str, status_value: Any, body: Any, reason: str
) -> Operation:
    """uncertain → failed: the provider's lookup found the request, refused (its status says
    so); the attempts left unknown failed."""
    moved = guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=SWEEPER,
        reason=reason,
        values={
            "reconcile_until": None,
            "provider_ref": provider_ref[:255],
            "error_class": ErrorClass.INVALID_INPUT,
            "last_error": sanitize_message(f"provider reports status {status_value}"),
            "response_body": seal_json(body),
        },
    )
    _resolve_unknown_attempts(moved, AttemptOutcome.FAILED)
    return moved


def operation_not_found_failed(*, operation: Operation, reason: str) -> Operation:
    """uncertain → failed: not found at the provider once it settled, and no attempt or
    lifetime is left for a re-issue."""
    moved = guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=SWEEPER,
        reason=reason,
        values={
            "reconcile_until": None,
            "error_class": ErrorClass.TRANSIENT,
            "last_error": "not found at provider after the last attempt",
        },
    )
    _resolve_unknown_attempts(moved, AttemptOutcome.NOT_FOUND)
    return moved


# --- Reviewers, the eligibility webhook, the poller, the output check ------------------------------


def operation_review_resolve(
    *, operation: Operation, to: str, actor: str, reason: str, provider_ref: str = ""
) -> Operation:
    """review → succeeded (the reviewer confirmed it, with the provider's reference),
    retry_wait (safe to retry: due now, its lookups counted afresh) or abandoned. A decision
    that it happened, or did not, resolves every attempt left unknown."""
    values: dict[str, Any] = {"reconcile_until": None, "lease_expires_at": None}
    resolved: str | None = None
    if to == S.SUCCEEDED:
        values["provider_ref"] = provider_ref[:255]
        resolved = AttemptOutcome.SUCCEEDED
    elif to == S.RETRY_WAIT:
        values.update(next_attempt_at=Now(), lookup_failures=0)
        resolved = AttemptOutcome.NOT_FOUND
    with transaction.atomic():
        moved = guarded_move(operation=operation, to=to, actor=actor, reason=reason, values=values)
        if resolved is not None:
            moved.attempt_set.filter(
                tenant_id=moved.tenant_id, outcome__in=[AttemptOutcome.AMBIGUOUS, AttemptOutcome.PENDING]
            ).update(outcome=resolved)
    return moved


def operation_not_wanted(*, operation: Operation, actor: str, why: str) -> Operation:
    """retry_wait → abandoned: the tenant's eligibility webhook said the retry is not wanted
    any more (ledger.recovery.eligibility)."""
    return guarded_move(
        operation=operation,
        to=S.ABANDONED,
        actor=actor,
        reason=f"not wanted any more (eligibility webhook): {why}",
        values={"next_attempt_at": None, "last_error": sanitize_message(f"not wanted: {why}")},
    )


def _retry_wait_note(*, operation: Operation, actor: str, reason: str, **columns: Any) -> bool:
    """A retry_wait row as it was read (status and lease token) records ``columns`` and a
    retry_wait → retry_wait event; False when it moved meanwhile (a claim took it, a cancel)."""
    with transaction.atomic():
        as_read = Operation.objects.filter(pk=operation.pk, status=S.RETRY_WAIT, lease_token=operation.lease_token)
        if not as_read.update(updated_at=Now(), **columns):
            return False
        OperationEvent.objects.create(
            tenant_id=operation.tenant_id,
            operation_id=operation.pk,
            from_status=S.RETRY_WAIT,
            to_status=S.RETRY_WAIT,
            actor=actor,
            reason=sanitize_message(reason),
            attempt=operation.attempts,
            at=Now(),
        )
    return True


def operation_still_wanted(*, operation: Operation, actor: str) -> bool:
    """retry_wait stays: the tenant's eligibility webhook said the retry is still wanted, so it
    goes ahead (``eligibility_confirmed_at``, an event without a change of state)."""
    return _retry_wait_note(
        operation=operation,
        actor=actor,
        reason="still wanted (eligibility webhook); the retry goes ahead",
        eligibility_confirmed_at=Now(),
    )


def operation_eligibility_unanswered(*, operation: Operation, actor: str, why: str) -> bool:
    """retry_wait stays, asked again in one ask interval: the eligibility webhook gave no
    answer (``why``); an event without a change of state."""
    interval = eligibility_ask_interval()
    text = f"eligibility unanswered: {why}"
    return _retry_wait_note(
        operation=operation,
        actor=actor,
        reason=f"{text}; waits, asked again in {interval} s",
        next_attempt_at=Now() + timedelta(seconds=interval),
        last_error=sanitize_message(text),
    )


def operation_poll_review(*, operation: Operation, actor: str, reason: str) -> Operation:
    """claimed (a poll lease) → review: the row's lifetime passed while the provider's job was
    not done; it may still finish there, so a reviewer decides (ledger.execution.polling)."""
    return guarded_move(operation=operation, to=S.REVIEW, actor=actor, reason=reason, values={"lease_expires_at": None})


def operation_output_reject(*, operation: Operation, actor: str, reason: str) -> Operation:
    """claimed|uncertain|review → failed as ``invalid_output``: the latest holder's verdict on
    what the provider produced (ledger.execution.outputs). ``reason`` is already sanitized."""
    return guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=actor,
        reason=f"invalid_output: {reason}",
        values={"error_class": ErrorClass.INVALID_OUTPUT, "last_error": reason, "next_attempt_at": None},
        attempt_values={
            "outcome": AttemptOutcome.FAILED,
            "error_class": ErrorClass.INVALID_OUTPUT,
            "message": reason,
            "finished_at": Now(),
        },
    )


# --- DLQ replays and run resumes -----------------------------------------------------------------


def operation_replay_not_retried(*, operation: Operation, actor: str) -> Operation:
    """retry_wait → failed for a replay's own operation: nobody comes back for a replay's key
    (the next replay is a new attempt under a new key)."""
    return guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=actor,
        reason="replays are not retried in place; the next replay is a new attempt",
    )


def operation_redrive(*, operation: Operation, actor: str, reason: str) -> Operation:
    """retry_wait → failed so that a run's resume re-drives the step through a replay (its DLQ
    entry is written in the same transaction by the ledger's hook): its caller is the only one
    who would send it otherwise."""
    return guarded_move(
        operation=operation,
        to=S.FAILED,
        actor=actor,
        reason=reason,
        values={"error_class": operation.error_class or ErrorClass.TRANSIENT, "next_attempt_at": None},
    )
