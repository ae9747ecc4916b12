"""Where the service may send: the one outbound policy (DESIGN §2, "Outbound calls").

Everything the service sends over HTTP on a tenant's behalf goes through here: execute-mode
workers (``ledger.providers.adapters``), the sweeper's provider lookups (``ledger.providers.reconcile``),
callbacks (``ledger.protocol.callbacks``), DLQ replays to replay targets (``dlq.replays.send``), alert
webhooks (``alerts.services``) and, later, the n8n connection. Two entry points:

* :func:`outbound_check` — at save time (a provider's base URL, a replay target, an alert
  webhook, a callback allow-list entry, a callback URL at submission) and again before a
  send: the URL normalised (scheme and host lower-cased, IDNA, default port dropped,
  percent-encoded unreserved characters decoded, ``.``/``..`` segments resolved; userinfo,
  backslashes, fragments and encoded slashes refused) and its destination checked as far
  as it can be without asking DNS.
* :func:`outbound_client` — an ``httpx.Client`` that never follows redirects, ignores
  proxies from the environment (``trust_env=False``) and whose transport checks at connect
  time: it resolves the host (:func:`resolve`, which tests replace), checks **every**
  address, and connects to a checked address itself — the address is pinned, so DNS
  rebinding between check and connect changes nothing. The Host header and TLS SNI still
  carry the name (httpcore passes the URL's host to TLS; only the TCP connect is pinned).

The rules (``ONCEGUARD["OUTBOUND_ALLOW"]``, env ``OUTBOUND_ALLOW``; comma-separated): a
host name (``api.stripe.com``), a suffix (``*.stripe.com``), an address or CIDR
(``10.0.0.0/8``, ``[fd00::/8]``), each optionally with ``:port`` or ``:first-last``
(``127.0.0.1:8010-8013``). A destination is allowed when

1. it is a cloud metadata address: only by a rule naming exactly that address (a CIDR
   or a host name never opens one);
2. a rule matches its host name, or its address, and its port; or
3. every address is public (globally routable, not multicast or reserved) and
   ``OUTBOUND_ALLOW_PUBLIC`` is on (the default).

So loopback, private, link-local, shared (CGNAT), multicast, unspecified and reserved
addresses are refused unless the deployment's own rules name them — by host *and* port
when a test or the demo allows exactly its own loopback servers.
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import re
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httpcore
import httpx
from django.conf import settings

from ledger.platform import tracing
from ledger.platform.errors import DestinationNotAllowed

log = logging.getLogger("onceguard.outbound")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}

# Instance-metadata services hand out cloud credentials to whoever asks from the machine.
# Most sit in link-local or ULA ranges (refused anyway); Oracle's and Alibaba's do not.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, DigitalOcean, OpenStack…
        "169.254.169.253",  # AWS DNS
        "169.254.169.123",  # AWS time
        "169.254.170.2",  # AWS ECS task credentials
        "169.254.170.23",  # AWS EKS pod identity
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")
_LOCALHOST_NAMES = ("localhost", "localhost.localdomain")
_UNRESERVED = re.compile(r"%(2[dDeE]|5[fF]|7[eE]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA])")
_ESCAPE = re.compile(r"%([0-9a-fA-F]{2})")
# Separators a receiver may decode before routing: refused encoded, so a prefix check on the
# path we see is a prefix check on the path the receiver routes.
_ENCODED_SEPARATORS = re.compile(r"%(2[fF]|5[cC]|00)")


class OutboundBlocked(httpx.ConnectError):
    """Raised by the policy transport before any connection is made. A ``ConnectError``, so
    code that knows nothing of the policy still treats it as "nothing was sent"."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"destination refused by the outbound policy: {reason}")
        self.reason = reason


# --- Rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    text: str
    ports: tuple[int, int] | None  # inclusive range; None = any port
    name: str = ""  # exact host name, or ".suffix" for *.suffix
    network: IPNetwork | None = None

    def port_matches(self, port: int) -> bool:
        return self.ports is None or self.ports[0] <= port <= self.ports[1]

    def matches_name(self, host: str, port: int) -> bool:
        if not self.name or not self.port_matches(port):
            return False
        if self.name.startswith("."):
            return host.endswith(self.name) and len(host) > len(self.name)
        return host == self.name

    def matches_address(self, address: IPAddress, port: int) -> bool:
        if self.network is None or not self.port_matches(port) or address.version != self.network.version:
            return False
        if address in METADATA_ADDRESSES:
            # Only a rule naming exactly this address opens a metadata service.
            return self.network.prefixlen == self.network.max_prefixlen and address in self.network
        return address in self.network


def _ports(text: str, rule: str) -> tuple[int, int] | None:
    if text == "":
        return None
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"OUTBOUND_ALLOW: bad port in {rule!r}") from None
    if not (0 < low <= high <= 65535):
        raise ValueError(f"OUTBOUND_ALLOW: bad port range in {rule!r}")
    return low, high


def parse_rule(text: str) -> Rule:
    """One OUTBOUND_ALLOW entry: ``host``, ``*.suffix``, ``address``, ``CIDR`` or
    ``[IPv6 address or CIDR]``, each optionally followed by ``:port`` or ``:first-last``."""
    raw = text.strip()
    if raw.startswith("["):
        inner, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"OUTBOUND_ALLOW: bad entry {text!r}")
        host, ports = inner, _ports(rest[1:], text)
    elif raw.count(":") > 1:
        host, ports = raw, None  # a bare IPv6 address or network, no port
    else:
        host, _, port_text = raw.partition(":")
        ports = _ports(port_text, text)
    host = host.strip().lower().rstrip(".")
    if not host:
        raise ValueError(f"OUTBOUND_ALLOW: empty host in {text!r}")
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return Rule(text=raw, ports=ports, network=network)
    if host.startswith("*."):
        return Rule(text=raw, ports=ports, name="." + _ascii_host(host[2:]))
    if "*" in host or "/" in host:
        raise ValueError(f"OUTBOUND_ALLOW: bad entry {text!r}")
    return Rule(text=raw, ports=ports, name=_ascii_host(host))


_rules_lock = threading.Lock()
_rules_cache: dict[Any, tuple[Rule, ...]] = {}
# Rules added for the current thread of control only (:func:`allowing`).
_extra_rules: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("outbound_extra_rules", default=())


@contextmanager
def allowing(*rules: str) -> Iterator[None]:
    """Allow ``rules`` as well, in this thread of control only, while the block runs — for
    code that starts its own receiver and sends to it in the same thread (the demo's seeding
    replay). Never seen by other threads, requests or processes."""
    token = _extra_rules.set(_extra_rules.get() + tuple(rules))
    try:
        yield
    finally:
        _extra_rules.reset(token)


def allow_rules() -> tuple[Rule, ...]:
    """The deployment's rules (plus any :func:`allowing` ones), parsed once per distinct value."""
    raw = settings.ONCEGUARD.get("OUTBOUND_ALLOW") or ""
    entries = [e for e in (raw.split(",") if isinstance(raw, str) else raw) if str(e).strip()]
    entries += list(_extra_rules.get())
    cache_key = tuple(str(e).strip() for e in entries)
    rules = _rules_cache.get(cache_key)
    if rules is None:
        rules = tuple(parse_rule(str(e)) for e in cache_key)
        with _rules_lock:
            if len(_rules_cache) > 64:
                _rules_cache.clear()
            _rules_cache[cache_key] = rules
    return rules


def public_allowed() -> bool:
    return bool(settings.ONCEGUARD.get("OUTBOUND_ALLOW_PUBLIC", True))


# --- Addresses -------------------------------------------------------------------------------


def _embedded_ipv4(address: IPAddress) -> list[IPAddress]:
    """IPv4 addresses an IPv6 address reaches: mapped, NAT64 and 6to4 forms."""
    if address.version != 6:
        return []
    assert isinstance(address, ipaddress.IPv6Address)
    out: list[IPAddress] = []
    if address.ipv4_mapped is not None:
        out.append(address.ipv4_mapped)
    if address in _NAT64:
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        out.append(address.sixtofour)
    return out


def address_class(address: IPAddress) -> str:
    """``public``, or the kind of special address it is (the refusal's reason)."""
    for inner in _embedded_ipv4(address):
        kind = address_class(inner)
        if kind != "public":
            return kind
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.version == 4 and address in ipaddress.ip_network("100.64.0.0/10"):
        return "shared (CGNAT)"
    if address.is_private:
        return "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return "public"


def destination_refusal(*, host: str, address: IPAddress, port: int) -> str | None:
    """Why sending to ``address``:``port`` (reached as ``host``) is refused; None = allowed."""
    rules = allow_rules()
    kind = address_class(address)
    targets = [address, *_embedded_ipv4(address)]
    if kind == "cloud metadata":
        if any(r.matches_address(a, port) for r in rules for a in targets):
            return None
        return f"{kind} address {address} is refused unless OUTBOUND_ALLOW names it exactly"
    if any(r.matches_name(host, port) for r in rules):
        return None
    if any(r.matches_address(a, port) for r in rules for a in targets):
        return None
    if kind == "public":
        if public_allowed():
            return None
        return f"{address} port {port} is not in OUTBOUND_ALLOW (OUTBOUND_ALLOW_PUBLIC is off)"
    return f"{kind} address {address} port {port} is not in OUTBOUND_ALLOW"


def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host``, in the order to try them. Tests replace this function
    (``monkeypatch.setattr(outbound, "resolve", …)``): it is looked up at every call."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    seen: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]
        if text not in seen:
            seen.append(text)
    return seen


def _literal(host: str) -> IPAddress | None:
    """``host`` as an address when it is one — in any spelling a resolver accepts for IPv4
    (``127.1``, ``0x7f.0.0.1``, ``2130706433``), so none slips through as a "name"."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fA-FxX.]+", text) and re.search(r"[0-9]", text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def checked_addresses(host: str, port: int) -> list[IPAddress]:
    """Resolve ``host`` and check every address; raise :class:`OutboundBlocked` if any is
    refused or none is found. The answer is what to connect to (pinned)."""
    literal = _literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            found = resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise httpx.ConnectError(f"cannot resolve the destination ({type(exc).__name__})") from exc
        addresses = []
        for text in found:
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:
                raise OutboundBlocked(f"the resolver answered a non-address for {host}") from None
        if not addresses:
            raise httpx.ConnectError("cannot resolve the destination (no address)")
    for address in addresses:
        why = destination_refusal(host=host, address=address, port=port)
        if why is not None:
            raise OutboundBlocked(why)
    return addresses


# --- URLs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormalisedURL:
    scheme: str
    host: str  # lower-case ASCII (IDNA); an IPv6 address without brackets
    port: int  # explicit or the scheme's default
    path: str  # percent-encoding normalised, dot segments resolved; "" when the URL has none
    query: str

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.path}" + (f"?{self.query}" if self.query else "")

    def __str__(self) -> str:
        return self.url

    def is_under(self, prefix: NormalisedURL) -> bool:
        """Same scheme, host and port, and a path at or below the prefix's path (``/hooks``
        covers ``/hooks`` and ``/hooks/…``; ``/hooks/`` covers ``/hooks/…``). Both sides
        are normalised, so ``..`` or ``%2e%2e`` cannot climb out of the prefix."""
        if (self.scheme, self.host, self.port) != (prefix.scheme, prefix.host, prefix.port):
            return False
        base, path = prefix.path or "/", self.path or "/"
        if base.endswith("/"):
            return path.startswith(base)
        return path == base or path.startswith(base + "/")


def _ascii_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    try:
        return host.encode("idna").decode("ascii") if any(ord(c) > 127 for c in host) else host
    except UnicodeError:
        raise ValueError("host is not a valid international domain name") from None


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4, on ``/``-separated segments."""
    out: list[str] = []
    segments = path.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == ".":
            if last:
                out.append("")
            continue
        if segment == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
            continue
        out.append(segment)
    result = "/".join(out)
    return result if result.startswith("/") else "/" + result


def _normalise_path(path: str) -> str:
    if _ENCODED_SEPARATORS.search(path):
        raise ValueError("the path holds an encoded slash, backslash or NUL")
    # Unreserved characters decoded (so %2e is a dot before dot segments are resolved),
    # every other escape in upper case.
    path = _UNRESERVED.sub(lambda m: unquote(m.group(0)), path)
    path = _ESCAPE.sub(lambda m: "%" + m.group(1).upper(), path)
    return _remove_dot_segments(path or "/")


def normalise_url(url: str) -> NormalisedURL:
    """The canonical form of an http(s) URL, or ValueError saying what is wrong with it."""
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise ValueError("not a URL of at most 2000 characters")
    if not url.isprintable() or any(c.isspace() for c in url):
        raise ValueError("the URL holds blanks or control characters")
    if "\\" in url:
        raise ValueError("the URL holds a backslash")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("only http and https URLs")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are not allowed")
    if parts.fragment or url.endswith("#"):
        raise ValueError("a fragment is not allowed")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the port is not a number from 1 to 65535") from None
    if port == 0:
        raise ValueError("the port is not a number from 1 to 65535")
    raw_host = parts.hostname or ""
    if not raw_host or "%" in raw_host:
        raise ValueError("the URL has no host")
    literal = _literal(raw_host)
    if literal is not None:
        host = str(literal)
    else:
        host = _ascii_host(raw_host)
        if not re.fullmatch(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", host) or ".." in host:
            raise ValueError("the host is not a valid name")
    return NormalisedURL(
        scheme=scheme,
        host=host,
        port=port if port is not None else DEFAULT_PORTS[scheme],
        # An empty path stays empty (a base URL keeps its form); it compares as "/".
        path=_normalise_path(parts.path) if parts.path else "",
        query=parts.query,
    )


def _is_localhost_name(host: str) -> bool:
    return host in _LOCALHOST_NAMES or host.endswith(".localhost")


def outbound_check(url: str, *, purpose: str) -> NormalisedURL:
    """Normalise ``url`` and check its destination as far as possible without DNS; raises
    :class:`ledger.platform.errors.DestinationNotAllowed` (400 ``destination_not_allowed``).

    An address literal is checked fully. A name a rule lists is allowed. ``localhost``
    names are resolved now and every address checked, as the send will. Any other name is
    allowed here when public destinations are (the send-time check sees its addresses);
    otherwise it is resolved now and every address checked. ``purpose`` names the caller in
    the message."""
    try:
        normalised = normalise_url(url)
    except ValueError as exc:
        raise DestinationNotAllowed(f"{purpose}: {exc}.", extra={"purpose": purpose}) from None
    host, port = normalised.host, normalised.port
    why: str | None = None
    literal = _literal(host)
    if literal is not None:
        why = destination_refusal(host=host, address=literal, port=port)
    elif any(rule.matches_name(host, port) for rule in allow_rules()):
        why = None
    elif _is_localhost_name(host) or not public_allowed():
        # localhost is answered from the hosts file, never by a DNS server: checked now, as
        # the send will be (every address it resolves to).
        try:
            checked_addresses(host, port)
        except OutboundBlocked as exc:
            why = exc.reason
        except httpx.ConnectError:
            why = f"{host} does not resolve and is not in OUTBOUND_ALLOW"
    if why is not None:
        raise DestinationNotAllowed(f"{purpose}: {why}.", extra={"purpose": purpose})
    return normalised


def outbound_refusal(url: str, *, purpose: str) -> str | None:
    """:func:`outbound_check` as a reason (None = allowed), for code that records rather
    than raises."""
    try:
        outbound_check(url, purpose=purpose)
    except DestinationNotAllowed as exc:
        return exc.detail
    return None


def outbound_prefixes_check(entries: Any, *, purpose: str) -> list[str]:
    """A list of URL prefixes (a tenant's callback allow-list) as it is stored: each one an
    http(s) URL without a query that the policy allows, in canonical form, no duplicates.
    Raises DestinationNotAllowed."""
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise DestinationNotAllowed(f"{purpose}: a list of http(s) URL prefixes is expected.")
    out: list[str] = []
    for entry in entries:
        normalised = outbound_check(entry, purpose=purpose)
        if normalised.query:
            raise DestinationNotAllowed(f"{purpose}: a prefix has no query string.")
        if normalised.url not in out:
            out.append(normalised.url)
    return out


def origin_refusal(url: str, *, purpose: str) -> str | None:
    """The send-time pre-check of a request URL: only its destination (scheme, host, port)
    is checked — its path is the provider's business and may hold escapes a canonical URL
    would not. None = allowed (so far: the transport checks the resolved addresses)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{purpose}: the URL is not valid"
    if parts.username is not None or parts.password is not None:
        return f"{purpose}: credentials in the URL are not allowed"
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    return outbound_refusal(f"{parts.scheme}://{netloc}{f':{port}' if port else ''}/", purpose=purpose)


# --- Sending ---------------------------------------------------------------------------------


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's TCP connect, after the policy: resolve, check every address, connect to
    a checked one. TLS is started by httpcore on the stream afterwards with the URL's host as
    SNI and for certificate checks, so only the address is pinned, not the name."""

    def __init__(self, *, purpose: str) -> None:
        self.purpose = purpose
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = checked_addresses(host, port)
        except OutboundBlocked as exc:
            log.warning("outbound_refused purpose=%s host=%s port=%s reason=%s", self.purpose, host, port, exc.reason)
            raise
        last: Exception | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(
                    str(address), port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise OutboundBlocked("unix sockets are not a destination")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class PolicyTransport(httpx.HTTPTransport):
    """httpx's transport over :class:`PinnedBackend`: no proxy, whatever the environment."""

    def __init__(self, *, purpose: str, limits: httpx.Limits | None = None, verify: bool = True) -> None:
        limits = limits or httpx.Limits()
        super().__init__(limits=limits, trust_env=False, verify=verify)
        # httpx builds its pool without a way to pass a network backend: replace it with the
        # same pool over the pinned backend (proxies are never configured here).
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(purpose=purpose),
        )


def outbound_client(
    *, purpose: str, timeout: float | httpx.Timeout = 10.0, max_connections: int = 20, **kwargs: Any
) -> httpx.Client:
    """The only way the service sends: redirects are answers (never followed), proxies from
    the environment are ignored, and every connect passes the policy after DNS."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.Client(
        transport=PolicyTransport(purpose=purpose, limits=limits),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        # Every request carries the current trace's traceparent, when tracing is on (ADR 0015).
        event_hooks={"request": [tracing.request_hook]},
        **kwargs,
    )
