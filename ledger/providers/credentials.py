"""A provider's credential: what the adapter puts in the provider's ``auth_header``.

Two sources, and a tenant can aim neither at a secret that is not its own (ADR 0001: a
tenant admin naming ``DATABASE_URL`` or another tenant's variable made the worker send it
to a URL of the admin's choosing):

* **stored on the provider**, sealed (``Provider.auth_secret``, ledger.platform.crypto, sealed even
  where payload encryption is off) — set, replaced or cleared through the console form or
  ``manage.py provider_upsert --auth-secret-stdin``; never shown again (the console says
  "set" or "not set"; the configuration trail says "‹secret›");
* **a platform-declared environment variable** (``Provider.auth_secret_env``): only a name
  starting with ``ONCEGUARD_PROVIDER_SECRET_PREFIX`` (``ONCEGUARD_SECRET_``) followed by the
  tenant's secret namespace (``Tenant.secret_namespace``: letters and digits, fixed when the
  tenant was made, never its slug — ADR 0001) and ``_`` — for tenant ``acme``, namespace
  ``ACME``, ``ONCEGUARD_SECRET_ACME_STRIPE``. Checked on save and again at send time: a
  reference outside the set (one stored before this rule) is never read; the attempt fails
  with that reason and the provider is paused with it (ledger.execution.attempts).

Nothing here logs or returns a credential's value except :func:`credential_value` to the
adapter.

The service's other stored secrets are sealed the same way and opened here, each by the one
caller that needs it in clear: a tenant's callback signing secrets (ledger.protocol.callbacks, to sign)
and an alert channel's webhook URL (alerts.services, to send). Everywhere else they are shown
as :func:`secret_tail` / :func:`url_masked` at most (docs/secrets.md).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone

from ledger.platform.crypto import EncryptionKeyError, is_sealed, open_json, seal_json
from ledger.platform.masking import UNREADABLE
from ledger.rules.provider_checks import secret_env_refusal


def sealed_credential(value: str) -> dict[str, Any] | None:
    """What ``Provider.auth_secret`` stores for ``value`` ("" clears it)."""
    if not value:
        return None
    return seal_json(value, always=True)


def secret_open(sealed: Any) -> str:
    """The clear text of a secret stored with :func:`sealed_credential` ("" when none is
    stored). Text stored in clear (before it was sealed; rotation and the migrations seal it)
    reads as it is. Raises ``EncryptionKeyError`` when no configured key opens it."""
    if sealed is None or sealed == "":
        return ""
    value = open_json(sealed)
    return value if isinstance(value, str) else ""


# A secret shorter than this shows no characters at all: four of eight would be half of it.
_TAIL_MIN_LENGTH = 12


def secret_tail(text: str) -> str:
    """How a stored secret is shown after it was made: its last 4 characters at most (enough
    to tell two apart), none of a short one."""
    return f"…{text[-4:]}" if len(text) >= _TAIL_MIN_LENGTH else "…"


# A signing secret rotated with overlap (tenant callback secrets, replay targets' signing
# secrets): the previous one keeps signing, beside the new one, for ``overlap_seconds`` after
# the rotation, so receivers switch without a gap.


def signing_secrets_now(
    *, current: str, previous: Any, rotated_at: datetime | None, overlap_seconds: float
) -> list[str]:
    """The secrets a message is signed with now: ``current``, and the sealed ``previous``
    opened while the overlap lasts (one ``v1=`` signature each, current first)."""
    if previous and rotated_at and timezone.now() < rotated_at + timedelta(seconds=overlap_seconds):
        return [current, secret_open(previous)]
    return [current]


def signing_secret_summary(
    *, current: Any, previous: Any, rotated_at: datetime | None, overlap_seconds: float, unset: str
) -> str:
    """What a page or command says instead of showing a rotated signing secret: whether it is
    set (``unset`` when not), its last 4 characters at most, when it was rotated and until
    when the previous one still signs."""
    if not current:
        return unset
    try:
        tail = secret_tail(secret_open(current))
    except EncryptionKeyError:
        tail = UNREADABLE
    text = f"set ({tail}); shown only when made or rotated"
    if rotated_at:
        until = rotated_at + timedelta(seconds=overlap_seconds)
        text += f"; last rotated {rotated_at:%Y-%m-%d %H:%M} UTC"
        if previous and timezone.now() < until:
            text += f"; the previous secret also signs until {until:%Y-%m-%d %H:%M} UTC"
    return text


def url_masked(url: str) -> str:
    """A URL that is itself a bearer secret (a Slack or Discord webhook's path is its token)
    as it may be shown: scheme and host, and the last 4 characters of the rest at most —
    ``https://hooks.slack.com/…abcd``. Never the path, the query or credentials."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "…"
    if not parts.scheme or not host:
        return "…"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    rest = url.partition(parts.netloc)[2]
    return f"{parts.scheme}://{netloc}/{secret_tail(rest)}"


def credential_is_set(provider: Any) -> bool:
    return bool(provider.auth_secret)


def stored_credential_value(sealed: Any) -> tuple[str | None, str | None]:
    """(the value, None) of a credential stored with :func:`sealed_credential`, or (None,
    why it cannot be used). Also for the DLQ's n8n connection key."""
    try:
        value = open_json(sealed) if is_sealed(sealed) else None
    except EncryptionKeyError:
        return None, "the stored credential cannot be decrypted with the configured keys"
    if not isinstance(value, str) or not value:
        return None, "the stored credential is not readable"
    return value, None


def credential_value(*, provider: Any, namespace: str) -> tuple[str | None, str | None]:
    """(the credential, None) or (None, why it cannot be used). (None, None): the provider
    has no credential. ``namespace``: the provider's tenant's stored secret namespace."""
    if provider.auth_secret:
        return stored_credential_value(provider.auth_secret)
    name = provider.auth_secret_env
    if not name:
        return None, None
    refusal = secret_env_refusal(namespace=namespace, name=name)
    if refusal:
        return None, refusal
    value = os.environ.get(name, "")
    if not value:
        return None, f"credential variable {name} is not set on this node"
    return value, None
