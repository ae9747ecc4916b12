"""What a claim is made of, checked and normalised: keys, runs, request fingerprints, leases,
error text and retry backoff; and the providers by id that the workers read.

Below ``ledger.protocol.transitions`` and ``ledger.protocol.services``, which both build on it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
from typing import Any

from django.conf import settings

from ledger.models import Operation, Tenant, Tombstone
from ledger.platform.errors import InvalidKey, ReservedKey, ValidationFailed
from ledger.platform.redaction import scrub
from ledger.platform.storable import MAX_DURATION_SECONDS
from ledger.rules.key_rules import PERSONAL_DATA, key_check, key_lookup_shape, key_refusal

MAX_MESSAGE_LENGTH = 500


# --- Inputs -----------------------------------------------------------------------------


def validate_key(key: Any) -> str:
    """A valid new key (ledger.rules.key_rules: 1–255 printable ASCII characters without surrounding
    blanks), else 400 ``invalid_idempotency_key`` naming the rule broken. The key is logged, so
    it must not carry personal data."""
    return key_check(key)


def claim_key_check(*, tenant_id: int, key: Any) -> str:
    """A caller's key for a claim or submission: a valid new key, or one the ledger holds (its
    row, or its tombstone once retention deleted the row) — a key stored before the rule keeps
    being answered. Only a key that breaks the rule costs the lookup. A key with personal data
    is valid where the tenant allows it (``Tenant.personal_data_in_keys_allowed``)."""
    refusal = key_refusal(key)
    if refusal is None:
        return key
    if (
        refusal.extra["rule"] == PERSONAL_DATA
        and Tenant.objects.filter(pk=tenant_id, personal_data_in_keys_allowed=True).exists()
    ):
        return key
    if key_lookup_shape(key) and (
        Operation.objects.filter(tenant_id=tenant_id, key=key).exists()
        or Tombstone.objects.filter(tenant_id=tenant_id, key=key).exists()
    ):
        return key
    raise refusal


# Versions are integers that fit the column; newer means larger.
MAX_VERSION = 2**31 - 1
# A key composed by versioned_key: {record}:{action}:v{version}.
VERSIONED_KEY = re.compile(r"^(?P<record>.+):(?P<action>[^:]+):v(?P<version>\d{1,10})$")


def key_version_parts(key: str) -> tuple[str, str, int] | None:
    """(record, action, version) of a key of versioned_key's form, else None."""
    match = VERSIONED_KEY.match(key)
    return None if match is None else (match["record"], match["action"], int(match["version"]))


def versioned_key(*, record: str, action: str, version: int) -> str:
    """The key of a claim or submission sent as parts: ``{record}:{action}:v{version}`` (the
    n8n node builds the same string), checked like any key."""
    if not record or not action or version is None:
        raise ValidationFailed("A versioned key needs `record`, `action` and `version` together.")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValidationFailed(f"`version` must be an integer from 0 to {MAX_VERSION}.")
    # Composed only: the claim applies the key rule, after asking whether the ledger holds it.
    key = f"{record}:{action}:v{version}"
    if not key_lookup_shape(key):
        raise key_refusal(key) or InvalidKey("The versioned key cannot be stored.")
    return key


def validate_run(run: Any) -> str:
    """A run id: empty (the correlation id is the run), or 1–255 printable characters without
    surrounding blanks, like a key (it is logged and appears in URLs)."""
    if run in (None, ""):
        return ""
    if not isinstance(run, str) or len(run) > 255 or not run.isprintable() or run.strip() != run:
        raise ValidationFailed("`run` must be at most 255 printable characters without surrounding blanks.")
    return run


# The service's own key spaces: a DLQ replay's ledger key (replay:{entry}:{n}, dlq.models),
# a callback's (callback:{operation id}, ledger.protocol.callbacks) and the derived key of a "re-run as
# new" ({key}~r{n}). A caller holding one would block that replay or silently suppress that
# callback, so callers may not claim or submit them.
RESERVED_KEY_PREFIXES = ("replay:", "callback:")
_DERIVED_KEY = re.compile(r"~r[0-9]+$")


def reserved_key_check(key: str) -> str:
    """Refuse a key of the service's own key spaces with 400 ``reserved_idempotency_key``;
    for keys that come from callers (``/claims``, submissions)."""
    if key.startswith(RESERVED_KEY_PREFIXES) or _DERIVED_KEY.search(key):
        raise ReservedKey(
            "Keys starting with replay: or callback:, and keys ending in ~r<number>, belong to the service"
            " (DLQ replays, callbacks, re-runs as new); choose another key."
        )
    return key


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_fingerprint(*, mode: str, provider: str, action: str, request: Any) -> str:
    """sha256 of the canonical JSON of (mode, provider, action, request) — DESIGN §3."""
    blob = canonical_json([mode, provider, action, request])
    return hashlib.sha256(blob.encode()).hexdigest()


def clamp_lease(seconds: float | None) -> float:
    cfg = settings.ONCEGUARD
    if seconds is None:
        seconds = cfg["LEASE_DEFAULT_SECONDS"]
    return float(min(max(float(seconds), cfg["LEASE_MIN_SECONDS"]), cfg["LEASE_MAX_SECONDS"]))


def sanitize_message(message: str | None) -> str:
    """Error text is stored for operators; keep it short, single-line and free of personal
    data (ledger.platform.redaction; masked before the cut, so no half address survives it)."""
    text = scrub(" ".join((message or "").split()))
    return text[:MAX_MESSAGE_LENGTH]


def backoff_seconds(*, attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base · 2^(attempt-1)))."""
    # Bounded whatever the provider's settings say: 2^62 keeps the product a float (never an
    # OverflowError), MAX_DURATION_SECONDS keeps now + the delay a datetime.
    ceiling = min(cap, base * (2 ** min(max(0, attempt - 1), 62)), MAX_DURATION_SECONDS)
    return (rng or random).uniform(0, ceiling)


def new_lease_token() -> str:
    return secrets.token_hex(16)
