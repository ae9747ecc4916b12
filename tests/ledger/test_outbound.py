"""The outbound policy (ledger.rules.outbound; a tenant may not make the service call a destination the deployment did not allow): what may be sent where, checked on
save after normalising the URL, and again at connect time after DNS, pinned to the checked
address. Every server here is this test's own, on 127.0.0.1; names resolve through a fake
resolver (``outbound.resolve`` replaced), never through DNS."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ledger.platform.errors import DestinationNotAllowed
from ledger.rules import outbound
from ledger.rules.outbound import OutboundBlocked, outbound_check, outbound_client


class Listener:
    """A loopback HTTP server that records every connection it accepts and every request."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.requests: list[dict[str, str]] = []
        self.connections = 0
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                listener.connections += 1
                super().setup()

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def _answer(self) -> None:
                listener.requests.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[list[str]]]:
    """Names the test gives answers for; each lookup pops the next answer (a rebinding DNS)."""
    answers: dict[str, list[list[str]]] = {}
    calls: list[str] = []

    def fake(host: str, port: int) -> list[str]:
        calls.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "unknown in this test")
        queue = answers[host]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr(outbound, "resolve", fake)
    answers["_calls"] = calls  # type: ignore[assignment]
    return answers


# --- On save: normalised, then checked --------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/x",
        "http://localhost:8080/",
        "http://[::1]:8080/",
        "http://0.0.0.0:8080/",
        "http://10.1.2.3/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://100.64.0.1/",
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://[fd00:ec2::254]/latest",
        "http://100.100.100.200/",
        "http://192.0.0.192/",
        "http://224.0.0.1/",
        "http://[fe80::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        # Spellings a resolver reads as 127.0.0.1.
        "http://127.1:8080/",
        "http://2130706433:8080/",
        "http://0x7f000001:8080/",
        "http://0177.0.0.1:8080/",
    ],
)
def test_special_addresses_are_refused_unless_the_deployment_allows_them(url):
    with pytest.raises(DestinationNotAllowed) as refused:
        outbound_check(url, purpose="test")
    assert refused.value.code == "destination_not_allowed" and refused.value.status == 400


def test_public_destinations_are_allowed_and_normalised():
    assert outbound_check("HTTPS://API.Stripe.COM:443/v1/./charges/", purpose="t").url == (
        "https://api.stripe.com/v1/charges/"
    )
    assert outbound_check("https://8.8.8.8/a/%2e%2e/b", purpose="t").url == "https://8.8.8.8/b"
    assert outbound_check("https://example.com/%7Euser/%41", purpose="t").url == "https://example.com/~user/A"


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pw@example.com/",
        "https://example.com@127.0.0.1/",
        "https://example.com\\@127.0.0.1/",
        "https://example.com/a%2F..%2Fadmin",
        "https://example.com/a%5c..%5cadmin",
        "https://example.com/#frag",
        "ftp://example.com/",
        "file:///etc/passwd",
        "https:///nohost",
        "https://exa mple.com/",
    ],
)
def test_urls_that_cannot_be_normalised_are_refused(url):
    with pytest.raises(DestinationNotAllowed):
        outbound_check(url, purpose="test")


def test_an_allow_rule_opens_exactly_its_host_and_port(outbound_allow):
    outbound_allow("http://127.0.0.1:8011")
    assert outbound_check("http://127.0.0.1:8011/charges", purpose="t")
    for other in ("http://127.0.0.1:8012/", "http://127.0.0.2:8011/", "http://[::1]:8011/"):
        with pytest.raises(DestinationNotAllowed):
            outbound_check(other, purpose="t")


def test_port_ranges_cidrs_and_suffixes(settings):
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "OUTBOUND_ALLOW": "127.0.0.1:8010-8013,10.0.0.0/8:443,*.corp.example,[fd00::/8]:8443",
    }
    for url in ("http://127.0.0.1:8013/", "https://10.9.8.7/", "https://[fd12::1]:8443/", "https://a.corp.example/"):
        assert outbound_check(url, purpose="t")
    for url in ("http://127.0.0.1:8014/", "http://10.9.8.7/", "https://[fd12::1]/"):
        with pytest.raises(DestinationNotAllowed):
            outbound_check(url, purpose="t")


def test_a_cidr_never_opens_a_metadata_address_only_an_exact_rule_does(settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": "169.254.0.0/16,fd00::/8"}
    assert outbound_check("http://169.254.1.1/", purpose="t")
    for url in ("http://169.254.169.254/", "http://[fd00:ec2::254]/"):
        with pytest.raises(DestinationNotAllowed):
            outbound_check(url, purpose="t")
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": "169.254.169.254:80"}
    assert outbound_check("http://169.254.169.254/", purpose="t")


def test_with_public_destinations_off_only_listed_ones_pass(settings, resolver):
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "OUTBOUND_ALLOW": "api.stripe.com:443,*.corp.example",
        "OUTBOUND_ALLOW_PUBLIC": False,
    }
    for name in ("hooks.example.com", "corp.example.evil", "evilcorp.example", "corp.example"):
        resolver[name] = [["93.184.216.34"]]
    assert outbound_check("https://api.stripe.com/v1", purpose="t")
    assert outbound_check("https://a.corp.example/x", purpose="t")
    for url in (
        "https://hooks.example.com/x",
        "https://93.184.216.34/x",
        "http://api.stripe.com/v1",
        "https://corp.example.evil/",
        "https://evilcorp.example/",
        "https://corp.example/",
    ):
        with pytest.raises(DestinationNotAllowed):
            outbound_check(url, purpose="t")


# --- At send time: after DNS, every address, pinned -------------------------------------------


def test_a_name_resolving_to_loopback_is_refused_at_connect_and_nothing_connects(listener, resolver):
    """A public-looking name passes the save check; at send time it resolves to loopback
    (here: this test's own listener) and no connection is made at all."""
    resolver["innocent.example"] = [["127.0.0.1"]]
    assert outbound_check(f"http://innocent.example:{listener.port}/", purpose="t")
    with outbound_client(purpose="test", timeout=2) as client, pytest.raises(OutboundBlocked) as blocked:
        client.get(f"http://innocent.example:{listener.port}/")
    assert "loopback" in blocked.value.reason
    assert listener.connections == 0 and listener.requests == []


def test_every_resolved_address_is_checked(listener, resolver, outbound_allow):
    outbound_allow(listener.url)
    resolver["mixed.example"] = [["127.0.0.1", "10.0.0.7"]]
    with outbound_client(purpose="test", timeout=2) as client, pytest.raises(OutboundBlocked):
        client.get(f"http://mixed.example:{listener.port}/")
    assert listener.connections == 0


def test_the_connection_is_pinned_to_the_checked_address_and_keeps_the_name(listener, resolver, outbound_allow):
    """DNS rebinding: the first answer is checked and used; a second lookup (which would say
    169.254.169.254) never happens for that connection. The Host header keeps the name."""
    outbound_allow(listener.url)
    resolver["rebind.example"] = [["127.0.0.1"], ["169.254.169.254"]]
    with outbound_client(purpose="test", timeout=2) as client:
        response = client.get(f"http://rebind.example:{listener.port}/hello")
    assert response.status_code == 200
    assert resolver["_calls"] == ["rebind.example"]  # type: ignore[comparison-overlap]
    (request,) = listener.requests
    assert request["host"] == f"rebind.example:{listener.port}" and request["path"] == "/hello"


def test_redirects_are_answers_never_followed(resolver, outbound_allow):
    target = Listener()
    redirector = Listener(status=302, headers={"Location": f"{target.url}/internal"})
    try:
        outbound_allow(redirector.url)
        with outbound_client(purpose="test", timeout=2) as client:
            response = client.get(f"{redirector.url}/start")
        assert response.status_code == 302 and target.connections == 0
    finally:
        target.close()
        redirector.close()


def test_proxy_variables_from_the_environment_are_ignored(listener, monkeypatch, outbound_allow):
    proxy = Listener()
    try:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        outbound_allow(listener.url)
        with outbound_client(purpose="test", timeout=2) as client:
            assert client.get(f"{listener.url}/direct").status_code == 200
        assert proxy.connections == 0 and len(listener.requests) == 1
    finally:
        proxy.close()


def test_an_unresolvable_name_is_a_connect_error_not_a_refusal(resolver):
    with outbound_client(purpose="test", timeout=2) as client, pytest.raises(httpx.ConnectError) as failed:
        client.get("http://nowhere.invalid/")
    assert not isinstance(failed.value, OutboundBlocked)


def test_allowing_adds_rules_for_this_thread_only(listener):
    seen: list[bool] = []

    def elsewhere() -> None:
        try:
            outbound_check(listener.url, purpose="t")
            seen.append(True)
        except DestinationNotAllowed:
            seen.append(False)

    with outbound.allowing(f"127.0.0.1:{listener.port}"):
        assert outbound_check(listener.url, purpose="t")
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(timeout=5)
    assert seen == [False]
    with pytest.raises(DestinationNotAllowed):
        outbound_check(listener.url, purpose="t")


def test_a_sweeper_lookup_to_a_refused_destination_is_unknown_and_connects_nowhere(listener):
    from ledger.models import Operation, Provider
    from ledger.providers.reconcile import LookupOutcome, provider_lookup

    provider = Provider(slug="p", base_url=listener.url, lookup_path="/charges?key={key}", timeout_seconds=2)
    result = provider_lookup(provider=provider, operation=Operation(key="k-1"))
    assert result.outcome == LookupOutcome.UNKNOWN and "OUTBOUND_ALLOW" in result.error
    assert listener.connections == 0


def test_a_sweeper_lookup_to_an_allowed_destination_is_made(listener, outbound_allow):
    from ledger.models import Operation, Provider
    from ledger.providers.reconcile import provider_lookup

    outbound_allow(listener.url)
    provider = Provider(slug="p", base_url=listener.url, lookup_path="/charges?key={key}", timeout_seconds=2)
    provider_lookup(provider=provider, operation=Operation(key="k-1"))
    assert [r["path"] for r in listener.requests] == ["/charges?key=k-1"]
