"""The access log's chain: keyed, anchored, and not shorter than the platform allows.

* **Keyed.** Each row's ``hash`` is HMAC-SHA256 over the canonical row (``prev_hash``
  included) under the access-log key named by the row's ``key_id``. The key lives outside
  the database: ``ONCEGUARD_ACCESSLOG_KEYS`` (``<id>:<secret>,…``, first = current, the
  others still verify), else the file ``ONCEGUARD_ACCESSLOG_KEY_FILE``, else
  ``var/accesslog.key``, created once with mode 600 (``make run`` creates it up front). Someone
  who can write the database but not read that key cannot forge or re-chain a row.
* **Old rows still verify.** Rows written before the key existed are ``v1`` (plain sha256, the
  first format). Migration review.0006 seals each tenant's v1 head with a signed ``legacy``
  checkpoint; a v1 row beyond it — a forged row with a recomputed unkeyed hash — is reported.
  The first v2 row links to the last v1 row's hash like any other.
* **Anchored.** Checkpoints (review.models.AccessLogCheckpoint) sign the head (seq, hash)
  per tenant, numbered without gaps: written by a django-q2 schedule
  (``ONCEGUARD_ACCESS_LOG["CHECKPOINT_MINUTES"]``, and at least every ``HEARTBEAT_HOURS``
  even when nothing happened) and by every purge (``purge`` checkpoints are the anchors a
  chain verifies from). ``accesslog_verify`` reports a checkpointed row that is gone
  (truncation, deleted tail rows), a checkpoint missing or forged, rows left uncovered longer
  than a checkpoint interval plus ``GRACE_MINUTES``, and checkpoints that stopped coming.
* **Witnessed as it moves.** Every appended row's (tenant, seq, id, hash) goes to the
  structured log stream once its transaction commits (``accesslog_witness`` lines of the
  ``onceguard.accesslog.witness`` logger, always at INFO), i.e. outside the database as soon
  as it is written. ``accesslog_verify --log FILE`` (review.audit.accesslog_witness) checks the
  database against those lines, so deleting the newest rows — which a checkpoint has not
  signed yet, up to ``CHECKPOINT_MINUTES`` — is reported as soon as it is done. Without the
  log, rows appended since the last checkpoint are protected by the chain only: deleting
  them *and* every later row within one interval is then undetectable.
* **Not shorter than the platform allows.** ``MIN_RETENTION_DAYS`` is the floor under every
  tenant's access-log retention: a policy below it is refused (console form and service),
  and the purge never deletes a younger row whatever a policy says.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.utils import timezone

from ledger.platform import env
from ledger.platform.logs import get_logger
from ledger.platform.redaction import scrub
from ledger.platform.secret_files import write_secret_file
from review.models import AccessLog, AccessLogCheckpoint, CheckpointKind

log = logging.getLogger("onceguard.accesslog")
# Its own logger, kept at INFO whatever LOG_LEVEL says (ledger.platform.logs): the lines are evidence.
witness_log = get_logger("onceguard.accesslog.witness")
WITNESS_EVENT = "accesslog_witness"

GENESIS = "0" * 64
V1, V2 = "v1", "v2"
KEYS_ENV = "ONCEGUARD_ACCESSLOG_KEYS"
KEY_FILE_ENV = "ONCEGUARD_ACCESSLOG_KEY_FILE"
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MIN_SECRET_LENGTH = 32
# Domain separation: a row's MAC can never be replayed as a checkpoint's, or the reverse.
_ROW_CONTEXT = b"onceguard/accesslog-row/v2\n"
_CHECKPOINT_CONTEXT = b"onceguard/accesslog-checkpoint/v1\n"


def accesslog_setting(name: str, default: Any) -> Any:
    return getattr(settings, "ONCEGUARD_ACCESS_LOG", {}).get(name, default)


def access_log_min_retention() -> timedelta:
    """The platform's floor under every tenant's access-log retention."""
    return timedelta(days=int(accesslog_setting("MIN_RETENTION_DAYS", 365)))


# --- The key ------------------------------------------------------------------------------------


class AccessLogKeyError(RuntimeError):
    """The access-log key is missing or malformed."""


@dataclass(frozen=True)
class AccessLogKeys:
    ids: tuple[str, ...]
    secrets: dict[str, bytes]
    source: str

    @property
    def current_id(self) -> str:
        return self.ids[0]


_lock = threading.Lock()
_cache: dict[str, AccessLogKeys] = {}


def key_file_path() -> Path:
    return Path(env.read(KEY_FILE_ENV) or Path(settings.VAR_DIR) / "accesslog.key")


def accesslog_key_ensure() -> Path | None:
    """Create the key file when no key is configured and none exists yet; its path (None
    when the key comes from the environment). Never prints or logs the key."""
    if env.read(KEYS_ENV).strip():
        return None
    path = key_file_path()
    if not path.exists() and write_secret_file(path, f"al1:{secrets.token_urlsafe(48)}\n"):
        log.warning("accesslog_key_generated path=%s (back this file up; set %s in production)", path, KEYS_ENV)
    return path


def _parse_keys(spec: str, source: str) -> AccessLogKeys:
    ids: list[str] = []
    found: dict[str, bytes] = {}
    for part in [p.strip() for p in spec.replace("\n", ",").split(",") if p.strip()]:
        key_id, sep, secret = part.partition(":")
        if not sep or not _KEY_ID_RE.match(key_id):
            raise AccessLogKeyError(f"Access-log keys in {source} are <id>:<secret> (id: letters, digits, _ and -).")
        if len(secret) < MIN_SECRET_LENGTH:
            raise AccessLogKeyError(f"Access-log key {key_id!r} in {source} is shorter than {MIN_SECRET_LENGTH}.")
        if key_id in found:
            raise AccessLogKeyError(f"Access-log key id {key_id!r} appears twice in {source}.")
        ids.append(key_id)
        found[key_id] = secret.encode()
    if not ids:
        raise AccessLogKeyError(f"No access-log key in {source}.")
    return AccessLogKeys(tuple(ids), found, source)


def accesslog_keys() -> AccessLogKeys:
    """The configured access-log keys (cached per process and per configuration)."""
    spec = env.read(KEYS_ENV).strip()
    cache_key = spec or f"file:{key_file_path()}"
    cached = _cache.get(cache_key)
    if cached is not None:
        return cached
    with _lock:
        source = KEYS_ENV
        if not spec:
            path = accesslog_key_ensure()
            assert path is not None
            spec, source = path.read_text().strip(), str(path)
        keys = _parse_keys(spec, source)
        _cache.clear()
        _cache[cache_key] = keys
    return keys


def _mac(key_id: str, context: bytes, text: str) -> str | None:
    secret = accesslog_keys().secrets.get(key_id)
    if secret is None:
        return None
    return hmac.new(secret, context + text.encode(), "sha256").hexdigest()


# --- Rows ------------------------------------------------------------------------------------------


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def _row_document(row: AccessLog) -> dict[str, Any]:
    return {
        "tenant": row.tenant_id,
        "seq": row.seq,
        "at": _iso(row.at),
        "action": row.action,
        "actor": row.actor,
        "user_id": row.user_id_at_time,
        "object_type": row.object_type,
        "object_id": row.object_id,
        "object_ref": row.object_ref,
        "fields": list(row.fields or []),
        "reason": row.reason,
        "ip": row.ip,
        "prev_hash": row.prev_hash,
    }


def _canonical(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_access_row(row: AccessLog) -> str:
    """The v1 canonical form (kept byte for byte: the rows written with it must verify)."""
    return _canonical(_row_document(row))


def access_row_hash_v1(row: AccessLog) -> str:
    return hashlib.sha256(canonical_access_row(row).encode()).hexdigest()


def _canonical_v2(row: AccessLog) -> str:
    # The version and key id are inside the MAC: a row cannot be relabelled.
    return _canonical({**_row_document(row), "v": V2, "key_id": row.key_id})


def access_row_hash(row: AccessLog) -> str | None:
    """What ``row.hash`` must be for its version; None when its key is not configured."""
    if row.chain_version == V1:
        return access_row_hash_v1(row)
    if row.chain_version == V2:
        return _mac(row.key_id, _ROW_CONTEXT, _canonical_v2(row))
    return None


def lock_chain(tenant_id: int) -> None:
    """One writer per tenant chain at a time, until the caller's transaction ends. SQLite
    transactions BEGIN IMMEDIATE (the write lock); the unique (tenant, seq) backs both up."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [0x0A11CE, int(tenant_id)])


def chain_anchor(tenant_id: int) -> tuple[int, str]:
    """(seq, hash) of the last row purged from the tenant's chain, or (0, genesis): the
    newest ``purge`` checkpoint (signed; verify checks the signature)."""
    cp = (
        AccessLogCheckpoint.objects.filter(tenant_id=tenant_id, kind=CheckpointKind.PURGE)
        .order_by("-seq")
        .values("seq", "hash")
        .first()
    )
    if cp is None:
        return 0, GENESIS
    return int(cp["seq"]), cp["hash"]


def _head(tenant_id: int) -> tuple[int, str]:
    last = AccessLog.objects.filter(tenant_id=tenant_id).order_by("-seq").values("seq", "hash").first()
    if last is None:
        return chain_anchor(tenant_id)
    return int(last["seq"]), last["hash"]


def normalize_ip(ip: str | None) -> str | None:
    if not ip:
        return None
    try:
        return ipaddress.ip_address(ip.strip()).compressed
    except ValueError:
        return None


def accesslog_append(
    *,
    tenant_id: int,
    action: str,
    actor: str,
    object_type: str,
    object_id: str = "",
    object_ref: str = "",
    fields: Iterable[str] = (),
    reason: str,
    ip: str | None = None,
    user_id: int | None = None,
) -> AccessLog:
    """Append one row to the tenant's chain (in the caller's transaction when there is one)."""
    key_id = accesslog_keys().current_id
    with transaction.atomic():
        lock_chain(tenant_id)
        seq, prev = _head(tenant_id)
        row = AccessLog(
            tenant_id=tenant_id,
            seq=seq + 1,
            at=timezone.now(),
            action=action,
            actor=actor[:150],
            user_id_at_time=user_id,
            object_type=object_type[:50],
            object_id=str(object_id)[:64],
            object_ref=str(object_ref)[:255],
            fields=sorted(set(fields)),
            # Masked like stored error text: a reason is typed by a person, and a row of
            # this chain can never be edited later (an erasure cannot reach it).
            reason=scrub(" ".join(reason.split()))[:500],
            ip=normalize_ip(ip),
            prev_hash=prev,
            chain_version=V2,
            key_id=key_id,
        )
        row.hash = access_row_hash(row)
        row.save(force_insert=True)
        # After the commit only: a row rolled back with its caller's transaction was never
        # in the chain, and a witness of it would read as a deleted row.
        transaction.on_commit(lambda: accesslog_witness(row))
    log.info(
        "access_logged tenant=%s seq=%s action=%s actor=%s object=%s:%s",
        tenant_id,
        row.seq,
        action,
        actor,
        object_type,
        object_id,
    )
    return row


def accesslog_witness(row: AccessLog) -> None:
    """One line outside the database per appended row: where the chain's head now is. Ids
    and the keyed hash only — nothing about who did what (the row's content stays in the
    database; the hash cannot be recomputed or forged without the access-log key)."""
    witness_log.info(WITNESS_EVENT, tenant=row.tenant_id, seq=row.seq, id=row.pk, hash=row.hash)


# --- Checkpoints -------------------------------------------------------------------------------------


def checkpoint_text(*, tenant_id: int, n: int, kind: str, seq: int, hash: str, at: datetime, key_id: str) -> str:
    return json.dumps(
        {"tenant": tenant_id, "n": n, "kind": kind, "seq": seq, "hash": hash, "at": _iso(at), "key_id": key_id},
        sort_keys=True,
        separators=(",", ":"),
    )


def checkpoint_signature(
    *, tenant_id: int, n: int, kind: str, seq: int, hash: str, at: datetime, key_id: str
) -> str | None:
    text = checkpoint_text(tenant_id=tenant_id, n=n, kind=kind, seq=seq, hash=hash, at=at, key_id=key_id)
    return _mac(key_id, _CHECKPOINT_CONTEXT, text)


def checkpoint_write(
    *,
    tenant_id: int,
    kind: str,
    seq: int,
    hash: str,
    model: type[models.Model] = AccessLogCheckpoint,
    at: datetime | None = None,
) -> models.Model:
    """Append a signed checkpoint (the caller holds the chain's lock). ``model`` lets
    migration review.0006 write with its historical model."""
    last_n = model.objects.filter(tenant_id=tenant_id).order_by("-n").values_list("n", flat=True).first() or 0
    key_id = accesslog_keys().current_id
    at = at or timezone.now()
    n = int(last_n) + 1
    return model.objects.create(
        tenant_id=tenant_id,
        n=n,
        kind=kind,
        seq=seq,
        hash=hash,
        at=at,
        key_id=key_id,
        signature=checkpoint_signature(tenant_id=tenant_id, n=n, kind=kind, seq=seq, hash=hash, at=at, key_id=key_id),
    )


def verified_purge_anchor(tenant_id: int) -> tuple[int, str]:
    """(seq, hash) of the tenant's newest ``purge`` checkpoint whose signature holds, or
    (0, genesis): rows at or below it were purged by retention, not deleted."""
    for cp in AccessLogCheckpoint.objects.filter(tenant_id=tenant_id, kind=CheckpointKind.PURGE).order_by("-seq"):
        wanted = checkpoint_signature(
            tenant_id=cp.tenant_id, n=cp.n, kind=cp.kind, seq=cp.seq, hash=cp.hash, at=cp.at, key_id=cp.key_id
        )
        if wanted is not None and hmac.compare_digest(wanted, cp.signature):
            return int(cp.seq), cp.hash
    return 0, GENESIS


def _heartbeat() -> timedelta:
    return timedelta(hours=float(accesslog_setting("CHECKPOINT_HEARTBEAT_HOURS", 24)))


def accesslog_checkpoint(*, tenant_id: int, force: bool = False) -> AccessLogCheckpoint | None:
    """Sign the tenant's head now: when it moved since the last checkpoint, when that one
    is older than the heartbeat, or when ``force``. None when nothing was written."""
    with transaction.atomic():
        lock_chain(tenant_id)
        seq, hash_ = _head(tenant_id)
        if seq == 0:
            return None
        last = AccessLogCheckpoint.objects.filter(tenant_id=tenant_id).order_by("-n").first()
        if (
            not force
            and last is not None
            and (last.seq, last.hash) == (seq, hash_)
            and last.at > timezone.now() - _heartbeat()
        ):
            return None
        cp = checkpoint_write(tenant_id=tenant_id, kind=CheckpointKind.HEAD, seq=seq, hash=hash_)
    log.info("accesslog_checkpoint tenant=%s n=%s seq=%s", tenant_id, cp.n, seq)
    return cp


def _chain_tenants() -> set[int]:
    return set(AccessLog.objects.values_list("tenant_id", flat=True).distinct()) | set(
        AccessLogCheckpoint.objects.values_list("tenant_id", flat=True).distinct()
    )


def accesslog_checkpoint_all(*, force: bool = False) -> int:
    """One checkpoint pass over every tenant with a chain; how many were written."""
    return sum(1 for t in sorted(_chain_tenants()) if accesslog_checkpoint(tenant_id=t, force=force) is not None)


def accesslog_seal_legacy(*, access_log_model: Any, checkpoint_model: Any, retention_run_model: Any) -> int:
    """Sign what exists of the unkeyed (v1) chains, once, when the keyed chain begins
    (migration review.0006, with its historical models): per tenant, the purge anchor its
    RetentionRuns recorded (unsigned until now) as a ``purge`` checkpoint, and the head of
    its v1 rows as a ``legacy`` checkpoint. Returns the tenants sealed."""
    tenants = sorted(set(access_log_model.objects.values_list("tenant_id", flat=True).distinct()))
    for tenant_id in tenants:
        run = (
            retention_run_model.objects.filter(tenant_id=tenant_id, accesslog_anchor_seq__isnull=False)
            .order_by("-accesslog_anchor_seq")
            .values("accesslog_anchor_seq", "accesslog_anchor_hash")
            .first()
        )
        if run is not None:
            checkpoint_write(
                tenant_id=tenant_id,
                kind=CheckpointKind.PURGE,
                seq=int(run["accesslog_anchor_seq"]),
                hash=run["accesslog_anchor_hash"],
                model=checkpoint_model,
            )
        head = access_log_model.objects.filter(tenant_id=tenant_id).order_by("-seq").values("seq", "hash").first()
        checkpoint_write(
            tenant_id=tenant_id,
            kind=CheckpointKind.LEGACY,
            seq=int(head["seq"]),
            hash=head["hash"],
            model=checkpoint_model,
        )
    return len(tenants)


# --- Verify ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProblem:
    tenant_id: int
    seq: int | None
    problem: str


def _grace() -> timedelta:
    minutes = float(accesslog_setting("CHECKPOINT_MINUTES", 15)) + float(accesslog_setting("GRACE_MINUTES", 60))
    return timedelta(minutes=minutes)


def _verify_checkpoints(tenant_id: int, problems: list[ChainProblem]) -> list[AccessLogCheckpoint]:
    """The tenant's checkpoints whose signature holds, in order; every other one reported."""
    valid: list[AccessLogCheckpoint] = []
    expected_n = 1
    for cp in AccessLogCheckpoint.objects.filter(tenant_id=tenant_id).order_by("n"):
        if cp.n != expected_n:
            problems.append(
                ChainProblem(tenant_id, None, f"checkpoint #{expected_n} is missing (next is #{cp.n}): deleted")
            )
        expected_n = cp.n + 1
        wanted = checkpoint_signature(
            tenant_id=cp.tenant_id, n=cp.n, kind=cp.kind, seq=cp.seq, hash=cp.hash, at=cp.at, key_id=cp.key_id
        )
        if wanted is None:
            problems.append(ChainProblem(tenant_id, cp.seq, f"checkpoint #{cp.n}: key {cp.key_id!r} not configured"))
        elif not hmac.compare_digest(wanted, cp.signature):
            problems.append(ChainProblem(tenant_id, cp.seq, f"checkpoint #{cp.n}: signature does not match (forged)"))
        else:
            valid.append(cp)
    return valid


def _verify_tenant(tenant_id: int, now: datetime, problems: list[ChainProblem]) -> int:
    checkpoints = _verify_checkpoints(tenant_id, problems)
    purges = [cp for cp in checkpoints if cp.kind == CheckpointKind.PURGE]
    anchor = max(purges, key=lambda cp: cp.seq) if purges else None
    anchor_seq, anchor_hash = (anchor.seq, anchor.hash) if anchor else (0, GENESIS)
    legacy_seq = max((cp.seq for cp in checkpoints if cp.kind == CheckpointKind.LEGACY), default=0)
    # Rows a checkpoint vouched for and that are not purged must still be there, unchanged.
    vouched: dict[int, list[AccessLogCheckpoint]] = {}
    for cp in checkpoints:
        if cp.kind != CheckpointKind.PURGE and cp.seq > anchor_seq:
            vouched.setdefault(cp.seq, []).append(cp)
    covered_to = max((cp.seq for cp in checkpoints), default=0)
    stale_before = now - _grace()
    uncovered_old = 0
    checked = 0
    expected_seq, expected_prev = anchor_seq + 1, anchor_hash
    for row in AccessLog.objects.filter(tenant_id=tenant_id).order_by("seq").iterator(chunk_size=2000):
        checked += 1
        if row.seq <= anchor_seq:
            problems.append(ChainProblem(tenant_id, row.seq, f"row at or below the purge anchor (seq {anchor_seq})"))
            continue
        if row.seq != expected_seq:
            problems.append(ChainProblem(tenant_id, row.seq, f"expected seq {expected_seq}: rows missing"))
        if row.prev_hash != expected_prev:
            problems.append(ChainProblem(tenant_id, row.seq, "prev_hash does not match the previous row"))
        wanted = access_row_hash(row)
        if row.chain_version == V1 and row.seq > legacy_seq:
            problems.append(ChainProblem(tenant_id, row.seq, "unkeyed (v1) row where only keyed rows may be: forged"))
        elif row.chain_version not in (V1, V2):
            problems.append(ChainProblem(tenant_id, row.seq, f"unknown chain version {row.chain_version!r}"))
        elif wanted is None:
            problems.append(ChainProblem(tenant_id, row.seq, f"access-log key {row.key_id!r} is not configured"))
        elif not hmac.compare_digest(wanted, row.hash):
            problems.append(ChainProblem(tenant_id, row.seq, "row content does not match its hash (edited)"))
        for cp in vouched.pop(row.seq, []):
            if cp.hash != row.hash:
                problems.append(ChainProblem(tenant_id, row.seq, f"row differs from checkpoint #{cp.n} (replaced)"))
        if row.seq > covered_to and row.at < stale_before:
            uncovered_old += 1
        expected_seq, expected_prev = row.seq + 1, row.hash
    for seq, cps in sorted(vouched.items()):
        problems.append(
            ChainProblem(
                tenant_id, seq, f"row {seq} (checkpoint #{cps[0].n}) is gone: the log was truncated or rows deleted"
            )
        )
    if uncovered_old:
        problems.append(
            ChainProblem(
                tenant_id,
                None,
                f"{uncovered_old} row(s) older than {stale_before:%Y-%m-%d %H:%M} UTC are covered by no checkpoint:"
                " the checkpoint schedule is not running, or newer checkpoints were deleted",
            )
        )
    if checkpoints and checkpoints[-1].at < now - _heartbeat() - _grace():
        problems.append(
            ChainProblem(
                tenant_id,
                None,
                f"the newest checkpoint (#{checkpoints[-1].n}) is from {checkpoints[-1].at:%Y-%m-%d %H:%M} UTC:"
                " the checkpoint schedule is not running, or newer checkpoints were deleted",
            )
        )
    return checked


def accesslog_verify(*, tenant_ids: list[int] | None = None) -> tuple[int, list[ChainProblem]]:
    """Recompute every tenant's chain and check it against its checkpoints: (rows checked,
    problems). Empty problems = intact. Tenants with checkpoints but no rows are checked too
    (a truncated log is not an empty one)."""
    checked = 0
    problems: list[ChainProblem] = []
    now = timezone.now()
    tenants = _chain_tenants()
    if tenant_ids is not None:
        tenants &= set(tenant_ids)
    for tenant_id in sorted(tenants):
        checked += _verify_tenant(tenant_id, now, problems)
    return checked, problems
