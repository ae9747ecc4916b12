"""The DLQ console: filters, masked payload skeleton, replay history, per-entry actions and
bulk actions that show the count before confirming; plus the setup commands."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.urls import reverse
from django_q.models import Schedule

from alerts import schedules as alert_schedules
from dlq.entries import services as dlq_entries
from dlq.ingest import services as dlq_ingest
from dlq.models import BulkReplay, FailedEvent, ReplayTarget
from dlq.replays import services as dlq_replays
from dlq.web.console.common import mask_skeleton
from review.models import StaffTenant
from tests.dlq.conftest import example

pytestmark = pytest.mark.django_db

LEAD = {
    "idempotency_key": "lead-77:crm:create:v1",
    "payload": example("voice-call-analyzed.json"),
    "error": {"class": "transient"},
    "source": {"workflow_id": "17"},
}


def ingest(tenant, event_id: str, **extra) -> FailedEvent:
    raw = json.dumps(LEAD | {"event_id": event_id} | extra).encode()
    return dlq_ingest.failed_event_ingest(tenant=tenant, raw=raw, actor="t").event


def changelist() -> str:
    return reverse("admin:dlq_failedevent_changelist")


def test_mask_skeleton_keeps_keys_and_hides_every_value():
    masked = mask_skeleton({"a": "secret", "b": [1, {"c": None}], "d": True})
    assert masked == {"a": "•••", "b": ["•••", {"c": None}], "d": "•••"}


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?status__exact=pending",
        "?error_class__exact=transient",
        "?workflow=17",
        "?match=workflow.id%3A17",
        "?match=call.from_number%3A1",
        "?failed_at__gte=2020-01-01+00%3A00%3A00%2B00%3A00",
        "?q=lead-1",
    ],
)
def test_the_list_answers_with_every_filter(admin_client, tenant, query):
    ingest(tenant, "lead-1")
    response = admin_client.get(changelist() + query)
    assert response.status_code == 200
    assert "Priya" not in response.content.decode()


def test_the_detail_page_shows_a_masked_skeleton_and_the_replay_history(admin_client, tenant, target, sink):
    event = ingest(tenant, "lead-1")
    dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=event.pk, actor="user:ops")
    page = admin_client.get(reverse("admin:dlq_failedevent_change", args=[event.pk])).content.decode()
    # The skeleton: keys stay (they say what is there), values are •••.
    assert "•••" in page and "call_id" in page
    for secret in ("Priya", "priya.raman", "+61412345678", "call_7f3c2a9e41b04d6f"):
        assert secret not in page
    assert "replay history" in page.lower() and "user:ops" in page and "succeeded" in page


def test_replay_from_the_detail_page(admin_client, tenant, target, sink):
    event = ingest(tenant, "lead-1")
    url = reverse("admin:dlq_failedevent_replay", args=[event.pk])
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(url, {"target": "", "note": ""})
    assert response.status_code == 302
    assert sink.received()[0].header("Idempotency-Key") == "lead-77:crm:create:v1"
    assert FailedEvent.objects.get(pk=event.pk).status == "replayed"
    # Again without force: refused, nothing sent.
    admin_client.post(url, {"target": "", "note": ""})
    assert len(sink.received()) == 1


def test_resolve_from_the_detail_page_needs_a_note(admin_client, tenant):
    event = ingest(tenant, "lead-1")
    url = reverse("admin:dlq_failedevent_resolve", args=[event.pk])
    assert admin_client.post(url, {"note": ""}).status_code == 200  # the form again
    assert FailedEvent.objects.get(pk=event.pk).status == "pending"
    assert admin_client.post(url, {"note": "fixed by hand"}).status_code == 302
    assert FailedEvent.objects.get(pk=event.pk).status == "resolved"


def test_bulk_replay_action_shows_the_count_then_confirms_exactly_that_selection(
    admin_client, tenant, target, enqueued, django_capture_on_commit_callbacks
):
    events = [ingest(tenant, f"lead-{i}") for i in range(3)]
    dlq_entries.failed_event_resolve(tenant_id=tenant.pk, event_pk=events[2].pk, actor="t", note="done")
    ticked = [str(e.pk) for e in events]
    page = admin_client.post(changelist(), {"action": "replay_selected", "_selected_action": ticked})
    assert page.status_code == 200
    text = page.content.decode()
    assert "You ticked 3 entries" in text and "<strong>2</strong> of them are pending" in text
    bulk = BulkReplay.objects.get()
    assert sorted(bulk.event_ids) == sorted([events[0].pk, events[1].pk]) and bulk.status == "draft"
    with django_capture_on_commit_callbacks(execute=True):
        done = admin_client.post(
            changelist(),
            {
                "action": "replay_selected",
                "_selected_action": ticked,
                "bulk_confirm": "1",
                "bulk_id": str(bulk.pk),
                "bulk_count": "2",
                "target": "n8n-rerun",
                "note": "CRM back up",
            },
        )
    assert done.status_code == 302
    bulk.refresh_from_db()
    assert bulk.status == "running" and bulk.note == "CRM back up" and bulk.confirmed_by.startswith("user:")
    assert ("dlq.tasks.bulk_replay_run_task", bulk.pk) in enqueued


def test_bulk_discard_action_needs_a_note(admin_client, tenant):
    events = [ingest(tenant, f"lead-{i}") for i in range(2)]
    ticked = [str(e.pk) for e in events]
    page = admin_client.post(changelist(), {"action": "discard_selected", "_selected_action": ticked})
    assert "You ticked <strong>2</strong> entries" in page.content.decode()
    admin_client.post(changelist(), {"action": "discard_selected", "_selected_action": ticked, "bulk_confirm": "1"})
    assert set(FailedEvent.objects.values_list("status", flat=True)) == {"pending"}
    admin_client.post(
        changelist(),
        {"action": "discard_selected", "_selected_action": ticked, "bulk_confirm": "1", "note": "test leads"},
    )
    assert set(FailedEvent.objects.values_list("status", flat=True)) == {"discarded"}


def test_staff_see_only_their_tenants_and_need_the_replay_permission(client, tenant, other_tenant, target):
    mine, theirs = ingest(tenant, "lead-1"), ingest(other_tenant, "lead-2")
    user = User.objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    StaffTenant.objects.create(user=user, tenant=tenant)
    auditor = Group.objects.get(name="auditor")
    user.groups.add(auditor)
    client.force_login(user)
    listing = client.get(changelist())
    assert listing.status_code == 200
    ids = {obj.pk for obj in listing.context["cl"].result_list}
    assert ids == {mine.pk}
    assert client.get(reverse("admin:dlq_failedevent_change", args=[theirs.pk])).status_code in (302, 404)
    # An auditor may look but not replay.
    assert client.post(reverse("admin:dlq_failedevent_replay", args=[mine.pk]), {}).status_code == 403
    user.groups.add(Group.objects.get(name="operator"))
    user = User.objects.get(pk=user.pk)
    client.force_login(user)
    assert client.get(reverse("admin:dlq_failedevent_replay", args=[mine.pk])).status_code == 200
    assert client.get(reverse("admin:dlq_failedevent_replay", args=[theirs.pk])).status_code == 404


def test_replaytarget_upsert_command(tenant):
    out = StringIO()
    call_command(
        "replaytarget_upsert",
        "--tenant",
        "acme",
        "--slug",
        "n8n",
        "--url",
        "https://n8n.example.invalid/webhook/r",
        "--idempotency-class",
        "key_advisory",
        "--default",
        stdout=out,
    )
    call_command(
        "replaytarget_upsert",
        "--tenant",
        "acme",
        "--slug",
        "crm",
        "--url",
        "https://crm.example.invalid/in",
        "--idempotency-header",
        "X-Request-Id",
        "--idempotency-class",
        "key_enforced",
        "--default",
        stdout=out,
    )
    crm = ReplayTarget.objects.get(slug="crm")
    assert crm.idempotency_header == "X-Request-Id" and crm.is_default
    assert not ReplayTarget.objects.get(slug="n8n").is_default
    assert "replay target acme/crm" in out.getvalue()
    assert crm.idempotency_class == "key_enforced" and crm.class_confirmed
    # Each new target's signing secret was printed once, when it was made.
    assert out.getvalue().count("signing secret (shown once") == 2
    # A new target must say whether its receiver refuses a second effect of a key.
    with pytest.raises(Exception, match="needs --idempotency-class"):
        call_command("replaytarget_upsert", "--tenant", "acme", "--slug", "new", "--url", "https://x.invalid")
    with pytest.raises(Exception, match="No tenant"):
        call_command("replaytarget_upsert", "--tenant", "nope", "--slug", "x", "--url", "https://x.invalid")


def test_dlq_schedules_command_is_idempotent():
    # What alerts' migration installs; a transactional test's flush before this one (in random
    # order) empties the table, so it is installed again here, as the migration does.
    alert_schedules.install_schedules()
    call_command("dlq_schedules", stdout=StringIO())
    call_command("dlq_schedules", stdout=StringIO())
    funcs = sorted(Schedule.objects.filter(name__startswith="dlq:").values_list("func", flat=True))
    assert funcs == ["dlq.tasks.auto_replay_task", "dlq.tasks.replays_recover_task"]
    # The alert flush belongs to the alerts app (installed by its migration).
    assert Schedule.objects.get(name="alerts: flush and retries").func == "alerts.tasks.alerts_flush_task"


def test_a_bulk_selection_over_the_limit_is_refused_with_a_message(admin_client, tenant, settings):
    settings.ONCEGUARD_DLQ = {"BULK_MAX_SELECTION": 1}
    ticked = [str(ingest(tenant, f"lead-{i}").pk) for i in range(2)]
    response = admin_client.post(changelist(), {"action": "replay_selected", "_selected_action": ticked}, follow=True)
    assert response.status_code == 200
    assert "more than 1 entries" in response.content.decode()
    assert not BulkReplay.objects.exists()
