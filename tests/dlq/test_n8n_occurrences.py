"""Error Trigger entries keyed by the business key (DESIGN §7, occurrences): the failed request
n8n reports (``execution.error.context.request``) is the entry's payload and its key; the same
key failing again while the entry is open is another occurrence of it; after it is closed, a
new entry linked to it; a replay sends the failed item's body under the original key."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest
from django.utils import timezone

from dlq.entries import services as dlq_entries
from dlq.entries.payloads import open_payload, seal_payload
from dlq.ingest import services as dlq_ingest
from dlq.ingest.parsing import failed_request_key
from dlq.models import FailedEvent, FailedEventOccurrence
from dlq.replays import services as dlq_replays
from dlq.rules.errors import KeyOpenInNewerEntry
from ledger.platform.errors import ValidationFailed
from ledger.protocol import services as ledger
from tests.dlq.conftest import example, post_raw
from tests.dlq.test_concurrency import run_together

pytestmark = pytest.mark.django_db

LEAD_KEY = "call_7f3c2a9e41b04d6f:crm-contact:v1"
CONTACT = example("crm-create-contact-request.json")["body"]


def error_report(execution: str, *, key: str | None = LEAD_KEY, body: Any = None, **headers: str) -> dict[str, Any]:
    """n8n 1.123's Error Trigger item for an HTTP Request node that failed with a 429: the
    error carries the failed item's request (n8n masks the credential it added itself)."""
    report = copy.deepcopy(example("n8n-error-trigger-execution.json"))
    execution_part = report["execution"]
    execution_part["id"] = execution
    execution_part.pop("retryOf")
    request_headers = {"content-type": "application/json", "Authorization": "**hidden**", **headers}
    if key is not None:
        request_headers["Idempotency-Key"] = key
    execution_part["error"]["context"] = {
        "itemIndex": 0,
        "request": {
            "method": "POST",
            "uri": "http://127.0.0.1:8010/contacts",
            "headers": request_headers,
            "body": CONTACT if body is None else body,
            "json": True,
        },
    }
    return report


def ingest(tenant, report: dict[str, Any], **kwargs: Any) -> dlq_ingest.IngestResult:
    return dlq_ingest.failed_event_ingest(tenant=tenant, raw=json.dumps(report).encode(), actor="t", **kwargs)


def test_an_error_trigger_entry_holds_the_failed_requests_body_under_its_idempotency_key(tenant):
    event = ingest(tenant, error_report("4812")).event

    assert event.shape == "n8n_execution" and event.event_id == "n8n:17:4812"
    assert event.original_key == LEAD_KEY and event.key_source == "request_header"
    # Only the failed item, not the report around it.
    assert open_payload(event.payload) == CONTACT
    assert event.error_class == "transient"


def test_only_the_content_type_and_key_headers_of_the_failed_request_are_stored(tenant):
    report = error_report(
        "4812",
        **{"Cookie": "session=abc", "X-Api-Key": "sk_live_1", "X-Auth-Token": "t0k", "X-Idempotency-Key": "other"},
    )
    event = ingest(tenant, report).event

    assert event.request_headers == {
        "content-type": "application/json",
        "idempotency-key": LEAD_KEY,
        "x-idempotency-key": "other",
    }
    stored = json.dumps([open_payload(event.payload), event.request_headers])
    for secret in ("session=abc", "sk_live_1", "t0k", "hidden"):
        assert secret not in stored


def test_the_same_lead_failing_twice_is_one_entry_with_two_occurrences_and_both_executions(tenant):
    first = ingest(tenant, error_report("4812"))
    again = error_report("4815")
    again["execution"]["error"]["message"] = "The connection timed out [ETIMEDOUT]"
    second = ingest(tenant, again)

    assert first.outcome == "created" and second.outcome == "occurrence"
    assert FailedEvent.objects.count() == 1
    event = second.event
    assert event.pk == first.event.pk and event.occurrence_count == 2
    # The last error is shown; each execution is kept for the trail.
    assert "ETIMEDOUT" in event.error_message and event.error_class == "ambiguous"
    occurrences = list(FailedEventOccurrence.objects.filter(event=event).order_by("number"))
    assert [(o.number, o.source_execution_id) for o in occurrences] == [(1, "4812"), (2, "4815")]
    assert "occurrence 2" in event.changes.order_by("-id").first().note
    # The second execution's own report, posted again, is a repost of the same entry.
    assert ingest(tenant, again).outcome == "repost"


def test_after_the_entry_is_closed_the_same_key_opens_a_new_entry_linked_to_the_earlier_one(tenant):
    first = ingest(tenant, error_report("4812")).event
    dlq_entries.failed_event_resolve(tenant_id=tenant.pk, event_pk=first.pk, actor="t", note="created by hand")

    second = ingest(tenant, error_report("4900"))

    assert second.outcome == "created" and second.event.pk != first.pk
    assert second.event.previous_id == first.pk and second.event.original_key == LEAD_KEY
    assert f"entry {first.pk}" in second.event.key_note
    # The next failure while the new one is open is an occurrence of the new one.
    assert ingest(tenant, error_report("4901")).event.pk == second.event.pk


def test_the_same_key_for_another_target_is_its_own_entry(tenant):
    one = ingest(tenant, error_report("4812")).event
    other = ingest(tenant, error_report("4813"), replay_target="billing").event
    assert one.pk != other.pk and FailedEvent.objects.count() == 2


def test_the_declared_key_field_is_the_key_when_the_request_has_no_key_header(tenant):
    report = error_report("4812", key=None)
    report["key_field"] = "customFields.call_id"
    event = ingest(tenant, report).event
    assert event.original_key == CONTACT["customFields"]["call_id"] and event.key_source == "request_field"
    assert "customFields.call_id" in event.key_note


def test_an_entry_without_a_key_says_so_in_words_and_is_not_merged(tenant):
    one = ingest(tenant, error_report("4812", key=None)).event
    two = ingest(tenant, error_report("4813", key=None)).event
    assert one.key_source == "missing" and one.original_key == "n8n:17:4812"
    assert "No business key" in one.key_note and "Idempotency-Key" in one.key_note
    assert one.pk != two.pk


def test_a_report_without_a_failed_request_has_no_key_and_keeps_the_report():
    # (A pure function: no database.)
    derived = failed_request_key(headers={}, body={"a": 1}, key_field="")
    assert derived.key == "" and derived.source == "missing" and "no key_field was declared" in derived.note


@pytest.mark.parametrize("bad", [" padded ", "x" * 300, "tab\there"])
def test_a_derived_key_that_is_no_valid_key_is_stored_as_no_usable_key(tenant, bad):
    event = ingest(tenant, error_report("4812", key=bad)).event
    assert event.key_source == "missing" and "no usable key" in event.key_note
    assert event.original_key == "n8n:17:4812"


def test_entries_posted_with_their_own_event_id_stay_one_per_event_whatever_their_key(client):
    for index in range(2):
        body = {"event_id": f"n8n:17:4812:CRM:{index}", "idempotency_key": LEAD_KEY, "payload": CONTACT}
        assert post_raw(client, json.dumps(body)).status_code == 201
    assert FailedEvent.objects.count() == 2


def test_envelopes_without_an_event_id_are_merged_by_their_key(client):
    for execution in ("1", "2"):
        body = {
            "idempotency_key": LEAD_KEY,
            "payload": CONTACT,
            "source": {"workflow_id": "9", "execution_id": execution},
        }
        post_raw(client, json.dumps(body))
    event = FailedEvent.objects.get()
    assert event.occurrence_count == 2 and event.key_source == "reported"


def test_a_forced_replay_of_a_closed_entry_whose_key_a_newer_entry_holds_is_refused(tenant, target, sink):
    first = ingest(tenant, error_report("4812")).event
    assert dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=first.pk, actor="t").outcome == "succeeded"
    newer = ingest(tenant, error_report("4900")).event
    assert newer.pk != first.pk

    with pytest.raises(KeyOpenInNewerEntry):
        dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=first.pk, actor="t", force=True, note="again")
    assert len(sink.received()) == 1


def test_a_replay_sends_the_failed_items_body_once_under_the_original_key(tenant, target, sink):
    ingest(tenant, error_report("4812"))
    event = ingest(tenant, error_report("4815")).event

    replay = dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=event.pk, actor="t")

    assert replay.outcome == "succeeded"
    [request] = sink.received()
    assert request.json() == CONTACT
    assert request.header("Idempotency-Key") == LEAD_KEY
    assert request.header("Authorization") is None


@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_failures_of_one_key_are_one_entry_with_ten_occurrences(tenant):
    secret = ledger.apikey_create(tenant=tenant, scopes=["read", "write"])[1]
    executions = iter(range(7000, 7010))
    lock = threading.Lock()

    def report(c: Any) -> Any:
        with lock:
            execution = str(next(executions))
        return post_raw(c, json.dumps(error_report(execution)))

    responses = run_together(10, report, secret)

    assert sorted(r.status_code for r in responses) == [200] * 9 + [201]
    event = FailedEvent.objects.get()
    assert event.occurrence_count == 10
    assert sorted(event.occurrences.values_list("number", flat=True)) == list(range(1, 11))


def _fetched_entry(tenant, items: list[Any]) -> FailedEvent:
    """An entry lead capture stored before the failed item was kept alone: ``{"items": [...]}``."""
    now = timezone.now()
    return FailedEvent.objects.create(
        tenant=tenant,
        event_id=f"n8n:17:{len(items)}",
        shape="n8n_execution",
        payload=seal_payload({"items": items}),
        failed_at=now,
        last_seen_at=now,
        original_key=LEAD_KEY,
        payload_source="n8n_execution_fetch",
    )


def test_an_entry_stored_earlier_with_one_fetched_item_replays_that_item_alone(tenant, target, sink):
    event = _fetched_entry(tenant, [CONTACT])
    assert dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=event.pk, actor="t").outcome == "succeeded"
    [request] = sink.received()
    assert request.json() == CONTACT and request.header("Idempotency-Key") == LEAD_KEY


def test_an_entry_holding_several_items_it_cannot_tell_apart_is_not_replayed_as_is(tenant, target, sink):
    event = _fetched_entry(tenant, [CONTACT, {**CONTACT, "firstName": "Ben"}])
    with pytest.raises(ValidationFailed, match="holds 2 input items"):
        dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=event.pk, actor="t")
    assert sink.received() == []
    event.refresh_from_db()
    assert event.status == "pending" and event.replay_count == 0


def test_the_api_and_the_console_show_the_occurrences_and_the_entries_of_the_same_key(tenant, client, admin_client):
    first = ingest(tenant, error_report("4812")).event
    dlq_entries.failed_event_discard(tenant_id=tenant.pk, event_pk=first.pk, actor="t", note="test lead")
    ingest(tenant, error_report("4900"))
    event = ingest(tenant, error_report("4901")).event

    body = client.get(f"/api/v1/dlq/events/{event.pk}").json()
    assert body["occurrence_count"] == 2 and body["previous_entry"] == first.pk
    assert body["key_source"] == "request_header" and body["original_key"] == LEAD_KEY

    page = admin_client.get(f"/admin/dlq/failedevent/{event.pk}/change/").content.decode()
    assert "execution 4900" in page and "execution 4901" in page
    assert f"entry {first.pk}</a> (discarded)" in page
    assert "the failed request&#x27;s key header" in page or "the failed request's key header" in page
