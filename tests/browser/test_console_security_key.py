"""A security key as the console's second factor, in a real browser (review.staff.mfa, ADR 0014):
Chromium's virtual authenticator (DevTools' WebAuthn domain) registers a key on the enrolment
page through django-otp-webauthn's own script, under the console's Content-Security-Policy,
and the next sign-in is verified with it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django_otp_webauthn.models import WebAuthnCredential

from review.models import ConsoleTotpDevice
from tests.browser.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def virtual_authenticator(tab: Any) -> None:
    cdp = tab.context.new_cdp_session(tab.page)
    cdp.send("WebAuthn.enable")
    cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )


def test_a_security_key_enrolled_in_the_browser_verifies_the_next_sign_in(
    console: Any, live_server: Any, settings: Any
) -> None:
    settings.CONSOLE_REQUIRE_MFA = True
    settings.CONSOLE_MFA_EXEMPT_USERS = []
    settings.CONSOLE_WEBAUTHN_RP_ID = settings.OTP_WEBAUTHN_RP_ID = "localhost"
    settings.OTP_WEBAUTHN_ALLOWED_ORIGINS = [live_server.url]
    User.objects.create_user("kim", password=PASSWORD, is_staff=True, is_superuser=True)

    first = console()
    virtual_authenticator(first)
    first.login("kim")
    assert "/admin/sign-in/second-factor/enrol/" in first.page.url
    first.page.click("#passkey-register-button")
    # (No wait_for_function: the console's CSP refuses the evaluated string it would run.)
    for _ in range(100):
        if WebAuthnCredential.objects.filter(user__username="kim", confirmed=True).exists():
            break
        first.page.wait_for_timeout(100)
    assert WebAuthnCredential.objects.filter(user__username="kim", confirmed=True).exists()
    first.shot("enrolled")
    first.go("/admin/")
    first.page.wait_for_selector("[data-testid=attention], #content-main, .og-card")
    assert "/admin/sign-in/" not in first.page.url
    assert not ConsoleTotpDevice.objects.filter(confirmed=True).exists()

    # The same browser profile (the key lives in this tab's virtual authenticator): sign out, in again.
    first.logout()
    first.login("kim")
    assert "/admin/sign-in/second-factor/" in first.page.url
    first.page.click("#passkey-verification-button")
    first.page.wait_for_url(lambda url: "/admin/sign-in/" not in url)
    first.shot("verified")
    assert first.go("/admin/ledger/operation/").status == 200
