"""Replays by target class (DESIGN §4, ADR 0003): an entry whose first try may have acted goes
to a key-advisory target only after a person's recorded decision; replays are signed with the
target's own secret and carry its sealed credential; plain http only on this machine."""

from __future__ import annotations

import json
import time

import pytest
from django.urls import reverse

from dlq.models import BulkReplay, FailedEvent, FailedEventChange, Replay, ReplayTarget
from dlq.replays import automatic as dlq_automatic
from dlq.replays import services as dlq_replays
from dlq.replays import signatures as dlq_signatures
from dlq.rules.errors import ReplayNeedsDecision
from dlq.targets import services as dlq_targets
from ledger.models import ConfigChange
from ledger.platform.errors import DestinationNotAllowed
from ledger.providers.adapters import sign
from tests.console.support import submit_form
from tests.dlq.test_bulk import run_bulk

pytestmark = pytest.mark.django_db

CREDENTIAL = "cred-s3cret-value-9f1c"


def ingest(client, event_id: str, error: dict) -> int:
    body = {
        "event_id": event_id,
        "idempotency_key": f"{event_id}:crm:create:v1",
        "payload": {"lead": event_id},
        "error": error,
    }
    response = client.post("/api/v1/dlq/events", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def ambiguous(client, event_id: str = "lead-1") -> int:
    return ingest(client, event_id, {"message": "ETIMEDOUT after the request was sent", "class": "ambiguous"})


def replay(client, event_id: int, **body):
    return client.post(f"/api/v1/dlq/events/{event_id}/replay", body, format="json")


def decide(client, event_id: int, note: str = "checked the CRM: no contact for this lead"):
    return client.post(f"/api/v1/dlq/events/{event_id}/resend-decision", {"note": note}, format="json")


@pytest.fixture
def advisory(tenant, sink) -> ReplayTarget:
    return dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="crm",
        url=f"{sink.url}/contacts",
        idempotency_class="key_advisory",
        timeout_seconds=2.0,
        is_default=True,
    )


def test_a_key_advisory_target_gets_nothing_for_an_ambiguous_entry_until_a_person_decides(client, advisory, sink):
    event_id = ambiguous(client)
    response = replay(client, event_id)
    assert response.status_code == 409
    problem = response.json()
    assert problem["code"] == "replay_needs_decision"
    assert "safe to resend" in problem["detail"] and "key-advisory" in problem["detail"]
    assert sink.received() == []
    assert not Replay.objects.filter(event_id=event_id).exists()
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_after_the_recorded_decision_the_entry_is_delivered_exactly_once(client, advisory, sink):
    event_id = ambiguous(client)
    assert decide(client, event_id, note="").status_code == 400  # a reason is required
    response = decide(client, event_id)
    assert response.status_code == 200, response.content
    change = FailedEventChange.objects.filter(event_id=event_id).order_by("-id").first()
    assert 'decision "safe to resend"' in change.note and "no contact" in change.note
    assert change.actor and FailedEvent.objects.get(pk=event_id).resend_decided_by == change.actor
    assert replay(client, event_id).json()["outcome"] == "succeeded"
    assert len(sink.received()) == 1
    # Replayed: another replay needs force; forced, the used-up decision is needed again.
    forced = replay(client, event_id, force=True, note="again")
    assert forced.status_code == 409 and forced.json()["code"] == "replay_needs_decision"
    assert len(sink.received()) == 1


def test_a_decision_is_used_up_by_the_replay_it_allowed(client, advisory, sink):
    event_id = ambiguous(client)
    decide(client, event_id)
    sink.mode, sink.status = "status", 500  # the replay itself comes back ambiguous
    assert replay(client, event_id).json()["outcome"] == "ambiguous"
    sink.mode = "ok"
    again = replay(client, event_id)
    assert again.status_code == 409 and "replay #1" in again.json()["detail"]
    assert len(sink.received()) == 1


def test_a_key_enforced_target_gets_an_ambiguous_entry_without_a_decision(client, tenant, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="stripe-like", url=sink.url, idempotency_class="key_enforced", is_default=True
    )
    event_id = ambiguous(client)
    assert replay(client, event_id).json()["outcome"] == "succeeded"
    [request] = sink.received()
    assert request.header("Idempotency-Key") == "lead-1:crm:create:v1"


@pytest.mark.parametrize(
    "error",
    [
        {"message": "connect ECONNREFUSED 10.0.0.5:443"},
        {"message": "CRM answered 429", "class": "transient"},
        {"message": "CRM answered 400", "class": "invalid_input"},
    ],
)
def test_an_entry_that_never_reached_the_target_replays_as_before(client, advisory, sink, error):
    event_id = ingest(client, "lead-2", error)
    response = replay(client, event_id)
    assert response.status_code == 201, response.content
    assert len(sink.received()) == 1


def test_bulk_replay_says_how_many_will_wait_and_sends_none_of_them(
    client, advisory, sink, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"BULK_REPLAY_PER_SECOND": 1000}
    waiting = ambiguous(client, "lead-a")
    sendable = ingest(client, "lead-b", {"class": "transient"})
    dry = client.post("/api/v1/dlq/replays", {"dry_run": True}, format="json").json()
    assert dry["count"] == 2
    assert dry["waiting_for_decision"]["count"] == 1
    assert "key-advisory" in dry["waiting_for_decision"]["reason"]
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/api/v1/dlq/replays", {"id": dry["id"], "count": 2}, format="json")
    run_bulk(enqueued, dry["id"])
    bulk = BulkReplay.objects.get(pk=dry["id"])
    assert (bulk.succeeded, bulk.skipped) == (1, 1)
    assert [r.json() for r in sink.received()] == [{"lead": "lead-b"}]
    assert FailedEvent.objects.get(pk=waiting).status == "pending"
    assert FailedEvent.objects.get(pk=sendable).status == "replayed"


def test_an_automatic_replay_sends_nothing_to_a_key_advisory_target(client, advisory, sink):
    event_id = ambiguous(client)
    ReplayTarget.objects.filter(pk=advisory.pk).update(auto_replay=True)
    dlq_automatic.auto_replay_due()
    with pytest.raises(ReplayNeedsDecision, match="waits for a decision"):
        dlq_replays.failed_event_replay(
            tenant_id=advisory.tenant_id, event_pk=event_id, actor="schedule", trigger="auto"
        )
    assert sink.received() == []


def test_a_lookup_that_finds_the_key_settles_the_entry_without_sending(client, tenant, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="crm",
        url=sink.url,
        idempotency_class="key_advisory",
        lookup_url=f"{sink.url}/contacts?external_id={{key}}",
        is_default=True,
    )
    sink.lookup_status = 200
    event_id = ambiguous(client)
    response = replay(client, event_id)
    assert response.status_code == 201, response.content
    assert response.json()["outcome"] == "succeeded"
    assert sink.received() == []
    [lookup] = sink.lookups
    assert lookup.path == "/contacts?external_id=lead-1%3Acrm%3Acreate%3Av1"
    assert lookup.header("Onceguard-Signature")
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"
    change = FailedEventChange.objects.filter(event_id=event_id).order_by("-id").first()
    assert "found by the target's lookup" in change.note


def test_a_lookup_that_does_not_find_the_key_lets_the_replay_send(client, tenant, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="crm",
        url=sink.url,
        idempotency_class="key_advisory",
        lookup_url=f"{sink.url}/contacts/{{key}}",
        is_default=True,
    )
    event_id = ambiguous(client)
    sink.lookup_status = 500  # no definite answer: the entry still waits
    assert replay(client, event_id).json()["code"] == "replay_needs_decision"
    sink.lookup_status = 404
    assert replay(client, event_id).json()["outcome"] == "succeeded"
    assert len(sink.received()) == 1


def test_replays_are_signed_with_the_current_and_the_previous_secret_during_a_rotation(client, advisory, sink):
    first = advisory.new_signing_secret
    assert first
    ingest(client, "lead-3", {"class": "transient"})
    second, made = dlq_targets.replay_target_signing_secret(target_id=advisory.pk, rotate=True)
    assert made and second != first
    replay(client, FailedEvent.objects.get(event_id="lead-3").pk)
    [request] = sink.received()
    header = request.header("Onceguard-Signature")
    assert header.count("v1=") == 2
    verify = dlq_signatures.replay_signature_verify
    assert verify(keys=[first], body=request.body, header=header)
    assert verify(keys=[second], body=request.body, header=header)
    assert not verify(keys=["someone-else-s-secret"], body=request.body, header=header)
    tampered = request.body.replace(b"lead-3", b"lead-4")
    assert not verify(keys=[first, second], body=tampered, header=header)
    stale = sign(secret=second, body=request.body, timestamp=int(time.time()) - 600)
    assert not verify(keys=[second], body=request.body, header=stale)


def test_the_credential_reaches_the_target_and_is_never_shown(client, tenant, sink, admin_client):
    target = dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="crm",
        url=f"{sink.url}/hook/tok-path-abcdef123456",
        idempotency_class="key_enforced",
        credential_header="X-Api-Key",
        credential_value=CREDENTIAL,
        is_default=True,
    )
    event_id = ingest(client, "lead-5", {"class": "transient"})
    replay(client, event_id)
    [request] = sink.received()
    assert request.header("X-Api-Key") == CREDENTIAL
    pages = [
        admin_client.get(reverse("admin:dlq_replaytarget_changelist")),
        admin_client.get(reverse("admin:dlq_replaytarget_change", args=[target.pk])),
    ]
    for page in pages:
        assert page.status_code == 200
        assert CREDENTIAL not in page.content.decode()
    # The list shows the URL masked past its host (a webhook path can be a token).
    assert "tok-path-abcdef" not in pages[0].content.decode()
    dumped = json.dumps([[c.before, c.after] for c in ConfigChange.objects.all()])
    assert CREDENTIAL not in dumped and target.new_signing_secret not in dumped


def test_plain_http_is_refused_for_a_target_that_is_not_on_this_machine(tenant, settings):
    with pytest.raises(DestinationNotAllowed, match="https is required"):
        dlq_targets.replay_target_upsert(
            tenant=tenant, slug="crm", url="http://crm.example.com/in", idempotency_class="key_advisory"
        )
    settings.ONCEGUARD_DLQ = {"REPLAY_ALLOW_HTTP": 1}
    target = dlq_targets.replay_target_upsert(
        tenant=tenant, slug="crm", url="http://crm.example.com/in", idempotency_class="key_advisory"
    )
    assert target.url == "http://crm.example.com/in"


def test_a_target_made_without_a_class_is_key_advisory_and_listed_as_not_confirmed(tenant, sink, admin_client):
    dlq_targets.replay_target_upsert(tenant=tenant, slug="legacy", url=sink.url)
    target = ReplayTarget.objects.get(slug="legacy")
    assert (target.idempotency_class, target.class_confirmed) == ("key_advisory", False)
    page = admin_client.get(reverse("admin:dlq_replaytarget_changelist") + "?class_state=unconfirmed")
    text = page.content.decode()
    assert "legacy" in text and "not confirmed" in text


def test_the_console_replay_page_says_what_the_entry_waits_for_and_records_the_decision(
    client, advisory, sink, admin_client
):
    event_id = ambiguous(client)
    page = admin_client.get(reverse("admin:dlq_failedevent_replay", args=[event_id])).content.decode()
    assert "waits for a decision" in page and 'data-testid="record-decision"' in page
    refused = admin_client.post(reverse("admin:dlq_failedevent_replay", args=[event_id]), {"note": ""}, follow=True)
    assert "Not replayed" in refused.content.decode() and sink.received() == []
    url = reverse("admin:dlq_failedevent_resend_decision", args=[event_id])
    response = admin_client.post(url, {"note": "CRM has no such contact"})
    assert response.status_code == 302
    assert FailedEvent.objects.get(pk=event_id).resend_decided_at is not None
    admin_client.post(reverse("admin:dlq_failedevent_replay", args=[event_id]), {"note": ""})
    assert len(sink.received()) == 1


def test_a_target_added_in_the_console_shows_its_secret_once_and_keeps_the_credential_write_only(
    tenant, sink, admin_client
):
    add = reverse("admin:dlq_replaytarget_add")
    fields = {
        "tenant": tenant.pk,
        "slug": "crm",
        "url": f"{sink.url}/in",
        "idempotency_header": "Idempotency-Key",
        "lookup_url": "",
        "credential_header": "X-Api-Key",
        "new_credential": CREDENTIAL,
        "timeout_seconds": "5",
        "active": "on",
        "_save": "Save",
    }
    refused = admin_client.post(add, fields)  # no class chosen: refused
    assert refused.status_code == 200 and not ReplayTarget.objects.exists()
    shown = admin_client.post(add, {**fields, "idempotency_class": "key_advisory"})
    assert shown.status_code == 200 and "no-store" in shown["Cache-Control"]
    target = ReplayTarget.objects.get()
    assert target.class_confirmed and target.credential_secret
    secret = dlq_targets.replay_target_signing_secret(target_id=target.pk)[0]
    assert secret in shown.content.decode()
    change = reverse("admin:dlq_replaytarget_change", args=[target.pk])
    page = admin_client.get(change).content.decode()
    assert secret not in page and CREDENTIAL not in page
    # Blank keeps the stored credential.
    assert submit_form(admin_client, change, timeout_seconds="6").status_code == 302
    target.refresh_from_db()
    assert target.credential_secret and target.timeout_seconds == 6
    dumped = json.dumps([[c.before, c.after] for c in ConfigChange.objects.all()])
    assert CREDENTIAL not in dumped and secret not in dumped
    # The rotate action shows the new secret once; the old one keeps signing for the overlap.
    rotated = admin_client.post(
        reverse("admin:dlq_replaytarget_changelist"),
        {"action": "rotate_signing_secret", "_selected_action": [target.pk]},
    )
    new = dlq_targets.replay_target_signing_secret(target_id=target.pk)[0]
    assert new != secret and new in rotated.content.decode()
    assert dlq_targets.replay_target_signing_secrets(target_id=target.pk) == [new, secret]


def test_the_target_list_warns_about_targets_whose_class_or_acknowledgement_nobody_confirmed(
    tenant, sink, admin_client
):
    # The console puts its own mixins in front of every page
    # (review.console.site.OnceguardAdminSite): the warnings are said by the list page itself,
    # above the rows.
    dlq_targets.replay_target_upsert(tenant=tenant, slug="legacy", url=sink.url)
    listed = admin_client.get(reverse("admin:dlq_replaytarget_changelist"))
    text = listed.content.decode()
    assert "1 replay target(s) were migrated as key-advisory and wait for their class to be confirmed" in text
    assert "1 replay target(s) count any 2xx as delivered and nobody confirmed it" in text

    ReplayTarget.objects.filter(slug="legacy").update(class_confirmed=True)
    text = admin_client.get(reverse("admin:dlq_replaytarget_changelist")).content.decode()
    assert "wait for their class to be confirmed" not in text
    assert "1 replay target(s) count any 2xx as delivered and nobody confirmed it" in text

    ReplayTarget.objects.filter(slug="legacy").update(ack_confirmed=True)
    text = admin_client.get(reverse("admin:dlq_replaytarget_changelist")).content.decode()
    assert "wait for their class to be confirmed" not in text and "nobody confirmed it" not in text
