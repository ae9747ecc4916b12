"""Alert settings: ``settings.ONCEGUARD_ALERTS`` (optional) over these defaults, which come
from the environment (``ALERT_<NAME>``, each declared with its meaning — and the former
``DLQ_…`` name still read — in ``ledger.platform.env``). Read per call, so tests can override them."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from ledger.platform import env

# (DEDUP_SECONDS, a time bucket in the dedup key, is gone: alerts dedup per episode — while
# one is unresolved a raise counts a repeat, after it resolved a raise opens a new one.)
DEFAULTS: dict[str, Any] = {
    s.name.removeprefix("ALERT_"): env.read(s.name) for s in env.SETTINGS if s.name.startswith("ALERT_")
}


def alert_setting(name: str) -> Any:
    configured = getattr(settings, "ONCEGUARD_ALERTS", {}) or {}
    return configured.get(name, DEFAULTS[name])
