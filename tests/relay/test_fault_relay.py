"""The fault relay, every mode against both kinds of provider, proven by journal and effects."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.support.holds import HoldsRecorded

KEY = "order-1001:charge:rev1"
BOTH = pytest.mark.parametrize("provider_mode", ["enforced", "advisory"])


def charge(http: httpx.Client, url: str, mode: str | None = None, **headers: str) -> httpx.Response:
    headers = {"Idempotency-Key": KEY, **headers}
    if mode:
        headers["X-Relay-Mode"] = mode
    return http.post(url + "/charges", json={"amount": 1000}, headers=headers)


def only_entry(relay) -> dict:
    journal = relay.journal()
    assert len(journal) == 1
    return journal[0]


@BOTH
def test_forward_and_respond_returns_the_providers_answer_and_journals_it(
    http, mock_provider_factory, relay_factory, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider)

    response = charge(http, relay.url)

    assert response.status_code == 201
    assert response.json()["id"].startswith("ch_")
    assert provider.effects()["count"] == 1
    entry = only_entry(relay)
    assert entry["seq"] == 1
    assert (entry["method"], entry["path"], entry["mode"]) == ("POST", "/charges", "forward-and-respond")
    assert (entry["forwarded"], entry["upstream_status"], entry["dropped"]) == (True, 201, False)
    assert entry["idempotency_key"] == KEY


@BOTH
def test_fail_before_forward_answers_502_and_the_provider_sees_nothing(
    http, mock_provider_factory, relay_factory, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider)

    response = charge(http, relay.url, "fail-before-forward")

    assert response.status_code == 502
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "relay_fail_before_forward"
    assert provider.effects()["requests"] == 0
    assert provider.effects()["count"] == 0
    entry = only_entry(relay)
    assert (entry["forwarded"], entry["upstream_status"], entry["dropped"]) == (False, None, False)


@BOTH
def test_fail_before_forward_close_closes_without_an_answer_and_the_provider_sees_nothing(
    http, mock_provider_factory, relay_factory, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider)

    with pytest.raises(httpx.RemoteProtocolError):
        charge(http, relay.url, "fail-before-forward-close")

    assert provider.effects()["requests"] == 0
    entry = only_entry(relay)
    assert (entry["forwarded"], entry["dropped"]) == (False, True)


@BOTH
def test_forward_then_drop_response_leaves_the_caller_with_a_connection_error_after_one_effect(
    http, mock_provider_factory, relay_factory, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider)

    with pytest.raises(httpx.RemoteProtocolError):
        charge(http, relay.url, "forward-then-drop-response")

    assert provider.effects()["count"] == 1
    entry = only_entry(relay)
    assert (entry["forwarded"], entry["upstream_status"], entry["dropped"]) == (True, 201, True)


@BOTH
def test_forward_then_reset_leaves_the_caller_with_a_reset_after_one_effect(
    http, mock_provider_factory, relay_factory, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider)

    with pytest.raises(httpx.TransportError):
        charge(http, relay.url, "forward-then-reset")

    assert provider.effects()["count"] == 1
    assert only_entry(relay)["dropped"] is True


def test_a_blind_resend_after_a_dropped_response_is_harmless_only_at_an_enforced_provider(
    http, mock_enforced, mock_advisory, relay_factory
):
    for provider in (mock_enforced, mock_advisory):
        relay = relay_factory(provider)
        with pytest.raises(httpx.RemoteProtocolError):
            charge(http, relay.url, "forward-then-drop-response")
        charge(http, relay.url)

    assert mock_enforced.effects()["by_key"] == {KEY: 1}
    # Class 2 at an advisory receiver: the re-send made a second effect (DESIGN §1).
    assert mock_advisory.effects()["by_key"] == {KEY: 2}


@BOTH
def test_delay_then_respond_exceeds_the_callers_timeout_after_the_provider_committed(
    mock_provider_factory, relay_factory, wait_for, provider_mode
):
    provider = mock_provider_factory(provider_mode)
    relay = relay_factory(provider, "delay-then-respond", delay=0.6)

    with httpx.Client(timeout=0.15, trust_env=False) as impatient, pytest.raises(httpx.ReadTimeout):
        charge(impatient, relay.url)

    # The relay journals the provider's answer on its own thread, after this caller gave up.
    assert wait_for(lambda: relay.journal()[0]["upstream_status"] is not None)
    assert provider.effects()["count"] == 1
    entry = only_entry(relay)
    assert (entry["mode"], entry["delay"], entry["forwarded"], entry["upstream_status"]) == (
        "delay-then-respond",
        0.6,
        True,
        201,
    )


def test_delay_then_respond_answers_a_patient_caller_after_the_header_delay(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)
    relay.server.stopping = held = HoldsRecorded()

    response = charge(http, relay.url, "delay-then-respond", **{"X-Relay-Delay": "0.2"})

    assert response.status_code == 201
    # The relay held the answer the header's 0.2 s before sending it (was: the answer's
    # wall-clock time was at least 0.2 s).
    assert held.waits == [0.2]
    assert only_entry(relay)["delay"] == 0.2


def test_relay_headers_are_stripped_before_forwarding(http, mock_enforced, relay_factory):
    # Two relays in a row: had the outer one forwarded its X-Relay-Mode, the inner one
    # would have dropped the answer too and the outer one would have seen no status.
    inner = relay_factory(mock_enforced)
    outer = relay_factory(inner)

    with pytest.raises(httpx.RemoteProtocolError):
        charge(http, outer.url, "forward-then-drop-response")

    assert only_entry(outer)["upstream_status"] == 201
    assert only_entry(inner)["mode"] == "forward-and-respond"
    assert mock_enforced.effects()["count"] == 1


def test_the_providers_status_headers_and_body_pass_through_unchanged(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)
    mock_enforced.script([{"status": 429, "retry_after": 7, "body": {"error": "rate_limited"}}])

    throttled = charge(http, relay.url)
    created = charge(http, relay.url)
    replayed = charge(http, relay.url)

    assert throttled.status_code == 429
    assert throttled.headers["Retry-After"] == "7"
    assert throttled.json() == {"error": "rate_limited"}
    assert replayed.status_code == 200
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json() == created.json()
    assert [e["upstream_status"] for e in relay.journal()] == [429, 201, 200]


def test_lookups_pass_through_with_their_query_and_are_journaled_without_it(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)
    created = charge(http, relay.url).json()

    found = http.get(relay.url + "/charges", params={"idempotency_key": KEY})

    assert found.json() == created
    assert relay.journal()[-1]["path"] == "/charges"
    assert relay.journal()[-1]["method"] == "GET"


def test_the_relay_mode_comes_from_the_start_argument_when_no_header_says_otherwise(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced, "fail-before-forward")

    refused = charge(http, relay.url)
    overridden = charge(http, relay.url, "forward-and-respond")

    assert refused.status_code == 502
    assert overridden.status_code == 201
    assert [e["mode"] for e in relay.journal()] == ["fail-before-forward", "forward-and-respond"]


def test_the_relay_mode_defaults_to_the_relay_mode_environment_variable(
    http, mock_enforced, relay_factory, monkeypatch
):
    monkeypatch.setenv("RELAY_MODE", "fail-before-forward")
    relay = relay_factory(mock_enforced)

    assert charge(http, relay.url).status_code == 502
    assert mock_enforced.effects()["requests"] == 0


def test_a_relay_script_steers_callers_that_cannot_set_headers(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)
    relay.script(["forward-then-drop-response", {"mode": "delay-then-respond", "delay": 0.05}])

    with pytest.raises(httpx.RemoteProtocolError):
        charge(http, relay.url)
    second = charge(http, relay.url)
    third = charge(http, relay.url)

    assert (second.status_code, third.status_code) == (200, 200)
    assert [e["mode"] for e in relay.journal()] == [
        "forward-then-drop-response",
        "delay-then-respond",
        "forward-and-respond",
    ]
    assert mock_enforced.effects()["count"] == 1


def test_set_mode_changes_the_relays_mode_until_reset(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    relay.set_mode("fail-before-forward")
    refused = charge(http, relay.url)
    relay.reset()
    passed = charge(http, relay.url)

    assert (refused.status_code, passed.status_code) == (502, 201)
    assert [e["seq"] for e in relay.journal()] == [2]


@pytest.mark.parametrize(
    "headers",
    [{"X-Relay-Mode": "drop-everything"}, {"X-Relay-Mode": "delay-then-respond", "X-Relay-Delay": "soon"}],
)
def test_unknown_relay_instructions_are_refused_with_400_and_nothing_is_forwarded(
    http, mock_enforced, relay_factory, headers
):
    relay = relay_factory(mock_enforced)

    response = http.post(relay.url + "/charges", json={}, headers=headers)

    assert response.status_code == 400
    assert response.json()["code"] == "relay_invalid_configuration"
    assert mock_enforced.effects()["requests"] == 0
    assert relay.journal() == []


def test_an_unreachable_upstream_answers_502_and_is_journaled_as_not_forwarded(http, relay_factory):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    relay = relay_factory(f"http://127.0.0.1:{closed_port}")

    response = charge(http, relay.url)

    assert response.status_code == 502
    assert response.json()["code"] == "relay_upstream_error"
    entry = only_entry(relay)
    assert (entry["forwarded"], entry["upstream_status"], entry["error"]) == (False, None, "ConnectError")


def test_an_upstream_slower_than_the_relays_timeout_answers_504_and_counts_as_forwarded(
    http, mock_enforced, relay_factory
):
    relay = relay_factory(mock_enforced, upstream_timeout=0.1)
    mock_enforced.script([{"delay": 0.4}])

    response = charge(http, relay.url)

    assert response.status_code == 504
    assert response.json()["code"] == "relay_upstream_timeout"
    entry = only_entry(relay)
    assert (entry["forwarded"], entry["error"]) == (True, "ReadTimeout")


def test_the_journal_never_holds_bodies(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    http.post(
        relay.url + "/contacts?email=jane.doe@example.com",
        json={"email": "jane.doe@example.com"},
        headers={"Idempotency-Key": "contact-1"},
    )

    entry = only_entry(relay)
    assert entry["path"] == "/contacts"
    assert "jane.doe" not in json.dumps(relay.journal())


def test_reset_empties_the_journal(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)
    charge(http, relay.url)

    relay.reset()

    assert relay.journal() == []
    charge(http, relay.url)
    assert [e["seq"] for e in relay.journal()] == [2]


def test_a_chunked_request_body_is_relayed_whole(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    response = http.post(
        relay.url + "/charges", content=iter([b'{"amount":', b" 5}"]), headers={"Idempotency-Key": "chunked"}
    )

    assert response.status_code == 201
    assert response.json()["amount"] == 5


def test_bodies_over_the_providers_limit_are_relayed_and_refused_by_the_provider(http, mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    response = http.post(relay.url + "/charges", content=b"x" * (2 * 1024 * 1024), headers={"Idempotency-Key": "big"})

    assert response.status_code == 413
    assert only_entry(relay)["upstream_status"] == 413


def test_the_relay_refuses_absolute_form_targets_so_it_is_never_an_open_proxy(mock_enforced, relay_factory):
    relay = relay_factory(mock_enforced)

    with socket.create_connection(("127.0.0.1", relay.port), timeout=2) as sock:
        sock.sendall(b"GET http://example.com/charges HTTP/1.1\r\nHost: example.com\r\n\r\n")
        answer = sock.recv(1024)

    assert answer.startswith(b"HTTP/1.0 400")
    assert relay.journal() == []
    assert mock_enforced.effects()["requests"] == 0
