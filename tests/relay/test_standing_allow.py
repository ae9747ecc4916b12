"""Servers started outside any test are allowed in every test only while they run: once one
stops, the system may hand its port to a later test's own listener, which a test of the
outbound policy expects to be refused (tests/ledger/test_outbound.py failed once that way)."""

from __future__ import annotations

from relay import testing as relay_testing
from tests.support import outbound


def test_a_stopped_servers_standing_rule_is_withdrawn() -> None:
    url = "http://127.0.0.1:1/"
    rule = outbound.rule_for(url)
    outbound.standing.append(rule)
    try:
        for hook in relay_testing.stopped_hooks:
            hook(url)
        assert rule not in outbound.standing
    finally:
        if rule in outbound.standing:
            outbound.standing.remove(rule)
