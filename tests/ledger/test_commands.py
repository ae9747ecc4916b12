"""Setup commands with the exact names and flags scripts and the README rely on."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from ledger.models import ApiKey, Provider, Tenant
from tests.ledger.support import CLAIM_URL, claim_body

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_tenant_create_makes_a_tenant():
    out = run("tenant_create", "initech", "--name", "Initech Ltd")

    tenant = Tenant.objects.get(slug="initech")
    assert tenant.name == "Initech Ltd"
    assert "initech" in out


def test_tenant_create_refuses_a_duplicate():
    run("tenant_create", "initech")

    with pytest.raises(CommandError):
        run("tenant_create", "initech")

    assert Tenant.objects.filter(slug="initech").count() == 1


def test_apikey_create_prints_the_key_alone_on_the_last_line_and_it_authenticates():
    run("tenant_create", "initech")
    run(
        "provider_upsert",
        "--tenant",
        "initech",
        "--slug",
        "stripe",
        "--base-url",
        "https://api.stripe.com",
        "--class",
        "key_enforced",
    )

    out = run("apikey_create", "--tenant", "initech")

    secret = out.rstrip("\n").splitlines()[-1]
    assert secret == secret.strip() and " " not in secret
    assert len(secret) >= 32
    # Hashed at rest: the secret itself is stored nowhere.
    api_key = ApiKey.objects.get()
    assert secret not in (api_key.hashed_key, api_key.prefix)
    assert api_key.prefix in secret
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/operations").status_code == 200
    assert client.post(CLAIM_URL, claim_body(), format="json").status_code == 201


def test_apikey_create_with_read_scope_only_cannot_write():
    run("tenant_create", "initech")

    secret = run("apikey_create", "--tenant", "initech", "--scopes", "read").rstrip("\n").splitlines()[-1]

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/operations").status_code == 200
    assert client.post(CLAIM_URL, claim_body(), format="json").status_code == 403
    assert ApiKey.objects.get().scopes == ["read"]


def test_apikey_create_with_all_scopes():
    run("tenant_create", "initech")

    run("apikey_create", "--tenant", "initech", "--scopes", "read,write,admin")

    assert ApiKey.objects.get().scopes == ["read", "write", "admin"]


@pytest.mark.parametrize(
    "args", [("--tenant", "nobody"), ("--tenant", "initech", "--scopes", "read,root")], ids=["no-tenant", "bad-scope"]
)
def test_apikey_create_refuses_unknown_tenants_and_scopes(args):
    run("tenant_create", "initech")

    with pytest.raises(CommandError):
        run("apikey_create", *args)

    assert not ApiKey.objects.exists()


def test_two_keys_are_different_secrets():
    run("tenant_create", "initech")

    first = run("apikey_create", "--tenant", "initech").splitlines()[-1]
    second = run("apikey_create", "--tenant", "initech").splitlines()[-1]

    assert first != second


def test_provider_upsert_with_every_flag_stores_every_field():
    run("tenant_create", "initech")

    run(
        "provider_upsert",
        "--tenant",
        "initech",
        "--slug",
        "stripe",
        "--base-url",
        "https://api.stripe.com",
        "--class",
        "key_enforced",
        "--idempotency-header",
        "X-Idem",
        "--lookup-path",
        "/charges?idempotency_key={key}&h={reconciliation_handle}",
        "--ref-pointer",
        "/data/0/id",
        "--status-pointer",
        "/data/0/status",
        "--success-values",
        "succeeded,paid",
        "--lookup-settle-seconds",
        "45",
        "--key-ttl-seconds",
        "3600",
        "--timeout-seconds",
        "7.5",
        "--max-attempts",
        "6",
        "--lifetime-seconds",
        "900",
    )

    p = Provider.objects.get(tenant__slug="initech", slug="stripe")
    assert p.base_url == "https://api.stripe.com"
    assert p.idempotency_class == "key_enforced"
    assert p.idempotency_header == "X-Idem"
    assert p.lookup_path == "/charges?idempotency_key={key}&h={reconciliation_handle}"
    assert p.ref_pointer == "/data/0/id"
    assert p.status_pointer == "/data/0/status"
    assert p.success_values == ["succeeded", "paid"]
    assert p.lookup_settle_seconds == 45
    assert p.key_ttl_seconds == 3600
    assert p.timeout_seconds == 7.5
    assert p.max_attempts == 6
    assert p.lifetime_seconds == 900


def test_provider_upsert_defaults_follow_the_design():
    run("tenant_create", "initech")

    run(
        "provider_upsert",
        "--tenant",
        "initech",
        "--slug",
        "smtp",
        "--base-url",
        "https://mail",
        "--class",
        "key_advisory",
    )

    p = Provider.objects.get(slug="smtp")
    assert (p.max_attempts, p.lifetime_seconds, p.idempotency_header) == (4, 1800, "Idempotency-Key")
    assert p.idempotency_class == "key_advisory"


def test_provider_upsert_updates_in_place_and_keeps_unset_fields():
    run("tenant_create", "initech")
    base = ["provider_upsert", "--tenant", "initech", "--slug", "stripe", "--class", "key_enforced"]
    run(*base, "--base-url", "https://a", "--max-attempts", "6", "--ref-pointer", "/ref")

    run(*base, "--base-url", "https://b", "--timeout-seconds", "3")

    p = Provider.objects.get()
    assert (p.base_url, p.max_attempts, p.ref_pointer, p.timeout_seconds) == ("https://b", 6, "/ref", 3.0)


def test_provider_upsert_takes_retry_delays_and_price():
    run("tenant_create", "initech")

    run(
        "provider_upsert",
        "--tenant",
        "initech",
        "--slug",
        "stripe",
        "--base-url",
        "https://a",
        "--class",
        "key_enforced",
        "--base-delay-seconds",
        "2.5",
        "--max-delay-seconds",
        "60",
        "--unit-price",
        "0.0300",
    )

    p = Provider.objects.get()
    assert (p.base_delay_seconds, p.max_delay_seconds, p.unit_price) == (2.5, 60.0, Decimal("0.0300"))


@pytest.mark.parametrize(
    "args",
    [
        ("--tenant", "nobody", "--slug", "s", "--base-url", "https://a", "--class", "key_enforced"),
        ("--tenant", "initech", "--slug", "s", "--base-url", "https://a", "--class", "sometimes"),
    ],
    ids=["no-tenant", "bad-class"],
)
def test_provider_upsert_refuses_unknown_tenants_and_classes(args):
    run("tenant_create", "initech")

    with pytest.raises(CommandError):
        run("provider_upsert", *args)

    assert not Provider.objects.exists()
