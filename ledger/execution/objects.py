"""Tenant objects: the bytes of uploads and validated outputs (DESIGN §5, "Uploads and outputs").

Bytes never travel through the queue or the database: they are kept through Django's storage
API under two aliases of ``settings.STORAGES`` — ``onceguard_objects`` (uploads and published
outputs, read only through the tenant-scoped API views) and ``onceguard_quarantine`` (fetched
outputs awaiting their checks; never read by anyone). Local folders under ``var/`` by default,
any Django storage backend (django-storages' S3 for scale) by configuration.

What an object *is* is decided from its content, never from what the sender says:
:func:`inspect` reads the magic bytes, then has Pillow decode an image completely, bounded by
``IMAGE_MAX_PIXELS`` before any pixel is decoded. :func:`receive_bounded` copies a stream into
an anonymous temporary file while hashing and counting it, and stops the moment the limit is
passed — the temporary file has no name, so nothing is left behind whatever happens.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any, Protocol

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.utils import timezone
from PIL import Image, UnidentifiedImageError

from ledger.models import OperationOutput, Upload

log = logging.getLogger("onceguard.objects")

OBJECTS = "onceguard_objects"
QUARANTINE = "onceguard_quarantine"
CHUNK_BYTES = 64 * 1024
# Received bodies up to this size stay in memory; larger ones spill to an unnamed temporary file.
SPOOL_BYTES = 1024 * 1024

# Magic bytes → media type. Checked in order; WebP needs its second marker (below).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
# The Pillow decoder of each image type: an image is opened with its own decoder only, so a
# file is never handed to a decoder its magic bytes did not name.
PILLOW_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}


def objects_storage() -> Storage:
    return storages[OBJECTS]


def quarantine_storage() -> Storage:
    return storages[QUARANTINE]


def setting(name: str) -> Any:
    return settings.ONCEGUARD[name]


def image_max_pixels() -> int:
    return int(setting("IMAGE_MAX_PIXELS"))


class ObjectTooLarge(Exception):
    """The stream passed its byte limit; reading stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


class NotRecognised(Exception):
    """The content is not what it must be; the message says why, in words without content."""


@dataclass(frozen=True)
class Facts:
    """What an object is, read from its content."""

    media_type: str
    width: int | None = None
    height: int | None = None


@dataclass
class Received:
    """A body copied aside: an unnamed temporary file (close it), its size and sha256."""

    file: IO[bytes]
    size: int
    sha256: str

    def close(self) -> None:
        self.file.close()


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


def sniff(head: bytes) -> str | None:
    """The media type the first bytes announce, or None when they announce none we know."""
    for magic, media_type in _MAGIC:
        if head.startswith(magic):
            return media_type
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def inspect(file: IO[bytes]) -> Facts:
    """The media type (and, for an image, its dimensions) of ``file``'s content; raises
    :class:`NotRecognised`. An image is decoded completely by the decoder its magic bytes
    name, after its declared size is checked against ``IMAGE_MAX_PIXELS``: a truncated or
    corrupt image, or one whose bytes do not match its magic, is refused."""
    file.seek(0)
    media_type = sniff(file.read(64))
    if media_type is None:
        raise NotRecognised("the content is not of a known media type")
    pillow_format = PILLOW_FORMATS.get(media_type)
    if pillow_format is None:
        return Facts(media_type=media_type)
    limit = image_max_pixels()
    try:
        file.seek(0)
        with warnings.catch_warnings():
            # Pillow warns (and errors past twice the limit) about huge images; the explicit
            # check below refuses them before decoding, whatever Pillow's own setting.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(file, formats=[pillow_format]) as image:
                width, height = image.size
                if width <= 0 or height <= 0 or width * height > limit:
                    raise NotRecognised(f"the image is {width}×{height} pixels (at most {limit} pixels)")
                image.verify()
            file.seek(0)
            with Image.open(file, formats=[pillow_format]) as image:
                # verify() checks structure only (chunk checksums); decoding every pixel
                # finds truncated or corrupt data as well.
                image.load()
    except NotRecognised:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # The exception's class only: its message can quote bytes of the file.
        raise NotRecognised(f"the content is not a valid {media_type} image ({type(exc).__name__})") from None
    return Facts(media_type=media_type, width=width, height=height)


def receive_bounded(chunks: Iterable[bytes], *, limit: int) -> Received:
    """Copy ``chunks`` into an unnamed temporary file, counting and hashing; raise
    :class:`ObjectTooLarge` as soon as more than ``limit`` bytes arrived (the file is
    closed and gone: it never had a name)."""
    file = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise ObjectTooLarge(limit)
            digest.update(chunk)
            file.write(chunk)
    except BaseException:
        file.close()
        raise
    file.seek(0)
    return Received(file=file, size=size, sha256=digest.hexdigest())


def stream_chunks(stream: Readable, *, limit: int) -> Iterable[bytes]:
    """Read ``stream`` in chunks, never asking for more than one byte past ``limit`` in all
    (enough to know it was passed)."""
    remaining = limit + 1
    while remaining > 0:
        chunk = stream.read(min(CHUNK_BYTES, remaining))
        if not chunk:
            return
        remaining -= len(chunk)
        yield chunk


def object_name(*, kind: str, tenant_id: int, sha256: str) -> str:
    """Where an object goes: per tenant and digest, with a random suffix so two writers of
    the same bytes never write one file (the database row, unique per tenant and digest or
    per operation, decides which one stays)."""
    return f"{kind}/{tenant_id}/{sha256[:2]}/{sha256}-{secrets.token_hex(4)}"


def object_save(storage: Storage, *, name: str, file: IO[bytes]) -> str:
    """Store ``file`` under ``name`` (or the name the storage chose); returns it."""
    file.seek(0)
    return storage.save(name, File(file, name=name))


def object_delete(storage: Storage, name: str) -> None:
    """Delete an object; one already gone is fine (deletes are repeated after crashes)."""
    if name:
        storage.delete(name)


def objects_delete_on_commit(names: list[str]) -> None:
    """Delete objects of the objects storage once the caller's transaction commits (their
    rows are deleted in it): a crash in between leaves an object no row names — unreachable
    — never a row without its bytes. A failed delete is logged, never raised into the
    committed caller."""

    def delete() -> None:
        storage = objects_storage()
        for name in names:
            try:
                object_delete(storage, name)
            except Exception as exc:
                log.warning("object_delete_failed error=%s", type(exc).__name__)

    if names:
        transaction.on_commit(delete)


# --- Leftovers of crashes ---------------------------------------------------------------------

# Objects younger than this are never swept: an upload or a publish writes its object just
# before it inserts the row that names it.
SWEEP_GRACE_SECONDS = 3600
SWEEP_MAX_FILES = 10_000


def _walk(storage: Storage, folder: str, budget: list[int]) -> Iterator[str]:
    """Every file name under ``folder``, depth first, at most ``budget[0]`` of them."""
    try:
        folders, files = storage.listdir(folder)
    except FileNotFoundError:
        return
    for name in sorted(files):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        yield f"{folder}/{name}" if folder else name
    for sub in sorted(folders):
        yield from _walk(storage, f"{folder}/{sub}" if folder else sub, budget)


def _older_than(storage: Storage, name: str, cutoff: datetime) -> bool:
    try:
        return storage.get_modified_time(name) < cutoff
    except (FileNotFoundError, NotImplementedError):
        return False


def objects_sweep(*, grace_seconds: int = SWEEP_GRACE_SECONDS, max_files: int = SWEEP_MAX_FILES) -> dict[str, int]:
    """Delete what a crash left behind, older than ``grace_seconds``: objects of the objects
    storage that no Upload or OperationOutput row names (a process killed between writing an
    object and inserting its row), and every quarantined copy (a process killed mid-check).
    Bounded: at most ``max_files`` names looked at per storage and pass."""
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    counts = {"orphans_deleted": 0, "quarantined_deleted": 0, "looked_at": 0}
    storage = objects_storage()
    budget = [max_files]
    for kind, model in (("uploads", Upload), ("outputs", OperationOutput)):
        names = list(_walk(storage, kind, budget))
        counts["looked_at"] += len(names)
        for start in range(0, len(names), 500):
            batch = names[start : start + 500]
            named = set(model.objects.filter(storage_name__in=batch).values_list("storage_name", flat=True))
            for name in batch:
                if name not in named and _older_than(storage, name, cutoff):
                    object_delete(storage, name)
                    counts["orphans_deleted"] += 1
    quarantine = quarantine_storage()
    budget = [max_files]
    for name in list(_walk(quarantine, "", budget)):
        counts["looked_at"] += 1
        if _older_than(quarantine, name, cutoff):
            object_delete(quarantine, name)
            counts["quarantined_deleted"] += 1
    if counts["orphans_deleted"] or counts["quarantined_deleted"]:
        log.info("objects_swept orphans=%s quarantined=%s", counts["orphans_deleted"], counts["quarantined_deleted"])
    return counts
