"""Runs (DESIGN §7, runs): the steps of one business transaction and resuming it from the
failed step.

A run is the set of operations sent with the same ``run`` id — or, without one, the same
correlation id (``ledger.protocol.selectors.run_operations`` says so once). :func:`run_view` shows each
step in the five checkpoint states (``ledger.models.CHECKPOINT_OF``), whether it is safe to
repeat, what an operator should know, and whether a resume re-drives it. The step's state is its
lineage's: a failed step whose replay succeeded is done (the original stays ``failed``; claims
of its key answer with the replay's outcome).

:func:`run_resume` re-drives exactly the steps the view marks, through the DLQ's replay path
(``dlq.replays.services.failed_event_replay``: a Replay row per step, its send guarded by the
ledger under ``replay:{entry}:{n}``, the original key sent, the original's ``superseded_by`` set):

- a ``failed`` step whose entry is pending and not quarantined: an execute-mode step's stored
  request goes to its provider (``to_provider``), a guard-mode step's payload to the run's
  replay target (the workflow's webhook), the effect being the caller's;
- a guard-mode step a reviewer (or the sweeper's lookup) resolved as not done, waiting for a
  caller that may never come back: it is failed first (its DLQ entry is written by the ledger's
  hook), then replayed to the replay target.

Done steps keep answering with their recorded outcome; uncertain ones (a key-advisory step
goes through review) and quarantined ones (correct them first) are never re-driven. Each
resume is recorded (``RunResume``: who, why, what it planned and what came of it).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from dlq.models import FailedEvent, FailedEventStatus, RunResume
from dlq.replays.services import failed_event_replay
from dlq.rules.errors import RunChangedSincePreview, RunNotFound, RunNothingToResume
from ledger.models import (
    CHECKPOINT_OF,
    ApprovalKind,
    Attempt,
    AttemptOutcome,
    Checkpoint,
    IdempotencyClass,
    Operation,
    OperationMode,
    OperationStatus,
)
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.protocol import approvals
from ledger.protocol import services as ledger_services
from ledger.protocol import transitions as ledger_transitions
from ledger.protocol.selectors import operation_newest_in_lineage, run_operations

S = OperationStatus
FE = FailedEventStatus
log = logging.getLogger("onceguard.dlq")

# How a resume re-drives a step.
VIA_PROVIDER = "provider"
VIA_TARGET = "target"
MAX_STEPS = 500


@dataclass
class RunStep:
    operation: Operation
    # The newest in the operation's lineage: itself, or the replay that superseded it.
    current: Operation
    checkpoint: str
    safe_to_repeat: bool
    advice: str
    # VIA_PROVIDER / VIA_TARGET when a resume re-drives it, else "".
    resume_via: str = ""
    entry: FailedEvent | None = None

    @property
    def will_resume(self) -> bool:
        return bool(self.resume_via)


@dataclass
class RunView:
    tenant_id: int
    run: str
    steps: list[RunStep] = field(default_factory=list)

    @property
    def plan(self) -> list[RunStep]:
        return [s for s in self.steps if s.will_resume]

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(s.checkpoint for s in self.steps)
        return {c: found.get(c, 0) for c in Checkpoint.values}


def _advisory(op: Operation) -> bool:
    return op.provider is not None and op.provider.idempotency_class == IdempotencyClass.KEY_ADVISORY


def _resolved_not_done(op: Operation, last_outcomes: dict[int, str]) -> bool:
    """A guard-mode retry whose last attempt was found not done (a reviewer's "safe to retry",
    the sweeper's lookup): nobody sends it but its caller."""
    return (
        op.mode == OperationMode.GUARD
        and op.status == S.RETRY_WAIT
        and last_outcomes.get(op.pk) == AttemptOutcome.NOT_FOUND
    )


def _step(op: Operation, *, entry: FailedEvent | None, last_outcomes: dict[int, str]) -> RunStep:
    current = operation_newest_in_lineage(op) if op.superseded_by_id else op
    checkpoint = CHECKPOINT_OF[current.status]
    step = RunStep(operation=op, current=current, checkpoint=checkpoint, safe_to_repeat=True, advice="", entry=entry)
    if current.status == S.SUCCEEDED:
        replayed = " (by a replay)" if current.pk != op.pk else ""
        step.advice = f"Done{replayed}: a repeat of its key answers with the recorded outcome, no second effect."
    elif current.status == S.FAILED:
        if current.replaced_by_id:
            step.advice = (
                f"Failed; replaced by a newer version (operation {current.replaced_by_id}), which is the step now."
            )
        elif entry is None:
            step.advice = "Failed, without a dead-letter entry to replay."
        elif entry.quarantine_reason and entry.status == FE.PENDING:
            step.advice = f"Quarantined: {entry.quarantine_reason} Correct its fields first (a corrected replay)."
        elif entry.status == FE.PENDING:
            step.resume_via = VIA_PROVIDER if op.mode == OperationMode.EXECUTE else VIA_TARGET
            where = "its provider, under its original key" if step.resume_via == VIA_PROVIDER else "the replay target"
            step.advice = f"Failed; it did not happen. A resume re-drives it through {where}."
        elif entry.status == FE.REPLAYING:
            step.advice = "Failed; a replay of it is under way."
        else:
            step.advice = f"Failed; its dead-letter entry is {entry.status}, so a resume leaves it alone."
    elif current.status == S.ABANDONED:
        step.safe_to_repeat = False
        why = (
            f"replaced by a newer version (operation {current.replaced_by_id})"
            if current.replaced_by_id
            else "cancelled, refused by a reviewer or no longer wanted"
        )
        step.advice = f"Abandoned on purpose ({why}); not to be repeated."
    elif current.status == S.CLAIMED:
        step.safe_to_repeat = False
        step.advice = "In progress: a lease is held and the effect may be under way. Do not repeat it."
    elif current.status in (S.UNCERTAIN, S.REVIEW):
        step.safe_to_repeat = False
        if _advisory(current) or current.status == S.REVIEW:
            step.advice = "Uncertain: it may have happened. A reviewer decides first; never re-sent blindly."
        else:
            step.advice = "Uncertain: being reconciled with the provider under its key; never re-sent blindly."
    elif current.status == S.QUEUED:
        step.advice = "Pending: waiting for a worker."
    elif _resolved_not_done(current, last_outcomes):
        step.resume_via = VIA_TARGET
        step.advice = (
            "Resolved as not done and waiting for its caller; a resume re-drives it through the replay target."
        )
    elif current.mode == OperationMode.EXECUTE:
        step.advice = "Pending: nothing happened yet; the workers retry it."
    else:
        step.advice = "Pending: nothing happened yet; its caller retries it by claiming the key again."
    return step


def run_view(*, tenant_id: int, run: str) -> RunView:
    """The run's steps in order, each in its checkpoint state (404 when the run has none)."""
    ops = list(run_operations(tenant_id=tenant_id, run=run)[: MAX_STEPS + 1])
    if not ops:
        raise RunNotFound("No operation of this tenant belongs to this run.")
    if len(ops) > MAX_STEPS:
        raise ValidationFailed(f"This run has more than {MAX_STEPS} steps; it is shown by its operations list.")
    entries = {e.operation_id: e for e in FailedEvent.objects.filter(operation_id__in=[o.pk for o in ops])}
    # The latest attempt's outcome of each guard-mode step waiting for a retry.
    latest = {o.pk: o.attempts for o in ops if o.mode == OperationMode.GUARD and o.status == S.RETRY_WAIT}
    last_outcomes: dict[int, str] = {}
    for operation_id, number, outcome in Attempt.objects.filter(operation_id__in=list(latest)).values_list(
        "operation_id", "number", "outcome"
    ):
        if number == latest[operation_id]:
            last_outcomes[operation_id] = outcome
    view = RunView(tenant_id=tenant_id, run=run)
    view.steps = [_step(op, entry=entries.get(op.pk), last_outcomes=last_outcomes) for op in ops]
    return view


def plan_of(view: RunView) -> list[dict[str, Any]]:
    """What a resume would do, as shown before it is confirmed (and recorded with it)."""
    return [
        {"operation": s.operation.pk, "key": s.operation.key, "step": s.operation.step, "via": s.resume_via}
        for s in view.plan
    ]


def run_resume(
    *,
    tenant_id: int,
    run: str,
    actor: str,
    note: str,
    target_slug: str = "",
    expected: list[int] | None = None,
) -> RunResume:
    """Re-drive the run's failed steps (module docstring); everything else is left alone.

    ``note`` (why) is required: the resume is recorded with its actor, plan and results.
    ``expected``: the operation ids a preview showed; when the plan differs now (a step
    finished, another failed), nothing is done (``409 run_changed_since_preview``).
    ``target_slug``: the replay target for guard-mode steps (else the entry's, else the
    tenant's default). A step that cannot be re-driven is reported, not fatal.
    """
    note = ledger_services.sanitize_message(note)
    if not note:
        raise ValidationFailed("Say why the run is resumed (a note); resumes are audited.")
    view = run_view(tenant_id=tenant_id, run=run)
    planned = plan_of(view)
    if not planned:
        raise RunNothingToResume(
            "No step of this run is failed and replayable; nothing was re-driven.", extra={"counts": view.counts}
        )
    if expected is not None and sorted(expected) != sorted(p["operation"] for p in planned):
        raise RunChangedSincePreview(
            "The steps a resume would re-drive changed since the preview; look again.",
            extra={"planned": [p["operation"] for p in planned]},
        )
    # Four-eyes (ADR 0013): the steps' providers (or the tenant) may require a second person.
    approvals.approval_gate(
        tenant_id=tenant_id,
        provider_id=None,
        provider_ids=[s.operation.provider_id for s in view.plan if s.operation.provider_id is not None],
        kind=ApprovalKind.RUN_RESUME,
        actor=actor,
        reason=note,
        target_ids=[p["operation"] for p in planned],
        target_ref=run,
        params={"note": note, "target_slug": target_slug, "expected": [p["operation"] for p in planned]},
    )
    resume = RunResume.objects.create(tenant_id=tenant_id, run=run[:255], actor=actor[:150], note=note, planned=planned)
    results: list[dict[str, Any]] = []
    for step in view.plan:
        results.append(_redrive(step=step, run=run, actor=actor, note=note, target_slug=target_slug))
    RunResume.objects.filter(pk=resume.pk).update(results=results)
    resume.refresh_from_db()
    log.info("run_resumed run=%s resume=%s actor=%s steps=%s", run, resume.pk, actor, len(results))
    return resume


def _redrive(*, step: RunStep, run: str, actor: str, note: str, target_slug: str) -> dict[str, Any]:
    op = step.operation
    result: dict[str, Any] = {"operation": op.pk, "key": op.key, "step": op.step, "via": step.resume_via}
    try:
        entry = step.entry
        if op.status == S.RETRY_WAIT:
            # Resolved as not done: its caller is the only one who sends it, so the run's
            # replay target does, and the row becomes failed first (its DLQ entry is written in
            # the same transaction by the ledger's hook) — the replay is the new attempt.
            with transaction.atomic():
                failed = ledger_transitions.operation_redrive(
                    operation=op, actor=actor, reason=f"resume of run {run}: re-driven through the replay target"
                )
            entry = FailedEvent.objects.get(operation_id=failed.pk)
        assert entry is not None
        replay = failed_event_replay(
            tenant_id=op.tenant_id,
            event_pk=entry.pk,
            actor=actor,
            target_slug=target_slug if step.resume_via == VIA_TARGET else "",
            note=f"resume of run {run}: {note}",
            to_provider=step.resume_via == VIA_PROVIDER,
        )
    except DomainError as exc:
        result.update(error=exc.code, detail=exc.detail)
        return result
    result.update(entry=entry.pk, replay=replay.number, outcome=replay.outcome, replay_operation=replay.operation_id)
    return result
