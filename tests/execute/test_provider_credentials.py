"""A provider's credential is a reference a tenant cannot aim (issue 11 item 2).

The attack: a tenant's console admin points a provider at a listener of their own and names
``DATABASE_URL`` (or another tenant's variable, or an encryption key) as its secret; the
worker sends it there, and ``GET /api/v1/operations/{id}`` shows the listener's answer. Each
test plays a step of it against a real loopback listener that records every connection,
and checks the secret never arrives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from ledger.execution.submission import operation_submit
from ledger.models import ErrorClass, IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed
from ledger.protocol import services
from ledger.providers import credentials
from tests.console.support import client_for, staff, submit_form
from tests.execute.support import run_due
from tests.support.listener import Listener

S = OperationStatus
DATABASE_SECRET = "postgres://onceguard:s3cr3t-db-password@db.internal:5432/onceguard"
GLOBEX_SECRET = "sk_live_globex_only_0123456789"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener(allow=True)
    yield server
    server.close()


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL_UNDER_TEST", DATABASE_SECRET)
    monkeypatch.setenv("DATABASE_URL", DATABASE_SECRET)
    monkeypatch.setenv("ONCEGUARD_SECRET_GLOBEX_STRIPE", GLOBEX_SECRET)


def _provider(tenant: Tenant, url: str, **fields: object) -> Provider:
    return services.provider_upsert(
        tenant=tenant,
        slug="exfil",
        base_url=url,
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
        auth_header="Authorization",
        timeout_seconds=2,
        max_attempts=1,
        **fields,
    )


def _submit_and_run(tenant: Tenant, key: str) -> Operation:
    operation_submit(
        tenant=tenant, key=key, provider="exfil", request={"method": "POST", "path": "/collect", "body": {}}
    )
    (done,) = run_due()
    return done


def _leaked(listener: Listener) -> bool:
    seen = listener.everything()
    return DATABASE_SECRET in seen or GLOBEX_SECRET in seen


def test_a_tenant_admin_cannot_name_database_url_or_another_tenants_variable_in_the_console(
    tenant, other_tenant, listener, secrets_in_env
):
    provider = _provider(tenant, listener.url)
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    url = f"/admin/ledger/provider/{provider.pk}/change/"
    for name in ("DATABASE_URL", "ONCEGUARD_SECRET_GLOBEX_STRIPE", "ONCEGUARD_ENCRYPTION_KEYS", "SECRET_KEY"):
        response = submit_form(admin, url, auth_secret_env=name)
        assert response.status_code == 200, name  # the form again, with the error
        assert "declared variables" in response.content.decode()
        assert Provider.objects.get(pk=provider.pk).auth_secret_env == ""
    # The tenant's own declared set is accepted.
    assert submit_form(admin, url, auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE").status_code == 302


def test_the_service_refuses_such_a_reference_on_save_whoever_saves(tenant, listener, secrets_in_env):
    for name in ("DATABASE_URL", "ONCEGUARD_SECRET_GLOBEX_STRIPE", "onceguard_secret_acme_x", "ONCEGUARD_SECRET_ACME_"):
        with pytest.raises(ValidationFailed):
            _provider(tenant, listener.url, auth_secret_env=name)


@pytest.mark.parametrize("name", ["DATABASE_URL", "ONCEGUARD_SECRET_GLOBEX_STRIPE"])
def test_a_stored_reference_outside_the_tenants_set_is_never_read_nor_sent(tenant, listener, secrets_in_env, name):
    """A reference stored before the rule (or by hand in the database): the worker does not
    read it, sends nothing, fails the attempt with the reason and pauses the provider;
    the API shows no secret."""
    provider = _provider(tenant, listener.url)
    Provider.objects.filter(pk=provider.pk).update(auth_secret_env=name)
    done = _submit_and_run(tenant, f"k-{name}")
    assert listener.connections == 0 and not _leaked(listener)
    assert done.status == S.FAILED and done.error_class == ErrorClass.PERMISSION
    assert name in done.last_error and "declared variables" in done.last_error
    provider.refresh_from_db()
    assert provider.paused_at is not None and name in provider.paused_reason
    api = Client(HTTP_AUTHORIZATION=f"Bearer {services.apikey_create(tenant=tenant, scopes=['read'])[1]}")
    body = api.get(f"/api/v1/operations/{done.pk}").content.decode()
    assert DATABASE_SECRET not in body and GLOBEX_SECRET not in body


def test_a_destination_the_deployment_does_not_allow_gets_no_connection_at_all(tenant, secrets_in_env, monkeypatch):
    """Even with a legitimate credential: a listener on a loopback port nobody allowed is
    refused on save, and a row stored by hand is refused before any connection."""
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_STRIPE", "sk_live_acme_0001")
    listener = Listener(allow=False)
    try:
        with pytest.raises(DestinationNotAllowed):
            _provider(tenant, listener.url, auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE")
        provider = _provider(tenant, "http://127.0.0.1:9", auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE")
        Provider.objects.filter(pk=provider.pk).update(base_url=listener.url)
        done = _submit_and_run(tenant, "k-not-allowed")
        assert listener.connections == 0
        assert done.status == S.FAILED and "destination refused" in done.last_error
    finally:
        listener.close()


def test_link_local_and_metadata_base_urls_are_refused_on_save(tenant):
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://10.0.0.1:8080/"):
        with pytest.raises(DestinationNotAllowed):
            _provider(tenant, url)


def test_the_providers_own_credential_is_stored_sealed_sent_and_never_shown(tenant, listener):
    provider = _provider(tenant, listener.url, auth_secret="Bearer sk_test_own_credential")
    stored = Provider.objects.values_list("auth_secret", flat=True).get(pk=provider.pk)
    assert "sk_test_own_credential" not in str(stored)
    done = _submit_and_run(tenant, "k-own")
    assert done.status == S.SUCCEEDED
    (request,) = listener.seen
    assert request.headers["Authorization"] == "Bearer sk_test_own_credential"
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    detail = admin.get(f"/admin/ledger/provider/{provider.pk}/change/").content.decode()
    listing = admin.get("/admin/ledger/provider/").content.decode()
    assert "sk_test_own_credential" not in detail + listing
    assert "set (stored encrypted; never shown)" in detail and ">stored<" in listing


def test_the_console_form_sets_replaces_and_clears_the_credential_without_showing_it(tenant, listener):
    provider = _provider(tenant, listener.url)
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    url = f"/admin/ledger/provider/{provider.pk}/change/"
    assert submit_form(admin, url, new_credential="Bearer first").status_code == 302
    provider.refresh_from_db()
    assert credentials.credential_value(provider=provider, namespace="ACME") == ("Bearer first", None)
    page = admin.get(url).content.decode()
    assert "Bearer first" not in page
    assert submit_form(admin, url, new_credential="Bearer second").status_code == 302
    provider.refresh_from_db()
    assert credentials.credential_value(provider=provider, namespace="ACME") == ("Bearer second", None)
    # Saving without typing keeps it; the box clears it.
    assert submit_form(admin, url).status_code == 302
    provider.refresh_from_db()
    assert credentials.credential_is_set(provider)
    assert submit_form(admin, url, clear_credential="on").status_code == 302
    provider.refresh_from_db()
    assert not credentials.credential_is_set(provider)


def test_a_declared_variable_of_the_tenant_is_read(tenant, listener, monkeypatch):
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_STRIPE", "Bearer sk_acme_declared")
    _provider(tenant, listener.url, auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE")
    assert _submit_and_run(tenant, "k-declared").status == S.SUCCEEDED
    assert listener.seen[0].headers["Authorization"] == "Bearer sk_acme_declared"


def test_the_migration_pauses_providers_whose_stored_reference_is_outside_their_tenants_set(tenant, listener):
    """Existing values stop working with a clear error on the provider, not silently: the
    data step of ledger.0009 pauses such a provider with the reason (it is never read)."""
    import importlib

    from django.apps import apps

    step = importlib.import_module("ledger.migrations.0009_provider_credentials_and_callback_secret_rotation")
    bad = _provider(tenant, listener.url)
    good = services.provider_upsert(
        tenant=tenant, slug="ok", base_url=listener.url, idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    Provider.objects.filter(pk=bad.pk).update(auth_secret_env="DATABASE_URL")
    Provider.objects.filter(pk=good.pk).update(auth_secret_env="ONCEGUARD_SECRET_ACME_CRM")
    step.pause_providers_reading_undeclared_variables(apps, None)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.paused_at is not None and "DATABASE_URL" in bad.paused_reason
    assert good.paused_at is None
