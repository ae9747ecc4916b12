"""Review decisions: every one a guarded transition with the reviewer as actor."""

from __future__ import annotations

import logging

from django.db import transaction

from alerts.services import alerts_resolve_for
from ledger.models import ApprovalKind, ApprovalRequest, Operation, OperationStatus
from ledger.platform.errors import DomainError, LeaseLost, OperationNotFound, ValidationFailed
from ledger.protocol import approvals
from ledger.protocol.transitions import operation_review_resolve
from review.models import ReviewDecision

S = OperationStatus
log = logging.getLogger("onceguard.review")


class ReviewNotOpen(DomainError):
    status, code, title = 409, "review_not_open", "Not waiting for review"


_TARGET = {
    ReviewDecision.CONFIRM_SUCCEEDED: S.SUCCEEDED,
    ReviewDecision.SAFE_TO_RETRY: S.RETRY_WAIT,
    ReviewDecision.ABANDON: S.ABANDONED,
}


def review_decision_record(
    *,
    operation_id: int,
    decision: str,
    note: str,
    actor: str,
    provider_ref: str = "",
    tenant_ids: list[int] | None = None,
) -> Operation:
    """Apply a reviewer's decision to an operation in `review`.

    ``tenant_ids`` limits which tenants' rows the caller may decide (None: any).
    """
    if decision not in _TARGET:
        raise ValidationFailed(f"decision must be one of {', '.join(ReviewDecision.values)}.")
    note = (note or "").strip()
    if not note:
        raise ValidationFailed("A note is required for every review decision.")
    rows = Operation.objects.filter(pk=operation_id)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    op = rows.first()
    if op is None:
        raise OperationNotFound("No such operation.")
    if op.status != S.REVIEW:
        raise ReviewNotOpen(f"The operation is {op.status}, not waiting for review.", extra={"status": op.status})
    if decision == ReviewDecision.SAFE_TO_RETRY:
        # Four-eyes (ADR 0013): "safe to retry" sends the request again; it waits for a second
        # person where the tenant or the provider requires one (the row stays in review).
        approvals.approval_gate(
            tenant_id=op.tenant_id,
            provider_id=op.provider_id,
            kind=ApprovalKind.SAFE_TO_RETRY,
            actor=actor,
            reason=note,
            target_ids=[op.pk],
            params={"decision": decision, "note": note, "provider_ref": provider_ref},
        )
    reason = f"{decision}: {note}"
    try:
        with transaction.atomic():
            # The reviewer's decision resolves every attempt that was left unknown.
            moved = operation_review_resolve(
                operation=op, to=_TARGET[decision], actor=actor, reason=reason, provider_ref=provider_ref
            )
            # The item's alerts (raised by the sweeper with the key as ref) are dealt with.
            alerts_resolve_for(
                tenant_id=op.tenant_id,
                kinds=["review_needed", "operation_stuck"],
                ref=op.key,
                actor=actor,
                note=f"review decision: {decision}",
            )
    except LeaseLost as exc:
        raise ReviewNotOpen("The operation changed while you were deciding; reload it.") from exc
    log.info("review_decision key=%s decision=%s to=%s", op.key, decision, moved.status)
    return moved


def _safe_to_retry_approved(request: ApprovalRequest, approver: str) -> str:
    """An approved "safe to retry": the reviewer's decision, in the approver's name."""
    p = approvals.approval_params(request)
    op = review_decision_record(
        operation_id=request.target_ids[0],
        decision=ReviewDecision.SAFE_TO_RETRY,
        note=f"{p.get('note', '')} (four-eyes: asked by {request.requested_by}, approved by {approver},"
        f" request #{request.pk})",
        actor=approver,
        provider_ref=p.get("provider_ref", ""),
        tenant_ids=[request.tenant_id],
    )
    return f"operation {op.pk}: {op.status}"


def review_approval_executor_connect() -> None:
    """Called from ``ReviewConfig.ready()``."""
    approvals.approval_executor_register(ApprovalKind.SAFE_TO_RETRY, _safe_to_retry_approved)
