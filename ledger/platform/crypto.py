"""Encryption at rest for payloads and recorded responses, and keyed digests of identifiers.

Ciphertext lives inside the existing JSON columns as ``{"_enc": "v2:<key id>:<token>"}``
so no table changes shape: a sealed value is still valid JSON, a plain value (written before
encryption was turned on) still reads. (On PostgreSQL the operation's and attempt's columns
store the envelope as its raw bytes, ledger.models.SealedJSONField; what they give back is this
envelope.) Code that needs plaintext calls :func:`open_json`;
everything else (lists, exports, logs) only ever sees the envelope.

Keys come from ``ONCEGUARD_ENCRYPTION_KEYS``: comma-separated ``<id>:<fernet key>`` (or a
bare Fernet key, whose id is derived from it); the first is the current key, the others
still decrypt (rotation: prepend a new key, run ``manage.py encryption_rotate``, then drop
the old one). Without the variable the embedded default generates ``var/encryption.key``
once and says where it is — back that file up, or the payloads are gone with it.

Subject digests (the data-subject index, the digest kept after redaction) are HMAC-SHA256
under a key derived from each encryption key, tagged with that key's id, so a phone number
can never be guessed from a bare hash and rotation never loses a search.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import phonenumbers
from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import transaction

from ledger.platform import env, hooks
from ledger.platform.secret_files import write_secret_file

log = logging.getLogger("onceguard.crypto")

ENVELOPE = "_enc"
REDACTED = "_redacted"
# v2: AES-256-GCM, 96-bit random nonce, the envelope's "v2:<key id>" as associated data,
# under a key derived from each configured Fernet key. v1 (Fernet tokens, the first format)
# still opens; `manage.py encryption_rotate` rewrites v1 values as v2. GCM: one primitive
# call per value instead of Fernet's AES-CBC + HMAC + timestamp (a tenth of the CPU of a
# completion went to Fernet); random nonces stay safe far beyond 2^32 values per key only
# with rotation, which the rotation command provides.
VERSION = "v2"
LEGACY_VERSION = "v1"
KEYS_ENV = "ONCEGUARD_ENCRYPTION_KEYS"
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class EncryptionKeyError(RuntimeError):
    """The configured keys cannot decrypt a value (wrong or missing key)."""


@dataclass(frozen=True)
class Keyring:
    ids: tuple[str, ...]
    fernets: dict[str, Fernet]
    hmac_keys: dict[str, bytes]
    source: str
    aeads: dict[str, AESGCM]

    @property
    def current_id(self) -> str:
        return self.ids[0]

    def multi(self) -> MultiFernet:
        return MultiFernet([self.fernets[i] for i in self.ids])


_lock = threading.Lock()
_cache: dict[str, Keyring] = {}


def _derived_id(raw: str) -> str:
    return "k" + hashlib.sha256(raw.encode()).hexdigest()[:8]


def _parse(spec: str, source: str) -> Keyring:
    ids: list[str] = []
    fernets: dict[str, Fernet] = {}
    hmac_keys: dict[str, bytes] = {}
    aeads: dict[str, AESGCM] = {}
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        key_id, sep, raw = part.partition(":")
        if not sep:
            key_id, raw = _derived_id(part), part
        if not _KEY_ID_RE.match(key_id):
            raise EncryptionKeyError(f"Bad key id {key_id!r} in {source} (letters, digits, _ and -, at most 32).")
        try:
            fernet = Fernet(raw.encode())
        except (ValueError, TypeError) as exc:
            raise EncryptionKeyError(f"Key {key_id!r} in {source} is not a Fernet key.") from exc
        if key_id in fernets:
            raise EncryptionKeyError(f"Key id {key_id!r} appears twice in {source}.")
        ids.append(key_id)
        fernets[key_id] = fernet
        # A separate key for digests: knowing a digest key never helps decrypt, and the
        # reverse. Derived, so one secret per key id is all an operator has to keep.
        secret = base64.urlsafe_b64decode(raw)
        hmac_keys[key_id] = hmac.new(secret, b"onceguard/subject-hmac/v1", "sha256").digest()
        aeads[key_id] = AESGCM(hmac.new(secret, b"onceguard/aead/v2", "sha256").digest())
    if not ids:
        raise EncryptionKeyError(f"No encryption key in {source}.")
    return Keyring(tuple(ids), fernets, hmac_keys, source, aeads)


def key_file_path() -> Path:
    return Path(settings.VAR_DIR) / "encryption.key"


def _embedded_spec() -> tuple[str, str]:
    path = key_file_path()
    if not path.exists():
        key_id = "local1"
        # Mode 600 and complete from birth (ledger.platform.secret_files): two processes starting at
        # once never write two different keys, and neither reads a half-written one.
        if write_secret_file(path, f"{key_id}:{Fernet.generate_key().decode()}\n"):
            log.warning("encryption_key_generated path=%s (back this file up; set %s in production)", path, KEYS_ENV)
    return path.read_text().strip().replace("\n", ","), str(path)


def keyring() -> Keyring:
    """The configured keys (cached per process and per configuration)."""
    spec = env.read(KEYS_ENV).strip()
    # Every seal and open asks for the ring: the key is kept cheap (no Path per call).
    cache_key = spec or f"file:{settings.VAR_DIR}"
    cached = _cache.get(cache_key)
    if cached is not None:
        return cached
    with _lock:
        source = KEYS_ENV
        if not spec:
            spec, source = _embedded_spec()
        ring = _parse(spec, source)
        _cache.clear()
        _cache[cache_key] = ring
    return ring


def encryption_enabled() -> bool:
    return bool(getattr(settings, "ONCEGUARD_PRIVACY", {}).get("ENCRYPT", True))


# --- Sealing JSON values ----------------------------------------------------------------------


def is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(ENVELOPE), str)


def is_redacted(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get(REDACTED), dict)


def seal_json(value: Any, *, always: bool = False) -> Any:
    """The envelope stored instead of ``value``. None stays None (nothing to protect);
    sealed or redacted values are returned as they are. ``always``: sealed even where
    payload encryption is switched off (credentials: ledger.providers.credentials)."""
    if value is None or is_sealed(value) or is_redacted(value) or not (always or encryption_enabled()):
        return value
    ring = keyring()
    blob = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    key_id = ring.current_id
    head = f"{VERSION}:{key_id}"
    nonce = os.urandom(12)
    sealed = nonce + ring.aeads[key_id].encrypt(nonce, blob, head.encode())
    return {ENVELOPE: f"{head}:{base64.urlsafe_b64encode(sealed).decode()}"}


def _split(envelope: str) -> tuple[str, str, str]:
    version, _, rest = envelope.partition(":")
    key_id, _, token = rest.partition(":")
    if version not in (VERSION, LEGACY_VERSION) or not key_id or not token:
        raise EncryptionKeyError("Unknown envelope format.")
    return version, key_id, token


def open_json(value: Any) -> Any:
    """The plaintext of a stored value; plain (legacy) and redacted values pass through."""
    if not is_sealed(value):
        return value
    version, key_id, token = _split(value[ENVELOPE])
    ring = keyring()
    try:
        if version == VERSION:
            aead = ring.aeads.get(key_id)
            if aead is None:
                raise EncryptionKeyError(f"No configured key decrypts a value sealed with key {key_id!r}.")
            sealed = base64.urlsafe_b64decode(token)
            blob = aead.decrypt(sealed[:12], sealed[12:], f"{version}:{key_id}".encode())
        else:
            fernet = ring.fernets.get(key_id)
            blob = fernet.decrypt(token.encode()) if fernet is not None else ring.multi().decrypt(token.encode())
    except (InvalidToken, InvalidTag, ValueError) as exc:
        raise EncryptionKeyError(f"No configured key decrypts a value sealed with key {key_id!r}.") from exc
    return json.loads(blob)


def key_id_of(value: Any) -> str | None:
    if not is_sealed(value):
        return None
    return _split(value[ENVELOPE])[1]


def reseal_json(value: Any, *, always: bool = False) -> Any:
    """Re-encrypt under the current key (rotation). Plain values get sealed. ``always``: as
    for :func:`seal_json` (secrets: sealed even where payload encryption is switched off)."""
    if value is None or is_redacted(value):
        return value
    if is_sealed(value) and value[ENVELOPE].startswith(f"{VERSION}:{keyring().current_id}:"):
        return value
    return seal_json(open_json(value), always=always)


# --- Keyed digests ---------------------------------------------------------------------------


def digest(text: str, *, key_id: str | None = None) -> tuple[str, str]:
    """(key id, hex HMAC-SHA256 of ``text``) under the current or the named key."""
    ring = keyring()
    kid = key_id or ring.current_id
    return kid, hmac.new(ring.hmac_keys[kid], text.encode(), "sha256").hexdigest()


def digests_all_keys(text: str) -> list[tuple[str, str]]:
    """The digest under every configured key: searches find rows indexed before a rotation."""
    return [digest(text, key_id=kid) for kid in keyring().ids]


def normalize_email(value: str) -> str:
    return value.strip().lower()


def normalize_phone(value: str, *, default_country_code: str | None = None, region: str | None = None) -> str:
    """E.164: ``+`` and digits. Read with ``phonenumbers``, so spaces, brackets, dashes and a
    national trunk prefix do not matter: with ``DEFAULT_PHONE_REGION=AU``, ``0412 345 678``,
    ``(04) 1234 5678``-style spellings and ``+61 412 345 678`` are one number. What it cannot
    read keeps the first rule: ``00`` becomes ``+``, a national number with one leading 0
    takes the configured default country code when there is one, otherwise ``+`` and the
    digits. The index and the search both call this, so they always agree."""
    raw = str(value).strip()
    digits = re.sub(r"\D", "", raw)
    if not digits:
        return ""
    text = "+" + digits[2:] if digits.startswith("00") and not raw.startswith("+") else raw
    region = (getattr(settings, "DEFAULT_PHONE_REGION", "") if region is None else region) or None
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        number = None
    if number is not None and phonenumbers.is_possible_number(number):
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    if raw.startswith("+"):
        return "+" + digits
    if digits.startswith("00"):
        return "+" + digits[2:]
    cc = default_country_code
    if cc is None:
        cc = str(
            getattr(settings, "ONCEGUARD_PRIVACY", {}).get("DEFAULT_COUNTRY_CODE")
            or env.read("ONCEGUARD_DEFAULT_COUNTRY_CODE")
        )
    if cc and digits.startswith("0") and not digits.startswith("00"):
        return "+" + cc + digits[1:]
    return "+" + digits


def normalize_identifier(kind: str, value: Any) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return ""
    if kind == "phone":
        return normalize_phone(str(value))
    if kind == "email":
        text = normalize_email(str(value))
        return text if "@" in text else ""
    return str(value).strip()


# --- Write-time hook ---------------------------------------------------------------------------


def payload_indexing_needed(values: list[Any]) -> bool:
    """Whether :func:`payload_written` has anything to do for ``values``: a value is stored
    and an index is connected. A write that answers False may skip its transaction."""
    return any(v is not None for v in values) and bool(hooks.payload_written.receivers)


def payload_written(*, tenant_id: int, record_type: str, record_id: int, values: list[Any], source: str = "") -> None:
    """Called by the services that store a payload: fills the data-subject index (keyed
    HMACs of the identifiers in it), so an auditor can find the record without decrypting.
    Never raises into the caller's write: a failure is logged (ids only, in its own
    savepoint) and the record is simply not findable by subject until indexed again.

    The index belongs to ``review.privacy.payloads``, which connects to ``hooks.payload_written``."""
    if not payload_indexing_needed(values):
        return
    try:
        # A savepoint: a failed index write must not poison the caller's transaction.
        with transaction.atomic():
            hooks.payload_written.send(
                tenant_id=tenant_id, record_type=record_type, record_id=record_id, values=values, source=source
            )
    except Exception as exc:  # indexing must not fail the write
        log.error("subject_index_failed record=%s:%s error=%s", record_type, record_id, type(exc).__name__)
