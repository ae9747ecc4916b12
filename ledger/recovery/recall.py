"""Recalled outputs (ADR 0020): what a rolled-back adapter revision produced is taken back.

A rollback (``ledger.providers.canary.revision_rollback``, by an operator or the automatic
watch) stamps the rolled-back revision's ``rolled_back_at`` in its own transaction. The recall
itself is this idempotent follow-up pass, in bounded batches — never in the rollback's
transaction, which would hold the provider's row locked while thousands of outputs move:

- :func:`outputs_recall_revision` runs right after an operator's rollback (the API's and the
  console's) for at most ``RECALL_MAX_ROWS`` outputs;
- :func:`outputs_recall_due`, on every sweeper pass, finishes what is left: an automatic
  rollback's outputs (the worker that rolled back does not wait for them), a pass a crash
  interrupted, and outputs a rolled-back revision's in-flight operations published after
  the rollback (an asynchronous job that finished late).

Each output moves by :func:`output_recall`, a guarded UPDATE on its state *and* its
``consumed_at`` as read: one nobody downloaded yet becomes ``quarantined`` (its bytes are no
longer served: ``410 output_quarantined``), one its caller already downloaded becomes
``flagged`` (served, marked "produced by a rolled-back revision"). Against a download racing
it, exactly one of the two UPDATEs matches (``ledger.execution.outputs.output_consume``).
The operation's history gets an event row and its submitter a callback
(``operation.output_recalled``), in the move's transaction.

May import: ``ledger.protocol`` and every room below it.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.functions import Now

from ledger.models import (
    OUTPUT_MOVES,
    AdapterRevision,
    Operation,
    OperationEvent,
    OperationOutput,
    OutputState,
)
from ledger.platform.errors import IllegalTransition
from ledger.protocol.callbacks import OUTPUT_RECALLED
from ledger.protocol.inputs import sanitize_message
from ledger.protocol.transitions import callback_enqueue
from ledger.providers import canary

log = logging.getLogger("onceguard.recall")

RECALL_BATCH = 200
# One call recalls at most this many outputs; the sweeper's next pass takes the rest.
RECALL_MAX_ROWS = 5_000
# Revisions looked at per sweeper pass (newest rollbacks first).
RECALL_MAX_REVISIONS = 200


def output_recall(*, output: OperationOutput, actor: str, reason: str) -> str | None:
    """published → quarantined (not consumed) or flagged (consumed), as read; the new state,
    or None when the row moved meanwhile (recalled already, or downloaded between the read
    and this UPDATE — the next pass reads it again). Writes the operation's event row and
    queues the recall callback in the same transaction."""
    to = OutputState.QUARANTINED if output.consumed_at is None else OutputState.FLAGGED
    if to not in OUTPUT_MOVES[output.state]:
        raise IllegalTransition(f"An output {output.state} cannot become {to}.")
    reason = sanitize_message(reason)[:500]
    with transaction.atomic():
        # Consumed is for ever: only "not yet consumed" can change under us.
        moved = OperationOutput.objects.filter(
            pk=output.pk,
            tenant_id=output.tenant_id,
            state=output.state,
            consumed_at__isnull=output.consumed_at is None,
        ).update(state=to, recalled_at=Now(), recall_reason=reason)
        if not moved:
            return None
        operation = Operation.objects.get(pk=output.operation_id, tenant_id=output.tenant_id)
        OperationEvent.objects.create(
            tenant_id=output.tenant_id,
            operation_id=operation.pk,
            from_status=operation.status,
            to_status=operation.status,
            actor=str(actor)[:150],
            reason=f"output {output.key} {OutputState(to).label}: {reason}"[:500],
            attempt=None,
            at=Now(),
        )
        callback_enqueue(operation=operation, event=OUTPUT_RECALLED)
    return to


def outputs_recall_revision(
    *, revision: AdapterRevision, actor: str, reason: str = "", max_rows: int = RECALL_MAX_ROWS
) -> dict[str, int]:
    """Recall the still-published outputs of ``revision`` (rolled back), in batches by id
    through the partial index of published outputs; counts by new state. Idempotent."""
    reason = reason or f"adapter revision {revision.number} was rolled back"
    counts = {OutputState.QUARANTINED.value: 0, OutputState.FLAGGED.value: 0}
    after = 0
    while sum(counts.values()) < max_rows:
        batch = list(
            OperationOutput.objects.filter(
                tenant_id=revision.tenant_id,
                adapter_revision_id=revision.pk,
                state=OutputState.PUBLISHED,
                pk__gt=after,
            ).order_by("pk")[: min(RECALL_BATCH, max_rows - sum(counts.values()))]
        )
        if not batch:
            break
        for output in batch:
            moved = output_recall(output=output, actor=actor, reason=reason)
            if moved is not None:
                counts[moved] += 1
        after = batch[-1].pk
    if any(counts.values()):
        log.warning(
            "outputs_recalled revision=%s provider=%s quarantined=%s flagged=%s",
            revision.number,
            revision.provider_id,
            counts[OutputState.QUARANTINED],
            counts[OutputState.FLAGGED],
        )
    return counts


def outputs_recall_due(*, max_rows: int = RECALL_MAX_ROWS) -> dict[str, int]:
    """The sweeper's pass: every rolled-back revision's outputs still published, newest
    rollbacks first, at most ``max_rows`` in all."""
    totals = {OutputState.QUARANTINED.value: 0, OutputState.FLAGGED.value: 0}
    revisions = AdapterRevision.objects.filter(rolled_back_at__isnull=False).order_by("-rolled_back_at", "-pk")
    for revision in revisions[:RECALL_MAX_REVISIONS]:
        left = max_rows - sum(totals.values())
        if left <= 0:
            break
        counts = outputs_recall_revision(revision=revision, actor="system:recall", max_rows=left)
        for state, n in counts.items():
            totals[state] += n
    return totals


def revision_rollback_recall(
    *, provider_id: int, actor: str, reason: str, number: int | None = None, tenant_ids: list[int] | None = None
) -> tuple[canary.RollbackResult, dict[str, int]]:
    """An operator's rollback (the API, the console, the command): ``canary.revision_rollback``,
    then the rolled-back revision's outputs recalled at once, up to ``RECALL_MAX_ROWS`` (the
    sweeper's pass takes the rest). The rollback stands whatever the recall does."""
    result = canary.revision_rollback(
        provider_id=provider_id, actor=actor, reason=reason, number=number, tenant_ids=tenant_ids
    )
    revision = AdapterRevision.objects.get(provider_id=result.provider.pk, number=result.rolled_back)
    recalled = outputs_recall_revision(
        revision=revision, actor=actor, reason=f"adapter revision {result.rolled_back} was rolled back: {reason}"
    )
    return result, recalled
