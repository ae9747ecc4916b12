"""Uploads by digest: a tenant's file stored outside the queue.

``upload_store`` takes the request body as a stream and, in this order:

1. copies it into an unnamed temporary file, hashing and counting as it goes, and refuses it
   (``413 payload_too_large``) the moment it passes ``UPLOAD_MAX_BYTES`` — reading stops
   there; an empty body is ``400 upload_empty``;
2. decides its media type from its content (ledger.execution.objects.inspect: magic bytes, then a full
   decode by Pillow for images) and refuses a type not in ``UPLOAD_MEDIA_TYPES`` or content
   that does not decode (``415 upload_media_type_not_allowed``) — the client's Content-Type
   is never read;
3. only then admits it: the same bytes from the same tenant already stored answer that upload
   (200; only its ``retain_until`` is raised, to a day from now); otherwise the object is written to the ``onceguard_objects``
   storage under a fresh name and the row inserted. The row, unique per tenant and digest,
   is the commit point: a concurrent upload of the same bytes that loses the insert deletes
   its own object and answers the winner's row.

Nothing is stored on a refusal: not a row, not an object, not a named temporary file.

**Kept while a job can use it** (DESIGN §11, retention). An accepted job that names an upload
raises its ``retain_until`` (:func:`uploads_retain`, before the job's row is written) to the end
of the job's lifetime plus its last attempt's lease; retention's delete
(:func:`uploads_purge`) skips an upload whose ``retain_until`` has not passed, under a row lock,
so a purge and a submission racing for the same upload cannot both win. An erasure
(:func:`uploads_delete_named`) is a person's request and deletes regardless: a job still
naming the upload then fails ``invalid_input`` (``upload_reference_invalid``, "no longer
stored") without sending.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce, Greatest

from ledger.execution import objects
from ledger.models import Tenant, Upload
from ledger.platform.errors import DomainError
from ledger.store import sql

log = logging.getLogger("onceguard.uploads")

KEY_PREFIX = "up_"
# How long retention keeps an upload from a re-upload of the same bytes (DESIGN §11): enough
# to submit the job it was uploaded for, whose submission then keeps it for that job's lifetime.
REUPLOAD_RETAIN_SECONDS = 86400


class UploadTooLarge(DomainError):
    status, code, title = 413, "payload_too_large", "Payload too large"


class UploadEmpty(DomainError):
    code, title = "upload_empty", "Empty upload"


class UploadMediaTypeNotAllowed(DomainError):
    status, code, title = 415, "upload_media_type_not_allowed", "Media type not allowed"


class UploadNotFound(DomainError):
    """Unknown key, or another tenant's: the same 404 (an upload's existence is tenant data)."""

    status, code, title = 404, "not_found", "Not found"


def upload_max_bytes() -> int:
    return int(objects.setting("UPLOAD_MAX_BYTES"))


def upload_media_types() -> list[str]:
    return list(objects.setting("UPLOAD_MEDIA_TYPES"))


def upload_key(sha256: str) -> str:
    return KEY_PREFIX + sha256


# An upload's key wherever a job names it (an intent's source_key, a field of a free-form body).
_KEY_IN_TEXT = re.compile(r"\bup_[0-9a-f]{64}\b")


def upload_keys_in(value: Any, *, depth: int = 0) -> set[str]:
    """Every upload key a stored value (a job's payload, request or intent, in plaintext)
    names, in any string at any depth."""
    found: set[str] = set()
    if depth > 16:
        return found
    if isinstance(value, str):
        found.update(_KEY_IN_TEXT.findall(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            found |= upload_keys_in(key, depth=depth + 1) | upload_keys_in(item, depth=depth + 1)
    elif isinstance(value, list):
        for item in value:
            found |= upload_keys_in(item, depth=depth + 1)
    return found


@dataclass(frozen=True)
class UploadResult:
    upload: Upload
    # False: these bytes were already stored for this tenant; nothing was written.
    created: bool


def upload_store(*, tenant: Tenant, stream: objects.Readable, declared_length: int | None = None) -> UploadResult:
    """Check and store one upload (module docstring); raises the refusals above."""
    limit = upload_max_bytes()
    if declared_length is not None and declared_length > limit:
        # Refused before a byte is read: the body says it is too large.
        raise UploadTooLarge(f"The file exceeds the limit of {limit} bytes.", extra={"limit": limit})
    try:
        received = objects.receive_bounded(objects.stream_chunks(stream, limit=limit), limit=limit)
    except objects.ObjectTooLarge:
        log.info("upload_refused tenant=%s reason=too_large limit=%s", tenant.pk, limit)
        raise UploadTooLarge(f"The file exceeds the limit of {limit} bytes.", extra={"limit": limit}) from None
    try:
        if received.size == 0:
            raise UploadEmpty(
                "The body is empty: send the file's bytes as the request body, with a Content-Length"
                " (a chunked body without one is read as empty)."
            )
        allowed = upload_media_types()
        try:
            facts = objects.inspect(received.file)
        except objects.NotRecognised as exc:
            log.info("upload_refused tenant=%s reason=unrecognised size=%s", tenant.pk, received.size)
            raise UploadMediaTypeNotAllowed(
                f"The file is not one of the accepted types ({', '.join(allowed)}): {exc}.", extra={"allowed": allowed}
            ) from None
        if facts.media_type not in allowed:
            log.info("upload_refused tenant=%s reason=media_type type=%s", tenant.pk, facts.media_type)
            raise UploadMediaTypeNotAllowed(
                f"The file is {facts.media_type}; accepted: {', '.join(allowed)}.",
                extra={"allowed": allowed, "detected": facts.media_type},
            )
        return _admit(tenant=tenant, received=received, facts=facts)
    finally:
        received.close()


def _admit(*, tenant: Tenant, received: objects.Received, facts: objects.Facts) -> UploadResult:
    existing = Upload.objects.filter(tenant_id=tenant.pk, sha256=received.sha256).first()
    # A re-upload answers the stored row, which may be past its retention TTL already: it is
    # kept a while from this answer, so the key just answered is there for the job it was sent
    # for. Guarded: a purge that deleted the row meanwhile leaves nothing to raise, and the
    # bytes are stored anew below.
    if existing is not None and uploads_retain(
        tenant_id=tenant.pk, keys={existing.key}, seconds=REUPLOAD_RETAIN_SECONDS
    ):
        return UploadResult(existing, created=False)
    storage = objects.objects_storage()
    name = objects.object_save(
        storage,
        name=objects.object_name(kind="uploads", tenant_id=tenant.pk, sha256=received.sha256),
        file=received.file,
    )
    try:
        with transaction.atomic():
            upload = Upload.objects.create(
                tenant_id=tenant.pk,
                key=upload_key(received.sha256),
                sha256=received.sha256,
                size=received.size,
                media_type=facts.media_type,
                width=facts.width,
                height=facts.height,
                storage_name=name,
            )
    except IntegrityError:
        # The same bytes were admitted meanwhile: theirs stays, ours goes.
        objects.object_delete(storage, name)
        return UploadResult(Upload.objects.get(tenant_id=tenant.pk, sha256=received.sha256), created=False)
    except BaseException:
        # No row, so nobody can reach the object: remove it rather than leave an orphan.
        objects.object_delete(storage, name)
        raise
    log.info("upload_stored tenant=%s key=%s size=%s type=%s", tenant.pk, upload.key, upload.size, upload.media_type)
    return UploadResult(upload, created=True)


def upload_get(*, tenant: Tenant, key: str) -> Upload:
    """One of the tenant's uploads; another tenant's key is as unknown as a made-up one."""
    upload = Upload.objects.filter(tenant_id=tenant.pk, key=key).first()
    if upload is None:
        raise UploadNotFound("No such upload.")
    return upload


def uploads_delete_named(*, tenant_id: int, keys: set[str]) -> int:
    """Delete the tenant's uploads with these keys (an erasure: the uploads a person's jobs
    named), as :func:`uploads_delete` does; keys of no upload are ignored. A person's request
    outranks ``retain_until``: a job still naming one fails ``invalid_input`` without sending."""
    if not keys:
        return 0
    ids = list(Upload.objects.filter(tenant_id=tenant_id, key__in=sorted(keys)).values_list("pk", flat=True))
    return uploads_delete(tenant_id=tenant_id, upload_ids=ids) if ids else 0


def uploads_delete(*, tenant_id: int, upload_ids: list[int]) -> int:
    """Delete uploads whatever their ``retain_until`` (an erasure; retention goes through
    :func:`uploads_purge`): the rows in the caller's transaction, their objects once it
    commits — a crash in between leaves an object no row names, never a row without bytes."""
    rows = list(Upload.objects.filter(tenant_id=tenant_id, pk__in=upload_ids).values_list("pk", "storage_name"))
    Upload.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
    objects.objects_delete_on_commit([name for _, name in rows])
    return len(rows)


def uploads_retain(*, tenant_id: int, keys: set[str], seconds: float) -> int:
    """Keep the tenant's uploads with these keys for at least ``seconds`` from now (the
    database's clock): ``retain_until`` becomes the later of its value and that moment, in one
    guarded UPDATE. Returns how many rows it raised — fewer than ``keys`` means some upload is
    gone (deleted since it was checked), and the caller must not accept a job naming it.

    Run before the job's row is written, committed with it or before it (a DLQ correction
    submits inside its own transaction): a crash or a refusal after it leaves an upload kept longer than needed, never an accepted job whose upload retention
    may delete. Against a purge, the row lock decides: the UPDATE waits for a purge that locked
    the row first (and then finds it deleted), and a purge that comes second sees the new
    ``retain_until`` (:func:`uploads_purge`)."""
    if not keys:
        return 0
    until = sql.db_now() + timedelta(seconds=seconds)
    return Upload.objects.filter(tenant_id=tenant_id, key__in=sorted(keys)).update(
        retain_until=Greatest(Coalesce(F("retain_until"), Value(until)), Value(until))
    )


def uploads_purge(*, tenant_id: int, upload_ids: list[int], now: datetime) -> tuple[int, int]:
    """Retention's delete of uploads past their TTL, in the caller's transaction: those whose
    ``retain_until`` is unset or has passed at ``now`` are locked (pk order) and deleted as
    :func:`uploads_delete` does; the rest are kept, since an accepted job that names them can
    still run. Returns (deleted, kept).

    The guard is read under the lock: on PostgreSQL a submission that raised ``retain_until``
    and committed while this waited for the row is seen, and one that comes after waits for
    this transaction and then finds no row (it refuses the job)."""
    if not upload_ids:
        return 0, 0
    free = Q(retain_until__isnull=True) | Q(retain_until__lte=now)
    rows = list(
        Upload.objects.select_for_update()
        .filter(free, tenant_id=tenant_id, pk__in=upload_ids)
        .order_by("pk")
        .values_list("pk", "storage_name")
    )
    Upload.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
    objects.objects_delete_on_commit([name for _, name in rows])
    return len(rows), len(upload_ids) - len(rows)
