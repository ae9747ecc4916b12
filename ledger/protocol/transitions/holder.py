"""The moves of an operation's lease holder: the worker, the guard or the API caller that
claimed it.

- ``operation_take``: ``queued``/``retry_wait`` → ``claimed`` by an execute-mode worker, with
  its attempt and the sent marker (a guard caller's retry is ``claim``'s ``operation_reclaim``).
- ``operation_wait``: ``claimed`` → ``waiting`` (an asynchronous provider has the job);
  ``operation_poll_take``: ``waiting`` → ``claimed`` for one poll.
- ``operation_mark_sent``: ``claimed`` → ``claimed`` with the sent marker (an event row, no
  change of state); ``operation_heartbeat`` extends the lease (no event: not a move).
- ``operation_complete``: ``claimed``/``uncertain``/``review`` → ``succeeded``, by the latest
  attempt's token only.
- ``operation_fail``: ``claimed``/``uncertain``/``review`` → ``retry_wait``, ``uncertain``,
  ``review`` or ``failed``, as DESIGN §3's failure table decides.

Above ``claim`` (a terminal move claims its callback) and ``trace``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ledger.models import (
    ALLOWED_TRANSITIONS,
    NO_RETRY_ERROR_CLASSES,
    REPORTABLE_STATES,
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    ErrorClass,
    Operation,
    OperationStatus,
    Provider,
)
from ledger.platform.errors import LeaseLost, OperationAlreadyFinished, ValidationFailed
from ledger.platform.logs import operation_fields
from ledger.protocol.evidence import attempt_evidence_record
from ledger.protocol.inputs import backoff_seconds, clamp_lease, new_lease_token, sanitize_message
from ledger.protocol.transitions.claim import after_terminal
from ledger.protocol.transitions.trace import (
    after_failed,
    check_moves,
    event_row,
    event_text,
    fenced_evidence_record,
    holder_refusal,
    journal_move,
    sealed_param,
    search_append,
    seconds_param,
)
from ledger.store import sql, statements

S = OperationStatus
log = logging.getLogger("onceguard.ledger")


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
    with transaction.atomic():
        op = statements.operation(
            "operation_wait",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": lease_token,
                "provider_ref": provider_ref,
                "poll_in_seconds": seconds_param(poll_in_seconds),
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
            search_append(op=op, text=provider_ref, ref=True)
            event_row(op=op, old=S.CLAIMED, actor=actor, reason=reason)
            return op
    current = Operation.objects.filter(pk=operation_id, tenant_id=tenant_id).first()
    if current is not None and current.status == S.WAITING and current.lease_token == lease_token:
        if current.provider_ref == provider_ref:
            return current
    raise holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)


def operation_poll_take(
    *, operation_id: int, tenant_id: int, lease_seconds: float, actor: str, reason: str
) -> Operation | None:
    """waiting → claimed for one poll (a worker's take, which holds the row locked, or the
    provider's webhook): a new token, a short lease, no new attempt. None when the row was
    not waiting any more (someone else took it first)."""
    with transaction.atomic():
        op = statements.operation(
            "operation_poll_take",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "lease_token": new_lease_token(),
                "lease_seconds": seconds_param(lease_seconds),
            },
        )
        if op is not None:
            event_row(op=op, old=S.WAITING, actor=actor, reason=reason)
    return op


def operation_take(
    *, operation_id: int, tenant_id: int, from_status: str, lease_seconds: float, past_deadline: bool, actor: str
) -> Operation | None:
    """queued|retry_wait → claimed by an execute-mode worker, with a new attempt and the sent
    marker (the worker sends right after); past its deadline or lifetime, without the marker,
    so the worker fails it instead of sending. The caller holds the row locked (the take's
    SKIP LOCKED read) in its transaction."""
    check_moves((from_status,), S.CLAIMED)
    with transaction.atomic():
        op = statements.operation(
            "operation_take",
            {
                "id": operation_id,
                "tenant_id": tenant_id,
                "from_status": from_status,
                "lease_token": new_lease_token(),
                "lease_seconds": seconds_param(lease_seconds),
                "past_deadline": past_deadline,
            },
        )
        if op is None:
            return None
        statements.execute("attempt_open", {"operation_id": op.pk, "tenant_id": op.tenant_id})
        event_row(
            op=op, old=from_status, actor=actor, reason="taken past its deadline" if past_deadline else "taken, sent"
        )
    return op


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
    with transaction.atomic():
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
            # A handle the marker brought is found by search too (ADR 0018).
            search_append(op=op, text=reconciliation_handle[:255])
            event_row(op=op, old=S.CLAIMED, actor=actor, reason="sent marker")
    if op is None:
        raise holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id, allow_expired=False)
    return op


def operation_heartbeat(
    *, operation_id: int, lease_token: str, lease_seconds: float | None = None, tenant_id: int
) -> Operation:
    """Extend a live holder's lease (claimed, same token). No event row: not a transition."""
    with transaction.atomic():
        op = statements.operation(
            "operation_heartbeat",
            {
                "id": operation_id,
                "lease_token": lease_token,
                "lease_seconds": seconds_param(clamp_lease(lease_seconds)),
                "tenant_id": tenant_id,
            },
        )
        if op is not None:
            # The attempt mirrors the row's lease exactly (its value, not a second clock read).
            Attempt.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk, lease_token=lease_token).update(
                lease_expires_at=op.lease_expires_at
            )
    if op is None:
        raise holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    return op


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
        "response_body": sealed_param(response_body),
    }
    with transaction.atomic():
        op = _complete_reported(params, actor=actor, reason=reason)
        if op is not None:
            after_terminal(op, actor=actor)
            # DEBUG: a success needs no one's attention and its record is the event row;
            # what does (fenced, failed, uncertain, paused) is logged at INFO or above. (The
            # fields are only gathered when the line is written.)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("operation_succeeded", extra=operation_fields(op))
            return op
    error = holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    if isinstance(error, LeaseLost) and "status" not in error.extra:
        fenced_evidence_record(
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
        op = statements.operation("operation_complete_pg", {**params, **event_text(actor=actor, reason=reason)})
        if op is not None:
            # Still inside the caller's transaction: journaled before the commit (ADR 0012).
            journal_move(op)
        return op
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
            search_append(op=op, text=params["provider_ref"], ref=True)
            event_row(op=op, old=old, actor=actor, reason=reason)
            return op
    return None


def _failure_evidence(op: Operation, attempt: dict[str, Any]) -> None:
    """The failed attempt's evidence, in its own transaction: it commits or rolls back with
    the failure it describes (ADR 0016)."""
    attempt_evidence_record(
        op=op,
        number=attempt["number"],
        outcome=attempt["outcome"],
        error_class=attempt["error_class"],
        message=attempt["message"],
        response_status=attempt["response_status"],
    )


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
        fenced_evidence_record(**fenced.evidence)
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
    with _atomic_keeping_fenced_evidence():
        op = (
            Operation.objects.select_for_update()
            .filter(pk=operation_id, tenant_id=tenant_id, lease_token=lease_token, status__in=REPORTABLE_STATES)
            .first()
        )
        if op is None:
            error = holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
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
            _failure_evidence(op, attempt)
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
                "response_body": sealed_param(response_body) if has_response else None,
                "throttled": 1 if throttled else 0,
                "retry_in_seconds": seconds_param(decision.next_attempt_in),
            },
        )
        if updated is None:  # pragma: no cover - the row is locked above
            raise LeaseLost("The operation moved while failing.")
        statements.execute("attempt_finish", attempt)
        _failure_evidence(op, attempt)
        event_row(
            op=updated,
            old=op.status,
            actor=actor,
            reason=f"{decision.reason}: {message}" if message else decision.reason,
        )
        if updated.status == S.FAILED:
            after_failed(updated)
        after_terminal(updated, actor=actor)
    log.info("operation_failed to=%s", updated.status, extra=operation_fields(updated, error_class=error_class))
    return updated
