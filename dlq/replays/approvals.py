"""The DLQ's re-sends under four-eyes (ADR 0013): which provider an entry's re-send is for,
and the services that run an approved request — the same ones the direct path calls, in the
approver's name (``ledger.protocol.approvals`` holds the requests and their moves; this app
connects the executors below in ``DlqConfig.ready()``)."""

from __future__ import annotations

from typing import Any

from dlq.entries.services import failed_event_resend_decide
from dlq.replays.bulk import bulk_replay_confirm
from dlq.replays.corrections import failed_event_correct
from dlq.replays.runs import run_resume
from dlq.replays.services import failed_event_replay
from ledger.models import ApprovalKind, ApprovalRequest, Tenant
from ledger.protocol import approvals


def approved_note(request: ApprovalRequest, approver: str, note: str) -> str:
    """The note a re-send carries when it runs for an approved request: both people in it."""
    return f"{note} (four-eyes: asked by {request.requested_by}, approved by {approver}, request #{request.pk})"


def _replay(request: ApprovalRequest, approver: str) -> str:
    p = approvals.approval_params(request)
    replay = failed_event_replay(
        tenant_id=request.tenant_id,
        event_pk=request.target_ids[0],
        actor=approver,
        target_slug=p.get("target_slug", ""),
        force=bool(p.get("force")),
        note=approved_note(request, approver, p.get("note", "")),
        as_new=bool(p.get("as_new")),
        confirm=bool(p.get("confirm")),
        to_provider=bool(p.get("to_provider")),
    )
    return f"replay #{replay.number} of entry {request.target_ids[0]}: {replay.outcome}"


def _correct(request: ApprovalRequest, approver: str) -> str:
    p = approvals.approval_params(request)
    result = failed_event_correct(
        tenant_id=request.tenant_id,
        event_pk=request.target_ids[0],
        actor=approver,
        fields=p.get("fields", {}),
        note=approved_note(request, approver, p.get("note", "")),
        target_slug=p.get("target_slug", ""),
    )
    if result.operation is not None:
        return f"corrected and submitted as {result.key} (operation {result.operation.pk})"
    assert result.replay is not None
    return f"corrected and replayed as {result.key} (replay #{result.replay.number}): {result.replay.outcome}"


def _bulk(request: ApprovalRequest, approver: str) -> str:
    p = approvals.approval_params(request)
    bulk = bulk_replay_confirm(
        tenant=Tenant.objects.get(pk=request.tenant_id),
        bulk_id=int(request.target_ref),
        actor=approver,
        count=p.get("count"),
        target_slug=p.get("target_slug") or None,
        note=approved_note(request, approver, p.get("note", "")),
    )
    return f"bulk replay #{bulk.pk} of {bulk.count} entries started"


def _resume(request: ApprovalRequest, approver: str) -> str:
    p = approvals.approval_params(request)
    resume = run_resume(
        tenant_id=request.tenant_id,
        run=request.target_ref,
        actor=approver,
        note=approved_note(request, approver, p.get("note", "")),
        target_slug=p.get("target_slug", ""),
        expected=p.get("expected"),
    )
    return f"run {request.target_ref} resumed (resume #{resume.pk}, {len(resume.results)} steps)"


def _resend_decision(request: ApprovalRequest, approver: str) -> str:
    p = approvals.approval_params(request)
    failed_event_resend_decide(
        tenant_id=request.tenant_id,
        event_pk=request.target_ids[0],
        actor=approver,
        note=approved_note(request, approver, p.get("note", "")),
    )
    return f'entry {request.target_ids[0]}: "safe to resend" recorded'


EXECUTORS: dict[str, Any] = {
    ApprovalKind.REPLAY: _replay,
    ApprovalKind.RERUN_AS_NEW: _replay,
    ApprovalKind.FORCED_REISSUE: _replay,
    ApprovalKind.CORRECTED_REPLAY: _correct,
    ApprovalKind.BULK_REPLAY: _bulk,
    ApprovalKind.RUN_RESUME: _resume,
    ApprovalKind.SAFE_TO_RESEND: _resend_decision,
}


def approval_executors_connect() -> None:
    """Called from ``DlqConfig.ready()``."""
    for kind, executor in EXECUTORS.items():
        approvals.approval_executor_register(kind, executor)
