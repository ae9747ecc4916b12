"""Security keys as the second factor of local console accounts (review.staff.mfa, ADR 0014),
through django-otp-webauthn's real ceremonies and a software authenticator
(tests.support.webauthn_authenticator): registration, then verification at the next sign-in."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.webauthn_authenticator import SoftwareAuthenticator

pytestmark = pytest.mark.django_db

User = get_user_model()
PASSWORD = "a-long-enough-password-1"
ORIGIN = "http://testserver"
BASE = "/admin/sign-in/webauthn/"


@pytest.fixture
def keys_on(settings: Any) -> None:
    settings.CONSOLE_REQUIRE_MFA = True
    settings.CONSOLE_MFA_EXEMPT_USERS = []
    settings.CONSOLE_WEBAUTHN_RP_ID = settings.OTP_WEBAUTHN_RP_ID = "testserver"
    settings.OTP_WEBAUTHN_ALLOWED_ORIGINS = [ORIGIN]


@pytest.fixture
def person(db: Any) -> Any:
    return User.objects.create_user("wendy", password=PASSWORD, is_staff=True, is_superuser=True)


def signed_in() -> Client:
    client = Client()
    assert client.post("/admin/login/", {"username": "wendy", "password": PASSWORD}).status_code == 302
    return client


def post_json(client: Client, path: str, body: Any = None) -> Any:
    return client.post(BASE + path, json.dumps(body or {}), content_type="application/json")


def register(client: Client, key: SoftwareAuthenticator, **kw: Any) -> Any:
    options = post_json(client, "registration/begin/").json()
    return post_json(client, "registration/complete/", key.register(options, **kw))


def authenticate(client: Client, key: SoftwareAuthenticator, **kw: Any) -> Any:
    options = post_json(client, "authentication/begin/").json()
    return post_json(client, "authentication/complete/", key.assert_(options, rp_id="testserver", **kw))


def test_the_enrolment_page_offers_a_security_key_when_keys_are_on(keys_on: None, person: Any) -> None:
    page = signed_in().get("/admin/sign-in/second-factor/enrol/")
    assert b'id="passkey-registration-placeholder"' in page.content
    assert b"otp_webauthn_register.js" in page.content


def test_a_registered_key_verifies_the_session_and_the_next_sign_in(keys_on: None, person: Any) -> None:
    client = signed_in()
    key = SoftwareAuthenticator(origin=ORIGIN)
    assert register(client, key).status_code == 200
    # Registering the first factor verifies the session that did it.
    assert client.get("/admin/").status_code == 200

    later = signed_in()
    answer = later.get("/admin/")
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/sign-in/second-factor/?")
    assert b'id="passkey-verification-placeholder"' in later.get("/admin/sign-in/second-factor/").content
    assert authenticate(later, key).status_code == 200
    assert later.get("/admin/").status_code == 200


def test_an_assertion_from_another_origin_or_another_key_does_not_verify(keys_on: None, person: Any) -> None:
    key = SoftwareAuthenticator(origin=ORIGIN)
    assert register(signed_in(), key).status_code == 200
    phished = signed_in()
    assert authenticate(phished, key, origin="https://console.example.evil").status_code == 422
    assert phished.get("/admin/").status_code == 302
    stranger = SoftwareAuthenticator(origin=ORIGIN)
    assert authenticate(phished, stranger).status_code >= 400
    assert phished.get("/admin/").status_code == 302


def test_an_unverified_session_cannot_add_a_key_beside_an_existing_factor(keys_on: None, person: Any) -> None:
    assert register(signed_in(), SoftwareAuthenticator(origin=ORIGIN)).status_code == 200
    intruder = signed_in()
    answer = post_json(intruder, "registration/begin/")
    assert answer.status_code == 403
    assert intruder.get("/admin/").status_code == 302


def test_without_a_relying_party_the_ceremonies_are_not_there(settings: Any, person: Any) -> None:
    settings.CONSOLE_REQUIRE_MFA = True
    settings.CONSOLE_WEBAUTHN_RP_ID = ""
    client = signed_in()
    assert post_json(client, "registration/begin/").status_code == 404
    assert b"passkey" not in client.get("/admin/sign-in/second-factor/enrol/").content


def test_the_ceremonies_answer_no_5xx_on_bad_input(keys_on: None, person: Any) -> None:
    client = signed_in()
    for path in ("registration/complete/", "authentication/complete/", "authentication/begin/"):
        for body in ("", "{", "[]", '{"id": 1}', json.dumps({"response": {"clientDataJSON": "%%%"}})):
            answer = client.post(BASE + path, body, content_type="application/json")
            assert answer.status_code < 500, (path, body, answer.status_code)
