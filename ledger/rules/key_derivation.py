"""Keys derived from personal data: "hash this field into the key" (DESIGN §3, keys).

A workflow whose only stable name for a lead is its e-mail address or phone number may not put
that value in a key (ledger.rules.key_rules, rule ``personal_data``: keys are logged and shown in
clear). It asks the service for a key derived from it instead: ``POST /api/v1/keys/derive``
answers ``<prefix>:<key id>:<digest>``, where the digest is HMAC-SHA256 over the tenant's id
and the value (or several named fields), under a **dedicated key that never rotates** — the
same lead must get the same key next month, or it would be charged twice. The key id in the
derived key names the secret used, so a deployment that must replace it (a leak) starts a new
key space that says so, instead of silently changing every lead's key.

The secret is ``ONCEGUARD_KEY_DERIVATION_KEY`` (``<id>:<secret>``, one key only), else the file
``var/key-derivation.key`` (mode 600, made once, id ``h1``); never in the database, never the
payload encryption keys (those rotate). The value is never logged, stored or echoed: an error
names the field, never its content. The tenant's id goes into the HMAC, so two tenants deriving
from the same address get unrelated keys.

Imports no app.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from ledger.platform import env
from ledger.platform.errors import ValidationFailed
from ledger.platform.secret_files import write_secret_file

log = logging.getLogger("onceguard.ledger")

KEY_ENV = "ONCEGUARD_KEY_DERIVATION_KEY"
FILE_KEY_ID = "h1"
MIN_SECRET_LENGTH = 32
_KEY_ID_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# Domain separation: a derived key's digest is never another HMAC of the service.
_CONTEXT = b"onceguard/key-derive/v1\n"
# 160 bits: 32 base32 characters, no padding.
DIGEST_BYTES = 20

PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_VALUE_LENGTH = 10_000
MAX_PARTS = 20
_PART_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class KeyDerivationKeyError(RuntimeError):
    """The derivation key is missing or malformed (a deployment error, not a caller's)."""


@dataclass(frozen=True)
class DerivationKey:
    key_id: str
    secret: bytes
    source: str


_lock = threading.Lock()
_cache: dict[str, DerivationKey] = {}


def key_file_path() -> Path:
    return Path(settings.VAR_DIR) / "key-derivation.key"


def _parse(spec: str, source: str) -> DerivationKey:
    key_id, sep, secret = spec.strip().partition(":")
    if not sep or not _KEY_ID_RE.match(key_id):
        raise KeyDerivationKeyError(
            f"The key-derivation key in {source} is <id>:<secret> (id: a lowercase letter, then up to 7"
            " lowercase letters or digits)."
        )
    if "," in secret or len(secret) < MIN_SECRET_LENGTH:
        raise KeyDerivationKeyError(
            f"The key-derivation key in {source} is one key of at least {MIN_SECRET_LENGTH} characters."
        )
    return DerivationKey(key_id, secret.encode(), source)


def derivation_key() -> DerivationKey:
    """The configured derivation key (cached per process and per configuration); the file is
    made on first use where the environment names none."""
    spec = env.read(KEY_ENV).strip()
    cache_key = spec or f"file:{settings.VAR_DIR}"
    cached = _cache.get(cache_key)
    if cached is not None:
        return cached
    with _lock:
        if spec:
            found = _parse(spec, KEY_ENV)
        else:
            path = key_file_path()
            if not path.exists() and write_secret_file(path, f"{FILE_KEY_ID}:{secrets.token_urlsafe(48)}\n"):
                log.warning(
                    "key_derivation_key_generated path=%s (back this file up; set %s in production)", path, KEY_ENV
                )
            found = _parse(path.read_text(), str(path))
        _cache[cache_key] = found
        return found


def _material(*, value: Any, parts: Any) -> bytes:
    """The canonical bytes of what is hashed: a value, or named fields (sorted by name).
    Errors name the field, never its content."""
    if (value is None) == (parts is None):
        raise ValidationFailed("Send either `value` (one string) or `parts` (named fields), not both.")
    if value is not None:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_VALUE_LENGTH:
            raise ValidationFailed(f"`value` must be a string of 1 to {MAX_VALUE_LENGTH} characters.")
        return json.dumps({"value": value}, ensure_ascii=False, separators=(",", ":")).encode()
    if not isinstance(parts, dict) or not 0 < len(parts) <= MAX_PARTS:
        raise ValidationFailed(f"`parts` must be an object of 1 to {MAX_PARTS} named fields.")
    for name, part in parts.items():
        if not _PART_NAME_RE.match(name):
            raise ValidationFailed("A field name in `parts` must be 1 to 64 letters, digits, `_`, `.` or `-`.")
        if isinstance(part, bool) or not isinstance(part, (str, int)) or part == "":
            raise ValidationFailed(f"The field `{name}` of `parts` must be a non-empty string or an integer.")
        if isinstance(part, str) and len(part) > MAX_VALUE_LENGTH:
            raise ValidationFailed(f"The field `{name}` of `parts` is longer than {MAX_VALUE_LENGTH} characters.")
    return json.dumps({"parts": parts}, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def key_derive(*, tenant_id: int, prefix: str = "", value: Any = None, parts: Any = None) -> str:
    """The key derived from ``value`` (or ``parts``) for the tenant: ``<prefix>:<key id>:<digest>``
    (``<key id>:<digest>`` without a prefix). The same input always gives the same key; the value
    itself is not recoverable from it and is never logged."""
    if prefix and not PREFIX_RE.match(prefix):
        raise ValidationFailed(
            "`prefix` must be 1 to 64 letters, digits, `.`, `_` or `-`, beginning with one of the first two."
        )
    material = _material(value=value, parts=parts)
    key = derivation_key()
    mac = hmac.new(key.secret, _CONTEXT + str(tenant_id).encode() + b"\n" + material, hashlib.sha256).digest()
    digest = base64.b32encode(mac[:DIGEST_BYTES]).decode().lower()
    # What was derived, never from what: the prefix, the key id and the field names only.
    log.info(
        "key_derived tenant=%s prefix=%s key_id=%s fields=%s",
        tenant_id,
        prefix or "-",
        key.key_id,
        ",".join(sorted(parts)) if isinstance(parts, dict) else "value",
    )
    return f"{prefix}:{key.key_id}:{digest}" if prefix else f"{key.key_id}:{digest}"
