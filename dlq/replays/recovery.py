"""Recovery (``dlq.tasks.replays_recover_task``, on a schedule): a replay whose sender stopped
between allocating its number and recording the answer is settled from what the ledger knows.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from dlq.models import FE, Replay, ReplayOutcome
from dlq.replays.services import settle_entry
from dlq.rules.conf import dlq_setting
from ledger.models import Operation, OperationStatus


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
                settle_entry(replay=replay, to=to, actor="recovery", note=f"replay #{replay.number} {outcome}: {why}")
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
