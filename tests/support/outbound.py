"""The outbound policy in tests: every test runs with ``OUTBOUND_ALLOW`` set to the one
loopback "nowhere" address the fixtures use for providers that are never reached
(``127.0.0.1:9``, the discard port: nothing listens there), and allows exactly the servers
it starts, by host and port:

    def test_…(outbound_allow, mock_enforced):   # the mock fixtures allow themselves
        outbound_allow(receiver.url)             # anything else the test starts

A test server class calls :func:`announce` with its URL when it starts, so a test allows it
without saying so; one started outside a test (a module-scoped fixture) stays allowed for
every later test of the session (nothing else listens on its port while it runs).
Processes a test starts get the same rules through their environment (``outbound_env``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from relay import testing as relay_testing

# Where fixtures point providers nobody sends to; refusing it would only test the fixture.
NOWHERE = "127.0.0.1:9"


def rule_for(target: Any) -> str:
    """``host:port`` of a URL, or of anything with a ``url`` (RunningServer, a sink)."""
    url = target if isinstance(target, str) else target.url
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def current_rules() -> str:
    return str(settings.ONCEGUARD.get("OUTBOUND_ALLOW") or "")


def outbound_env(*targets: Any) -> dict[str, str]:
    """Environment for a child process: this test's rules plus ``targets``."""
    rules = [r for r in current_rules().split(",") if r] + [rule_for(t) for t in targets]
    return {"OUTBOUND_ALLOW": ",".join(dict.fromkeys(rules))}


# Set by the autouse ``outbound_allow`` fixture for the duration of each test.
_active: Callable[..., list[str]] | None = None
# Servers announced outside any test: allowed in every test from then on.
standing: list[str] = []


def announce(url: str) -> None:
    """A test server is listening at ``url``: the running test (or every test) may reach it."""
    if _active is not None:
        _active(url)
    elif rule_for(url) not in standing:
        standing.append(rule_for(url))


def retract(url: str) -> None:
    """A server announced outside any test has stopped: its port is no longer allowed in every
    test (the system may hand that port to a later test's own listener)."""
    rule = rule_for(url)
    if rule in standing:
        standing.remove(rule)


def activate(allow: Callable[..., list[str]] | None) -> None:
    global _active
    _active = allow


# Mock providers and relays (relay.testing) announce themselves.
if announce not in relay_testing.started_hooks:
    relay_testing.started_hooks.append(announce)
if retract not in relay_testing.stopped_hooks:
    relay_testing.stopped_hooks.append(retract)
