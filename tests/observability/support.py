"""Helpers of the observability tests."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


def allow_outbound(django_settings: Any, *urls: str) -> str:
    """Add these loopback servers (host:port) to the outbound allow-list of this test and
    return the rules, for the environment of processes the test starts."""
    rules = [r for r in str(django_settings.ONCEGUARD.get("OUTBOUND_ALLOW") or "").split(",") if r]
    rules += [f"{urlsplit(u).hostname}:{urlsplit(u).port}" for u in urls]
    django_settings.ONCEGUARD = {**django_settings.ONCEGUARD, "OUTBOUND_ALLOW": ",".join(dict.fromkeys(rules))}
    return current_outbound_rules()


def current_outbound_rules() -> str:
    return str(settings.ONCEGUARD.get("OUTBOUND_ALLOW") or "")
