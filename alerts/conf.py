"""Alert settings: ``settings.ONCEGUARD_ALERTS`` (optional) over these defaults, which come
from the environment (``ALERT_<NAME>``). Read per call, so tests can override them."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

# Before alerts had their own app these were DLQ settings; their former names still work.
_FORMER = {
    "MAX_ATTEMPTS": "DLQ_ALERT_MAX_ATTEMPTS",
    "RETRY_BASE_SECONDS": "DLQ_ALERT_RETRY_BASE_SECONDS",
    "CONSOLE_BASE_URL": "DLQ_CONSOLE_BASE_URL",
}


def _env(name: str, default: Any) -> Any:
    raw = os.environ.get(f"ALERT_{name}") or os.environ.get(_FORMER[name])
    if raw in (None, ""):
        return default
    if isinstance(default, int):
        return int(raw)
    return raw


# (DEDUP_SECONDS, a time bucket in the dedup key, is gone: alerts dedup per episode — while
# one is unresolved a raise counts a repeat, after it resolved a raise opens a new one.)
DEFAULTS: dict[str, Any] = {
    # Delivery retries: attempts and the first delay (doubling).
    "MAX_ATTEMPTS": 5,
    "RETRY_BASE_SECONDS": 30,
    # Alert messages link here (`/admin/...`).
    "CONSOLE_BASE_URL": "http://127.0.0.1:8000",
}

DEFAULTS = {name: _env(name, value) for name, value in DEFAULTS.items()}


def alert_setting(name: str) -> Any:
    configured = getattr(settings, "ONCEGUARD_ALERTS", {}) or {}
    return configured.get(name, DEFAULTS[name])
