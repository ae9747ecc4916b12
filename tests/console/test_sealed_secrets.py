"""Secrets at rest are sealed and never shown after they are made (docs/secrets.md): a tenant's
callback signing secrets and an alert channel's webhook URL are stored as ciphertext under the
payload keys, re-sealed by key rotation, opened only to sign and to send, shown masked (last 4
at most) on every console page to every role, and never named by a console search, filter or
ordering (a lookup on ciphertext would reveal nothing, and must not be offered)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from alerts import services as alerts
from alerts.models import AlertChannel, AlertDelivery
from alerts.tasks import alert_dispatch_task
from ledger.models import ConfigChange, Tenant
from ledger.platform import crypto
from ledger.protocol.callbacks import callback_signing_secrets, tenant_callback_secret
from ledger.providers.credentials import url_masked
from review.privacy.keys import encryption_rotate
from review.staff.roles import ROLES
from tests.console.support import client_for, page, staff, submit_form
from tests.dlq.sinks import Sink

SLACK = "https://hooks.slack.invalid/services/T000/B000/XXXXSECRETabcd"
SECRET_COLUMNS = {(Tenant, "callback_secret"), (Tenant, "callback_secret_previous"), (AlertChannel, "url")}


def _stored(table: str, column: str, pk: int) -> Any:
    """The column as the database holds it (raw SQL: no field conversion)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])
        value = cursor.fetchone()[0]
    return bytes(value) if isinstance(value, memoryview) else value


def _as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@pytest.fixture
def sink() -> Any:
    started = Sink().start()
    yield started
    started.stop()


# --- Stored sealed ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_callback_secrets_are_stored_as_ciphertext_not_the_clear_value(tenant):
    first = tenant_callback_secret(tenant_id=tenant.pk)
    second = tenant_callback_secret(tenant_id=tenant.pk, rotate=True)
    current = _as_text(_stored("ledger_tenant", "callback_secret", tenant.pk))
    previous = _as_text(_stored("ledger_tenant", "callback_secret_previous", tenant.pk))
    assert second not in current and first not in previous and first not in current
    # Both sign during the overlap, opened from what is stored.
    assert callback_signing_secrets(tenant_id=tenant.pk) == [second, first]


@pytest.mark.django_db
def test_the_callback_secret_is_sealed_even_where_payload_encryption_is_off(tenant, settings):
    settings.ONCEGUARD_PRIVACY = {**getattr(settings, "ONCEGUARD_PRIVACY", {}), "ENCRYPT": False}
    secret = tenant_callback_secret(tenant_id=tenant.pk)
    assert secret not in _as_text(_stored("ledger_tenant", "callback_secret", tenant.pk))
    assert crypto.is_sealed(Tenant.objects.get(pk=tenant.pk).callback_secret)


@pytest.mark.django_db
def test_an_alert_webhook_url_is_stored_as_ciphertext_and_delivery_still_reaches_it(tenant, sink):
    made = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/hook/tokenXYZ123")
    stored = _as_text(_stored("alerts_alertchannel", "url", made.pk))
    assert "tokenXYZ123" not in stored and "127.0.0.1" not in stored
    alerts.alert_raise(tenant_id=tenant.pk, kind="dlq_new", ref="7", summary="one entry")
    alert_dispatch_task(tenant.pk)
    assert [m.path for m in sink.received()] == ["/hook/tokenXYZ123"]
    assert AlertDelivery.objects.get().status == "sent"


@pytest.mark.django_db
def test_the_same_url_again_is_no_change_and_a_new_url_is_a_masked_replacement(tenant):
    made = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK)
    sealed = AlertChannel.objects.get(pk=made.pk).url
    alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK)
    assert AlertChannel.objects.get(pk=made.pk).url == sealed
    assert ConfigChange.objects.filter(object_type="alerts.alertchannel").count() == 1
    alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK.replace("abcd", "wxyz"))
    changed = ConfigChange.objects.filter(object_type="alerts.alertchannel").latest("id")
    assert changed.after == {"url": "‹secret, replaced›"}
    assert "XXXXSECRET" not in json.dumps([[c.before, c.after] for c in ConfigChange.objects.all()])


def test_a_webhook_url_is_shown_as_scheme_host_and_its_last_four_characters():
    assert url_masked(SLACK) == "https://hooks.slack.invalid/…abcd"
    assert url_masked("http://127.0.0.1:8080/a/very/long/secret/path") == "http://127.0.0.1:8080/…path"
    # A short path shows nothing of itself: four characters would be most of it.
    assert url_masked("https://example.invalid/abc") == "https://example.invalid/…"
    assert url_masked("https://user:pw@example.invalid/a-long-token-here") == "https://example.invalid/…here"


# --- Key rotation -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_encryption_rotate_reseals_callback_secrets_and_webhook_urls_under_the_new_key(tenant, monkeypatch):
    old_spec = f"old1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, old_spec)
    first = tenant_callback_secret(tenant_id=tenant.pk)
    second = tenant_callback_secret(tenant_id=tenant.pk, rotate=True)
    channel = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK)
    # One written in clear by hand (as before the migration sealed them): rotation seals it.
    clear = alerts.alert_channel_upsert(tenant=tenant, name="other", kind="slack", url=SLACK)
    AlertChannel.objects.filter(pk=clear.pk).update(url=SLACK)
    new_spec = f"new1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, f"{new_spec},{old_spec}")

    report = encryption_rotate(batch_size=1)
    assert report["ledger.Tenant"]["resealed"] == 1 and report["alerts.AlertChannel"]["resealed"] == 2
    stored = Tenant.objects.get(pk=tenant.pk)
    assert crypto.key_id_of(stored.callback_secret) == crypto.key_id_of(stored.callback_secret_previous) == "new1"
    assert {crypto.key_id_of(c.url) for c in AlertChannel.objects.all()} == {"new1"}
    assert encryption_rotate(dry_run=True)["ledger.Tenant"]["stale"] == 0
    # The old key can go: everything still opens, and callbacks sign with both secrets.
    monkeypatch.setenv(crypto.KEYS_ENV, new_spec)
    assert callback_signing_secrets(tenant_id=tenant.pk) == [second, first]
    assert {alerts.channel_url(c) for c in AlertChannel.objects.all()} == {SLACK}
    assert channel.pk in AlertChannel.objects.values_list("pk", flat=True)


# --- The console --------------------------------------------------------------------------------


def _clients(tenant: Tenant) -> dict[str, Any]:
    clients = {role: client_for(staff(f"{role}-s", role=role, tenants=[tenant])) for role in ROLES}
    clients["superuser"] = client_for(User.objects.create_superuser("root-s", password="x" * 12))
    return clients


@pytest.mark.django_db
def test_no_role_sees_a_callback_secret_or_webhook_url_on_any_tenant_or_channel_page(tenant):
    first = tenant_callback_secret(tenant_id=tenant.pk)
    second = tenant_callback_secret(tenant_id=tenant.pk, rotate=True)
    channel = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK)
    root = client_for(User.objects.create_superuser("root-edit", password="x" * 12))
    # A console edit too, so the history and configuration trail pages have rows to show.
    assert submit_form(root, f"/admin/alerts/alertchannel/{channel.pk}/change/", active=None).status_code == 302
    assert submit_form(root, f"/admin/ledger/tenant/{tenant.pk}/change/", max_in_flight="9").status_code == 302
    urls = [
        "/admin/ledger/tenant/",
        "/admin/ledger/tenant/export.csv",
        f"/admin/ledger/tenant/{tenant.pk}/change/",
        f"/admin/ledger/tenant/{tenant.pk}/history/",
        "/admin/alerts/alertchannel/",
        "/admin/alerts/alertchannel/export.csv",
        f"/admin/alerts/alertchannel/{channel.pk}/change/",
        f"/admin/alerts/alertchannel/{channel.pk}/history/",
        "/admin/ledger/configchange/",
        "/admin/ledger/configchange/export.csv",
        *(f"/admin/ledger/configchange/{pk}/change/" for pk in ConfigChange.objects.values_list("pk", flat=True)),
    ]
    secrets = (first, second, first[-8:], second[-8:], "XXXXSECRET", "/services/T000")
    for who, client in _clients(tenant).items():
        seen = {}
        for url in urls:
            status, text = page(client, url)
            assert status < 500, (who, url, status)
            if status == 200:
                seen[url] = text
        assert seen, who
        for secret in secrets:
            assert not any(secret in text for text in seen.values()), (who, secret)
        # What they see instead, where the page is theirs to see: host and last 4, last 4.
        channel_page = seen.get(f"/admin/alerts/alertchannel/{channel.pk}/change/")
        assert channel_page is None or "https://hooks.slack.invalid/…abcd" in channel_page, who
        tenant_page = seen.get(f"/admin/ledger/tenant/{tenant.pk}/change/")
        assert tenant_page is None or f"…{second[-4:]}" in tenant_page, who
        if who in ("superuser", "admin", "operator", "auditor"):
            assert channel_page is not None and tenant_page is not None, who


@pytest.mark.django_db
def test_the_channel_form_keeps_the_stored_url_when_left_blank_and_checks_a_new_one(tenant):
    channel = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="slack", url=SLACK)
    sealed = AlertChannel.objects.get(pk=channel.pk).url
    admin_client = client_for(staff("ada-s", role="admin", tenants=[tenant]))
    form_url = f"/admin/alerts/alertchannel/{channel.pk}/change/"
    assert "XXXXSECRET" not in page(admin_client, form_url)[1]
    assert submit_form(admin_client, form_url, digest_threshold="7").status_code == 302
    kept = AlertChannel.objects.get(pk=channel.pk)
    assert kept.url == sealed and kept.digest_threshold == 7
    # A new URL passes the outbound policy: a refused one is a form error naming no path.
    refused = submit_form(admin_client, form_url, webhook_url="http://169.254.169.254/latest/secret-path")
    assert refused.status_code == 200 and "secret-path" not in refused.content.decode()
    assert AlertChannel.objects.get(pk=channel.pk).url == sealed
    replaced = SLACK.replace("abcd", "wxyz")
    assert submit_form(admin_client, form_url, webhook_url=replaced).status_code == 302
    assert alerts.channel_url(AlertChannel.objects.get(pk=channel.pk)) == replaced
    # A new channel needs one.
    added = submit_form(admin_client, "/admin/alerts/alertchannel/add/", name="new", kind="slack", tenant=tenant.pk)
    assert added.status_code == 200 and not AlertChannel.objects.filter(name="new").exists()


def _names_a_secret(model: Any, path: str) -> bool:
    """Whether a console lookup path (``tenant__callback_secret``) reaches a secret column."""
    for part in path.lstrip("-^=@").split("__"):
        if (model, part) in SECRET_COLUMNS:
            return True
        try:
            field = model._meta.get_field(part)
        except Exception:
            return False
        if not field.is_relation or field.related_model is None:
            return False
        model = field.related_model
    return False


def test_no_console_search_filter_or_ordering_names_a_secret_column():
    offered = []
    for model, model_admin in admin.site._registry.items():
        names = [
            *model_admin.search_fields,
            *(f for f in model_admin.list_filter if isinstance(f, str)),
            *(f[0] for f in model_admin.list_filter if isinstance(f, tuple)),
            *(model_admin.ordering or ()),
            *(model_admin.sortable_by or ()),
            model_admin.date_hierarchy or "",
            *(f for f in model_admin.list_display if isinstance(f, str)),
        ]
        offered += [(model.__name__, name) for name in names if name and _names_a_secret(model, name)]
    assert offered == []


# --- The migrations -----------------------------------------------------------------------------

BEFORE_SEALING = [("ledger", "0031_sealed_values_as_bytes"), ("alerts", "0004_tenant_on_deliveries")]
SEALED = [("ledger", "0033_sealed_callback_secrets"), ("alerts", "0005_sealed_webhook_urls")]


@pytest.mark.django_db(transaction=True)
def test_the_migrations_seal_clear_secrets_and_urls_and_reverse_to_them():
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate(BEFORE_SEALING).apps
        tenant = old.get_model("ledger", "Tenant").objects.create(
            slug="sealing", name="", callback_secret="current-secret-value-1", callback_secret_previous="prev-value-2"
        )
        bare = old.get_model("ledger", "Tenant").objects.create(slug="sealing-none", name="")
        channel = old.get_model("alerts", "AlertChannel").objects.create(
            tenant=tenant, name="c", kind="slack", url=SLACK
        )

        executor.loader.build_graph()
        sealed = executor.migrate(SEALED).apps
        for column, clear in (
            ("callback_secret", "current-secret-value-1"),
            ("callback_secret_previous", "prev-value-2"),
        ):
            assert clear not in _as_text(_stored("ledger_tenant", column, tenant.pk))
            assert (
                crypto.open_json(getattr(sealed.get_model("ledger", "Tenant").objects.get(pk=tenant.pk), column))
                == clear
            )
        assert sealed.get_model("ledger", "Tenant").objects.get(pk=bare.pk).callback_secret is None
        assert "XXXXSECRET" not in _as_text(_stored("alerts_alertchannel", "url", channel.pk))
        assert crypto.open_json(sealed.get_model("alerts", "AlertChannel").objects.get(pk=channel.pk).url) == SLACK

        executor.loader.build_graph()
        back = executor.migrate(BEFORE_SEALING).apps
        reopened = back.get_model("ledger", "Tenant").objects.get(pk=tenant.pk)
        assert (reopened.callback_secret, reopened.callback_secret_previous) == (
            "current-secret-value-1",
            "prev-value-2",
        )
        assert back.get_model("ledger", "Tenant").objects.get(pk=bare.pk).callback_secret == ""
        assert back.get_model("alerts", "AlertChannel").objects.get(pk=channel.pk).url == SLACK
    finally:
        executor.loader.build_graph()
        executor.migrate(leaves)
    call_command("encryption_rotate", "--dry-run", stdout=io.StringIO())
