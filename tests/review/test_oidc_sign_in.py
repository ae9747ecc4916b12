"""Single sign-on to the console (review.staff.oidc, ADR 0014) against a real OpenID Connect
provider on loopback (tests.support.oidc_provider): the browser's side is the Django test
client, the provider's answers are real HTTP, the ID tokens are real RS256 JWTs.

These run once, in the PostgreSQL pass (``pg_pass``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ledger.models import ConfigChange, Tenant
from review.models import OidcIdentity, StaffTenant
from tests.support.oidc_provider import OidcProvider

pytestmark = [pytest.mark.pg_pass, pytest.mark.django_db(transaction=False)]

User = get_user_model()

ROLE_MAP = {"ops-oncall": "operator", "risk-audit": "auditor", "platform-admins": "admin"}


@pytest.fixture(scope="module")
def idp() -> Iterator[OidcProvider]:
    provider = OidcProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def sso(idp: OidcProvider, settings: Any, tenant: Tenant, other_tenant: Tenant) -> OidcProvider:
    for name, value in idp.settings().items():
        setattr(settings, name, value)
    settings.CONSOLE_OIDC_ROLE_MAP = ROLE_MAP
    settings.CONSOLE_OIDC_ROLE_CLAIM = "groups"
    settings.CONSOLE_OIDC_TENANT_CLAIM = "tenants"
    idp.tamper = {}
    idp.person = {
        "sub": "alice-0001",
        "email": "alice@example.com",
        "preferred_username": "alice",
        "groups": ["ops-oncall", "unrelated-group"],
        "tenants": ["acme"],
    }
    return idp


def sign_in(client: Client, idp: OidcProvider, *, next_url: str = "") -> Any:
    """The browser's round trip: the console's button, the provider's redirect back, the
    callback. Returns the callback's answer."""
    start = client.get("/admin/sign-in/sso/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start
    authorize = start["Location"]
    assert authorize.startswith(f"{idp.url}/authorize?")
    back = httpx.get(authorize, follow_redirects=False)
    assert back.status_code == 302, back.text
    callback = urlsplit(back.headers["Location"])
    assert callback.path == "/admin/sign-in/sso/callback/"
    return client.get(callback.path, {k: v[0] for k, v in parse_qs(callback.query).items()})


def test_the_sign_in_page_offers_single_sign_on_only_when_configured(client: Client, settings: Any, sso: Any) -> None:
    assert b'data-testid="sso-sign-in"' in client.get("/admin/login/").content
    settings.OIDC_RP_CLIENT_ID = ""
    assert b'data-testid="sso-sign-in"' not in client.get("/admin/login/").content
    assert client.get("/admin/sign-in/sso/").status_code == 404


def test_the_authorization_request_carries_state_nonce_and_a_pkce_s256_challenge(client: Client, sso: Any) -> None:
    query = parse_qs(urlsplit(client.get("/admin/sign-in/sso/")["Location"]).query)
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) >= 43
    assert query["state"][0] and query["nonce"][0]
    assert query["redirect_uri"] == ["http://testserver/admin/sign-in/sso/callback/"]


def test_a_sign_in_makes_a_staff_user_with_the_mapped_role_and_tenant_and_reaches_the_console(
    client: Client, sso: OidcProvider, tenant: Tenant
) -> None:
    answer = sign_in(client, sso)
    assert answer.status_code == 302 and answer["Location"] == "/admin/"
    identity = OidcIdentity.objects.get(issuer=sso.issuer, subject="alice-0001")
    user = identity.user
    assert user.is_staff and not user.is_superuser and not user.has_usable_password()
    assert sorted(user.groups.values_list("name", flat=True)) == ["operator"]
    assert list(StaffTenant.objects.filter(user=user).values_list("tenant__slug", flat=True)) == ["acme"]
    assert client.get("/admin/").status_code == 200
    # The code was exchanged with its PKCE verifier.
    assert sso.token_requests[-1]["code_verifier"]
    change = ConfigChange.objects.filter(object_type="auth.user", object_id=str(user.pk)).latest("pk")
    assert change.after == {"roles": ["operator"], "tenants": [tenant.pk]}


def test_next_is_honoured_after_sign_in_and_an_outside_address_is_not(client: Client, sso: OidcProvider) -> None:
    assert sign_in(client, sso, next_url="/admin/dlq/")["Location"] == "/admin/dlq/"
    other = Client()
    assert sign_in(other, sso, next_url="https://evil.example/")["Location"] == "/admin/"


def test_a_role_change_at_the_provider_applies_at_the_next_sign_in(
    client: Client, sso: OidcProvider, other_tenant: Tenant
) -> None:
    sign_in(client, sso)
    user = OidcIdentity.objects.get(subject="alice-0001").user
    sso.person = {**sso.person, "groups": ["risk-audit"], "tenants": ["globex"]}
    second = Client()
    assert sign_in(second, sso).status_code == 302
    user.refresh_from_db()
    assert sorted(user.groups.values_list("name", flat=True)) == ["auditor"]
    assert list(StaffTenant.objects.filter(user=user).values_list("tenant__slug", flat=True)) == ["globex"]
    assert OidcIdentity.objects.count() == 1


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ({"aud": "someone-else"}, "another client's token"),
        ({"iss": "https://other-issuer.example"}, "another issuer's token"),
        ({"exp_offset": -3600}, "an expired token"),
        ({"foreign_key": True}, "a signature by a key the provider never published"),
        ({"nonce": "not-the-sessions-nonce"}, "a token minted for another sign-in"),
        ({"aud": ["onceguard-console", "other-app"], "azp": "other-app"}, "a token authorised for another party"),
    ],
)
def test_a_token_that_does_not_prove_the_sign_in_is_refused_with_a_page_not_a_500(
    client: Client, sso: OidcProvider, tamper: dict[str, Any], why: str
) -> None:
    sso.tamper = tamper
    answer = sign_in(client, sso)
    assert answer.status_code == 403, why
    assert b"sso_token_invalid" in answer.content
    assert not OidcIdentity.objects.exists()
    assert client.get("/admin/").status_code == 302


def test_a_person_none_of_whose_groups_is_mapped_is_refused_with_a_clear_page(
    client: Client, sso: OidcProvider
) -> None:
    sso.person = {**sso.person, "groups": ["marketing"]}
    answer = sign_in(client, sso)
    assert answer.status_code == 403
    assert b"none of your groups" in answer.content.lower() and b"sso_no_role" in answer.content
    assert not User.objects.filter(username__startswith="alice").exists()


def test_a_person_with_no_known_tenant_is_refused(client: Client, sso: OidcProvider) -> None:
    sso.person = {**sso.person, "tenants": ["no-such-tenant"]}
    answer = sign_in(client, sso)
    assert answer.status_code == 403 and b"sso_no_tenant" in answer.content


def test_the_same_email_at_another_issuer_is_another_identity(client: Client, sso: OidcProvider, settings: Any) -> None:
    sign_in(client, sso)
    second_idp = OidcProvider().start()
    try:
        for name, value in second_idp.settings().items():
            setattr(settings, name, value)
        second_idp.person = dict(sso.person)
        assert sign_in(Client(), second_idp).status_code == 302
    finally:
        second_idp.stop()
    identities = list(OidcIdentity.objects.order_by("pk"))
    assert len(identities) == 2
    assert identities[0].user_id != identities[1].user_id
    assert {i.issuer for i in identities} == {sso.issuer, second_idp.issuer}


def test_a_local_account_with_the_same_email_is_never_taken_over(client: Client, sso: OidcProvider) -> None:
    local = User.objects.create_user("alice", email="alice@example.com", password="pw-long-enough-1", is_staff=True)
    sign_in(client, sso)
    identity = OidcIdentity.objects.get()
    assert identity.user_id != local.pk


def test_a_replayed_or_forged_callback_is_refused_without_a_500(client: Client, sso: OidcProvider) -> None:
    answer = client.get("/admin/sign-in/sso/callback/", {"code": "x", "state": "never-issued"})
    assert answer.status_code == 403
    client.get("/admin/sign-in/sso/")
    answer = client.get("/admin/sign-in/sso/callback/", {"code": "x", "state": "never-issued"})
    assert answer.status_code == 403
    answer = client.get("/admin/sign-in/sso/callback/", {"error": "access_denied", "state": "x"})
    assert answer.status_code == 403
    assert client.get("/admin/sign-in/sso/callback/", {"code": "\x00", "state": "\x00"}).status_code < 500


def test_a_code_is_good_once(client: Client, sso: OidcProvider) -> None:
    start = client.get("/admin/sign-in/sso/")
    back = httpx.get(start["Location"], follow_redirects=False)
    callback = urlsplit(back.headers["Location"])
    params = {k: v[0] for k, v in parse_qs(callback.query).items()}
    assert client.get(callback.path, params).status_code == 302
    # The same redirect again (a stolen URL): its state is spent.
    thief = Client()
    thief.get("/admin/sign-in/sso/")
    assert thief.get(callback.path, params).status_code == 403


def test_a_provider_that_does_not_answer_is_a_page_not_a_500(client: Client, sso: OidcProvider, settings: Any) -> None:
    start = client.get("/admin/sign-in/sso/")
    back = httpx.get(start["Location"], follow_redirects=False)
    settings.OIDC_OP_TOKEN_ENDPOINT = "http://127.0.0.1:9/token"
    callback = urlsplit(back.headers["Location"])
    answer = client.get(callback.path, {k: v[0] for k, v in parse_qs(callback.query).items()})
    assert answer.status_code == 502 and b"sso_provider_unavailable" in answer.content


def test_a_single_sign_on_session_is_not_asked_for_the_consoles_second_factor(
    client: Client, sso: OidcProvider, settings: Any
) -> None:
    settings.CONSOLE_REQUIRE_MFA = True
    sign_in(client, sso)
    assert client.get("/admin/").status_code == 200


def test_sign_in_latency_through_the_loopback_provider(sso: OidcProvider, capsys: Any) -> None:
    """Not a speed assertion (STYLE: benchmarks measure speed): the median is printed for the
    ADR's record. The first round warms the JWKS fetch and the role groups."""
    timings = []
    for _ in range(11):
        began = time.perf_counter()
        assert sign_in(Client(), sso).status_code == 302
        timings.append((time.perf_counter() - began) * 1000)
    with capsys.disabled():
        print(f"\nsingle sign-on round trip: median {statistics.median(timings[1:]):.1f} ms over 10")
