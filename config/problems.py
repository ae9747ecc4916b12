"""RFC 9457 problem+json for every error the API can answer, with a stable `code`."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from ledger.platform.errors import DomainError
from ledger.platform.outage import database_unavailable, retry_after_seconds
from ledger.protocol import approvals
from ledger.web.serializers import approval_representation

log = logging.getLogger("onceguard.api")

PROBLEM_CONTENT_TYPE = "application/problem+json"

# DRF's own exceptions, given codes that do not change between DRF versions.
_DRF_CODES: dict[type[Exception], tuple[str, str]] = {
    drf_exceptions.ParseError: ("malformed_json", "Malformed request body"),
    drf_exceptions.AuthenticationFailed: ("unauthenticated", "Authentication failed"),
    drf_exceptions.NotAuthenticated: ("unauthenticated", "Authentication required"),
    drf_exceptions.PermissionDenied: ("forbidden", "Permission denied"),
    drf_exceptions.NotFound: ("not_found", "Not found"),
    drf_exceptions.MethodNotAllowed: ("method_not_allowed", "Method not allowed"),
    drf_exceptions.NotAcceptable: ("not_acceptable", "Not acceptable"),
    drf_exceptions.UnsupportedMediaType: ("unsupported_media_type", "Unsupported media type"),
    drf_exceptions.Throttled: ("throttled", "Too many requests"),
    drf_exceptions.ValidationError: ("validation_error", "Request is not valid"),
}


# Members RFC 9457 (and we) define. A domain error's own field of the same name (e.g. the
# operation's `status`) is renamed `operation_<name>`: it must neither collide with the
# parameters below (a TypeError, so a 500) nor overwrite the problem's HTTP status.
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "code", "detail", "instance"})


def _extension_members(extra: dict[str, Any]) -> dict[str, Any]:
    return {(f"operation_{name}" if name in _PROBLEM_MEMBERS else name): value for name, value in extra.items()}


def problem_body(status: int, code: str, title: str, detail: str, instance: str = "", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"https://onceguard.invalid/problems/{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    body.update(extra)
    return body


def problem_response(status: int, code: str, title: str, detail: str, **extra: Any) -> JsonResponse:
    """A problem+json response outside DRF (middleware, plain Django views)."""
    return JsonResponse(
        problem_body(status, code, title, detail, **extra), status=status, content_type=PROBLEM_CONTENT_TYPE
    )


DATABASE_UNAVAILABLE = (503, "database_unavailable", "Database unavailable")
DATABASE_UNAVAILABLE_DETAIL = (
    "The database cannot be reached right now. Retry after the time in Retry-After; with the same"
    " idempotency key a retry is safe whether or not this request was recorded."
)


def database_unavailable_response(request: HttpRequest) -> HttpResponse:
    """503 + Retry-After while the database is unreachable, from anywhere in a request:
    problem+json under /api/, a short page for the console."""
    # The class only: a database error's message can hold host and user names.
    log.warning("database_unavailable path=%s error=%s", request.path, type(sys.exc_info()[1]).__name__)
    if request.path.startswith("/api/"):
        response: HttpResponse = problem_response(
            *DATABASE_UNAVAILABLE, DATABASE_UNAVAILABLE_DETAIL, instance=request.path
        )
    else:
        response = HttpResponse(
            "<!doctype html><title>Service unavailable</title><h1>Service unavailable</h1>"
            "<p>The database cannot be reached right now. Try again in a moment.</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = str(retry_after_seconds())
    response["Cache-Control"] = "no-store"
    return response


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    request = context.get("request")
    instance = request.path if request is not None else ""
    headers: dict[str, str] = {}
    if isinstance(exc, approvals.ApprovalPending):
        # Not a problem: the re-send was accepted as a request a second person decides (ADR
        # 0013). Every re-sending endpoint answers the same way, documented on each.
        pending = exc.request
        return Response(
            approval_representation(pending), status=202, headers={"Location": f"/api/v1/approvals/{pending.pk}"}
        )
    if isinstance(exc, DomainError):
        body = problem_body(exc.status, exc.code, exc.title, exc.detail, instance, **_extension_members(exc.extra))
        if exc.retry_after is not None:
            headers["Retry-After"] = str(max(0, int(exc.retry_after)))
        return Response(body, status=exc.status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    if isinstance(exc, drf_exceptions.APIException):
        code, title = next(
            (v for cls, v in _DRF_CODES.items() if isinstance(exc, cls)), ("error", "Request could not be processed")
        )
        extra: dict[str, Any] = {}
        if isinstance(exc, drf_exceptions.ValidationError):
            extra["errors"] = exc.detail
            detail = "One or more fields are not valid."
        elif isinstance(exc, drf_exceptions.ParseError):
            # The parser's message can quote the body; never echo it.
            detail = "The request body is not valid JSON."
        else:
            detail = str(exc.detail)
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
            headers["WWW-Authenticate"] = 'Bearer realm="api"'
        body = problem_body(exc.status_code, code, title, detail, instance, **extra)
        return Response(body, status=exc.status_code, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
    if database_unavailable(exc):
        # Not the request's fault nor a bug: retryable once the database is back (Django
        # replaces the broken connection at the end of this request).
        log.warning("database_unavailable path=%s error=%s", instance, type(exc).__name__)
        body = problem_body(*DATABASE_UNAVAILABLE, DATABASE_UNAVAILABLE_DETAIL, instance)
        headers = {"Retry-After": str(retry_after_seconds()), "Cache-Control": "no-store"}
        return Response(body, status=503, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
    # Unexpected: log the class only (the message may carry request data), answer 500.
    log.error("unhandled_error path=%s error=%s", instance, type(exc).__name__, exc_info=False)
    body = problem_body(
        500, "internal_error", "Internal error", "The server failed; nothing was recorded for this request.", instance
    )
    return Response(body, status=500, content_type=PROBLEM_CONTENT_TYPE)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """API: problem+json. Console: a page in the console's look saying what was refused, who
    you are signed in as and with which roles, and the way back (templates/403.html)."""
    if request.path.startswith("/api/"):
        return problem_response(403, "forbidden", "Permission denied", "You may not do this.", instance=request.path)
    user = getattr(request, "user", None)
    context: dict[str, Any] = {"title": "Not allowed", "reason": str(exception or "")}
    if user is not None and user.is_authenticated and user.is_staff:
        context.update(admin.site.each_context(request))
    return render(request, "403.html", context, status=403)


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """A request Django refused as suspicious (a lookup or ``_to_field`` a console list does not
    offer, a malformed header): problem+json for the API, a page in the console's look."""
    if request.path.startswith("/api/"):
        return problem_response(400, "bad_request", "Bad request", "The request is not valid.", instance=request.path)
    context: dict[str, Any] = {"title": "Bad request", "code": "bad_request"}
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        context.update(admin.site.each_context(request))
    return render(request, "400.html", context, status=400)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    # API clients get problem+json; the console keeps Django's HTML page.
    if not request.path.startswith("/api/"):
        return defaults.page_not_found(request, exception or Http404())
    return problem_response(404, "not_found", "Not found", "No such resource.", instance=request.path)


def handler500(request: HttpRequest) -> HttpResponse:
    # Called while the exception is being handled (outside DRF: middleware, console views).
    exc = sys.exc_info()[1]
    if exc is not None and database_unavailable(exc):
        return database_unavailable_response(request)
    if not request.path.startswith("/api/"):
        return defaults.server_error(request)
    return problem_response(500, "internal_error", "Internal error", "The server failed.", instance=request.path)
