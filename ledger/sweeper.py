"""The sweeper: reconciles the crash window (DESIGN §3 "The sweeper").

Each rule reads candidate ids through an index on (status, time) and moves each row with a
guarded UPDATE that re-checks the condition, so overlapping passes (two nodes, a manual
run) never handle a row twice: the second UPDATE matches nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import connection

from ledger import sql
from ledger.models import AttemptOutcome, Operation, OperationMode, OperationStatus
from ledger.services import decide_unsent_expiry, operation_transition

S = OperationStatus
log = logging.getLogger("onceguard.sweeper")


@dataclass
class SweepReport:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def _expired_claim_ids(limit: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM ledger_operation WHERE status = %s AND lease_expires_at < {sql.now()}"
            " ORDER BY lease_expires_at LIMIT %s",
            [S.CLAIMED, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def sender_honours_marker(op: Operation) -> bool:
    """Only senders known to write `sent` before sending may be trusted when it is absent."""
    return op.mode == OperationMode.EXECUTE or op.uses_sent_marker


def sweep_expired_leases(*, batch: int = 500, report: SweepReport | None = None) -> SweepReport:
    """claimed rows whose lease expired: → retry_wait when provably unsent, else → uncertain."""
    report = report or SweepReport()
    for op_id in _expired_claim_ids(batch):
        op = Operation.objects.filter(pk=op_id, status=S.CLAIMED).first()
        if op is None:
            continue
        if op.sent_at is None and sender_honours_marker(op):
            to, delay, reason = decide_unsent_expiry(op)
            sets = [("lease_expires_at", "NULL", [])]
            if delay is not None:
                due_sql, due_p = sql.now_plus(delay)
                sets.append(("next_attempt_at", due_sql, due_p))
            outcome = AttemptOutcome.EXPIRED
        else:
            to, reason = (
                S.UNCERTAIN,
                "lease expired after the sent marker" if op.sent_at else "lease expired; sender may have sent",
            )
            sets = [("lease_expires_at", "NULL", [])]
            outcome = AttemptOutcome.AMBIGUOUS
        try:
            operation_transition(
                operation=op,
                to=to,
                actor="sweeper",
                reason=reason,
                sets=sets,
                extra_where=f"lease_expires_at < {sql.now()}",
                attempt_update=[("outcome", "%s", [outcome]), ("finished_at", sql.now(), [])],
            )
        except Exception as exc:  # another pass or the holder moved it first
            from ledger.errors import LeaseLost

            if not isinstance(exc, LeaseLost):
                raise
            report.add("raced")
            continue
        report.add(f"claimed->{to}")
        log.info("sweeper_lease_expired key=%s attempt=%s to=%s", op.key, op.attempts, to)
    return report


def sweep(*, batch: int = 500) -> SweepReport:
    """One pass of every rule."""
    report = SweepReport()
    sweep_expired_leases(batch=batch, report=report)
    return report
