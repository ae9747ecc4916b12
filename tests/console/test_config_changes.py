"""A trail of who changed what (issue 11 item 8): every change of configuration, staff roles,
tenant memberships and API keys leaves an append-only ConfigChange row (who, when, what,
before → after, secrets masked), through the path a user takes — console form, management
command or service — readable by auditors of the tenant and exportable as CSV. API keys can
expire."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from alerts.models import AlertChannel
from dlq.models import ReplayTarget
from ledger.models import ApiKey, ConfigChange, Provider, Tenant
from ledger.protocol import services
from ledger.providers.credentials import secret_open
from ledger.tenants import auth as ledger_auth
from ledger.tenants.config_changes import SECRET_MASK, SECRET_REPLACED
from review.models import RetentionPolicy, StaffTenant
from review.retention.policies import retention_policy_save
from tests.console.support import client_for, enforced_provider, page, staff, submit_form

pytestmark = pytest.mark.django_db(transaction=True)


def _changes(**filters: Any) -> list[ConfigChange]:
    return list(ConfigChange.objects.filter(**filters).order_by("id"))


def _no_secret_in_table(*secrets: str) -> None:
    dumped = json.dumps([[c.before, c.after, c.object_repr] for c in ConfigChange.objects.all()])
    assert not any(s and s in dumped for s in secrets)


@pytest.fixture
def ada(tenant: Tenant) -> Client:
    return client_for(staff("ada", role="admin", tenants=[tenant]))


@pytest.fixture
def root(db: Any) -> Client:
    return client_for(User.objects.create_superuser("root", password="x" * 12))


# --- Providers --------------------------------------------------------------------------------------


def test_a_provider_made_by_command_and_changed_in_the_console_is_recorded(tenant, ada):
    call_command(
        "provider_upsert",
        "--tenant=acme",
        "--slug=crm",
        "--base-url=http://127.0.0.1:9/api",
        "--class=key_enforced",
        stdout=io.StringIO(),
    )
    provider = Provider.objects.get(slug="crm")
    [created] = _changes(object_type="ledger.provider")
    assert created.action == "create" and created.actor.startswith("cli:") and created.tenant_id == tenant.pk
    assert created.before is None and created.after["base_url"] == "http://127.0.0.1:9/api"

    response = submit_form(
        ada, f"/admin/ledger/provider/{provider.pk}/change/", max_attempts="9", timeout_seconds="3.5"
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    [_, changed] = _changes(object_type="ledger.provider")
    assert changed.action == "update" and changed.actor == "user:ada" and changed.object_repr == "acme/crm"
    # The row the command's service writes (one write path, ADR 0006): a change of the
    # adapter's timeout names the revision it made, as `manage.py provider_upsert` does.
    assert changed.before == {"max_attempts": 4, "revision": 1, "timeout_seconds": 10.0}
    assert changed.after == {"max_attempts": 9, "revision": 2, "timeout_seconds": 3.5}
    # Saving the form again without a change adds nothing.
    submit_form(ada, f"/admin/ledger/provider/{provider.pk}/change/")
    assert len(_changes(object_type="ledger.provider")) == 2


# --- API keys ---------------------------------------------------------------------------------------


def test_an_api_key_made_with_an_expiry_by_command_and_revoked_in_the_console_is_recorded(tenant, ada):
    out = io.StringIO()
    call_command("apikey_create", "--tenant=acme", "--scopes=read", "--expires-in-days=30", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    api_key = ApiKey.objects.get()
    assert timedelta(days=29) < api_key.expires_at - timezone.now() <= timedelta(days=30)
    [created] = _changes(object_type="ledger.apikey")
    assert created.action == "create" and created.actor.startswith("cli:")
    assert created.after["hashed_key"] == SECRET_MASK and created.after["expires_at"]
    assert created.after["scopes"] == ["read"] and "expires" in out.getvalue()

    _, body = page(ada, "/admin/ledger/apikey/")
    assert "Expires at" in body
    ada.post("/admin/ledger/apikey/", {"action": "revoke", "_selected_action": [api_key.pk]})
    [_, revoked] = _changes(object_type="ledger.apikey")
    assert revoked.actor == "user:ada" and revoked.before == {"revoked_at": None} and revoked.after["revoked_at"]
    _no_secret_in_table(secret, api_key.hashed_key)


def test_an_expired_api_key_authenticates_nothing_even_while_it_is_cached(tenant, provider, monkeypatch):
    _, secret = services.apikey_create(tenant=tenant, scopes=["read"], expires_at=timezone.now() + timedelta(hours=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/operations").status_code == 200  # loaded into the per-process cache

    class Later:
        @staticmethod
        def now() -> Any:
            return timezone.now() + timedelta(hours=2)

    monkeypatch.setattr(ledger_auth, "timezone", Later)
    response = client.get("/api/v1/operations")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_an_expiry_in_the_past_is_refused(tenant):
    with pytest.raises(Exception, match="future"):
        services.apikey_create(tenant=tenant, expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Exception, match="above 0"):
        call_command("apikey_create", "--tenant=acme", "--expires-in-days=0", stdout=io.StringIO())


# --- Tenants and their callback settings ------------------------------------------------------------


def test_tenant_creation_settings_allow_list_and_callback_secret_are_recorded_secret_masked(tenant, root):
    call_command("tenant_create", "initech", stdout=io.StringIO())
    initech = Tenant.objects.get(slug="initech")
    [created] = _changes(object_type="ledger.tenant", tenant=initech)
    assert created.action == "create" and created.actor.startswith("cli:")

    out = io.StringIO()
    call_command("tenant_callback_secret", "--tenant=initech", "--allow=https://hooks.example.invalid/cb", stdout=out)
    call_command("tenant_callback_secret", "--tenant=initech", "--rotate", stdout=out)
    allow, first_secret, rotated = _changes(object_type="ledger.tenant", tenant=initech)[1:]
    assert allow.after == {"callback_allow_list": ["https://hooks.example.invalid/cb"]}
    assert first_secret.before == {"callback_secret": ""} and first_secret.after == {"callback_secret": SECRET_MASK}
    assert rotated.before == {"callback_secret": SECRET_MASK} and rotated.after == {"callback_secret": SECRET_REPLACED}

    response = submit_form(root, f"/admin/ledger/tenant/{initech.pk}/change/", max_in_flight="25")
    assert response.status_code == 302, response.content.decode()[:2000]
    settings_change = _changes(object_type="ledger.tenant", tenant=initech)[-1]
    assert settings_change.actor == "user:root"
    assert settings_change.before == {"max_in_flight": None} and settings_change.after == {"max_in_flight": 25}
    initech.refresh_from_db()
    _no_secret_in_table(secret_open(initech.callback_secret))


# --- Replay targets, alert channels, retention policies ------------------------------------------------


def test_replay_targets_by_command_and_console_are_recorded(tenant, ada):
    call_command(
        "replaytarget_upsert",
        "--tenant=acme",
        "--slug=n8n",
        "--url=http://127.0.0.1:9/hook?token=abc",
        "--idempotency-class=key_enforced",
        "--default",
        stdout=io.StringIO(),
    )
    target = ReplayTarget.objects.get()
    [created] = _changes(object_type="dlq.replaytarget")
    assert created.action == "create" and created.after["is_default"] is True
    # A URL keeps its host and path, never its query (where tokens travel).
    assert created.after["url"] == f"http://127.0.0.1:9/hook?{SECRET_MASK}"
    response = submit_form(ada, f"/admin/dlq/replaytarget/{target.pk}/change/", auto_replay="on")
    assert response.status_code == 302, response.content.decode()[:2000]
    changed = _changes(object_type="dlq.replaytarget")[-1]
    assert changed.actor == "user:ada" and changed.before == {"auto_replay": False}
    assert changed.after == {"auto_replay": True}
    _no_secret_in_table("token=abc")


def test_alert_channels_by_command_and_console_are_recorded_webhook_url_masked(tenant, ada):
    url = "https://hooks.slack.invalid/services/T000/B000/XXXXSECRET"
    call_command(
        "alertchannel_upsert", "--tenant=acme", "--name=ops", "--kind=slack", f"--url={url}", stdout=io.StringIO()
    )
    channel = AlertChannel.objects.get()
    [created] = _changes(object_type="alerts.alertchannel")
    assert created.action == "create" and created.after["url"] == SECRET_MASK and created.after["kind"] == "slack"
    response = submit_form(ada, f"/admin/alerts/alertchannel/{channel.pk}/change/", active=None)
    assert response.status_code == 302, response.content.decode()[:2000]
    changed = _changes(object_type="alerts.alertchannel")[-1]
    assert changed.before == {"active": True} and changed.after == {"active": False}
    ada.post(f"/admin/alerts/alertchannel/{channel.pk}/delete/", {"post": "yes"})
    deleted = _changes(object_type="alerts.alertchannel")[-1]
    assert deleted.action == "delete" and deleted.after is None and deleted.before["name"] == "ops"
    assert not AlertChannel.objects.exists()
    _no_secret_in_table("XXXXSECRET")


def test_retention_policies_by_console_and_service_are_recorded(tenant, ada):
    response = ada.post(
        "/admin/review/retentionpolicy/add/",
        {"tenant": tenant.pk, "record_type": "operations", "payload_ttl": "1 week", "record_ttl": "30 days"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    [created] = _changes(object_type="review.retentionpolicy")
    assert created.action == "create" and created.actor == "user:ada"
    assert created.after["payload_ttl"] == "7 days" and created.after["record_ttl"] == "30 days"
    retention_policy_save(
        tenant_id=tenant.pk,
        record_type="operations",
        payload_ttl=timedelta(days=7),
        record_ttl=timedelta(days=90),
        actor="user:ops",
    )
    changed = _changes(object_type="review.retentionpolicy")[-1]
    assert changed.before == {"record_ttl": "30 days"} and changed.after == {"record_ttl": "90 days"}
    assert RetentionPolicy.objects.get().record_ttl == timedelta(days=90)


# --- Staff roles and tenant memberships --------------------------------------------------------------


def test_a_staff_users_roles_and_memberships_changed_in_the_console_are_recorded(tenant, other_tenant, root):
    bob = staff("bob", role="reviewer", tenants=[tenant])
    ConfigChange.objects.all().delete()  # (the fixtures' own setup is not what this test is about)
    response = root.post("/admin/review/stafftenant/add/", {"user": bob.pk, "tenant": other_tenant.pk})
    assert response.status_code == 302, response.content.decode()[:2000]
    [membership] = _changes(object_type="review.stafftenant")
    assert membership.action == "create" and membership.tenant_id == other_tenant.pk
    assert membership.after["user"] == bob.pk and membership.actor == "user:root"

    admin_group = Group.objects.get(name="admin")
    reviewer_group = Group.objects.get(name="reviewer")
    response = submit_form(root, f"/admin/auth/user/{bob.pk}/change/", groups=[str(admin_group.pk)])
    assert response.status_code == 302, response.content.decode()[:2000]
    role_changes = _changes(object_type="auth.user")
    # Shown to each tenant bob works for: a new admin is each tenant's business.
    assert sorted(c.tenant_id for c in role_changes) == sorted([tenant.pk, other_tenant.pk])
    for change in role_changes:
        assert change.before == {"groups": [reviewer_group.name]} and change.after == {"groups": [admin_group.name]}
    bob.refresh_from_db()
    _no_secret_in_table(bob.password)
    membership_row = StaffTenant.objects.get(user=bob, tenant=other_tenant)
    root.post(f"/admin/review/stafftenant/{membership_row.pk}/delete/", {"post": "yes"})
    assert _changes(object_type="review.stafftenant")[-1].action == "delete"


# --- Reading the trail ---------------------------------------------------------------------------------


def test_auditors_read_and_export_their_tenants_trail_only_and_nobody_edits_it(tenant, other_tenant, root):
    enforced_provider(tenant, "crm")
    enforced_provider(other_tenant, "erp")
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    status, body = page(auditor, "/admin/ledger/configchange/")
    assert status == 200 and "acme/crm" in body and "globex/erp" not in body
    status, text = page(auditor, "/admin/ledger/configchange/export.csv", data={"object_type": "ledger.provider"})
    rows = list(csv.reader(io.StringIO(text)))
    assert status == 200 and rows[0][:4] == ["At", "Tenant", "Actor", "Action"]
    assert any("acme/crm" in r for r in rows[1:]) and not any("globex/erp" in r for r in rows[1:])
    after = next(r for r in rows[1:] if "acme/crm" in r)[-1]
    assert json.loads(after)["slug"] == "crm"

    change = ConfigChange.objects.filter(tenant=tenant).first()
    assert root.get("/admin/ledger/configchange/add/").status_code == 403
    assert root.post(f"/admin/ledger/configchange/{change.pk}/delete/", {"post": "yes"}).status_code == 403
    root.post(f"/admin/ledger/configchange/{change.pk}/change/", {"actor": "user:nobody"})
    assert ConfigChange.objects.get(pk=change.pk).actor == change.actor


def test_a_tenant_deleted_in_the_console_keeps_its_trail(db, root):
    call_command("tenant_create", "typo-tenant", stdout=io.StringIO())
    typo = Tenant.objects.get(slug="typo-tenant")
    response = root.post(f"/admin/ledger/tenant/{typo.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Tenant.objects.filter(pk=typo.pk).exists()
    created, deleted = _changes(object_type="ledger.tenant", object_id=str(typo.pk))
    assert (created.action, deleted.action) == ("create", "delete") and deleted.actor == "user:root"
    assert deleted.tenant_id == typo.pk and deleted.before["slug"] == "typo-tenant"
