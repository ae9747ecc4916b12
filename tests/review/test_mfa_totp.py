"""The second factor of local console accounts (review.staff.mfa, ADR 0014): an authenticator
app enrolled and then asked for at every password sign-in, its key sealed at rest, wrong codes
throttled and, past CONSOLE_MFA_MAX_FAILURES, the device locked until ``mfa_reset``."""

from __future__ import annotations

import base64
import re
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from django_otp.oath import TOTP

from ledger.models import ConfigChange
from ledger.platform import crypto
from ledger.platform.crypto import is_sealed
from review.models import ConsoleTotpDevice
from review.privacy.keys import encryption_rotate

pytestmark = pytest.mark.django_db

User = get_user_model()
PASSWORD = "a-long-enough-password-1"


@pytest.fixture
def mfa_on(settings: Any) -> None:
    settings.CONSOLE_REQUIRE_MFA = True
    settings.CONSOLE_MFA_EXEMPT_USERS = ["admin"]
    settings.CONSOLE_MFA_MAX_FAILURES = 4


@pytest.fixture
def operator(db: Any) -> Any:
    return User.objects.create_user("olivia", password=PASSWORD, is_staff=True, is_superuser=True)


def password_sign_in(client: Client, username: str) -> None:
    answer = client.post("/admin/login/", {"username": username, "password": PASSWORD, "next": "/admin/"})
    assert answer.status_code == 302, answer.content[:500]


def code_for(key_b32: str, *, at: float | None = None) -> str:
    totp = TOTP(base64.b32decode(key_b32.replace(" ", "")), step=30, digits=6)
    totp.time = time.time() if at is None else at
    return f"{totp.token():06d}"


def enrol(client: Client) -> str:
    page = client.get("/admin/sign-in/second-factor/enrol/")
    assert page.status_code == 200
    key = re.search(rb'data-testid="mfa-key">([A-Z2-7 ]+)<', page.content).group(1).decode()
    answer = client.post("/admin/sign-in/second-factor/enrol/", {"code": code_for(key), "next": "/admin/"})
    assert answer.status_code == 302 and answer["Location"] == "/admin/"
    return key.replace(" ", "")


def test_without_the_setting_a_password_reaches_the_console(client: Client, operator: Any) -> None:
    password_sign_in(client, "olivia")
    assert client.get("/admin/").status_code == 200


def test_a_password_session_without_a_device_is_sent_to_enrol_and_reaches_nothing_else(
    client: Client, operator: Any, mfa_on: None
) -> None:
    password_sign_in(client, "olivia")
    for path in ("/admin/", "/admin/ledger/operation/", "/admin/dlq/failedevent/"):
        answer = client.get(path)
        assert answer.status_code == 302
        assert answer["Location"].startswith("/admin/sign-in/second-factor/enrol/?next=")


def test_enrolment_seals_the_key_and_a_confirmed_key_is_never_shown_again(
    client: Client, operator: Any, mfa_on: None
) -> None:
    password_sign_in(client, "olivia")
    key = enrol(client)
    device = ConsoleTotpDevice.objects.get(user=operator)
    assert device.confirmed and is_sealed(device.sealed_key)
    assert key not in str(device.sealed_key)
    # Enrolment verified this session: the console opens.
    assert client.get("/admin/").status_code == 200
    change = ConfigChange.objects.filter(object_type="auth.user", object_id=str(operator.pk)).latest("pk")
    assert change.reason == "second factor enrolled" and key not in str(change.after)


def test_a_wrong_code_does_not_confirm_an_enrolment(client: Client, operator: Any, mfa_on: None) -> None:
    password_sign_in(client, "olivia")
    client.get("/admin/sign-in/second-factor/enrol/")
    answer = client.post("/admin/sign-in/second-factor/enrol/", {"code": "000000"})
    assert answer.status_code == 400 and b'data-testid="mfa-error"' in answer.content
    assert not ConsoleTotpDevice.objects.filter(user=operator, confirmed=True).exists()
    assert client.get("/admin/").status_code == 302


def test_the_next_sign_in_asks_for_the_code_and_a_right_code_opens_the_console(operator: Any, mfa_on: None) -> None:
    first = Client()
    password_sign_in(first, "olivia")
    key = enrol(first)
    second = Client()
    password_sign_in(second, "olivia")
    answer = second.get("/admin/ledger/operation/")
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/sign-in/second-factor/?next=")
    # An unverified session cannot enrol a new app over the old one (that would bypass it).
    assert second.get("/admin/sign-in/second-factor/enrol/")["Location"].startswith("/admin/sign-in/second-factor/")
    # The code of the next time step: the enrolment's code was spent on its own step.
    code = code_for(key, at=time.time() + 30)
    answer = second.post("/admin/sign-in/second-factor/", {"code": code, "next": "/admin/ledger/operation/"})
    assert answer.status_code == 302 and answer["Location"] == "/admin/ledger/operation/"
    assert second.get("/admin/ledger/operation/").status_code == 200


def test_a_code_is_good_for_one_session_only(operator: Any, mfa_on: None) -> None:
    first = Client()
    password_sign_in(first, "olivia")
    key = enrol(first)
    code = code_for(key, at=time.time() + 30)
    a, b = Client(), Client()
    password_sign_in(a, "olivia")
    password_sign_in(b, "olivia")
    assert a.post("/admin/sign-in/second-factor/", {"code": code}).status_code == 302
    assert b.post("/admin/sign-in/second-factor/", {"code": code}).status_code == 400
    assert b.get("/admin/").status_code == 302


def test_wrong_codes_are_throttled_then_lock_the_device_until_mfa_reset(
    operator: Any, mfa_on: None, settings: Any
) -> None:
    first = Client()
    password_sign_in(first, "olivia")
    key = enrol(first)
    client = Client()
    password_sign_in(client, "olivia")
    device = ConsoleTotpDevice.objects.get(user=operator)
    for _ in range(settings.CONSOLE_MFA_MAX_FAILURES):
        assert client.post("/admin/sign-in/second-factor/", {"code": "123456"}).status_code == 400
        # Past the doubling wait (django-otp's throttle), so each try is counted.
        ConsoleTotpDevice.objects.filter(pk=device.pk).update(
            throttling_failure_timestamp=timezone.now() - timedelta(hours=1)
        )
    # Even the right code is refused now: the device is locked, not just slowed down.
    answer = client.post("/admin/sign-in/second-factor/", {"code": code_for(key, at=time.time() + 30)})
    assert answer.status_code == 400 and b"locked" in answer.content
    assert client.get("/admin/").status_code == 302

    out = StringIO()
    call_command("mfa_reset", "olivia", stdout=out)
    assert "olivia" in out.getvalue()
    assert not ConsoleTotpDevice.objects.filter(user=operator).exists()
    again = Client()
    password_sign_in(again, "olivia")
    assert again.get("/admin/")["Location"].startswith("/admin/sign-in/second-factor/enrol/")
    assert ConfigChange.objects.filter(object_id=str(operator.pk), reason="second factors reset").exists()


def test_a_wrong_code_right_after_another_waits_out_the_throttle(operator: Any, mfa_on: None) -> None:
    first = Client()
    password_sign_in(first, "olivia")
    key = enrol(first)
    client = Client()
    password_sign_in(client, "olivia")
    assert client.post("/admin/sign-in/second-factor/", {"code": "123456"}).status_code == 400
    assert client.post("/admin/sign-in/second-factor/", {"code": "654321"}).status_code == 400
    # Within the wait, the right code is refused too (and not counted as a success).
    assert client.post("/admin/sign-in/second-factor/", {"code": code_for(key, at=time.time() + 30)}).status_code == 400


def test_mfa_reset_of_an_unknown_user_says_so(db: Any) -> None:
    with pytest.raises(CommandError):
        call_command("mfa_reset", "nobody")


def test_the_demo_admin_stays_password_only(client: Client, mfa_on: None) -> None:
    User.objects.create_user("admin", password=PASSWORD, is_staff=True, is_superuser=True)
    password_sign_in(client, "admin")
    assert client.get("/admin/").status_code == 200


def test_the_second_factor_pages_answer_no_5xx_on_bad_input(client: Client, operator: Any, mfa_on: None) -> None:
    password_sign_in(client, "olivia")
    for body in ({"code": "x" * 5000}, {"code": "\x00"}, {}, {"code": "12 34 56"}, {"next": "https://evil.example"}):
        for path in ("/admin/sign-in/second-factor/enrol/", "/admin/sign-in/second-factor/"):
            answer = client.post(path, body)
            assert answer.status_code < 500
            assert "evil.example" not in answer.get("Location", "")
    assert Client().get("/admin/sign-in/second-factor/").status_code == 302


def test_encryption_rotate_reseals_authenticator_keys_and_their_codes_still_work(
    operator: Any, mfa_on: None, monkeypatch: Any
) -> None:
    old_spec = f"old1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, old_spec)
    first = Client()
    password_sign_in(first, "olivia")
    key = enrol(first)
    new_spec = f"new1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, f"{new_spec},{old_spec}")
    assert encryption_rotate(batch_size=1)["review.ConsoleTotpDevice"]["resealed"] == 1
    assert crypto.key_id_of(ConsoleTotpDevice.objects.get(user=operator).sealed_key) == "new1"
    # The old key can go: the app's codes still open the console.
    monkeypatch.setenv(crypto.KEYS_ENV, new_spec)
    later = Client()
    password_sign_in(later, "olivia")
    assert later.post("/admin/sign-in/second-factor/", {"code": code_for(key, at=time.time() + 30)}).status_code == 302
