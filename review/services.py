"""Review decisions: every one is a guarded transition with the reviewer as actor."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from ledger.errors import DomainError, LeaseLost, OperationNotFound, ValidationFailed
from ledger.models import AttemptOutcome, Operation, OperationStatus
from ledger.services import operation_transition
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
    changes: dict[str, Any] = {"reconcile_until": None, "lease_expires_at": None}
    attempt_outcome: str | None = None
    if decision == ReviewDecision.CONFIRM_SUCCEEDED:
        changes["provider_ref"] = provider_ref[:255]
        attempt_outcome = AttemptOutcome.SUCCEEDED
    elif decision == ReviewDecision.SAFE_TO_RETRY:
        changes.update(next_attempt_at=Now(), lookup_failures=0)
        attempt_outcome = AttemptOutcome.NOT_FOUND
    reason = f"{decision}: {note}"
    try:
        with transaction.atomic():
            moved = operation_transition(operation=op, to=_TARGET[decision], actor=actor, reason=reason, changes=changes)
            if attempt_outcome is not None:
                # The reviewer's decision resolves every attempt that was left unknown.
                moved.attempt_set.filter(outcome__in=[AttemptOutcome.AMBIGUOUS, AttemptOutcome.PENDING]).update(
                    outcome=attempt_outcome
                )
    except LeaseLost as exc:
        raise ReviewNotOpen("The operation changed while you were deciding; reload it.") from exc
    log.info("review_decision key=%s decision=%s to=%s", op.key, decision, moved.status)
    return moved
