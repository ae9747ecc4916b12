"""Request guards that run before any view reads the body."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse

from config.problems import problem_response


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


# Every view under this prefix is a DRF APIView authenticated by a Bearer API key
# (tests/test_api_middleware.py holds that): no session, no signed-in user, no messages.
API_PREFIX = "/api/v1/"


class _ConsoleOnly:
    """Runs the wrapped middleware for console requests only; API requests pass straight on.

    Building a session store, a lazy user and a message storage costs an API request
    ~0.1 ms of CPU for objects it never reads. Routing follows ``path_info``, as URL
    resolution does, so exactly the requests that reach an API view skip them.
    """

    get_response: Callable[[HttpRequest], HttpResponse]

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]


class ConsoleSessionMiddleware(_ConsoleOnly, SessionMiddleware):
    pass


class ConsoleAuthenticationMiddleware(_ConsoleOnly, AuthenticationMiddleware):
    pass


class ConsoleMessageMiddleware(_ConsoleOnly, MessageMiddleware):
    pass
