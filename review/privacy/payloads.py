"""Privacy: masking, reveal with a reason, the data-subject index.

Everything that shows a payload in plain text goes through :func:`payload_reveal`, which
writes the AccessLog row first (review.audit.accesslog: the keyed, checkpointed chain; its
functions are re-exported here for the callers that know them by this module). Everything
else renders :func:`mask_json`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from django.conf import settings
from django.db import models

from dlq.models import FailedEvent
from ledger.platform import crypto
from ledger.platform.errors import ValidationFailed
from ledger.platform.masking import mask_json
from review.audit.accesslog import GENESIS, ChainProblem, accesslog_append, accesslog_verify, chain_anchor, normalize_ip  # noqa: F401 (re-exported for callers of review.privacy.payloads)
from review.models import AccessAction, AccessLog, RecordType, SubjectIndex

log = logging.getLogger("onceguard.privacy")

MIN_REASON_LENGTH = 8

# Columns that hold payloads, per model label. Masked everywhere; revealed only here.
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "ledger.operation": ("payload", "request", "response_body"),
    "review.reviewitem": ("payload", "request", "response_body"),
    "ledger.attempt": ("response_body",),
    "dlq.failedevent": ("payload",),
    "dlq.replay": ("response_body",),
}
FIELD_LABELS = {"payload": "payload", "request": "request (execute mode)", "response_body": "recorded response"}


def payload_fields_of(model: type[models.Model] | models.Model) -> tuple[str, ...]:
    return PAYLOAD_FIELDS.get(model._meta.label_lower, ())


def privacy_setting(name: str, default: Any) -> Any:
    return getattr(settings, "ONCEGUARD_PRIVACY", {}).get(name, default)


# --- Masking -----------------------------------------------------------------------------------
# mask_json is ledger.platform.masking's: one masking rule for the API, the console and exports.


@dataclass(frozen=True)
class PayloadState:
    field: str
    label: str
    # "empty", "sealed", "plain" (written before encryption), "redacted"
    state: str
    masked: str
    key_id: str | None
    redacted_at: str | None
    redaction: dict[str, Any] | None


def payload_state(obj: models.Model, field: str) -> PayloadState:
    raw = getattr(obj, field, None)
    label = FIELD_LABELS.get(field, field)
    if raw is None:
        return PayloadState(field, label, "empty", "", None, None, None)
    if crypto.is_redacted(raw):
        info = raw[crypto.REDACTED]
        return PayloadState(field, label, "redacted", "", None, info.get("at"), info)
    if crypto.is_sealed(raw):
        try:
            shape = mask_json(crypto.open_json(raw))
        except crypto.EncryptionKeyError:
            shape = "‹sealed with a key that is not configured›"
        return PayloadState(
            field, label, "sealed", json.dumps(shape, indent=2, ensure_ascii=False), crypto.key_id_of(raw), None, None
        )
    return PayloadState(
        field, label, "plain", json.dumps(mask_json(raw), indent=2, ensure_ascii=False), None, None, None
    )


# --- Reveal ---------------------------------------------------------------------------------------


def object_id_of(obj: models.Model) -> str:
    """How the console and the access log name a row: its primary key — for a history row keyed
    ``(id, <time>)`` (attempts, events: DESIGN §12) its id, which one sequence per table makes
    one row's."""
    return str(obj.id) if obj._meta.is_composite_pk else str(obj.pk)  # type: ignore[attr-defined]


def object_label(obj: models.Model) -> tuple[str, str, str]:
    """(object_type, object_id, object_ref) for the log. Refs are keys/ids, never personal data."""
    ref = getattr(obj, "key", None) or getattr(obj, "event_id", None) or getattr(obj, "ledger_key", None) or ""
    label = obj._meta.concrete_model._meta.label_lower
    return label, object_id_of(obj), str(ref)


def object_download_record(
    *, obj: models.Model, tenant_id: int, reason: str, actor: str, ip: str | None, user_id: int | None = None
) -> AccessLog:
    """The access-log row of a stored file's download (an upload or a published output: tenant
    data, possibly a person's), written before a byte is read. Callers check permission and
    tenant scope first (console: view_payload and the admin's scoped queryset)."""
    reason = " ".join((reason or "").split())
    if len(reason) < MIN_REASON_LENGTH:
        raise ValidationFailed(f"Say why you need the file (at least {MIN_REASON_LENGTH} characters).")
    object_type, object_id, object_ref = object_label(obj)
    return accesslog_append(
        tenant_id=tenant_id,
        action=AccessAction.REVEAL,
        actor=actor,
        user_id=user_id,
        object_type=object_type,
        object_id=object_id,
        object_ref=object_ref,
        fields=["content"],
        reason=reason,
        ip=ip,
    )


def payload_reveal(
    *,
    obj: models.Model,
    tenant_id: int,
    fields: Iterable[str],
    reason: str,
    actor: str,
    ip: str | None,
    user_id: int | None = None,
) -> tuple[dict[str, Any], AccessLog]:
    """The plaintext of ``fields`` of ``obj``; the AccessLog row is written first.

    Callers check permission and tenant scope before calling (console: view_payload and
    the admin's scoped queryset; API: the key's `payload` scope and its tenant).
    """
    reason = " ".join((reason or "").split())
    if len(reason) < MIN_REASON_LENGTH:
        raise ValidationFailed(f"Say why you need to see it (at least {MIN_REASON_LENGTH} characters).")
    allowed = payload_fields_of(obj)
    wanted = [f for f in (fields or allowed) if f in allowed]
    if not wanted:
        raise ValidationFailed(f"Nothing to reveal; fields are {', '.join(allowed) or 'none'}.")
    object_type, object_id, object_ref = object_label(obj)
    entry = accesslog_append(
        tenant_id=tenant_id,
        action=AccessAction.REVEAL,
        actor=actor,
        user_id=user_id,
        object_type=object_type,
        object_id=object_id,
        object_ref=object_ref,
        fields=wanted,
        reason=reason,
        ip=ip,
    )
    values: dict[str, Any] = {}
    for field in wanted:
        raw = getattr(obj, field)
        values[field] = None if crypto.is_redacted(raw) else crypto.open_json(raw)
    return values, entry


# --- Data-subject index ---------------------------------------------------------------------------

# Keys anywhere in a payload whose values identify a person, by kind. Extend with
# ONCEGUARD_PRIVACY["SUBJECT_KEYS"]; explicit dotted paths per source with
# ONCEGUARD_PRIVACY["SUBJECT_PATHS"] = [{"source": "<glob>", "paths": {"a.b": "phone"}}].
DEFAULT_SUBJECT_KEYS: dict[str, str] = {
    "email": "email",
    "email_address": "email",
    "emailaddress": "email",
    "phone": "phone",
    "phone_number": "phone",
    "phonenumber": "phone",
    "mobile": "phone",
    "from_number": "phone",
    "caller_number": "phone",
    "customer_phone": "phone",
    "customer_email": "email",
}


def _walk(value: Any, path: tuple[str, ...] = (), depth: int = 0) -> Iterator[tuple[tuple[str, ...], Any]]:
    if depth > 8:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, (*path, str(k)), depth + 1)
    elif isinstance(value, list):
        for v in value[:200]:
            yield from _walk(v, path, depth + 1)
    else:
        yield path, value


def extract_identifiers(value: Any, *, source: str = "") -> set[tuple[str, str]]:
    """{(kind, normalized identifier)} found in a plaintext payload."""
    keys = {**DEFAULT_SUBJECT_KEYS, **{k.lower(): v for k, v in privacy_setting("SUBJECT_KEYS", {}).items()}}
    paths: dict[str, str] = {}
    for rule in privacy_setting("SUBJECT_PATHS", []):
        if fnmatchcase(source or "", rule.get("source", "*")):
            paths.update(rule.get("paths", {}))
    found: set[tuple[str, str]] = set()
    for path, leaf in _walk(value):
        if not path:
            continue
        kind = paths.get(".".join(path)) or keys.get(path[-1].lower())
        if kind:
            normalized = crypto.normalize_identifier(kind, leaf)
            if normalized:
                found.add((kind, normalized))
    return found


def subject_index_record(
    *, tenant_id: int, record_type: str, record_id: int, values: Iterable[Any], source: str = ""
) -> int:
    """Index the identifiers of a record's plaintext payload(s); returns rows written."""
    identifiers: set[tuple[str, str]] = set()
    for value in values:
        if value is not None and not crypto.is_redacted(value):
            identifiers |= extract_identifiers(crypto.open_json(value), source=source)
    if not identifiers:
        return 0
    rows = []
    for kind, text in sorted(identifiers):
        key_id, hexdigest = crypto.digest(f"{kind}:{text}")
        rows.append(
            SubjectIndex(
                tenant_id=tenant_id,
                record_type=record_type,
                record_id=record_id,
                kind=kind,
                key_id=key_id,
                digest=hexdigest,
            )
        )
    SubjectIndex.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


@dataclass(frozen=True)
class SubjectHits:
    operation_ids: list[int]
    failed_event_ids: list[int]


def subject_search(*, tenant_ids: list[int] | None, phone: str = "", email: str = "") -> SubjectHits:
    """Every operation and DLQ entry indexed under this phone number or email address."""
    digests: list[str] = []
    for kind, raw in (("phone", phone), ("email", email)):
        if raw:
            normalized = crypto.normalize_identifier(kind, raw)
            if normalized:
                digests += [d for _, d in crypto.digests_all_keys(f"{kind}:{normalized}")]
    if not digests:
        return SubjectHits([], [])
    # Links to records retention deleted stay for the person's trail (review.privacy.subjects); a
    # search finds living records only.
    rows = SubjectIndex.objects.filter(digest__in=digests, gone_at__isnull=True)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    op_ids = sorted(set(rows.filter(record_type=RecordType.OPERATIONS).values_list("record_id", flat=True)))
    fe_ids = set(rows.filter(record_type=RecordType.FAILED_EVENTS).values_list("record_id", flat=True))
    # A DLQ entry made from an operation carries that operation's payload.
    if op_ids:
        fe_ids |= set(FailedEvent.objects.filter(operation_id__in=op_ids).values_list("pk", flat=True))
    return SubjectHits(op_ids, sorted(fe_ids))


def redaction_marker(
    *, value: Any, policy_id: int | str | None, run_id: int | None, at: datetime, erasure_id: int | None = None
) -> dict[str, Any]:
    """What stays of a destroyed payload: when, why (a retention policy and run, or an
    erasure on request), and a keyed digest (never a bare hash)."""
    plain = crypto.open_json(value)
    blob = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key_id, hexdigest = crypto.digest(f"payload:{blob}")
    return {
        crypto.REDACTED: {
            "at": at.astimezone(UTC).isoformat(timespec="microseconds"),
            "policy": policy_id,
            "run": run_id,
            **({"erasure": erasure_id} if erasure_id is not None else {}),
            "hmac": hexdigest,
            "key_id": key_id,
            "bytes": len(blob.encode()),
        }
    }
