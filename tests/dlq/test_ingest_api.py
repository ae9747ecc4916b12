"""POST/GET /api/v1/dlq/events: idempotent ingest by identity, raw shapes kept, size limits,
filters, tenancy; payload text never answered or logged."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import Alert
from dlq.entries.payloads import open_payload
from dlq.models import FailedEvent, FailedEventChange
from tests.dlq.conftest import example, example_bytes, post_raw

pytestmark = pytest.mark.django_db

EXECUTION = "n8n-error-trigger-execution.json"
TRIGGER = "n8n-error-trigger-trigger.json"


@pytest.mark.parametrize(
    ("name", "identity"), [(EXECUTION, "n8n:17:4812"), (TRIGGER, "n8n:18:trigger:1764480000000:Webhook")]
)
def test_each_n8n_variant_posted_twice_is_one_entry(client, name, identity):
    first = post_raw(client, example_bytes(name))
    assert first.status_code == 201, first.content
    assert first.json()["event_id"] == identity and first.json()["ingest"] == "created"
    again = post_raw(client, example_bytes(name))
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["ingest"] == "repost"
    assert again.json()["seen_count"] == 2
    assert FailedEvent.objects.count() == 1
    # One alert for the new entry, none for the repost.
    assert Alert.objects.filter(kind="dlq_new").count() == 1


def test_both_variants_make_two_entries(client):
    post_raw(client, example_bytes(EXECUTION))
    post_raw(client, example_bytes(TRIGGER))
    assert FailedEvent.objects.count() == 2


def test_a_retry_of_a_known_execution_is_the_same_failure_with_its_retry_count_bumped(client):
    original = example(EXECUTION)
    original["execution"]["id"] = "4790"
    del original["execution"]["retryOf"]
    first = post_raw(client, json.dumps(original))
    assert first.status_code == 201 and first.json()["retry_count"] == 0
    retry = post_raw(client, example_bytes(EXECUTION))  # 4812, retryOf 4790
    assert retry.status_code == 200 and retry.json()["ingest"] == "retry"
    assert retry.json()["id"] == first.json()["id"] and retry.json()["retry_count"] == 1
    # A retry of the retry is the same failure once more; reposting it changes nothing more.
    second = example(EXECUTION)
    second["execution"].update(id="4830", retryOf="4812")
    assert post_raw(client, json.dumps(second)).json()["retry_count"] == 2
    assert post_raw(client, json.dumps(second)).json()["retry_count"] == 2
    assert FailedEvent.objects.count() == 1


def test_a_retry_reported_before_its_original_still_makes_one_entry(client):
    retry = post_raw(client, example_bytes(EXECUTION))
    assert retry.status_code == 201 and retry.json()["retry_count"] == 1
    original = example(EXECUTION)
    original["execution"]["id"] = "4790"
    del original["execution"]["retryOf"]
    late = post_raw(client, json.dumps(original))
    assert late.status_code == 200 and late.json()["id"] == retry.json()["id"]
    assert FailedEvent.objects.count() == 1


def test_an_unknown_shape_is_stored_raw_and_flagged_and_reposting_it_does_not_duplicate(client):
    body = example_bytes("voice-call-analyzed.json")
    first = post_raw(client, body)
    assert first.status_code == 201
    assert first.json()["shape"] == "raw" and first.json()["weak_identity"] is True
    assert first.json()["event_id"].startswith("hmac:")
    assert post_raw(client, body).status_code == 200
    # Kept whole for inspection and replay (sealed at rest when encryption is on).
    assert open_payload(FailedEvent.objects.get().payload) == example("voice-call-analyzed.json")


def test_a_non_json_body_is_refused_not_stored(client):
    # Issue 11 §4: a report that is not JSON cannot be told from a broken client.
    response = post_raw(client, b"<html>upstream error page</html>")
    assert response.status_code == 400 and response.json()["code"] == "malformed_json"
    assert not FailedEvent.objects.exists()


def test_envelope_with_explicit_key_and_target(client):
    body = {
        "event_id": "lead-77",
        "idempotency_key": "lead-77:crm:create:v1",
        "replay_target": "crm",
        "payload": example("crm-create-contact-request.json"),
        "error": {"message": "CRM 429", "class": "transient"},
    }
    response = client.post("/api/v1/dlq/events", body, format="json")
    assert response.status_code == 201
    data = response.json()
    assert data["original_key"] == "lead-77:crm:create:v1" and data["replay_target"] == "crm"
    assert data["error_class"] == "transient"


def test_an_idempotency_key_header_names_the_original_key_of_an_n8n_payload(client):
    response = post_raw(client, example_bytes(EXECUTION), HTTP_IDEMPOTENCY_KEY="lead-77:crm:create:v1")
    assert response.json()["original_key"] == "lead-77:crm:create:v1"
    no_header = post_raw(client, example_bytes(TRIGGER))
    # Without an explicit key the identity is the key a replay carries.
    assert no_header.json()["original_key"] == no_header.json()["event_id"]


def test_a_malformed_envelope_answers_400_problem_json_and_records_nothing(client):
    response = client.post("/api/v1/dlq/events", {"payload": {}, "error_class": "bogus"}, format="json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_error"
    assert FailedEvent.objects.count() == 0


def test_over_the_dlq_size_limit_answers_413_problem_json(client, settings):
    settings.ONCEGUARD_DLQ = {"MAX_EVENT_BYTES": 2048}
    body = {"event_id": "big", "payload": {"blob": "x" * 4096}}
    response = client.post("/api/v1/dlq/events", body, format="json")
    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "payload_too_large" and response.json()["limit"] == 2048
    assert "xxxx" not in response.content.decode()
    assert FailedEvent.objects.count() == 0
    small = client.post("/api/v1/dlq/events", {"event_id": "small", "payload": {"blob": "x"}}, format="json")
    assert small.status_code == 201


def test_over_the_global_body_limit_answers_413_before_auth(client, settings):
    settings.MAX_REQUEST_BYTES = 1000
    response = post_raw(client, json.dumps({"payload": "y" * 5000}))
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"


def test_ingest_needs_the_write_scope_and_a_key(make_client, tenant):
    reader = make_client(tenant, scopes=["read"])
    assert post_raw(reader, example_bytes(EXECUTION)).status_code == 403
    from rest_framework.test import APIClient

    assert post_raw(APIClient(), example_bytes(EXECUTION)).status_code == 401
    assert FailedEvent.objects.count() == 0


def test_the_same_failure_for_two_tenants_is_two_entries_and_each_sees_only_its_own(client, make_client, other_tenant):
    other = make_client(other_tenant)
    a = post_raw(client, example_bytes(EXECUTION)).json()
    b = post_raw(other, example_bytes(EXECUTION)).json()
    assert a["id"] != b["id"]
    assert [e["id"] for e in client.get("/api/v1/dlq/events").json()["results"]] == [a["id"]]
    assert client.get(f"/api/v1/dlq/events/{b['id']}").status_code == 404


def test_list_filters_by_status_workflow_class_dates_and_searchable_fields(client, tenant):
    post_raw(client, example_bytes(EXECUTION))  # workflow 17, transient
    post_raw(client, example_bytes(TRIGGER))  # workflow 18, unclassified
    client.post(
        "/api/v1/dlq/events",
        {"event_id": "e3", "payload": {"event_type": "call_analyzed"}, "error": {"class": "invalid_input"}},
        format="json",
    )
    FailedEvent.objects.filter(event_id="e3").update(failed_at=timezone.now() - timedelta(days=3))

    def ids(**params):
        response = client.get("/api/v1/dlq/events", params)
        assert response.status_code == 200, response.content
        return sorted(e["event_id"] for e in response.json()["results"])

    assert len(ids()) == 3
    assert ids(workflow="17") == ["n8n:17:4812"]
    assert ids(error_class="transient") == ["n8n:17:4812"]
    assert ids(error_class="") == ["n8n:18:trigger:1764480000000:Webhook"]
    # The trigger variant carries its own time (2025-11-30); e3 was moved three days back.
    days_ago = (timezone.now() - timedelta(days=5)).isoformat(), (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(failed_after=days_ago[0], failed_before=days_ago[1]) == ["e3"]
    assert ids(failed_after=days_ago[1]) == ["n8n:17:4812"]
    assert ids(match="workflow.id:18") == ["n8n:18:trigger:1764480000000:Webhook"]
    assert ids(match="event_type:call_analyzed") == ["e3"]
    assert ids(match=["workflow.id:17", "execution.mode:webhook"]) == ["n8n:17:4812"]
    assert ids(status="resolved") == []
    # Only configured (non-personal) paths can be searched.
    refused = client.get("/api/v1/dlq/events", {"match": "call.from_number:+61412345678"})
    assert refused.status_code == 400 and refused.json()["code"] == "validation_error"


def test_no_payload_text_in_answers_history_or_logs(client, caplog):
    caplog.set_level(logging.DEBUG, logger="onceguard")
    envelope = {
        "event_id": "lead-1",
        "payload": example("voice-call-analyzed.json"),
        "error": {"message": "CRM refused", "class": "invalid_input"},
    }
    created = client.post("/api/v1/dlq/events", envelope, format="json").json()
    post_raw(client, example_bytes("voice-call-analyzed.json"))
    listing = client.get("/api/v1/dlq/events").content.decode()
    detail = client.get(f"/api/v1/dlq/events/{created['id']}").content.decode()
    history = " ".join(FailedEventChange.objects.values_list("note", flat=True))
    alerts = " ".join(Alert.objects.values_list("summary", flat=True))
    for secret in ("priya", "Priya", "+61412345678", "Raman", "home and contents"):
        assert secret not in listing and secret not in detail
        assert secret not in caplog.text and secret not in history and secret not in alerts
