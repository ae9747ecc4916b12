"""Console security basics (login throttling, CSP, cookies, sessions) and the dashboard."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from ledger.models import Provider
from review.models import LoginFailure, RetentionRun
from tests.console.support import (
    advisory_provider,
    client_for,
    enforced_provider,
    failed_op,
    op_in_review,
    page,
    staff,
)

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _login(client: Client, username: str, password: str, ip: str = "10.0.0.1") -> bool:
    response = client.post("/admin/login/?next=/admin/", {"username": username, "password": password}, REMOTE_ADDR=ip)
    return response.status_code == 302


def test_five_failed_logins_lock_that_username_from_that_address_even_with_the_right_password(tenant):
    staff("ann", role="auditor", tenants=[tenant])
    client = Client()
    for _ in range(5):
        assert not _login(client, "ann", "wrong password", ip="10.0.0.1")
    assert LoginFailure.objects.filter(username="ann", ip="10.0.0.1").count() == 5
    response = client.post(
        "/admin/login/", {"username": "ann", "password": "correct horse battery"}, REMOTE_ADDR="10.0.0.1"
    )
    assert response.status_code == 200 and "Too many failed sign-in attempts" in response.content.decode()
    # Once the window has passed, the right password works again and clears the count.
    LoginFailure.objects.update(at=timezone.now() - timedelta(minutes=16))
    assert _login(client, "ann", "correct horse battery", ip="10.0.0.1")
    assert not LoginFailure.objects.filter(username="ann").exists()


def test_nobody_can_lock_an_account_out_from_elsewhere(tenant, settings):
    """Issue 11 item 9: failures for ann from an attacker's address (well past the per-user
    limit, below the per-address one) lock only that address's attempts on ann; ann signs in
    from her own address. Today's code locked the username everywhere."""
    settings.ONCEGUARD_SECURITY = {"LOGIN_MAX_FAILURES": 5, "LOGIN_MAX_FAILURES_PER_IP": 30}
    staff("ann", role="auditor", tenants=[tenant])
    attacker = Client()
    for _ in range(12):
        assert not _login(attacker, "ann", "guess", ip="203.0.113.66")
    assert not _login(attacker, "ann", "correct horse battery", ip="203.0.113.66")
    assert _login(Client(), "ann", "correct horse battery", ip="198.51.100.7")


def test_forwarded_for_is_honoured_only_from_a_trusted_proxy(tenant, settings):
    """Behind the deployment's proxy the client's address comes from X-Forwarded-For (its
    right-most untrusted hop); from anyone else the header is ignored, so an attacker cannot
    spend someone else's address on failures, nor dodge its own lock by inventing one."""
    settings.TRUSTED_PROXIES = ["10.0.0.0/24"]
    settings.ONCEGUARD_SECURITY = {"LOGIN_MAX_FAILURES": 3, "LOGIN_MAX_FAILURES_PER_IP": 30}
    staff("ann", role="auditor", tenants=[tenant])
    client = Client()
    # Through the proxy (10.0.0.5): the client is the hop the proxy appended, whatever the
    # client itself put in front of it.
    for _ in range(3):
        client.post(
            "/admin/login/",
            {"username": "ann", "password": "guess"},
            REMOTE_ADDR="10.0.0.5",
            HTTP_X_FORWARDED_FOR="198.51.100.7, 203.0.113.66",
        )
    assert set(LoginFailure.objects.values_list("ip", flat=True)) == {"203.0.113.66"}
    # Ann behind the same proxy from her own address is not locked.
    response = client.post(
        "/admin/login/",
        {"username": "ann", "password": "correct horse battery"},
        REMOTE_ADDR="10.0.0.5",
        HTTP_X_FORWARDED_FOR="198.51.100.7",
    )
    assert response.status_code == 302
    # Straight from the internet, a forged header counts for nothing: the peer address is used.
    LoginFailure.objects.all().delete()
    for _ in range(3):
        client.post(
            "/admin/login/",
            {"username": "ann", "password": "guess"},
            REMOTE_ADDR="203.0.113.66",
            HTTP_X_FORWARDED_FOR="198.51.100.7",
        )
    assert set(LoginFailure.objects.values_list("ip", flat=True)) == {"203.0.113.66"}


def test_many_failures_from_one_address_lock_that_address(tenant, settings):
    settings.ONCEGUARD_SECURITY = {"LOGIN_MAX_FAILURES_PER_IP": 3}
    staff("ann", role="auditor", tenants=[tenant])
    client = Client()
    for n in range(3):
        _login(client, f"guess{n}", "x", ip="10.9.9.9")
    assert not _login(client, "ann", "correct horse battery", ip="10.9.9.9")
    assert _login(Client(), "ann", "correct horse battery", ip="10.1.1.1")


def test_every_console_page_has_a_strict_csp_and_the_api_a_closed_one(tenant, make_client):
    client = client_for(staff("ann", role="auditor", tenants=[tenant]))
    csp = client.get("/admin/")["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert Client().get("/admin/login/")["Content-Security-Policy"] == csp
    api = make_client(tenant, ["read"])
    assert api.get("/api/v1/operations")["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"
    response = client.get("/admin/")
    assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"


def test_sessions_expire_and_cookies_are_http_only():
    assert settings.SESSION_COOKIE_AGE <= 12 * 3600
    assert settings.SESSION_EXPIRE_AT_BROWSER_CLOSE and settings.SESSION_COOKIE_HTTPONLY
    assert settings.CSRF_COOKIE_HTTPONLY and "django.middleware.csrf.CsrfViewMiddleware" in settings.MIDDLEWARE


def _settings_in_subprocess(env: dict[str, str], expr: str) -> str:
    code = f"import os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings'; from django.conf import settings; print(({expr}))"
    clean = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECURE_COOKIES", "ALLOWED_HOSTS")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_secure_cookies_and_hsts_when_not_debug_behind_a_real_host_name():
    expr = "settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_HSTS_SECONDS"
    assert _settings_in_subprocess({"DEBUG": "0", "ALLOWED_HOSTS": "console.example.invalid"}, expr) == (
        "(True, True, 31536000)"
    )
    # The embedded default (plain http on loopback) keeps them off, or the login cookie would never return.
    assert _settings_in_subprocess({"DEBUG": "0"}, expr) == "(False, False, 0)"
    assert _settings_in_subprocess({"DEBUG": "1", "ALLOWED_HOSTS": "console.example.invalid"}, expr) == (
        "(False, False, 0)"
    )


# --- Dashboard ------------------------------------------------------------------------------------


def test_dashboard_counts_link_to_their_filtered_lists_and_are_scoped(tenant, other_tenant):
    mailer = advisory_provider(tenant)
    op_in_review(tenant, mailer, "d:1")
    op_in_review(tenant, mailer, "d:2")
    failed_op(tenant, enforced_provider(tenant), "d:3")
    op_in_review(other_tenant, advisory_provider(other_tenant), "other:1")
    crm = Provider.objects.get(tenant=tenant, slug="crm")
    Provider.objects.filter(pk=crm.pk).update(paused_at=timezone.now(), paused_reason="HTTP 401 from provider")
    RetentionRun.objects.create(tenant=tenant, pass_id="p", started_at=timezone.now(), status="done", redacted=4)
    client = client_for(staff("olga", role="admin", tenants=[tenant]))
    status, body = page(client, "/admin/")
    assert status == 200
    assert (
        'href="/admin/ledger/operation/?status__exact=review" data-testid="ops-review"><span class="og-n">2</span>'
        in body
    )
    assert 'data-testid="ops-failed"><span class="og-n">1</span>' in body
    assert (
        'href="/admin/dlq/failedevent/?status__exact=pending" data-testid="dlq-pending"><span class="og-n">1</span>'
        in body
    )
    assert 'data-testid="review-backlog">2</a>' in body and "Oldest waiting" in body
    assert 'href="/admin/review/pausedprovider/?paused=yes" data-testid="paused">1 paused' in body
    assert "HTTP 401 from provider" in body
    assert 'data-testid="last-purge"' in body and "4 redacted" in body
    # Each link leads to a list with that many rows.
    _, listed = page(client, "/admin/ledger/operation/?status__exact=review")
    assert listed.count("/change/") - listed.count("/admin/ledger/operation/add") >= 2 and "other:1" not in listed
    _, paused = page(client, "/admin/review/pausedprovider/?paused=yes")
    assert f"/admin/review/pausedprovider/{crm.pk}/change/" in paused


def test_dashboard_hides_links_a_role_cannot_follow(tenant):
    client = client_for(staff("rita", role="reviewer", tenants=[tenant]))
    _, body = page(client, "/admin/")
    assert 'data-testid="review-backlog"' in body
    assert 'data-testid="dlq-pending"' not in body and 'data-testid="paused"' not in body
