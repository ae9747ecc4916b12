"""Request guards that run before any view reads the body, and before any query."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import date, datetime

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.dateparse import parse_date, parse_datetime

from config.problems import problem_response
from ledger.platform import tracing
from ledger.platform.errors import InvalidQueryParameter
from ledger.platform.outage import dead_connections_discard
from ledger.platform.storable import query_time_problem


class DeadConnectionMiddleware:
    """First in MIDDLEWARE: persistent connections (CONN_MAX_AGE) the database server hung
    up on while idle — a restart, a failover, an outage — are closed before this request uses
    them, so the first request after the database is back succeeds instead of failing on a
    dead socket. A poll of the socket, no round trip (ledger.platform.outage)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        dead_connections_discard()
        return self.get_response(request)


request_log = logging.getLogger("onceguard.requests")


class QuietRequestLogMiddleware:
    """One log line per request, only for the ones worth reading: an error answer (4xx, 5xx)
    or one that took at least ``REQUEST_LOG_SLOW_MS``. Off (0) unless set: `make run` sets it
    (default 1000) instead of the web server's every-request access log, which scrolled the
    demo's sign-in away within seconds. The path only: a query string can hold personal data."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.slow_ms = int(getattr(settings, "REQUEST_LOG_SLOW_MS", 0) or 0)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not self.slow_ms:
            return self.get_response(request)
        started = time.monotonic()
        response = self.get_response(request)
        took = int((time.monotonic() - started) * 1000)
        if response.status_code >= 400 or took >= self.slow_ms:
            request_log.log(
                logging.WARNING if response.status_code >= 500 else logging.INFO,
                "request method=%s path=%s status=%s duration_ms=%s",
                request.method,
                request.path,
                response.status_code,
                took,
            )
        return response


class TraceContextMiddleware:
    """An API request is a server span that continues the caller's W3C ``traceparent`` (the n8n
    node sends one): the claim, the completion and everything they call are in the caller's
    trace (ADR 0015). Named by the route's pattern, never the path: a path can hold a key.
    Left out of the chain (MiddlewareNotUsed) while tracing is off, so it costs nothing."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        if not tracing.enabled():
            raise MiddlewareNotUsed("tracing is off (OTEL_EXPORTER_OTLP_ENDPOINT unset)")
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        headers = {
            "traceparent": request.META.get("HTTP_TRACEPARENT", ""),
            "tracestate": request.META.get("HTTP_TRACESTATE", ""),
        }
        with tracing.server_span(name=f"{request.method} /api", headers=headers) as span:
            response = self.get_response(request)
            if span is not None:
                match = request.resolver_match
                route = f"/{match.route}" if match is not None and match.route else "/api"
                span.update_name(f"{request.method} {route}")
                span.set_attributes(
                    {
                        "http.request.method": request.method or "",
                        "http.route": route,
                        "http.response.status_code": response.status_code,
                    }
                )
                if response.status_code >= 500:
                    span.set_status(tracing.Status(tracing.StatusCode.ERROR))
        return response


UPLOADS_PATH = "/api/v1/uploads"


class ApiBodyLimitMiddleware:
    """Refuse API bodies over MAX_REQUEST_BYTES (uploads: UPLOAD_MAX_BYTES) with 413 before a
    byte is read, when their Content-Length says so."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = -1
            # An upload's body is a file, streamed to storage with its own limit (ledger.execution.uploads).
            limit = (
                settings.ONCEGUARD["UPLOAD_MAX_BYTES"] if request.path == UPLOADS_PATH else settings.MAX_REQUEST_BYTES
            )
            if length < 0:
                return problem_response(
                    400, "bad_content_length", "Bad Content-Length", "Content-Length is not a number."
                )
            if length > limit:
                return problem_response(
                    413,
                    "payload_too_large",
                    "Payload too large",
                    f"The body exceeds the limit of {limit} bytes.",
                    limit=limit,
                )
        return self.get_response(request)


def _query_problem(request: HttpRequest) -> str | None:
    """Why the address cannot be answered without a 500 somewhere below, or None."""
    if "\x00" in request.path:
        return "Paths must not hold NUL characters (%00)."
    for name, values in request.GET.lists():
        for value in (name, *values):
            if "\x00" in value:
                return "Query parameters must not hold NUL characters (%00)."
            if len(value) <= 40 and value[:1].isdigit():
                when = _as_time(value)
                if when is not None and query_time_problem(when) is not None:
                    return f"{name}: {query_time_problem(when)}"
    return None


def _as_time(value: str) -> datetime | date | None:
    try:
        return parse_datetime(value) or parse_date(value)
    except ValueError:
        # Well formed but not a date (month 13): the view's own validation answers it.
        return None


class QueryNulMiddleware:
    """Refuse with 400, for every page, an address whose values would fail below the view:

    - U+0000 (``%00``) in the path or a query parameter: PostgreSQL takes no NUL in a text
      parameter, so a filter, search box or match value carrying one fails in the driver;
    - a time (or date) in a query parameter near the ends of Python's datetime (year 1 or
      9999 with an offset): converting it to UTC for the database overflows, on any list that
      filters by it (ledger.platform.storable.query_time_problem).

    One check at the door covers the API's filters and the console's search and filters.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = _query_problem(request)
        if problem is not None:
            if request.path.startswith("/api/"):
                error = InvalidQueryParameter
                return problem_response(400, error.code, error.title, problem)
            return HttpResponseBadRequest(problem)
        return self.get_response(request)
