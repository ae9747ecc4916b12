"""Replay: the original key in the target's header, guarded by the ledger under
replay:{id}:{n}; failure → pending, success → replayed, force + note to do it again;
re-run as new is separate, confirmed and audited; resolve/discard need a note."""

from __future__ import annotations

import json

import pytest

from dlq.models import FailedEvent, FailedEventChange, Replay
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from ledger.models import Operation
from ledger.protocol.transitions.claim import guarded_move
from review.decisions.services import review_decision_record
from tests.dlq.conftest import example, example_bytes, post_raw

pytestmark = pytest.mark.django_db

ENVELOPE = {
    "event_id": "lead-77",
    "idempotency_key": "lead-77:crm:create:v1",
    "payload": example("crm-create-contact-request.json"),
    "error": {"message": "CRM answered 429", "class": "transient"},
}


def ingest(client, body=None) -> int:
    response = client.post("/api/v1/dlq/events", body or ENVELOPE, format="json")
    assert response.status_code in (200, 201), response.content
    return response.json()["id"]


def replay(client, event_id, **body):
    return client.post(f"/api/v1/dlq/events/{event_id}/replay", body, format="json")


def test_the_target_receives_the_stored_payload_with_the_original_key(client, target, sink):
    event_id = ingest(client)
    response = replay(client, event_id)
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["outcome"] == "succeeded" and data["number"] == 1
    assert data["ledger_key"] == f"replay:{event_id}:1"
    [request] = sink.received()
    assert request.path == "/webhook/rerun"
    assert request.header("Idempotency-Key") == "lead-77:crm:create:v1"
    assert request.json() == ENVELOPE["payload"]
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"
    # A success keeps the target's answer as its status, not as an error message.
    replayed = Replay.objects.get(event_id=event_id)
    assert (replayed.response_status, replayed.error_message) == (200, "")
    # The send was guarded by the ledger under its own key, and is recorded there.
    op = Operation.objects.get(key=f"replay:{event_id}:1")
    assert op.status == "succeeded" and op.provider_ref == "sink-1"


def test_the_target_s_own_header_name_carries_the_key(client, tenant, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="hook", url=sink.url, idempotency_header="X-Request-Key", is_default=True
    )
    event_id = ingest(client, ENVELOPE | {"replay_target": ""})
    replay(client, event_id)
    assert sink.received()[0].header("X-Request-Key") == "lead-77:crm:create:v1"


def test_an_n8n_entry_replays_its_error_trigger_payload_under_its_identity(client, target, sink):
    event_id = post_raw(client, example_bytes("n8n-error-trigger-execution.json")).json()["id"]
    assert replay(client, event_id).json()["outcome"] == "succeeded"
    request = sink.received()[0]
    assert request.header("Idempotency-Key") == "n8n:17:4812"
    assert request.json()["execution"]["id"] == "4812"


def test_a_failed_replay_puts_the_entry_back_to_pending_and_history_is_kept(client, target, sink):
    event_id = ingest(client)
    sink.mode, sink.status = "status", 422
    failed = replay(client, event_id).json()
    assert failed["outcome"] == "failed" and failed["response_status"] == 422
    assert failed["error_class"] == "invalid_input"
    assert FailedEvent.objects.get(pk=event_id).status == "pending"
    # The replay's ledger row failed; it did not become a second DLQ entry.
    assert Operation.objects.get(key=f"replay:{event_id}:1").status == "failed"
    assert FailedEvent.objects.count() == 1
    sink.mode = "ok"
    ok = replay(client, event_id).json()
    assert ok["outcome"] == "succeeded" and ok["number"] == 2
    assert list(Replay.objects.filter(event_id=event_id).order_by("number").values_list("outcome", flat=True)) == [
        "failed",
        "succeeded",
    ]
    moves = list(
        FailedEventChange.objects.filter(event_id=event_id).order_by("id").values_list("from_status", "to_status")
    )
    assert moves == [
        ("", "pending"),
        ("pending", "replaying"),
        ("replaying", "pending"),
        ("pending", "replaying"),
        ("replaying", "replayed"),
    ]


def test_a_transient_answer_fails_the_replay_key_at_once_instead_of_leaving_it_waiting(client, target, sink):
    event_id = ingest(client)
    sink.mode, sink.status = "status", 503
    assert replay(client, event_id).json()["error_class"] == "transient"
    # Nobody comes back for replay:{id}:1 — the next replay is replay:{id}:2.
    assert Operation.objects.get(key=f"replay:{event_id}:1").status == "failed"


def test_a_target_that_is_down_is_a_transient_failure_and_nothing_was_sent(client, tenant):
    dlq_targets.replay_target_upsert(tenant=tenant, slug="down", url="http://127.0.0.1:9/", is_default=True)
    event_id = ingest(client)
    data = replay(client, event_id).json()
    assert data["outcome"] == "failed" and data["error_class"] == "transient"
    assert data["error_message"].startswith("not delivered")


def test_a_target_that_times_out_after_the_send_is_ambiguous(client, tenant, sink):
    dlq_targets.replay_target_upsert(tenant=tenant, slug="slow", url=sink.url, timeout_seconds=0.3, is_default=True)
    sink.mode = "hang"
    event_id = ingest(client)
    data = replay(client, event_id).json()
    assert data["outcome"] == "ambiguous" and data["error_class"] == "ambiguous"
    # Unknown outcome: the ledger says so; the entry is an operator's again.
    assert Operation.objects.get(key=f"replay:{event_id}:1").status == "uncertain"
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def _ambiguous_replay(client, tenant, sink) -> tuple[int, Operation]:
    # Key-enforced: the point here is lineage; the class rule (a key-advisory target waits for a
    # decision after an ambiguous replay) has its own tests (test_replay_classes.py).
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="slow", url=sink.url, timeout_seconds=0.3, is_default=True, idempotency_class="key_enforced"
    )
    sink.mode = "hang"
    event_id = ingest(client)
    assert replay(client, event_id).json()["outcome"] == "ambiguous"
    sink.release.set()
    op = Operation.objects.get(key=f"replay:{event_id}:1")
    # The sweeper could not tell (a webhook target has no lookup): a human decides.
    op = guarded_move(operation=op, to="review", actor="sweeper", reason="no lookup")
    return event_id, op


def test_an_ambiguous_replay_confirmed_by_a_reviewer_marks_the_entry_replayed(client, tenant, sink):
    event_id, op = _ambiguous_replay(client, tenant, sink)
    assert FailedEvent.objects.get(pk=event_id).status == "pending"
    review_decision_record(
        operation_id=op.pk, decision="confirm_succeeded", note="target shows lead 77 created", actor="rita"
    )
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"
    assert Replay.objects.get(event_id=event_id, number=1).outcome == "succeeded"
    change = FailedEventChange.objects.filter(event_id=event_id).order_by("-id").first()
    assert (change.from_status, change.to_status, change.actor) == ("pending", "replayed", "rita")
    assert "settled succeeded" in change.note


def test_an_ambiguous_replay_abandoned_by_a_reviewer_leaves_the_entry_pending(client, tenant, sink):
    event_id, op = _ambiguous_replay(client, tenant, sink)
    review_decision_record(operation_id=op.pk, decision="abandon", note="cannot verify", actor="rita")
    assert FailedEvent.objects.get(pk=event_id).status == "pending"
    assert Replay.objects.get(event_id=event_id, number=1).outcome == "failed"


def test_a_newer_replay_owns_the_entry_when_an_older_ambiguous_one_is_settled(client, tenant, sink):
    event_id, op = _ambiguous_replay(client, tenant, sink)
    sink.mode, sink.status = "status", 422
    assert replay(client, event_id).json()["outcome"] == "failed"
    review_decision_record(operation_id=op.pk, decision="confirm_succeeded", note="it did arrive", actor="rita")
    # Replay #1's row says what was decided; the entry keeps the newest replay's answer.
    assert Replay.objects.get(event_id=event_id, number=1).outcome == "succeeded"
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_replaying_a_replayed_entry_needs_force_and_a_note(client, target, sink):
    event_id = ingest(client)
    replay(client, event_id)
    again = replay(client, event_id)
    assert again.status_code == 409 and again.json()["code"] == "replay_needs_force"
    no_note = replay(client, event_id, force=True)
    assert no_note.status_code == 400 and no_note.json()["code"] == "note_required"
    forced = replay(client, event_id, force=True, note="customer asked for a resend")
    assert forced.status_code == 201 and forced.json()["forced"] is True
    assert forced.json()["note"] == "customer asked for a resend"
    assert len(sink.received()) == 2
    # Both carried the original key.
    assert {r.header("Idempotency-Key") for r in sink.received()} == {"lead-77:crm:create:v1"}


def test_rerun_as_new_is_confirmed_noted_and_sends_a_derived_key(client, target, sink):
    event_id = ingest(client)
    unconfirmed = replay(client, event_id, as_new=True, note="CRM cached the 429")
    assert unconfirmed.status_code == 400 and unconfirmed.json()["code"] == "confirmation_required"
    no_note = replay(client, event_id, as_new=True, confirm=True)
    assert no_note.status_code == 400 and no_note.json()["code"] == "note_required"
    assert sink.received() == [] and Replay.objects.count() == 0
    done = replay(client, event_id, as_new=True, confirm=True, note="CRM cached the 429").json()
    assert done["as_new"] is True and done["sent_key"] == "lead-77:crm:create:v1~r1"
    assert sink.received()[0].header("Idempotency-Key") == "lead-77:crm:create:v1~r1"
    change = FailedEventChange.objects.filter(event_id=event_id, to_status="replaying").get()
    assert "re-run as new" in change.note and "CRM cached the 429" in change.note


def test_derived_keys_stay_within_255_characters():
    assert len(dlq_replays.derive_new_key("k" * 255, 12)) == 255


def test_target_override_and_missing_target(client, tenant, sink, sink_factory):
    event_id = ingest(client)
    missing = replay(client, event_id)
    assert missing.status_code == 409 and missing.json()["code"] == "replay_target_missing"
    other = sink_factory()
    dlq_targets.replay_target_upsert(tenant=tenant, slug="main", url=sink.url, is_default=True)
    dlq_targets.replay_target_upsert(tenant=tenant, slug="other", url=other.url)
    assert replay(client, event_id, target="other").json()["target"] == "other"
    assert len(other.received()) == 1 and sink.received() == []
    assert replay(client, ingest(client, ENVELOPE | {"event_id": "x2"}), target="nope").status_code == 409


def test_an_entry_naming_its_target_goes_there(client, tenant, sink, sink_factory):
    named = sink_factory()
    dlq_targets.replay_target_upsert(tenant=tenant, slug="main", url=sink.url, is_default=True)
    dlq_targets.replay_target_upsert(tenant=tenant, slug="crm", url=named.url)
    event_id = ingest(client, ENVELOPE | {"replay_target": "crm"})
    replay(client, event_id)
    assert len(named.received()) == 1 and sink.received() == []


def test_resolve_and_discard_need_a_note_and_close_the_entry(client, target, sink):
    first, second = ingest(client), ingest(client, ENVELOPE | {"event_id": "other"})
    no_note = client.post(f"/api/v1/dlq/events/{first}/resolve", {"note": "  "}, format="json")
    assert no_note.status_code == 400 and no_note.json()["code"] == "note_required"
    resolved = client.post(f"/api/v1/dlq/events/{first}/resolve", {"note": "fixed in the CRM by hand"}, format="json")
    assert resolved.status_code == 200 and resolved.json()["status"] == "resolved"
    assert resolved.json()["status_note"] == "fixed in the CRM by hand"
    discarded = client.post(f"/api/v1/dlq/events/{second}/discard", {"note": "test lead"}, format="json")
    assert discarded.json()["status"] == "discarded"
    # Closed entries stay closed.
    for path, body in (("replay", {}), ("resolve", {"note": "again"}), ("discard", {"note": "again"})):
        response = client.post(f"/api/v1/dlq/events/{first}/{path}", body, format="json")
        assert response.status_code == 409 and response.json()["code"] == "failed_event_closed"
    assert sink.received() == []


def test_an_entry_being_replayed_cannot_be_resolved(client, target):
    event_id = ingest(client)
    FailedEvent.objects.filter(pk=event_id).update(status="replaying")
    response = client.post(f"/api/v1/dlq/events/{event_id}/resolve", {"note": "done"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "failed_event_busy"
    second = replay(client, event_id)
    assert second.status_code == 409 and second.json()["code"] == "replay_in_progress"


def test_another_tenant_cannot_replay_or_resolve(client, make_client, other_tenant, target, sink):
    event_id = ingest(client)
    intruder = make_client(other_tenant)
    assert replay(intruder, event_id).status_code == 404
    assert intruder.post(f"/api/v1/dlq/events/{event_id}/resolve", {"note": "x"}, format="json").status_code == 404
    assert sink.received() == []


def test_detail_lists_the_replay_lineage_without_the_payload(client, target, sink):
    event_id = ingest(client)
    replay(client, event_id)
    detail = client.get(f"/api/v1/dlq/events/{event_id}").json()
    assert [r["outcome"] for r in detail["replays"]] == ["succeeded"]
    assert "payload" not in detail and "Priya" not in json.dumps(detail)
