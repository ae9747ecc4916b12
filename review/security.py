"""Console security basics: login throttling and a Content-Security-Policy header.

Throttling is database-backed (LoginFailure rows), so every web worker and node sees the
same counts: more than ``LOGIN_MAX_FAILURES`` failures for one username, or
``LOGIN_MAX_FAILURES_PER_IP`` from one address, within ``LOGIN_WINDOW_SECONDS`` lock that
username / address out until the window has passed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from review.models import LoginFailure


def _setting(name: str, default: int) -> int:
    value = getattr(settings, "ONCEGUARD_SECURITY", {}).get(name)
    if value is None:
        raw = os.environ.get(name)
        return int(raw) if raw else default
    return int(value)


def client_ip(request: HttpRequest | None) -> str | None:
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


def login_locked(*, username: str, ip: str | None) -> bool:
    since = timezone.now() - timedelta(seconds=_setting("LOGIN_WINDOW_SECONDS", 900))
    recent = LoginFailure.objects.filter(at__gte=since)
    if username and recent.filter(username=username.lower()[:150]).count() >= _setting("LOGIN_MAX_FAILURES", 5):
        return True
    if ip and recent.filter(ip=ip).count() >= _setting("LOGIN_MAX_FAILURES_PER_IP", 30):
        return True
    return False


def login_failed(*, username: str, ip: str | None) -> None:
    now = timezone.now()
    LoginFailure.objects.create(username=(username or "").lower()[:150], ip=ip, at=now)
    # Keep the table small: a day of history is plenty for throttling and forensics.
    LoginFailure.objects.filter(at__lt=now - timedelta(days=1)).delete()


def login_succeeded(*, username: str) -> None:
    LoginFailure.objects.filter(username=(username or "").lower()[:150]).delete()


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
