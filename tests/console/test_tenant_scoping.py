"""Staff see only their tenants' rows — in every model's list, search, detail page and CSV
export — enforced once by the console's admin site, whoever wrote the ModelAdmin."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from alerts.models import AlertDelivery
from alerts.services import alert_channel_upsert, alert_raise
from dlq.models import BulkReplay, FailedEvent, FailedEventAlias, Replay, RunResume
from dlq.n8n import connections as dlq_connections
from dlq.targets import services as dlq_targets
from ledger.models import (
    AdmissionRefusalCount,
    ApprovalRequest,
    Attempt,
    FenceHold,
    Operation,
    OperationEvent,
    OperationOutput,
    Tenant,
    Tombstone,
    Upload,
)
from ledger.protocol import services
from ledger.providers import prompts
from review.audit.accesslog import accesslog_checkpoint
from review.models import ErasureRun, RetentionPolicy, RetentionRun, StaffTenant
from review.privacy import payloads as privacy
from review.staff.tenancy import object_tenant_id, tenant_path
from tests.console.support import (
    advisory_provider,
    client_for,
    enforced_provider,
    example,
    failed_op,
    op_in_review,
    page,
    staff,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _populate(tenant: Tenant, tag: str) -> dict[str, Any]:
    """One row of every console model for ``tenant``; keys carry ``tag`` so pages can be searched."""
    crm = enforced_provider(tenant)
    mailer = advisory_provider(tenant)
    services.apikey_create(tenant=tenant, scopes=["read"], name=f"key-{tag}")
    review = op_in_review(
        tenant, mailer, f"review-{tag}", handle=f"handle-{tag}", payload=example("voice-call-analyzed.json")
    )
    # Its failed attempt also leaves the tenant's failed-attempt evidence (ADR 0016).
    failed = failed_op(tenant, crm, f"failed-{tag}", payload=example("crm-create-contact-request.json"))
    event = FailedEvent.objects.get(operation=failed)
    target = dlq_targets.replay_target_upsert(
        tenant=tenant, slug=f"target-{tag}", url="http://127.0.0.1:9/hook", is_default=True
    )
    channel = alert_channel_upsert(tenant=tenant, name=f"chan-{tag}", kind="webhook", url="http://127.0.0.1:9/a")
    alert_raise(tenant_id=tenant.pk, kind="test", ref=f"ref-{tag}", summary="x")
    AlertDelivery.objects.create(tenant_id=channel.tenant_id, channel=channel, alert_ids=[1], body={"text": "x"})
    BulkReplay.objects.create(
        tenant=tenant, event_ids=[event.pk], count=1, digest="0" * 64, created_by="t", expires_at=timezone.now()
    )
    Replay.objects.create(
        tenant=tenant,
        event=event,
        number=1,
        ledger_key=f"replay:{event.pk}:1",
        sent_key=failed.key,
        target=target,
        target_slug=target.slug,
        target_url=target.url,
        actor="t",
        started_at=timezone.now(),
    )
    FailedEventAlias.objects.create(tenant=tenant, identity=f"alias-{tag}", event=event)
    RunResume.objects.create(tenant=tenant, run=f"run-{tag}", actor="t", note="n", planned=[], results=[])
    # The allowed "nowhere" address (tests.support.outbound): never contacted here.
    dlq_connections.n8n_connection_save(tenant=tenant, base_url="http://127.0.0.1:9", api_key=f"key-{tag}", actor="t")
    AdmissionRefusalCount.objects.create(tenant=tenant, reason=f"r-{tag}", count=1, last_at=timezone.now())
    prompts.prompt_template_create(
        tenant=tenant, name=f"prompt-{tag}", text="Say {{ x }}", slots={"x": {"max_length": 9}}, actor="t"
    )
    privacy.accesslog_append(
        tenant_id=tenant.pk,
        action="reveal",
        actor=f"user:{tag}",
        object_type="ledger.operation",
        object_id=str(review.pk),
        object_ref=review.key,
        fields=["payload"],
        reason="scoping test",
        ip="127.0.0.1",
    )
    accesslog_checkpoint(tenant_id=tenant.pk)
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=timedelta(days=30))
    RetentionRun.objects.create(tenant=tenant, pass_id=tag, started_at=timezone.now())
    # A published output of the failed operation and an upload (rows: the pages never read bytes).
    digest = tag.encode().hex().ljust(64, "0")
    OperationOutput.objects.create(
        tenant=tenant, operation=failed, key=f"out_{digest}", sha256=digest, size=1, media_type="image/png"
    )
    Upload.objects.create(tenant=tenant, key=f"up_{digest}", sha256=digest, size=1, media_type="image/png")
    now = timezone.now()
    ErasureRun.objects.create(
        tenant=tenant, subject_ref=f"email:{tag}", actor="t", reason="r", requested_at=now, updated_at=now
    )
    Tombstone.objects.create(
        tenant=tenant,
        key=f"gone-{tag}",
        operation_id=999,
        mode="guard",
        fingerprint="f",
        final_status="succeeded",
        created_at=now,
        done_at=now,
        deleted_at=now,
        keep_until=now + timedelta(days=1),
    )
    # A key a restored database forgot (ADR 0012): a hold of its own.
    FenceHold.objects.create(
        tenant=tenant, key=f"held-{tag}", provider_id=crm.pk, journaled_state="succeeded", epoch=1, found_at=now
    )
    # A re-send waiting for a second person (four-eyes, ADR 0013).
    ApprovalRequest.objects.create(
        tenant=tenant,
        kind="replay",
        target_ids=[event.pk],
        requested_by=f"user:{tag}",
        request_reason=f"approval-{tag}",
        requested_at=now,
        expires_at=now + timedelta(days=1),
    )
    member = User.objects.create_user(f"member-{tag}", is_staff=True)
    StaffTenant.objects.create(user=member, tenant=tenant)
    return {"review": review, "failed": failed, "event": event}


def _all_console_perms(user: User) -> None:
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label__in=["ledger", "alerts", "dlq", "review"])
    )


@pytest.fixture
def two_tenants(tenant: Tenant, other_tenant: Tenant) -> tuple[Tenant, Tenant, dict[str, Any], dict[str, Any]]:
    mine = _populate(tenant, "mine")
    theirs = _populate(other_tenant, "theirs")
    return tenant, other_tenant, mine, theirs


def _scoped_models() -> list[type]:
    """Every model with console pages and a tenant: ModelAdmins and the history tables' pages
    (review.console.history_pages: attempts and events, keyed (id, <time>))."""
    models = [*admin.site._registry, *admin.site._history_pages]
    return sorted((m for m in models if tenant_path(m) is not None), key=lambda m: m._meta.label_lower)


def _page_of(model: type) -> Any:
    return admin.site._registry.get(model) or admin.site.history_page(model)


def _scoped_rows(model: type, request: Any) -> Any:
    """The queryset the page builds (lists, searches, actions, exports all start there)."""
    page = _page_of(model)
    return page.get_queryset(request) if model in admin.site._registry else page.queryset(request)


def _row_id(obj: Any) -> Any:
    # A history row's pages name it by its id alone; every other row by its pk.
    return obj.id if obj._meta.is_composite_pk else obj.pk


def test_every_registered_admin_is_wrapped_by_the_console_mixins():
    for model, model_admin in admin.site._registry.items():
        assert getattr(model_admin, "onceguard_scoped", False), model
        assert getattr(model_admin, "onceguard_console", False), model


def test_every_tenant_model_shows_only_the_users_tenants_in_list_detail_and_export(two_tenants):
    mine_tenant, theirs_tenant, _, _ = two_tenants
    user = staff("scoped", role=None, tenants=[mine_tenant])
    _all_console_perms(user)
    user = User.objects.get(pk=user.pk)
    client = client_for(user)
    user.user_permissions.add(Permission.objects.get(codename="export_data"))
    checked = []
    for model in _scoped_models():
        base = model._default_manager.all()
        own = [o for o in base if object_tenant_id(o) == mine_tenant.pk]
        other = [o for o in base if object_tenant_id(o) == theirs_tenant.pk]
        label = model._meta.label_lower
        # Every console model has data for both tenants here: a model added later without
        # rows in _populate fails this test instead of passing silently.
        assert own and other, f"{label}: no rows for both tenants"
        app, name = model._meta.app_label, model._meta.model_name
        status, body = page(client, f"/admin/{app}/{name}/")
        assert status == 200, (label, status)
        for obj in other:
            assert f"/admin/{app}/{name}/{_row_id(obj)}/change/" not in body, f"{label}: other tenant's row listed"
            status, _ = page(client, f"/admin/{app}/{name}/{_row_id(obj)}/change/")
            assert status in (302, 404), f"{label}: other tenant's detail page answered {status}"
        assert any(f"/admin/{app}/{name}/{_row_id(obj)}/change/" in body for obj in own), f"{label}: own rows missing"
        status, csv_text = page(client, f"/admin/{app}/{name}/export.csv")
        assert status == 200, (label, status)
        assert "theirs" not in csv_text and "globex" not in csv_text, f"{label}: export leaks"
        # The queryset the admin builds (lists, searches, actions, exports all start there).
        request = type("R", (), {"user": user, "onceguard_tenant_ids": [mine_tenant.pk]})()
        rows = _scoped_rows(model, request)
        assert {object_tenant_id(o) for o in rows} == {mine_tenant.pk}, label
        checked.append(label)
    assert {
        "ledger.operation",
        "ledger.attempt",
        "ledger.operationevent",
        "dlq.failedevent",
        "review.accesslog",
    } <= set(checked)
    assert len(checked) >= 20, checked


def test_searching_for_another_tenants_key_or_handle_finds_nothing(two_tenants):
    mine_tenant, _, mine, theirs = two_tenants
    client = client_for(staff("searcher", role="reviewer", tenants=[mine_tenant]))
    _, body = page(client, "/admin/review/reviewitem/", data={"q": "handle-theirs"})
    assert "review-theirs" not in body
    _, body = page(client, "/admin/review/reviewitem/", data={"q": "handle-mine"})
    assert "review-mine" in body
    _, body = page(client, "/admin/ledger/operation/", data={"q": theirs["failed"].key})
    assert f"/admin/ledger/operation/{theirs['failed'].pk}/change/" not in body


def test_related_filters_offer_only_own_tenants(two_tenants):
    mine_tenant, _, _, _ = two_tenants
    client = client_for(staff("filterer", role="auditor", tenants=[mine_tenant]))
    for url in (
        "/admin/ledger/operation/",
        "/admin/ledger/provider/",
        "/admin/review/accesslog/",
        "/admin/dlq/failedevent/",
    ):
        _, body = page(client, url)
        assert "globex" not in body, url


def test_a_staff_user_without_tenants_sees_no_rows(two_tenants):
    client = client_for(staff("nobody", role="auditor", tenants=[]))
    _, body = page(client, "/admin/ledger/operation/")
    assert "review-mine" not in body and "review-theirs" not in body


def test_superusers_see_every_tenant(two_tenants):
    root = User.objects.create_superuser("root", password="x" * 12)
    _, body = page(client_for(root), "/admin/ledger/operation/")
    assert "review-mine" in body and "review-theirs" in body


def test_tenantless_models_are_superuser_only(two_tenants):
    mine_tenant, _, _, _ = two_tenants
    user = staff("adm", role="admin", tenants=[mine_tenant])
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=["auth", "django_q"]))
    client = client_for(User.objects.get(pk=user.pk))
    for url in ("/admin/auth/user/", "/admin/auth/group/", "/admin/django_q/schedule/", "/admin/review/loginfailure/"):
        status, _ = page(client, url)
        assert status == 403, url


def test_a_form_cannot_save_a_row_for_another_tenant(two_tenants):
    mine_tenant, theirs_tenant, _, _ = two_tenants
    client = client_for(staff("cfg", role="admin", tenants=[mine_tenant]))
    response = client.post(
        "/admin/review/retentionpolicy/add/",
        {"tenant": theirs_tenant.pk, "record_type": "access_log", "payload_ttl": "", "record_ttl": "10 00:00:00"},
    )
    # The tenant choice is scoped: another tenant is not a valid choice.
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not RetentionPolicy.objects.filter(tenant=theirs_tenant, record_type="access_log").exists()


def test_review_api_keys_cannot_touch_another_tenants_items(two_tenants, make_client):
    mine_tenant, _, mine, theirs = two_tenants
    api = make_client(mine_tenant, ["read", "write"])
    listed = api.get("/api/v1/review/items").json()["results"]
    assert [i["key"] for i in listed] == [mine["review"].key]
    r = api.post(
        f"/api/v1/review/items/{theirs['review'].pk}/decision", {"decision": "abandon", "note": "x"}, format="json"
    )
    assert r.status_code == 404
    assert Operation.objects.get(pk=theirs["review"].pk).status == "review"


def test_decide_page_refuses_another_tenants_item(two_tenants):
    mine_tenant, _, _, theirs = two_tenants
    client = client_for(staff("rev", role="reviewer", tenants=[mine_tenant]))
    response = client.post(
        f"/admin/review/reviewitem/{theirs['review'].pk}/change/", {"decision": "abandon", "note": "not mine"}
    )
    assert response.status_code in (302, 404)
    assert Operation.objects.get(pk=theirs["review"].pk).status == "review"


def test_history_rows_of_other_tenants_are_not_reachable_via_inlines(two_tenants):
    mine_tenant, _, _, theirs = two_tenants
    client = client_for(staff("aud", role="auditor", tenants=[mine_tenant]))
    attempt = Attempt.objects.filter(operation=theirs["failed"]).first()
    event = OperationEvent.objects.filter(operation=theirs["failed"]).first()
    assert page(client, f"/admin/ledger/attempt/{attempt.id}/change/")[0] in (302, 404)
    assert page(client, f"/admin/ledger/operationevent/{event.id}/change/")[0] in (302, 404)
    # The pages exist: the user's own rows answer.
    own = Attempt.objects.filter(operation__tenant=mine_tenant).first()
    assert page(client, f"/admin/ledger/attempt/{own.id}/change/")[0] == 200
