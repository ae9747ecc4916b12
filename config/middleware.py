"""Request guards that run before any view reads the body, and before any query."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from config.problems import problem_response
from ledger.errors import InvalidQueryParameter
from ledger.outage import dead_connections_discard


class DeadConnectionMiddleware:
    """First in MIDDLEWARE: persistent connections (CONN_MAX_AGE) the database server hung
    up on while idle — a restart, a failover, an outage — are closed before this request uses
    them, so the first request after the database is back succeeds instead of failing on a
    dead socket. A poll of the socket, no round trip (ledger.outage)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        dead_connections_discard()
        return self.get_response(request)


class ApiBodyLimitMiddleware:
    """Refuse API bodies over MAX_REQUEST_BYTES with 413 before a byte is parsed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = -1
            limit = settings.MAX_REQUEST_BYTES
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


class QueryNulMiddleware:
    """Refuse a query string or path holding U+0000 (``%00``) with 400, for every page.

    PostgreSQL takes no NUL in a text parameter: a filter, search box or match value that
    carries one fails inside the driver (a 500) on whichever list it reaches. One check at
    the door covers the API's filters and the console's search and filters alike.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any(
            "\x00" in name or any("\x00" in value for value in values) for name, values in request.GET.lists()
        ):
            if request.path.startswith("/api/"):
                error = InvalidQueryParameter
                return problem_response(
                    400, error.code, error.title, "Query parameters and paths must not hold NUL characters (%00)."
                )
            return HttpResponseBadRequest("NUL characters (%00) are not allowed in the address.")
        return self.get_response(request)
