"""API and console requests share Django's stock middleware: an API answer carries the
security headers and never a session cookie (API views authenticate by key alone and never
touch the session); console requests get sessions, users, messages and CSRF.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from ledger.tenants.auth import ApiKeyAuthentication
from tests.ledger.support import CLAIM_URL, claim_body, op_url

pytestmark = pytest.mark.django_db

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
}


def routes(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found.extend(routes(pattern.url_patterns, route))
        elif isinstance(pattern, URLPattern):
            found.append((route, pattern.callback))
    return found


# API routes that do not authenticate by API key, each with why. A provider's webhook comes
# from the provider, which holds no API key: its body's HMAC under the provider's sealed
# webhook secret is its authentication (tests/execute/test_async_providers.py refuses a bad one).
SIGNED_NOT_KEYED = {"api/v1/webhooks/<slug:tenant>/<slug:slug>"}


def test_every_view_under_the_api_prefix_is_an_api_key_only_drf_view():
    api_routes = [(route, view) for route, view in routes(get_resolver().url_patterns) if route.startswith("api/v1/")]
    assert len(api_routes) >= 10
    assert SIGNED_NOT_KEYED <= {route for route, _ in api_routes}

    for route, view in api_routes:
        view_class = getattr(view, "cls", None)
        assert view_class is not None and issubclass(view_class, APIView), route
        expected = [] if route in SIGNED_NOT_KEYED else [ApiKeyAuthentication]
        assert list(view_class.authentication_classes) == expected, route


def test_an_unsigned_webhook_is_refused_without_a_session(client):
    response = client.post("/api/v1/webhooks/demo/images", data=b"{}", content_type="application/json")

    assert response.status_code in (401, 404)
    assert response["Content-Type"] == "application/problem+json"
    assert "sessionid" not in response.cookies


def test_api_answers_carry_the_security_headers_and_no_session_cookie(api):
    responses = [api.post(CLAIM_URL, claim_body("mw-1"), format="json")]
    created = responses[0].json()
    responses.append(
        api.post(op_url(created["id"], "complete"), {"lease_token": created["lease_token"]}, format="json")
    )
    responses.append(api.post(CLAIM_URL, claim_body("mw-1"), format="json"))
    responses.append(api.post(CLAIM_URL, claim_body("mw-2", provider=None), format="json"))
    responses.append(api.post("/api/v1/no-such-thing", {}, format="json"))

    assert [r.status_code for r in responses] == [201, 200, 200, 400, 404]
    for response in responses:
        for name, value in SECURITY_HEADERS.items():
            assert response[name] == value, (response.status_code, name)
        assert "Set-Cookie" not in response
        assert not response.cookies
        assert "Cookie" not in response.get("Vary", "")
        assert response["Content-Length"] == str(len(response.content))


def test_an_api_request_with_a_host_outside_allowed_hosts_is_refused_and_records_nothing(api):
    from ledger.models import Operation

    response = api.post(CLAIM_URL, claim_body("mw-host"), format="json", HTTP_HOST="evil.example")

    assert response.status_code == 400
    assert not Operation.objects.filter(key="mw-host").exists()


def test_a_session_cookie_on_an_api_request_is_neither_read_nor_refreshed(api, client):
    User.objects.create_superuser("root", "root@example.invalid", "pw-123456789")
    client.login(username="root", password="pw-123456789")
    api.cookies = client.cookies

    response = api.post(CLAIM_URL, claim_body("mw-cookie"), format="json")

    assert response.status_code == 201
    assert not response.cookies


def test_console_requests_still_get_sessions_users_messages_and_csrf(client):
    login_page = client.get("/admin/login/")
    assert login_page.status_code == 200
    assert "csrftoken" in login_page.cookies
    assert hasattr(login_page.wsgi_request, "session")
    assert hasattr(login_page.wsgi_request, "_messages")
    assert not login_page.wsgi_request.user.is_authenticated

    User.objects.create_superuser("root", "root@example.invalid", "pw-123456789")
    client.login(username="root", password="pw-123456789")
    dashboard = client.get("/admin/")
    assert dashboard.status_code == 200
    assert dashboard.wsgi_request.user.username == "root"


def test_a_console_post_without_a_csrf_token_is_still_refused(db):
    from django.test import Client

    response = Client(enforce_csrf_checks=True).post("/admin/login/", {"username": "a", "password": "b"})

    assert response.status_code == 403


def test_the_framework_floor_view_is_routed_only_by_the_bench_settings(api, settings):
    from rest_framework.test import APIClient

    assert api.post("/api/v1/_bench/floor", {}, format="json").status_code == 404

    settings.ROOT_URLCONF = "bench.floor"
    answered = api.post("/api/v1/_bench/floor", {"any": "body"}, format="json")
    anonymous = APIClient().post("/api/v1/_bench/floor", {}, format="json")

    assert answered.status_code == 200 and answered.json() == {"ok": True}
    # The project's API-key authentication, as on every API view.
    assert anonymous.status_code == 401 and anonymous["Content-Type"] == "application/problem+json"
