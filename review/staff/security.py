"""Console security basics: login throttling, the client's address, and a
Content-Security-Policy header.

Throttling is database-backed (LoginFailure rows), so every web worker and node sees the
same counts. It keys on the username **and** the client's address: more than
``LOGIN_MAX_FAILURES`` failures for one username from one address, or
``LOGIN_MAX_FAILURES_PER_IP`` from one address whatever the usernames, within
``LOGIN_WINDOW_SECONDS``, lock that pair / that address out until the window has passed.
Nobody can lock an account out from somewhere else: guessing a colleague's password from
another address locks only that address. A success clears its own pair only.

The client's address is ``REMOTE_ADDR`` — unless that is one of ``TRUSTED_PROXIES``
(CIDRs of the deployment's own reverse proxies), when it is the right-most address of
``X-Forwarded-For`` that is not itself a trusted proxy. A forwarded header from anyone else
is ignored: a client cannot pick the address it is throttled (or logged) under.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from ledger.platform import env
from review.models import LoginFailure


def _setting(name: str) -> int:
    """``settings.ONCEGUARD_SECURITY[name]`` when set, else the environment (``ledger.platform.env``)."""
    value = getattr(settings, "ONCEGUARD_SECURITY", {}).get(name)
    return int(env.read(name) if value is None else value)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_proxies() -> list[Network]:
    return [ipaddress.ip_network(str(c).strip(), strict=False) for c in getattr(settings, "TRUSTED_PROXIES", [])]


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, proxies: list[Network]) -> bool:
    return any(address.version == net.version and address in net for net in proxies)


def client_ip(request: HttpRequest | None) -> str | None:
    """The address of the client that sent ``request`` (see the module's docstring)."""
    if request is None:
        return None
    remote = request.META.get("REMOTE_ADDR") or ""
    peer = _address(remote)
    if peer is None:
        return remote or None
    proxies = trusted_proxies()
    if not proxies or not _trusted(peer, proxies):
        return str(peer)
    forwarded = [p for p in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if p.strip()]
    # Right to left: each hop appended the address it received from; the first one that is
    # not our own proxy is the client (anything further left the client could have written).
    for hop in reversed(forwarded):
        address = _address(hop)
        if address is None:
            return str(peer)
        if not _trusted(address, proxies):
            return str(address)
    return str(peer)


def _username(username: str) -> str:
    return (username or "").lower()[:150]


def login_locked(*, username: str, ip: str | None) -> bool:
    since = timezone.now() - timedelta(seconds=_setting("LOGIN_WINDOW_SECONDS"))
    recent = LoginFailure.objects.filter(at__gte=since)
    if username and recent.filter(username=_username(username), ip=ip).count() >= _setting("LOGIN_MAX_FAILURES"):
        return True
    if ip and recent.filter(ip=ip).count() >= _setting("LOGIN_MAX_FAILURES_PER_IP"):
        return True
    return False


def login_failed(*, username: str, ip: str | None) -> None:
    now = timezone.now()
    LoginFailure.objects.create(username=_username(username), ip=ip, at=now)
    # Keep the table small: a day of history is plenty for throttling and forensics.
    LoginFailure.objects.filter(at__lt=now - timedelta(days=1)).delete()


def login_succeeded(*, username: str, ip: str | None) -> None:
    """A success clears the failures of this username from this address only."""
    LoginFailure.objects.filter(username=_username(username), ip=ip).delete()


CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# The Swagger page (drf-spectacular) loads its assets from a CDN and runs an inline bootstrap.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; img-src 'self' data: https://cdn.jsdelivr.net; "
    "object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
)
API_CSP = "default-src 'none'; frame-ancestors 'none'"


class ContentSecurityPolicyMiddleware:
    """A strict CSP on every response: the console runs only its own scripts."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            if request.path.startswith("/api/docs"):
                policy = DOCS_CSP
            elif request.path.startswith("/api/"):
                policy = API_CSP
            else:
                policy = CONSOLE_CSP
            response["Content-Security-Policy"] = policy
        return response
