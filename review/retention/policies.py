"""Retention policies: what a tenant keeps, and for how long.

The platform's defaults (a tenant without a policy for a record type, when they apply) and its
floors (no policy goes below them; the access log's is review.audit.accesslog's), each tenant's
policies as the purge reads them, and the one write path of a policy (ADR 0006): checked
against the floors, every change recorded in the configuration trail.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from ledger.models import ConfigChangeAction
from ledger.platform.errors import ValidationFailed
from ledger.tenants.config_changes import config_change_of, config_snapshot
from ledger.web import display
from review.audit.accesslog import access_log_min_retention
from review.models import RecordType, RetentionPolicy


def retention_setting(name: str, default: Any) -> Any:
    return getattr(settings, "ONCEGUARD_RETENTION", {}).get(name, default)


def _days(value: Any) -> timedelta | None:
    return None if value is None else timedelta(days=int(value))


def retention_defaults(record_type: str) -> tuple[timedelta | None, timedelta | None]:
    """(payload TTL, record TTL) a tenant without a policy for ``record_type`` gets."""
    spec = retention_setting("DEFAULTS", {}).get(record_type, {})
    return _days(spec.get("payload_days")), _days(spec.get("record_days"))


def retention_floor(record_type: str) -> tuple[timedelta | None, timedelta | None]:
    """(payload TTL, record TTL) no tenant's policy may go below; the access log's record
    floor is review.audit.accesslog's."""
    if record_type == RecordType.ACCESS_LOG:
        return None, access_log_min_retention()
    spec = retention_setting("FLOORS", {}).get(record_type, {})
    return _days(spec.get("payload_days")), _days(spec.get("record_days"))


def defaults_apply() -> bool:
    return bool(retention_setting("APPLY_DEFAULTS", False))


def _policies(tenant_id: int) -> dict[str, RetentionPolicy]:
    """The tenant's policies; the platform's defaults (unsaved, pk None) for the record types
    it has none for, when defaults apply."""
    policies = {p.record_type: p for p in RetentionPolicy.objects.filter(tenant_id=tenant_id)}
    if defaults_apply():
        for record_type in RecordType.values:
            payload_ttl, record_ttl = retention_defaults(record_type)
            if record_type not in policies and (payload_ttl or record_ttl):
                policies[record_type] = RetentionPolicy(
                    tenant_id=tenant_id, record_type=record_type, payload_ttl=payload_ttl, record_ttl=record_ttl
                )
    return policies


def retention_policy_check(*, record_type: str, payload_ttl: timedelta | None, record_ttl: timedelta | None) -> None:
    """ValidationFailed unless the TTLs make a policy: positive, payload before record, and an
    no TTL below the platform's floors (``retention_floor``; the access log's is review.audit.accesslog's)."""
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
    # The platform's floors under payloads and records (``retention_floor``, ONCEGUARD_RETENTION).
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
