"""Review decisions (every one a guarded transition with the reviewer as actor) and
retention policies (checked against the platform's floors, every change recorded)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction

from alerts.services import alerts_resolve_for
from ledger.models import ConfigChangeAction, Operation, OperationStatus
from ledger.platform.errors import DomainError, LeaseLost, OperationNotFound, ValidationFailed
from ledger.protocol.transitions import operation_review_resolve
from ledger.tenants.config_changes import config_change_of, config_snapshot
from ledger.web import display
from review.audit.accesslog import access_log_min_retention
from review.models import RecordType, RetentionPolicy, ReviewDecision
from review.retention.purge import retention_floor

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


# --- Retention policies ----------------------------------------------------------------------------


def retention_policy_check(*, record_type: str, payload_ttl: timedelta | None, record_ttl: timedelta | None) -> None:
    """ValidationFailed unless the TTLs make a policy: positive, payload before record, and an
    no TTL below the platform's floors (review.retention.purge; the access log's is review.audit.accesslog's)."""
    for label, ttl in (("payload TTL", payload_ttl), ("record TTL", record_ttl)):
        if ttl is not None and ttl <= timedelta(0):
            raise ValidationFailed(f"The {label} must be longer than zero.", extra={"field": label.replace(" ", "_")})
    if payload_ttl is not None and record_ttl is not None and payload_ttl > record_ttl:
        raise ValidationFailed("The payload TTL cannot be longer than the record TTL.")
    floor = access_log_min_retention()
    if record_type == RecordType.ACCESS_LOG and record_ttl is not None and record_ttl < floor:
        raise ValidationFailed(
            f"The access log is kept at least {floor.days} days (the platform's minimum); a shorter record TTL"
            " is not allowed.",
            extra={"field": "record_ttl", "minimum_days": floor.days},
        )
    # The platform's floors under payloads and records (review.retention.purge, ONCEGUARD_RETENTION).
    payload_floor, record_floor = retention_floor(record_type)
    for label, field, ttl, minimum in (
        ("payload TTL", "payload_ttl", payload_ttl, payload_floor),
        ("record TTL", "record_ttl", record_ttl, record_floor),
    ):
        if ttl is not None and minimum is not None and ttl < minimum:
            raise ValidationFailed(
                f"The platform keeps {RecordType(record_type).label} at least {display.duration_words(minimum)}"
                f" before this; a shorter {label} is not allowed.",
                extra={"field": field, "minimum_days": minimum.days},
            )


def retention_policy_save(
    *,
    tenant_id: int,
    record_type: str,
    actor: str,
    payload_ttl: timedelta | None = None,
    record_ttl: timedelta | None = None,
    legal_hold: bool = False,
    legal_hold_note: str = "",
) -> RetentionPolicy:
    """Create or replace the tenant's policy for ``record_type``; the change is recorded."""
    if record_type not in RecordType.values:
        raise ValidationFailed(f"Unknown record type {record_type!r}.")
    retention_policy_check(record_type=record_type, payload_ttl=payload_ttl, record_ttl=record_ttl)
    fields = {
        "payload_ttl": payload_ttl,
        "record_ttl": record_ttl,
        "legal_hold": legal_hold,
        "legal_hold_note": legal_hold_note[:300],
    }
    with transaction.atomic():
        existing = RetentionPolicy.objects.select_for_update().filter(tenant_id=tenant_id, record_type=record_type)
        before = config_snapshot(existing[0]) if existing else None
        policy, created = RetentionPolicy.objects.update_or_create(
            tenant_id=tenant_id, record_type=record_type, defaults=fields
        )
        config_change_of(
            policy,
            actor=actor,
            action=ConfigChangeAction.CREATE if created else ConfigChangeAction.UPDATE,
            before=before,
        )
    return policy
