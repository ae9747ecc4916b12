"""relay.testing: servers in this process or in their own, and the management commands."""

from __future__ import annotations

import threading

import httpx
import pytest
from django.core.management import CommandError, call_command

from relay.testing import start_mock_provider

KEY = {"Idempotency-Key": "order-1001:charge:rev1"}


def refuses_connections(url: str) -> bool:
    try:
        httpx.get(url + "/_effects", timeout=0.5, trust_env=False)
    except httpx.ConnectError:
        return True
    return False


def test_a_stopped_server_no_longer_accepts_connections():
    provider = start_mock_provider("enforced")
    assert provider.effects()["count"] == 0

    provider.stop()
    provider.stop()

    assert refuses_connections(provider.url)
    assert not provider.is_running()


def test_servers_bind_loopback_on_a_free_port():
    with start_mock_provider("advisory") as first, start_mock_provider("advisory") as second:
        assert first.url.startswith("http://127.0.0.1:")
        assert first.port != second.port


def test_a_relay_has_no_effects_and_a_provider_has_no_journal(mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    with pytest.raises(TypeError):
        relay.effects()
    with pytest.raises(TypeError):
        mock_enforced.journal()


def test_stopping_a_provider_releases_a_request_it_was_holding_without_an_answer(http, wait_for):
    provider = start_mock_provider("enforced")
    provider.script([{"delay": 60}])
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(http.post(provider.url + "/charges", json={}, headers=KEY).status_code)
        except httpx.TransportError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert wait_for(lambda: provider.effects()["requests"] == 1)
    provider.stop()
    # Well within the caller's own 2 s timeout: the stop released it, not the timeout.
    caller.join(timeout=1)

    assert not caller.is_alive()
    assert isinstance(outcome[0], httpx.RemoteProtocolError)


def test_process_provider_starts_answers_and_stops(http, mock_provider_factory):
    provider = mock_provider_factory("enforced", process=True)

    first = http.post(provider.url + "/charges", json={"amount": 1}, headers=KEY)
    repeat = http.post(provider.url + "/charges", json={"amount": 1}, headers=KEY)

    assert provider.pid is not None
    assert (first.status_code, repeat.status_code) == (201, 200)
    assert provider.effects()["count"] == 1
    provider.stop()
    assert not provider.is_running()
    assert refuses_connections(provider.url)


def test_a_sigkilled_provider_process_leaves_a_caller_mid_request_with_a_transport_error(
    http, mock_provider_factory, wait_for
):
    provider = mock_provider_factory("advisory", process=True)
    provider.script([{"delay": 30}])
    errors: list[BaseException] = []

    def call() -> None:
        try:
            http.post(provider.url + "/charges", json={}, headers=KEY)
        except httpx.TransportError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    # The request is being held by the provider once it is counted.
    assert wait_for(lambda: provider.effects()["requests"] == 1)
    provider.kill()
    caller.join(timeout=2)

    assert not provider.is_running()
    assert len(errors) == 1


def test_process_relay_drops_the_answer_after_the_provider_committed(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced, "forward-then-drop-response", process=True)

    with pytest.raises(httpx.RemoteProtocolError):
        http.post(relay.url + "/charges", json={}, headers=KEY)

    assert mock_enforced.effects()["count"] == 1
    assert relay.journal()[0]["dropped"] is True


@pytest.mark.parametrize("command", [["mockprovider", "--mode", "enforced"], ["relay", "--upstream", "http://x"]])
def test_commands_refuse_a_non_loopback_host_unless_allowed(command):
    with pytest.raises(CommandError, match="loopback"):
        call_command(*command, "--host", "0.0.0.0", "--port", "0")


def test_relay_command_refuses_an_unknown_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("RELAY_MODE", "sometimes")

    with pytest.raises(CommandError, match="unknown relay mode"):
        call_command("relay", "--upstream", "http://127.0.0.1:9", "--port", "0")
