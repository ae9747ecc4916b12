"""Key rotation: re-encrypt every stored payload under the current key, in batches, and
re-key the data-subject index. Safe to interrupt and run again (each batch is its own short
transaction and only touches rows not yet under the current key)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.db import transaction
from django.db.models import Q

from ledger.models import SealedJSONField
from ledger.platform import crypto
from review.models import RecordType, SubjectIndex
from review.privacy.payloads import subject_index_record

# (model label, columns, record type for the subject index, subject-index columns)
SEALED_COLUMNS: list[tuple[str, tuple[str, ...], str | None, tuple[str, ...]]] = [
    ("ledger.Operation", ("payload", "request", "response_body"), RecordType.OPERATIONS, ("payload", "request")),
    ("ledger.Attempt", ("response_body",), None, ()),
    ("dlq.FailedEvent", ("payload",), RecordType.FAILED_EVENTS, ("payload",)),
    ("dlq.Replay", ("response_body",), None, ()),
    # A four-eyes request's parameters: a correction's values (ADR 0013).
    ("ledger.ApprovalRequest", ("params",), None, ()),
    # Evaluation manifests: what a generated document holds, a vendor's name among it (ADR 0022).
    ("ledger.OperationManifest", ("content",), None, ()),
]
# Secrets sealed under the same keys, always (even where payload encryption is off): a value
# found in clear (stored before it was sealed) is sealed too. docs/secrets.md lists them.
SECRET_COLUMNS: list[tuple[str, tuple[str, ...]]] = [
    ("ledger.Tenant", ("callback_secret", "callback_secret_previous")),
    ("ledger.Provider", ("auth_secret", "webhook_secret")),
    ("dlq.N8nConnection", ("api_key_secret",)),
    ("dlq.ReplayTarget", ("signing_secret", "signing_secret_previous", "credential_secret")),
    ("alerts.AlertChannel", ("url",)),
    # Authenticator apps' shared keys (review.staff.mfa, ADR 0014).
    ("review.ConsoleTotpDevice", ("sealed_key",)),
]


def _stale(model: Any, column: str, current: str) -> Q:
    """Rows whose ``column`` holds something not sealed under the current key."""
    if isinstance(model._meta.get_field(column), SealedJSONField):
        # Stored as bytes on PostgreSQL: asked of the stored form (ledger.models.SealedUnder).
        sealed_now = Q(**{f"{column}__sealed_under": f"{crypto.VERSION}:{current}"})
    else:
        sealed_now = Q(**{f"{column}___enc__startswith": f"{crypto.VERSION}:{current}:"})
    redacted = Q(**{f"{column}__has_key": crypto.REDACTED})
    # A value that is not an envelope at all (stored in clear) is stale too, said outright:
    # on SQLite the negated `sealed_under` of such a value is NULL, not true.
    plain = ~Q(**{f"{column}__has_key": crypto.ENVELOPE})
    return Q(**{f"{column}__isnull": False}) & (plain | ~sealed_now) & ~redacted


def encryption_rotate(
    *, batch_size: int = 500, dry_run: bool = False, out: Callable[[str], Any] | None = None
) -> dict[str, dict[str, int]]:
    current = crypto.keyring().current_id
    report: dict[str, dict[str, int]] = {}
    tables = [(label, columns, record_type, indexed, False) for label, columns, record_type, indexed in SEALED_COLUMNS]
    tables += [(label, columns, None, (), True) for label, columns in SECRET_COLUMNS]
    for label, columns, record_type, indexed, always in tables:
        try:
            model = apps.get_model(label)
        except LookupError:
            continue
        counts = _reseal_table(
            model, columns, current, batch_size=batch_size, dry_run=dry_run, always=always, out=out, label=label
        )
        if record_type is not None and not dry_run:
            counts["reindexed"] = _rekey_subject_index(model, record_type, indexed, current, batch_size)
        report[label] = counts
    return report


def _reseal_table(
    model: Any,
    columns: tuple[str, ...],
    current: str,
    *,
    batch_size: int,
    dry_run: bool,
    always: bool,
    out: Callable[[str], Any] | None,
    label: str,
) -> dict[str, int]:
    stale = Q()
    for column in columns:
        stale |= _stale(model, column, current)
    rows = model.objects.filter(stale)
    counts = {"stale": rows.count(), "resealed": 0, "unreadable": 0, "reindexed": 0}
    if dry_run:
        return counts
    # Walked by id, which every table here has and which alone names a row (attempts
    # are keyed (id, started_at): a key is a tuple, ordered by its time too).
    last_id = 0
    while True:
        batch = list(rows.filter(id__gt=last_id).order_by("id").only("id", *columns)[:batch_size])
        if not batch:
            break
        with transaction.atomic():
            for obj in batch:
                try:
                    updates = {c: crypto.reseal_json(getattr(obj, c), always=always) for c in columns}
                except crypto.EncryptionKeyError:
                    # Sealed under a key that is no longer configured: left as it is,
                    # counted, so the operator knows not to drop keys yet.
                    counts["unreadable"] += 1
                    continue
                model.objects.filter(pk=obj.pk).update(**updates)
                counts["resealed"] += 1
        last_id = batch[-1].id
        if out:
            out(f"{label}: {counts['resealed']}/{counts['stale']} resealed")
    return counts


def _rekey_subject_index(model: Any, record_type: str, columns: tuple[str, ...], current: str, batch_size: int) -> int:
    """Index rows under an old key id are recomputed under the current one (by record)."""
    done = 0
    last_id = -1
    while True:
        ids = list(
            SubjectIndex.objects.filter(record_type=record_type, record_id__gt=last_id)
            .exclude(key_id=current)
            .order_by("record_id")
            .values_list("record_id", flat=True)
            .distinct()[:batch_size]
        )
        if not ids:
            return done
        last_id = ids[-1]
        with transaction.atomic():
            for obj in model.objects.filter(pk__in=ids).only("pk", "tenant_id", *columns):
                try:
                    subject_index_record(
                        tenant_id=obj.tenant_id,
                        record_type=record_type,
                        record_id=obj.pk,
                        values=[getattr(obj, c) for c in columns],
                    )
                except crypto.EncryptionKeyError:
                    continue  # keeps its old-key rows until its key is configured again
                SubjectIndex.objects.filter(record_type=record_type, record_id=obj.pk).exclude(key_id=current).delete()
                done += 1
