"""Secrets the console never shows (issue 11 items 2 and 9): a tenant's callback signing
secret (today any reviewer, auditor or operator read it on the tenant's page), lease tokens
(the holder's credential for an attempt), a provider's stored credential; and scheduled
tasks, which nobody can create or edit there (a Schedule names any importable function)."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django_q.models import Schedule

from ledger.models import Attempt, ConfigChange, Tenant
from ledger.protocol import services
from ledger.protocol.callbacks import tenant_callback_secret
from ledger.providers.credentials import secret_open
from tests.console.support import client_for, enforced_provider, op_in_review, page, staff, succeeded_op

pytestmark = pytest.mark.django_db

ROLES = ("operator", "reviewer", "auditor", "admin")


def _every_page_of(client, tenant, op) -> str:
    urls = [
        f"/admin/ledger/tenant/{tenant.pk}/change/",
        "/admin/ledger/tenant/",
        "/admin/ledger/tenant/export.csv",
        "/admin/ledger/configchange/",
        "/admin/ledger/configchange/export.csv",
        f"/admin/ledger/operation/{op.pk}/change/",
        "/admin/ledger/operation/",
        "/admin/ledger/operation/export.csv",
        "/admin/ledger/attempt/",
        "/admin/ledger/attempt/export.csv",
        *(f"/admin/ledger/attempt/{a.id}/change/" for a in Attempt.objects.filter(operation=op)),
        f"/admin/review/reviewitem/{op.pk}/change/",
        "/admin/review/reviewitem/",
    ]
    texts = []
    for url in urls:
        status, text = page(client, url)
        if status == 200:
            texts.append(text)
    return "\n".join(texts)


def test_no_role_can_read_the_callback_secret_or_a_lease_token_anywhere_in_the_console(tenant):
    secret = tenant_callback_secret(tenant_id=tenant.pk)
    op = op_in_review(tenant, enforced_provider(tenant), "k-in-review")
    tokens = set(Attempt.objects.filter(operation=op).values_list("lease_token", flat=True)) | {op.lease_token}
    assert secret and all(tokens)
    clients = {role: client_for(staff(f"{role}-1", role=role, tenants=[tenant])) for role in ROLES}
    clients["superuser"] = client_for(User.objects.create_superuser("root", password="x" * 12))
    for who, client in clients.items():
        seen = _every_page_of(client, tenant, op)
        assert seen, who
        assert secret not in seen, who
        assert not any(token in seen for token in tokens), who
    # What they see instead.
    _, text = page(clients["reviewer"], f"/admin/ledger/tenant/{tenant.pk}/change/")
    assert "shown only when made or rotated" in text


def test_rotating_shows_the_new_secret_once_to_those_who_may_change_tenants(tenant):
    old = tenant_callback_secret(tenant_id=tenant.pk)
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = admin.post(
        "/admin/ledger/tenant/", {"action": "rotate_callback_secret", ACTION_CHECKBOX_NAME: [tenant.pk]}
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    tenant.refresh_from_db()
    new = secret_open(tenant.callback_secret)
    assert new != old and new in response.content.decode()
    assert secret_open(tenant.callback_secret_previous) == old and tenant.callback_secret_rotated_at is not None
    # Never again: not on the tenant's page, not in the trail (masked), not in the session.
    _, text = page(admin, f"/admin/ledger/tenant/{tenant.pk}/change/")
    assert new not in text and "the previous secret also signs until" in text
    change = ConfigChange.objects.filter(object_type="ledger.tenant").latest("id")
    assert new not in str(change.after) and old not in str(change.before)
    assert new not in str(dict(admin.session))
    # A reviewer (view only) cannot run it.
    reviewer = client_for(staff("rex", role="reviewer", tenants=[tenant]))
    reviewer.post("/admin/ledger/tenant/", {"action": "rotate_callback_secret", ACTION_CHECKBOX_NAME: [tenant.pk]})
    assert secret_open(Tenant.objects.get(pk=tenant.pk).callback_secret) == new


def test_the_secret_command_prints_a_secret_only_when_it_makes_one(tenant):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("tenant_callback_secret", "--tenant", tenant.slug, stdout=out)
    secret = secret_open(Tenant.objects.get(pk=tenant.pk).callback_secret)
    assert secret in out.getvalue()
    again = StringIO()
    call_command("tenant_callback_secret", "--tenant", tenant.slug, stdout=again)
    assert secret not in again.getvalue() and "--rotate" in again.getvalue()


def test_a_providers_stored_credential_is_never_rendered(tenant):
    provider = services.provider_upsert(
        tenant=tenant,
        slug="crm",
        base_url="http://127.0.0.1:9",
        idempotency_class="key_enforced",
        auth_secret="tok_9f8e7d",
    )
    succeeded_op(tenant, provider, "k-1")
    for role in ROLES:
        client = client_for(staff(f"{role}-2", role=role, tenants=[tenant]))
        for url in (f"/admin/ledger/provider/{provider.pk}/change/", "/admin/ledger/provider/"):
            assert "tok_9f8e7d" not in page(client, url)[1]
    assert "tok_9f8e7d" not in str(list(ConfigChange.objects.values_list("after", flat=True)))


def test_scheduled_tasks_are_read_only_even_for_a_superuser():
    """django-q2's own page lets a superuser schedule any importable function (os.system)."""
    schedule = Schedule.objects.create(name="sweep", func="ledger.schedules.sweep_task", schedule_type=Schedule.MINUTES)
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    assert root.get("/admin/django_q/schedule/").status_code == 200
    assert root.get("/admin/django_q/schedule/add/").status_code == 403
    created = root.post(
        "/admin/django_q/schedule/add/",
        {"name": "pwn", "func": "os.system", "args": "'touch /tmp/pwned'", "schedule_type": "O", "repeats": "-1"},
    )
    assert created.status_code == 403 and not Schedule.objects.filter(func="os.system").exists()
    changed = root.post(
        f"/admin/django_q/schedule/{schedule.pk}/change/",
        {"name": "sweep", "func": "os.system", "schedule_type": "I", "minutes": "1", "repeats": "-1"},
    )
    assert changed.status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).func == "ledger.schedules.sweep_task"
    assert root.post(f"/admin/django_q/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 403
    detail = root.get(f"/admin/django_q/schedule/{schedule.pk}/change/")
    assert detail.status_code == 200 and 'name="func"' not in detail.content.decode()
