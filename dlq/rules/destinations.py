"""Where the DLQ may send, checked one way: a tenant's n8n base URL and request timeout, and
a replay target's URL and lookup URL — allowed by the outbound policy (``ledger.rules.outbound``),
stored canonical, and https unless on this machine or the deployment allows plain http. The
models' ``clean``, the write paths and the send itself ask these, so the console, the
commands and a replay refuse the same destinations in the same words."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from dlq.rules.conf import dlq_setting
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed
from ledger.rules.outbound import outbound_check


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Stands in for {key} while a lookup URL is normalised (braces would be percent-encoded).
_KEY_MARK = "onceguardkeymark7f3a"


def replay_target_url_check(url: str, *, lookup: bool = False) -> str:
    """A replay target's URL (or lookup URL, which must hold ``{key}``) as stored: allowed by
    the outbound policy, canonical, and ``https`` unless it is a loopback address or the
    deployment allows plain http (DLQ ``REPLAY_ALLOW_HTTP``): a replay carries a credential
    and personal data. Raises DestinationNotAllowed."""
    purpose = "replay target lookup URL" if lookup else "replay target URL"
    if lookup and "{key}" not in url:
        raise DestinationNotAllowed(f"{purpose}: it must hold {{key}}, where the business key is put.")
    checked = outbound_check(url.replace("{key}", _KEY_MARK) if lookup else url, purpose=purpose)
    host = (urlsplit(checked.url).hostname or "").lower()
    if urlsplit(checked.url).scheme != "https" and not _is_loopback(host) and not dlq_setting("REPLAY_ALLOW_HTTP"):
        raise DestinationNotAllowed(
            f"{purpose}: https is required for a target that is not on this machine (a replay carries the"
            " target's credential and the entry's data)."
        )
    return checked.url.replace(_KEY_MARK, "{key}") if lookup else checked.url


N8N_PURPOSE = "n8n connection"


def n8n_base_url_check(url: str) -> str:
    """The n8n base URL as stored: allowed by the outbound policy, canonical, without query,
    and without a trailing slash (``/api/v1/…`` is appended). Raises DestinationNotAllowed."""
    normalised = outbound_check(url, purpose=N8N_PURPOSE)
    if normalised.query:
        raise DestinationNotAllowed(f"{N8N_PURPOSE}: the base URL has no query string.")
    return normalised.url.rstrip("/")


def n8n_timeout_check(seconds: float) -> float:
    """One request to n8n waits this long at most: from half a second to 30. Raises
    ValidationFailed (the console's form, ``manage.py n8n_connect`` and the service say the same)."""
    if not 0.5 <= float(seconds or 0) <= 30:
        raise ValidationFailed(
            "The n8n timeout must be between 0.5 and 30 seconds.", extra={"field": "timeout_seconds"}
        )
    return float(seconds)
