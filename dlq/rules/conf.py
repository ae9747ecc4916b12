"""DLQ settings: ``settings.ONCEGUARD_DLQ`` (optional) over these defaults, which come
from the environment (``DLQ_<NAME>``, each declared with its meaning in ``ledger.platform.env``).
Read per call, so tests can override them."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from ledger.platform import env

DEFAULTS: dict[str, Any] = {
    s.name.removeprefix("DLQ_"): env.read(s.name) for s in env.SETTINGS if s.name.startswith("DLQ_")
}


def dlq_setting(name: str) -> Any:
    configured = getattr(settings, "ONCEGUARD_DLQ", {}) or {}
    return configured.get(name, DEFAULTS[name])
