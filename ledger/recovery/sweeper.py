"""The sweeper: reconciles the crash window (DESIGN §3 "The sweeper").

Each rule reads candidates through a partial index on (status, time) and moves each row
with a guarded UPDATE that re-checks the condition, so overlapping passes (two nodes, a
manual run) never handle a row twice: the second UPDATE matches nothing. Rows that need a
slow step (a provider lookup) are first taken under a short reconciliation lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, Q
from django.db.models.functions import Coalesce, Now

from ledger.models import (
    Attempt,
    AttemptOutcome,
    IdempotencyClass,
    Operation,
    OperationMode,
    OperationStatus,
)
from ledger.platform import hooks, tracing
from ledger.platform.errors import LeaseLost
from ledger.platform.logs import bound_log_fields, log_context
from ledger.platform.passes import failure_text, row_isolated
from ledger.protocol import approvals, transitions
from ledger.protocol.selectors import attempt_log_fields
from ledger.protocol.transitions import decide_unsent_expiry
from ledger.providers.adapters import is_asynchronous
from ledger.providers.canary import canary_watch_all
from ledger.providers.reconcile import LookupOutcome, provider_lookup
from ledger.providers.revisions import operation_adapter_view
from ledger.recovery.eligibility import eligibility_recheck
from ledger.recovery.recall import outputs_recall_due
from ledger.store import sql
from ledger.store.open_rows import open_rows_where

S = OperationStatus
log = logging.getLogger("onceguard.sweeper")
# The label of this pass's failures (ledger.platform.passes).
JOB = "sweeper"

Changes = dict[str, Any]


@dataclass
class SweepReport:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def _move(
    op: Operation, to: str, report: SweepReport, move: Callable[[], Operation], *, also: Any = None
) -> Operation | None:
    """One named move (``move``, a ledger.protocol.transitions function, to ``to``); a row someone else
    moved first is counted, not overwritten. Its lines name the attempt's adapter revision and
    prompt template version, as the worker's did."""
    if _fields_bound(op):
        return _move_logged(op, to, report, move, also=also)
    with log_context(**attempt_log_fields(op)):
        return _move_logged(op, to, report, move, also=also)


def _fields_bound(op: Operation) -> bool:
    """Whether the lines written here already name ``op``'s attempt (reconcile_uncertain binds
    them around its row): its prompt template is then not read a second time per move."""
    bound = bound_log_fields()
    return bound.get("operation") == op.pk and bound.get("attempt") == op.attempts


def _move_logged(
    op: Operation, to: str, report: SweepReport, move: Callable[[], Operation], *, also: Any
) -> Operation | None:
    try:
        with transaction.atomic():
            moved = move()
            if also is not None:
                also(moved)
    except LeaseLost:
        report.add("raced")
        return None
    report.add(f"{op.status}->{to}")
    log.info("sweeper_moved key=%s attempt=%s from=%s to=%s", op.key, op.attempts, op.status, to)
    return moved


def sender_honours_marker(op: Operation) -> bool:
    """Only senders known to write `sent` before sending may be trusted when it is absent."""
    return op.mode == OperationMode.EXECUTE or op.uses_sent_marker


# --- claimed rows whose lease expired ------------------------------------------------------


def sweep_expired_leases(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """claimed, lease expired: → retry_wait when provably unsent, else → uncertain."""
    report = report or SweepReport()
    # Candidates off the work queue's mirror (ADR 0017); each is checked again on its row.
    expired = open_rows_where(status=S.CLAIMED, lease_expires_at__lt=Now())
    ids = list(
        Operation.objects.filter(expired).order_by("open_row__lease_expires_at").values_list("id", flat=True)[:batch]
    )
    for op in Operation.objects.filter(pk__in=ids, status=S.CLAIMED).select_related("provider"):
        with row_isolated(job=JOB, ref=f"operation={op.pk}"):
            _expire_one(op, report)
    return report


def _expire_one(op: Operation, report: SweepReport) -> None:
    """One claimed row whose lease expired."""
    if op.polls > 0:
        # A poll lease (ledger.execution.polling): a poll and an output fetch are GETs that change
        # nothing at the provider, and a publish is fenced by this token and state, so
        # a lost poller left nothing uncertain. The job is polled again, now.
        why = f"poll lease expired; polls change nothing at the provider: poll job {op.provider_ref} again"
        _move(op, S.WAITING, report, lambda: transitions.operation_poll_lease_expire(operation=op, reason=why))
        return
    delay: float | None = None
    if op.sent_at is None and sender_honours_marker(op):
        to, delay, reason = decide_unsent_expiry(op)
        outcome = AttemptOutcome.EXPIRED
    else:
        to = S.UNCERTAIN
        reason = "lease expired after the sent marker" if op.sent_at else "lease expired; the sender may have sent"
        outcome = AttemptOutcome.AMBIGUOUS
    _move(
        op,
        to,
        report,
        lambda: transitions.operation_lease_expire(
            operation=op, to=to, reason=reason, next_attempt_in=delay, attempt_outcome=outcome
        ),
        also=_review_alert if to == S.REVIEW else None,
    )


# --- uncertain rows: reconcile with the provider ---------------------------------------------


def key_first_used_at(op: Operation) -> datetime:
    """The earliest time the provider may have seen this operation's key.

    A key-enforced provider remembers a key for its key TTL from the key's *first* use
    (Stripe prunes keys 24 h after they were created), not from our latest re-issue: measured
    from the latest attempt, a row re-issued near the end of the TTL looked fresh while the
    provider had already forgotten the first, performed request, and the next re-issue acted
    twice (found by the stateful test, tests/ledger/test_stateful.py). Attempts of a sender
    that honours the marker count from their marker; others from their start.
    """
    attempts = Attempt.objects.filter(operation_id=op.pk)
    if sender_honours_marker(op):
        attempts = attempts.filter(sent_at__isnull=False)
    first = attempts.aggregate(first=Min(Coalesce("sent_at", "started_at")))["first"]
    return first or op.sent_at or op.claimed_at or op.created_at


def _take_uncertain(batch: int) -> list[int]:
    """Take uncertain rows under a short reconciliation lease, so a second sweeper (another
    node, a manual run) passes them over: read with SKIP LOCKED, set in the same transaction."""
    free = open_rows_where(status=S.UNCERTAIN) & (Q(reconcile_until__isnull=True) | Q(reconcile_until__lt=Now()))
    until = sql.db_now() + timedelta(seconds=int(settings.ONCEGUARD["RECONCILE_LEASE_SECONDS"]))
    with transaction.atomic():
        ids = list(
            Operation.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(free)
            .order_by("open_row__updated_at")
            .values_list("id", flat=True)[:batch]
        )
        Operation.objects.filter(pk__in=ids, status=S.UNCERTAIN).filter(
            Q(reconcile_until__isnull=True) | Q(reconcile_until__lt=Now())
        ).update(reconcile_until=until)
    return ids


def _release(op_id: int, *, lookup_failed: bool = False) -> None:
    """The reconciliation lease ends; a failed lookup is counted."""
    changes: Changes = {"reconcile_until": None}
    if lookup_failed:
        changes["lookup_failures"] = F("lookup_failures") + 1
    Operation.objects.filter(pk=op_id).update(**changes)


def _review_alert(op: Operation) -> None:
    hooks.alert_raised.send(
        tenant_id=op.tenant_id, kind="review_needed", ref=op.key, summary=f"operation {op.pk} needs a decision"
    )


def _review(op: Operation, reason: str, report: SweepReport) -> None:
    """uncertain → review, with an alert: nothing settles it without a human."""
    _move(
        op,
        S.REVIEW,
        report,
        lambda: transitions.operation_hand_to_review(operation=op, reason=reason),
        also=_review_alert,
    )


def reconcile_uncertain(
    *, batch: int = 100, report: SweepReport | None = None, client: httpx.Client | None = None
) -> SweepReport:
    report = report or SweepReport()
    for op_id in _take_uncertain(batch):
        op = Operation.objects.select_related("provider").filter(pk=op_id, status=S.UNCERTAIN).first()
        if op is None:
            continue
        # Every line about this row names its attempt's adapter revision and prompt version.
        # The lookup is an HTTP call: no transaction is held across it (atomic=False).
        with row_isolated(job=JOB, ref=f"operation={op.pk}", on_failure=_lookup_backoff(op), atomic=False):
            with (
                log_context(**attempt_log_fields(op)),
                # The sweeper's lookup continues the trace the claim stored (ADR 0015).
                tracing.operation_span("onceguard.reconcile", operation=op),
            ):
                _reconcile_one(op, report=report, client=client)
    return report


def _lookup_backoff(op: Operation) -> Any:
    """What a row records when reconciling it raised: the error and one more lookup failure,
    and its reconciliation lease is extended, doubling with its failures (up to an hour), so
    the next passes try the other rows first."""

    def record(exc: BaseException) -> None:
        failures = op.lookup_failures + 1
        backoff = min(3600, int(settings.ONCEGUARD["RECONCILE_LEASE_SECONDS"]) * 2 ** min(failures, 12))
        Operation.objects.filter(pk=op.pk, status=S.UNCERTAIN).update(
            lookup_failures=F("lookup_failures") + 1,
            last_error=failure_text(JOB, exc),
            reconcile_until=sql.db_now() + timedelta(seconds=backoff),
        )

    return record


def _reconcile_one(op: Operation, *, report: SweepReport, client: httpx.Client | None) -> None:
    """One uncertain row: review, a re-issue, or what the provider's lookup says."""
    if op.provider is None:
        _review(op, "no provider to reconcile with", report)
        return
    # Looked up where it was sent: the adapter revision its last attempt ran under.
    provider = operation_adapter_view(op, op.provider)
    if provider.idempotency_class == IdempotencyClass.KEY_ADVISORY:
        # Nothing at the receiver stops a second effect: a human decides, never a re-send.
        _review(op, "key-advisory provider: outcome unknown, not re-sent", report)
        return
    now = sql.db_now()
    sent_at = op.sent_at or op.claimed_at or op.created_at
    # Past the key TTL the provider may have forgotten the key: a re-issue could act twice.
    forgotten_at = key_first_used_at(op) + timedelta(seconds=provider.key_ttl_seconds)
    ttl_passed = now > forgotten_at
    ttl_reason = "past the provider's key TTL: a re-issue could act twice"
    if not provider.lookup_path:
        if ttl_passed:
            _review(op, ttl_reason, report)
        elif op.mode == OperationMode.EXECUTE:
            # Key-enforced: re-issuing with the same key is safe while the provider
            # remembers the key; the worker does it. The row's lifetime ends there, so a
            # re-issue held back (a paused or throttled provider) is failed by the worker
            # instead of sent, and with this attempt unresolved that means review.
            ends = min(op.expires_at, forgotten_at) if op.expires_at else forgotten_at
            why = "key-enforced, no lookup: re-issue with the same key"
            _move(
                op,
                S.RETRY_WAIT,
                report,
                lambda: transitions.operation_reissue(operation=op, reason=why, expires_at=ends),
            )
        else:
            _review(op, "guard mode, provider has no lookup", report)
        return
    result = provider_lookup(provider=provider, operation=op, client=client)
    if result.outcome == LookupOutcome.UNKNOWN:
        report.add("lookup_unknown")
        if op.lookup_failures + 1 >= int(settings.ONCEGUARD["LOOKUP_FAILURE_LIMIT"]):
            _release(op.pk, lookup_failed=True)
            op.refresh_from_db()
            _review(op, f"lookups keep failing ({result.error})", report)
        else:
            _release(op.pk, lookup_failed=True)
        log.info("sweeper_lookup_unknown key=%s error=%s", op.key, result.error)
        return
    if result.outcome == LookupOutcome.FOUND and is_asynchronous(provider):
        # The asynchronous provider has the job (a crash between its answer and our
        # record): follow it by polls like any accepted job — its state and output come
        # from its status answer, never from the lookup's.
        why = f"found at provider as job {result.provider_ref}: waiting on it"
        _move(
            op,
            S.WAITING,
            report,
            lambda: transitions.operation_found_waiting(operation=op, provider_ref=result.provider_ref, reason=why),
        )
        return
    if result.outcome == LookupOutcome.FOUND:
        if result.succeeded:
            why = f"found at provider ({result.status_value or 'ok'})"
            _move(
                op,
                S.SUCCEEDED,
                report,
                lambda: transitions.operation_found_succeeded(
                    operation=op, provider_ref=result.provider_ref, body=result.body, reason=why
                ),
            )
        else:
            why = f"provider reports status {result.status_value!r}"
            _move(
                op,
                S.FAILED,
                report,
                lambda: transitions.operation_found_failed(
                    operation=op,
                    provider_ref=result.provider_ref,
                    status_value=result.status_value,
                    body=result.body,
                    reason=why,
                ),
            )
        return
    # Not found: trusted only once the provider has had time to settle.
    trusted_after = sent_at + timedelta(seconds=provider.timeout_seconds + provider.lookup_settle_seconds)
    if now < trusted_after:
        _release(op.pk)
        report.add("not_found_settling")
        return
    if ttl_passed:
        _review(op, ttl_reason, report)
        return
    counted = op.attempts - op.throttled_attempts
    if counted >= op.max_attempts or (op.expires_at and now > op.expires_at):
        why = "not found at provider; attempts or lifetime exhausted"
        _move(op, S.FAILED, report, lambda: transitions.operation_not_found_failed(operation=op, reason=why))
    else:
        why = "not found at provider: re-issue with the same key"
        _move(
            op,
            S.RETRY_WAIT,
            report,
            lambda: transitions.operation_reissue(operation=op, reason=why, not_found=True),
        )


# --- retry_wait rows nobody comes back for, stuck rows ----------------------------------------


def expire_abandoned_retries(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """Guard-mode retry_wait past its lifetime: the caller is not coming back → failed + DLQ."""
    report = report or SweepReport()
    ended = open_rows_where(status=S.RETRY_WAIT, mode=OperationMode.GUARD) & Q(expires_at__lt=Now())
    ids = list(Operation.objects.filter(ended).values_list("id", flat=True)[:batch])
    for op in Operation.objects.filter(pk__in=ids, status=S.RETRY_WAIT):
        with row_isolated(job=JOB, ref=f"operation={op.pk}"):
            _move(
                op,
                S.FAILED,
                report,
                lambda op=op: transitions.operation_expire_retry(operation=op, actor="sweeper"),
            )
    return report


def review_unpolled_waits(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """``waiting`` past its lifetime, its poll overdue by ``POLL_OVERDUE_SECONDS`` (no worker
    took it: none running, or the provider paused): → review + alert. Not failed — the provider
    may still finish the job, and a failed row may be replayed (a second render). A row whose
    poll is overdue within its lifetime holds no lease and loses nothing by waiting: the next
    worker polls it, and ``alert_stuck`` reports it if that takes too long."""
    report = report or SweepReport()
    overdue = sql.db_now() - timedelta(seconds=int(settings.ONCEGUARD["POLL_OVERDUE_SECONDS"]))
    ended = open_rows_where(status=S.WAITING, next_attempt_at__lt=overdue) & Q(expires_at__lt=Now())
    ids = list(
        Operation.objects.filter(ended).order_by("open_row__next_attempt_at").values_list("id", flat=True)[:batch]
    )
    for op in Operation.objects.filter(pk__in=ids, status=S.WAITING):
        with row_isolated(job=JOB, ref=f"operation={op.pk}"):
            why = (
                f"lifetime passed while waiting on the provider's job {op.provider_ref}, and no worker polled it;"
                " it may still finish there: a reviewer decides"
            )
            _move(
                op,
                S.REVIEW,
                report,
                lambda op=op, why=why: transitions.operation_unpolled_review(operation=op, overdue=overdue, reason=why),
                also=_review_alert,
            )
    return report


# The open states a row can be stuck in, one group per partial index (see alert_stuck);
# alerts.clearing reads the same groups to tell when an operation_stuck alert has cleared.
STUCK_STATE_GROUPS: tuple[tuple[str, ...], ...] = ((S.CLAIMED,), (S.UNCERTAIN, S.REVIEW), (S.WAITING,))


def alert_stuck(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """Open rows older than the threshold: one alert per stuck spell (alerted_at). A row that
    has moved since its alert (updated_at past alerted_at) and is stuck again is alerted again:
    its first alert has cleared meanwhile (alerts.clearing), so this one opens a new alert."""
    report = report or SweepReport()
    cutoff = sql.db_now() - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
    ids: list[int] = []
    # One query per partial index (claimed; uncertain+review; waiting): an IN over all the
    # states matches no index's predicate and scans the whole table.
    for states in STUCK_STATE_GROUPS:
        unalerted = Q(alerted_at__isnull=True) | Q(alerted_at__lt=F("updated_at"))
        stuck = open_rows_where(status__in=states, updated_at__lt=cutoff) & unalerted
        with transaction.atomic():
            found = list(
                Operation.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(stuck)
                .values_list("id", flat=True)[:batch]
            )
            Operation.objects.filter(unalerted, pk__in=found, status__in=states, updated_at__lt=cutoff).update(
                alerted_at=Now()
            )
        ids += found
    for op in Operation.objects.filter(pk__in=ids).only("id", "tenant_id", "key", "status"):
        with row_isolated(job=JOB, ref=f"operation={op.pk}"):
            hooks.alert_raised.send(
                tenant_id=op.tenant_id,
                kind="operation_stuck",
                ref=op.key,
                summary=f"operation {op.pk} {op.status} too long",
            )
            report.add("stuck_alerted")
    return report


def sweep(*, batch: int = 500, client: httpx.Client | None = None) -> SweepReport:
    """One pass of every rule."""
    report = SweepReport()
    sweep_expired_leases(batch=batch, report=report)
    reconcile_uncertain(batch=batch, report=report, client=client)
    expire_abandoned_retries(batch=batch, report=report)
    review_unpolled_waits(batch=batch, report=report)
    alert_stuck(batch=batch, report=report)
    # Old retries whose provider declares recheck_after: ask the tenant before they go ahead.
    for outcome, n in eligibility_recheck(batch=batch, client=client).items():
        report.add(f"eligibility_{outcome}", n)
    # Running adapter canaries: rolled back when failing (the workers also check after each
    # failing canary attempt; this pass covers what they cannot see, ledger.providers.canary).
    for verdict, n in canary_watch_all().items():
        report.add(f"canary_{verdict}", n)
    # Rolled-back revisions' outputs still published are recalled (ADR 0020): an automatic
    # rollback's, a late publish's, what an interrupted pass left.
    for state, n in outputs_recall_due().items():
        if n:
            report.add(f"outputs_{state}", n)
    # Four-eyes requests nobody answered in time expire; an approved one whose re-send never
    # reported back is failed (ADR 0013).
    # Only what happened is reported, as every other count here: a quiet pass says "nothing to do".
    for outcome, n in approvals.approval_requests_expire().items():
        if n:
            report.add(f"approvals_{outcome}", n)
    return report
