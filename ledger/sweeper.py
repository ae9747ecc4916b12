"""The sweeper: reconciles the crash window (DESIGN §3 "The sweeper").

Each rule reads candidates through a partial index on (status, time) and moves each row
with a guarded UPDATE that re-checks the condition, so overlapping passes (two nodes, a
manual run) never handle a row twice: the second UPDATE matches nothing. Rows that need a
slow step (a provider lookup) are first taken under a short reconciliation lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction

from ledger import hooks, sql
from ledger.crypto import seal_json
from ledger.errors import LeaseLost
from ledger.models import AttemptOutcome, ErrorClass, IdempotencyClass, Operation, OperationMode, OperationStatus
from ledger.reconcile import LookupOutcome, provider_lookup
from ledger.services import decide_unsent_expiry, operation_transition

S = OperationStatus
log = logging.getLogger("onceguard.sweeper")

Sets = list[tuple[str, str, list[Any]]]


@dataclass
class SweepReport:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def _cfg(name: str) -> int:
    return int(settings.ONCEGUARD[name])


def _ids(query: str, params: list[Any]) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return [row[0] for row in cursor.fetchall()]


def _move(
    op: Operation,
    to: str,
    reason: str,
    report: SweepReport,
    *,
    sets: Sets | None = None,
    attempt_update: Sets | None = None,
    extra_where: str = "",
    also: Any = None,
) -> Operation | None:
    """One guarded move; a row someone else moved first is counted, not overwritten."""
    try:
        with transaction.atomic():
            moved = operation_transition(
                operation=op,
                to=to,
                actor="sweeper",
                reason=reason,
                sets=sets,
                attempt_update=attempt_update,
                extra_where=extra_where,
            )
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
    ids = _ids(
        f"SELECT id FROM ledger_operation WHERE status = %s AND lease_expires_at < {sql.now()}"
        " ORDER BY lease_expires_at LIMIT %s",
        [S.CLAIMED, batch],
    )
    for op in Operation.objects.filter(pk__in=ids, status=S.CLAIMED).select_related("provider"):
        sets: Sets = [("lease_expires_at", "NULL", [])]
        if op.sent_at is None and sender_honours_marker(op):
            to, delay, reason = decide_unsent_expiry(op)
            if delay is not None:
                due_sql, due_p = sql.now_plus(delay)
                sets.append(("next_attempt_at", due_sql, due_p))
            outcome = AttemptOutcome.EXPIRED
        else:
            to = S.UNCERTAIN
            reason = "lease expired after the sent marker" if op.sent_at else "lease expired; the sender may have sent"
            outcome = AttemptOutcome.AMBIGUOUS
        _move(
            op,
            to,
            reason,
            report,
            sets=sets,
            attempt_update=[("outcome", "%s", [outcome]), ("finished_at", sql.now(), [])],
            extra_where=f"lease_expires_at < {sql.now()}",
            also=_review_alert if to == S.REVIEW else None,
        )
    return report


# --- uncertain rows: reconcile with the provider ---------------------------------------------


def _take_uncertain(batch: int) -> list[int]:
    """Take uncertain rows under a short reconciliation lease (one guarded UPDATE)."""
    lease_sql, lease_p = sql.now_plus(_cfg("RECONCILE_LEASE_SECONDS"))
    skip_locked = " FOR UPDATE SKIP LOCKED" if sql.is_postgres() else ""
    free = f"(reconcile_until IS NULL OR reconcile_until < {sql.now()})"
    return _ids(
        f"UPDATE ledger_operation SET reconcile_until = {lease_sql} WHERE id IN ("
        f"SELECT id FROM ledger_operation WHERE status = %s AND {free} ORDER BY updated_at LIMIT %s{skip_locked})"
        f" AND status = %s AND {free} RETURNING id",
        [*lease_p, S.UNCERTAIN, batch, S.UNCERTAIN],
    )


def _release(op_id: int, *, lookup_failed: bool = False) -> None:
    extra = ", lookup_failures = lookup_failures + 1" if lookup_failed else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET reconcile_until = NULL{extra} WHERE id = %s", [op_id])


def _review_alert(op: Operation) -> None:
    hooks.alert_raised.send(
        tenant_id=op.tenant_id, kind="review_needed", ref=op.key, summary=f"operation {op.pk} needs a decision"
    )


def _mark_ambiguous_attempts(outcome: str) -> Any:
    def apply(op: Operation) -> None:
        op.attempt_set.filter(outcome__in=[AttemptOutcome.AMBIGUOUS, AttemptOutcome.PENDING]).update(outcome=outcome)

    return apply


def reconcile_uncertain(
    *, batch: int = 100, report: SweepReport | None = None, client: httpx.Client | None = None
) -> SweepReport:
    report = report or SweepReport()
    clear: Sets = [("reconcile_until", "NULL", [])]
    for op_id in _take_uncertain(batch):
        op = Operation.objects.select_related("provider").filter(pk=op_id, status=S.UNCERTAIN).first()
        if op is None:
            continue
        provider = op.provider
        if provider is None:
            _move(op, S.REVIEW, "no provider to reconcile with", report, sets=clear, also=_review_alert)
            continue
        if provider.idempotency_class == IdempotencyClass.KEY_ADVISORY:
            # Nothing at the receiver stops a second effect: a human decides, never a re-send.
            _move(
                op,
                S.REVIEW,
                "key-advisory provider: outcome unknown, not re-sent",
                report,
                sets=clear,
                also=_review_alert,
            )
            continue
        now = sql.db_now()
        sent_at = op.sent_at or op.claimed_at or op.created_at
        # Past the key TTL the provider may have forgotten the key: a re-issue could act twice.
        ttl_passed = now > sent_at + timedelta(seconds=provider.key_ttl_seconds)
        ttl_reason = "past the provider's key TTL: a re-issue could act twice"
        if not provider.lookup_path:
            if ttl_passed:
                _move(op, S.REVIEW, ttl_reason, report, sets=clear, also=_review_alert)
            elif op.mode == OperationMode.EXECUTE:
                # Key-enforced: re-issuing with the same key is safe; the worker does it.
                _move(
                    op,
                    S.RETRY_WAIT,
                    "key-enforced, no lookup: re-issue with the same key",
                    report,
                    sets=[*clear, ("next_attempt_at", sql.now(), [])],
                )
            else:
                _move(op, S.REVIEW, "guard mode, provider has no lookup", report, sets=clear, also=_review_alert)
            continue
        result = provider_lookup(provider=provider, operation=op, client=client)
        if result.outcome == LookupOutcome.UNKNOWN:
            report.add("lookup_unknown")
            if op.lookup_failures + 1 >= _cfg("LOOKUP_FAILURE_LIMIT"):
                _release(op.pk, lookup_failed=True)
                op.refresh_from_db()
                _move(op, S.REVIEW, f"lookups keep failing ({result.error})", report, sets=clear, also=_review_alert)
            else:
                _release(op.pk, lookup_failed=True)
            log.info("sweeper_lookup_unknown key=%s error=%s", op.key, result.error)
            continue
        if result.outcome == LookupOutcome.FOUND:
            if result.succeeded:
                _move(
                    op,
                    S.SUCCEEDED,
                    f"found at provider ({result.status_value or 'ok'})",
                    report,
                    sets=[
                        *clear,
                        ("provider_ref", "%s", [result.provider_ref[:255]]),
                        ("response_status", "%s", [200]),
                        ("response_body", sql.json_param(), [sql.dumps(seal_json(result.body))]),
                        ("lease_expires_at", "NULL", []),
                    ],
                    attempt_update=[
                        ("outcome", "%s", [AttemptOutcome.SUCCEEDED]),
                        ("provider_ref", "%s", [result.provider_ref[:255]]),
                    ],
                )
            else:
                _move(
                    op,
                    S.FAILED,
                    f"provider reports status {result.status_value!r}",
                    report,
                    sets=[
                        *clear,
                        ("provider_ref", "%s", [result.provider_ref[:255]]),
                        ("error_class", "%s", [ErrorClass.INVALID_INPUT]),
                        ("last_error", "%s", [f"provider reports status {result.status_value}"[:500]]),
                        ("response_body", sql.json_param(), [sql.dumps(seal_json(result.body))]),
                    ],
                    also=_mark_ambiguous_attempts(AttemptOutcome.FAILED),
                )
            continue
        # Not found: trusted only once the provider has had time to settle.
        trusted_after = sent_at + timedelta(seconds=provider.timeout_seconds + provider.lookup_settle_seconds)
        if now < trusted_after:
            _release(op.pk)
            report.add("not_found_settling")
            continue
        if ttl_passed:
            _move(op, S.REVIEW, ttl_reason, report, sets=clear, also=_review_alert)
            continue
        counted = op.attempts - op.throttled_attempts
        if counted >= op.max_attempts or (op.expires_at and now > op.expires_at):
            _move(
                op,
                S.FAILED,
                "not found at provider; attempts or lifetime exhausted",
                report,
                sets=[
                    *clear,
                    ("error_class", "%s", [ErrorClass.TRANSIENT]),
                    ("last_error", "%s", ["not found at provider after the last attempt"]),
                ],
                also=_mark_ambiguous_attempts(AttemptOutcome.NOT_FOUND),
            )
        else:
            _move(
                op,
                S.RETRY_WAIT,
                "not found at provider: re-issue with the same key",
                report,
                sets=[*clear, ("next_attempt_at", sql.now(), [])],
                also=_mark_ambiguous_attempts(AttemptOutcome.NOT_FOUND),
            )
    return report


# --- retry_wait rows nobody comes back for, stuck rows ----------------------------------------


def expire_abandoned_retries(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """Guard-mode retry_wait past its lifetime: the caller is not coming back → failed + DLQ."""
    report = report or SweepReport()
    ids = _ids(
        f"SELECT id FROM ledger_operation WHERE status = %s AND mode = %s AND expires_at < {sql.now()} LIMIT %s",
        [S.RETRY_WAIT, OperationMode.GUARD, batch],
    )
    for op in Operation.objects.filter(pk__in=ids, status=S.RETRY_WAIT):
        _move(
            op,
            S.FAILED,
            "lifetime ended while waiting for a retry",
            report,
            sets=[("error_class", "%s", [op.error_class or ErrorClass.TRANSIENT])],
            extra_where=f"expires_at < {sql.now()}",
        )
    return report


def alert_stuck(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """Open rows older than the threshold: one alert per row, ever (alerted_at)."""
    report = report or SweepReport()
    cutoff_sql, cutoff_p = sql.now_plus(-_cfg("STUCK_ALERT_SECONDS"))
    ids: list[int] = []
    # One statement per partial index (claimed; uncertain+review): an IN over all three
    # states matches neither index's predicate and scans the whole table.
    for states in ([S.CLAIMED], [S.UNCERTAIN, S.REVIEW]):
        marks = ", ".join(["%s"] * len(states))
        ids += _ids(
            f"UPDATE ledger_operation SET alerted_at = {sql.now()} WHERE id IN (SELECT id FROM ledger_operation"
            f" WHERE status IN ({marks}) AND updated_at < {cutoff_sql} AND alerted_at IS NULL LIMIT %s)"
            " AND alerted_at IS NULL RETURNING id",
            [*states, *cutoff_p, batch],
        )
    for op in Operation.objects.filter(pk__in=ids).only("id", "tenant_id", "key", "status"):
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
    alert_stuck(batch=batch, report=report)
    return report
