"""Recalled outputs (ADR 0020): what a rolled-back adapter revision produced is taken back.

A rollback (``ledger.providers.canary.revision_rollback``, by an operator or the automatic
watch) stamps the rolled-back revision's ``rolled_back_at`` in its own transaction. The recall
itself is this idempotent follow-up pass, in bounded batches — never in the rollback's
transaction, which would hold the provider's row locked while thousands of outputs move:

- :func:`outputs_recall_revision` runs right after an operator's rollback (the API's, the
  console's and the command's) for at most ``RECALL_INLINE_MAX_ROWS`` outputs;
- :func:`outputs_recall_due`, on every sweeper pass, finishes what is left: an automatic
  rollback's outputs (the worker that rolled back does not wait for them), a pass a crash
  interrupted, and outputs a rolled-back revision's in-flight operations published after
  the rollback (an asynchronous job that finished late).

A batch of outputs moves by :func:`outputs_recall` in one transaction, its rows locked first:
one nobody downloaded yet becomes ``quarantined`` (its bytes are no longer served: ``410
output_quarantined``), one its caller already downloaded becomes ``flagged`` (served, marked
"produced by a rolled-back revision"). A first download racing it waits for the lock and then
finds the row quarantined (``ledger.execution.outputs.output_consume`` re-reads it). Each
operation's history gets an event row and its submitter a callback
(``operation.output_recalled``), in the batch's transaction.

May import: ``ledger.protocol`` and every room below it.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Exists, OuterRef
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
# One sweeper pass recalls at most this many outputs; the next pass takes the rest.
RECALL_MAX_ROWS = 2_000
# An operator's rollback recalls at most this many before it answers (about 6 ms an output on
# PostgreSQL with its callback, 0.4 ms without: a few seconds at most); the sweeper the rest.
RECALL_INLINE_MAX_ROWS = 1_000
# Revisions recalled from per sweeper pass, of those that still have a published output
# (newest rollbacks first); the next pass takes the rest.
RECALL_MAX_REVISIONS = 200


def outputs_recall(*, tenant_id: int, output_ids: list[int], actor: str, reason: str) -> dict[str, int]:
    """published → quarantined (not consumed) or flagged (consumed), for a batch of one
    tenant's outputs, in one transaction; counts by new state. The batch's rows still
    published are locked first (in id order), so a first download racing the recall waits and
    then finds the row quarantined (``output_consume`` re-reads it: 410), and what is read
    as consumed or not is what moves. Writes each operation's event row and queues each
    submitter's recall callback in the same transaction. Rows recalled meanwhile are skipped."""
    reason = sanitize_message(reason)[:500]
    counts = {OutputState.QUARANTINED.value: 0, OutputState.FLAGGED.value: 0}
    with transaction.atomic():
        rows = list(
            OperationOutput.objects.select_for_update()
            .filter(tenant_id=tenant_id, pk__in=output_ids, state=OutputState.PUBLISHED)
            .order_by("pk")
            .values_list("pk", "operation_id", "key", "consumed_at")
        )
        if not rows:
            return counts
        by_state: dict[str, list[tuple[int, int, str]]] = {s: [] for s in counts}
        for pk, operation_id, key, consumed_at in rows:
            to = OutputState.QUARANTINED if consumed_at is None else OutputState.FLAGGED
            if to not in OUTPUT_MOVES[OutputState.PUBLISHED]:  # pragma: no cover - the table allows both
                raise IllegalTransition(f"A published output cannot become {to}.")
            by_state[to].append((pk, operation_id, key))
        for to, moving in by_state.items():
            if moving:
                OperationOutput.objects.filter(
                    tenant_id=tenant_id, pk__in=[pk for pk, _, _ in moving], state=OutputState.PUBLISHED
                ).update(state=to, recalled_at=Now(), recall_reason=reason)
                counts[to] = len(moving)
        operations = {
            op.pk: op for op in Operation.objects.filter(tenant_id=tenant_id, pk__in=[row[1] for row in rows])
        }
        OperationEvent.objects.bulk_create(
            OperationEvent(
                tenant_id=tenant_id,
                operation_id=operation_id,
                from_status=operations[operation_id].status,
                to_status=operations[operation_id].status,
                actor=str(actor)[:150],
                reason=f"output {key} {OutputState(to).label}: {reason}"[:500],
                attempt=None,
                at=Now(),
            )
            for to, moving in by_state.items()
            for _, operation_id, key in moving
        )
        for operation in operations.values():
            if operation.callback_url:
                callback_enqueue(operation=operation, event=OUTPUT_RECALLED)
    return counts


def outputs_recall_revision(
    *, revision: AdapterRevision, actor: str, reason: str = "", max_rows: int = RECALL_MAX_ROWS
) -> dict[str, int]:
    """Recall the still-published outputs of ``revision`` (rolled back), in batches by id
    through the outputs' (revision, state, id) index, each batch one transaction; counts by
    new state. Idempotent."""
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
            )
            .order_by("pk")
            .values_list("pk", flat=True)[: min(RECALL_BATCH, max_rows - sum(counts.values()))]
        )
        if not batch:
            break
        moved = outputs_recall(tenant_id=revision.tenant_id, output_ids=batch, actor=actor, reason=reason)
        for state, n in moved.items():
            counts[state] += n
        after = batch[-1]
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
    # Only revisions with something left to recall (one probe of the outputs' (revision,
    # state, id) index each): the rolled-back revisions already recalled pile up over the
    # years, and a cap on them alone left an older rollback's late outputs never looked at.
    revisions = (
        AdapterRevision.objects.filter(rolled_back_at__isnull=False)
        .filter(
            Exists(
                OperationOutput.objects.filter(
                    tenant_id=OuterRef("tenant_id"), adapter_revision_id=OuterRef("pk"), state=OutputState.PUBLISHED
                )
            )
        )
        .order_by("-rolled_back_at", "-pk")
    )
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
    then the rolled-back revision's outputs recalled at once, up to ``RECALL_INLINE_MAX_ROWS`` (the
    sweeper's pass takes the rest). The rollback stands whatever the recall does."""
    result = canary.revision_rollback(
        provider_id=provider_id, actor=actor, reason=reason, number=number, tenant_ids=tenant_ids
    )
    revision = AdapterRevision.objects.get(provider_id=result.provider.pk, number=result.rolled_back)
    recalled = outputs_recall_revision(
        revision=revision,
        actor=actor,
        reason=f"adapter revision {result.rolled_back} was rolled back: {reason}",
        max_rows=RECALL_INLINE_MAX_ROWS,
    )
    return result, recalled
