"""Lead capture for n8n Error Trigger entries (issue 12, item 3): with the tenant's n8n
connection, ingesting an Error Trigger report enqueues (after commit) a fetch of the failed
execution from n8n's public REST API — here a real loopback server standing in for it — and
the failed node's input items become the entry's payload, sealed, with where they came from
shown on the entry's page and in the API. Every failure leaves the entry as it was and says
why, without personal data."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dlq.entries.payloads import open_payload
from dlq.ingest import fetch as dlq_fetch
from dlq.models import FailedEvent, FailedEventChange, N8nConnection, PayloadFetch
from dlq.n8n import client as n8n
from dlq.n8n import connections as dlq_connections
from dlq.tasks import n8n_payload_fetch_task
from ledger.models import ConfigChange, Tenant
from ledger.platform.crypto import is_sealed, open_json
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed
from tests.console.support import MARKERS, client_for, staff
from tests.dlq.conftest import EXAMPLES, example, example_bytes, post_raw
from tests.dlq.n8n_api import FakeN8nApi

KEY = "n8n-api-key.eyJhbGciOiJIUzI1NiJ9.test-only"
TASK = "dlq.tasks.n8n_payload_fetch_task"
CONTACT = example("crm-create-contact-request.json")["body"]
EXECUTION = json.loads((EXAMPLES / "n8n-execution-with-data.json").read_text())
REPORT = example_bytes("n8n-error-trigger-execution.json")
PERSONAL = ("Priya", "Raman", "priya.raman", "+61412345678", "61412345678")


@pytest.fixture
def n8n_api() -> Iterator[FakeN8nApi]:
    api = FakeN8nApi().start()
    api.executions["4812"] = copy.deepcopy(EXECUTION)
    yield api
    api.stop()


@pytest.fixture
def connected(tenant: Tenant, n8n_api: FakeN8nApi) -> N8nConnection:
    return dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, api_key=KEY, actor="test")


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pauses between tries are the real ones' business; here they would only slow the suite.
    monkeypatch.setattr(n8n, "FETCH_PAUSES", (0.0, 0.0))


def ingest(client: Any, captured: Any) -> FailedEvent:
    with captured(execute=True):
        response = post_raw(client, REPORT)
    assert response.status_code == 201, response.json()
    return FailedEvent.objects.get(pk=response.json()["id"])


def fetches(enqueued: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [call for call in enqueued if call[0] == TASK]


def run_task(event: FailedEvent) -> FailedEvent:
    """What the cluster runs after the ingestion committed."""
    n8n_payload_fetch_task(event.pk)
    event.refresh_from_db()
    return event


def assert_left_as_reported(event: FailedEvent, *, reason: str) -> None:
    event.refresh_from_db()
    assert event.payload_fetch == PayloadFetch.FAILED
    assert reason in event.payload_fetch_note, event.payload_fetch_note
    assert event.payload_source == "reported" and event.payload_source_ref == ""
    # The entry holds the report as it arrived.
    assert open_payload(event.payload) == json.loads(REPORT)
    for value in PERSONAL:
        assert value not in event.payload_fetch_note
    change = FailedEventChange.objects.filter(event=event).order_by("-id").first()
    assert change is not None and change.note.startswith("payload not fetched from n8n:")


# --- the happy path -------------------------------------------------------------------------------


def test_an_error_trigger_entry_gets_the_failed_nodes_input_items_after_commit(
    client, tenant, connected, n8n_api, enqueued, django_capture_on_commit_callbacks
):
    event = ingest(client, django_capture_on_commit_callbacks)
    # Ingestion asked n8n nothing; the fetch is a task, enqueued once the entry committed.
    assert n8n_api.asked == []
    assert event.payload_fetch == PayloadFetch.PENDING
    assert fetches(enqueued) == [(TASK, event.pk)]

    event = run_task(event)

    assert event.payload_fetch == PayloadFetch.FETCHED, event.payload_fetch_note
    assert event.payload_source == "n8n_execution_fetch" and event.payload_source_ref == "4812"
    # The failed item itself, as the failed request's body would be.
    assert open_payload(event.payload) == CONTACT
    assert is_sealed(event.payload)
    assert event.payload_fetch_note == "1 input item of node “CRM: Create Contact”."
    # The report's search values stay; the item's configured ones would join them.
    assert event.search_fields["workflow.id"] == "17"
    (asked,) = n8n_api.asked
    assert asked.path == "/api/v1/executions/4812?includeData=true"
    assert asked.header("X-N8N-API-KEY") == KEY
    change = FailedEventChange.objects.filter(event=event).order_by("-id").first()
    assert change.actor == "n8n lead capture" and "execution 4812" in change.note
    # Done once: the task again (a redelivery) asks nothing.
    run_task(event)
    assert len(n8n_api.asked) == 1


def test_the_api_and_the_console_say_where_the_payload_came_from_without_showing_it(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    body = client.get(f"/api/v1/dlq/events/{event.pk}").json()
    assert body["payload_source"]["source"] == "n8n_execution_fetch"
    assert body["payload_source"]["ref"] == "4812" and body["payload_source"]["fetch"] == "fetched"
    assert body["payload_source"]["fetched_at"]

    admin = staff("ada", role="admin", tenants=[tenant])
    page = client_for(admin).get(f"/admin/dlq/failedevent/{event.pk}/change/").content.decode()
    assert "fetched from n8n execution 4812" in page
    assert "customFields" in page
    for value in MARKERS:
        assert value not in page


def test_of_a_batch_the_entry_holds_only_the_item_the_error_names_keyed_by_the_declared_field(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    second = {**CONTACT, "firstName": "Ben", "customFields": {"call_id": "call_2", "postcode": "3000"}}
    stack = n8n_api.executions["4812"]["data"]["executionData"]["nodeExecutionStack"][0]
    stack["data"]["main"][0].append({"json": second, "pairedItem": {"item": 1}})
    report = json.loads(REPORT)
    report["execution"]["error"]["context"] = {"itemIndex": 1}
    report["key_field"] = "customFields.call_id"
    with django_capture_on_commit_callbacks(execute=True):
        response = post_raw(client, json.dumps(report))
    event = FailedEvent.objects.get(pk=response.json()["id"])
    assert event.key_source == "missing"

    event = run_task(event)

    # The item that succeeded before the failure is not held, so never re-sent.
    assert open_payload(event.payload) == second
    assert event.original_key == "call_2" and event.key_source == "request_field"


def test_a_fetched_key_another_entry_opened_meanwhile_leaves_this_entry_without_it(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks, monkeypatch
):
    report = json.loads(REPORT)
    report["key_field"] = "customFields.call_id"
    with django_capture_on_commit_callbacks(execute=True):
        event = FailedEvent.objects.get(pk=post_raw(client, json.dumps(report)).json()["id"])
    other = {
        "idempotency_key": "call_7f3c2a9e41b04d6f",
        "payload": CONTACT,
        "source": {"workflow_id": "9", "execution_id": "1"},
    }
    post_raw(client, json.dumps(other))
    # The race: the other entry opened after the look for an open entry of the key.
    monkeypatch.setattr(dlq_fetch.selectors, "failed_events_of_key", lambda **kw: FailedEvent.objects.none())

    event = run_task(event)

    assert event.payload_fetch == PayloadFetch.FETCHED and open_payload(event.payload) == CONTACT
    assert event.key_source == "missing" and "held open by another entry" in event.key_note


def test_an_error_trigger_entry_of_a_batch_none_of_whose_items_the_error_names_holds_every_item_and_says_so(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    second = {**CONTACT, "firstName": "Ben", "customFields": {"call_id": "call_2", "postcode": "3000"}}
    stack = n8n_api.executions["4812"]["data"]["executionData"]["nodeExecutionStack"][0]
    stack["data"]["main"][0].append({"json": second, "pairedItem": {"item": 1}, "binary": {"data": {"mimeType": "x"}}})
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert open_payload(event.payload) == {"items": [CONTACT, second]}
    assert event.payload_fetch_note == (
        "2 input items of node “CRM: Create Contact”; 1 carried binary data, which is not fetched."
    )
    assert event.key_source == "missing" and "cannot be told apart among 2 input items" in event.key_note


# --- when nothing is fetched --------------------------------------------------------------------


def test_without_a_connection_nothing_is_enqueued_and_the_entry_is_as_reported(
    client, tenant, n8n_api, enqueued, django_capture_on_commit_callbacks
):
    event = ingest(client, django_capture_on_commit_callbacks)
    assert event.payload_fetch == PayloadFetch.NONE and fetches(enqueued) == []
    assert client.get(f"/api/v1/dlq/events/{event.pk}").json()["payload_source"]["source"] == "reported"


def test_a_switched_off_connection_fetches_nothing(
    client, tenant, connected, n8n_api, enqueued, django_capture_on_commit_callbacks
):
    dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, active=False, actor="test")
    event = ingest(client, django_capture_on_commit_callbacks)
    assert event.payload_fetch == PayloadFetch.NONE and fetches(enqueued) == []


def test_other_shapes_are_not_fetched(client, tenant, connected, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        post_raw(client, example_bytes("n8n-error-trigger-trigger.json"))
        client.post("/api/v1/dlq/events", {"event_id": "e-1", "payload": CONTACT, "error": "429"}, format="json")
    assert fetches(enqueued) == []
    assert set(FailedEvent.objects.values_list("payload_fetch", flat=True)) == {""}


# --- a fetch that fails leaves the entry as it is and says why --------------------------------------


def test_a_refused_api_key_is_not_tried_again(client, tenant, connected, n8n_api, django_capture_on_commit_callbacks):
    n8n_api.script = [401]
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason="n8n refused the API key (HTTP 401)")
    assert len(n8n_api.asked) == 1


def test_an_execution_n8n_does_not_have_is_tried_three_times_then_recorded(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    n8n_api.executions.clear()
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason="n8n has no execution 4812 for this API key (HTTP 404)")
    assert "tried 3 times" in event.payload_fetch_note
    assert len(n8n_api.asked) == n8n.FETCH_TRIES == 3


def test_an_execution_saved_after_the_error_trigger_fired_is_fetched_on_a_later_try(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    n8n_api.script = [404, 503]
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert event.payload_fetch == PayloadFetch.FETCHED
    assert len(n8n_api.asked) == 3


def test_an_execution_still_running_is_waited_for_and_then_recorded(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    n8n_api.executions["4812"]["status"] = "running"
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason="the execution is still running in n8n")
    assert len(n8n_api.asked) == 3


def test_a_slow_n8n_is_given_up_on_within_the_timeout(client, tenant, n8n_api, django_capture_on_commit_callbacks):
    dlq_connections.n8n_connection_save(
        tenant=tenant, base_url=n8n_api.url, api_key=KEY, timeout_seconds=0.5, actor="t"
    )
    # Each answer is held for a minute (or until the server stops after the test); a client
    # without the bound would wait three minutes in all.
    n8n_api.script, n8n_api.slow_seconds = ["slow", "slow", "slow"], 60.0
    event = ingest(client, django_capture_on_commit_callbacks)
    event = run_task(event)
    assert_left_as_reported(event, reason="n8n did not answer within 0.5 s")
    # Each of the three tries gave up before its answer came (was: the three took under 8 s of
    # wall clock).
    assert n8n_api.slow_answered == 0
    assert len(n8n_api.asked) == 3


def test_a_destination_the_outbound_policy_no_longer_allows_is_not_contacted(
    client, tenant, connected, n8n_api, settings, django_capture_on_commit_callbacks
):
    event = ingest(client, django_capture_on_commit_callbacks)
    # The deployment withdrew the rule that allowed the n8n host after the connection was saved.
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": "127.0.0.1:9"}
    event = run_task(event)
    assert_left_as_reported(event, reason="not fetched:")
    assert n8n_api.asked == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda ex: ex.pop("data"), "the execution has no data"),
        (lambda ex: ex.update(id="999"), "another execution"),
        (
            lambda ex: ex["data"].update(executionData={}, resultData={"runData": {}, "lastNodeExecuted": "X"}),
            "no input items for the failed node 'X'",
        ),
        (lambda ex: ex["data"]["executionData"]["nodeExecutionStack"][0]["data"].update(main="?"), "no input items"),
    ],
    ids=["no-data", "other-execution", "no-items", "odd-items"],
)
def test_an_execution_of_an_unexpected_shape_is_recorded(
    client, tenant, connected, n8n_api, change, reason, django_capture_on_commit_callbacks
):
    if reason == "no input items":
        # Nor does the node's source lead anywhere.
        n8n_api.executions["4812"]["data"]["resultData"]["runData"].pop("Contact")
    change(n8n_api.executions["4812"])
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason=reason)


def test_an_answer_that_is_not_json_is_recorded(client, tenant, connected, n8n_api, django_capture_on_commit_callbacks):
    n8n_api.script = ["garbage"]
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason="not JSON that can be stored")


def test_items_bigger_than_an_entry_may_hold_are_not_stored(
    client, tenant, connected, n8n_api, settings, django_capture_on_commit_callbacks
):
    settings.ONCEGUARD_DLQ = {"MAX_EVENT_BYTES": 2000}
    stack = n8n_api.executions["4812"]["data"]["executionData"]["nodeExecutionStack"][0]
    stack["data"]["main"][0][0]["json"] = {**CONTACT, "notes": "x" * 3000}
    event = run_task(ingest(client, django_capture_on_commit_callbacks))
    assert_left_as_reported(event, reason="an entry holds at most 2000")


def test_an_entry_replayed_before_the_fetch_finished_keeps_what_was_replayed(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    event = ingest(client, django_capture_on_commit_callbacks)
    FailedEvent.objects.filter(pk=event.pk).update(replay_count=1)
    event = run_task(event)
    assert_left_as_reported(event, reason="replayed, resolved or discarded before the fetch finished")


def test_a_connection_removed_before_the_fetch_is_recorded(
    client, tenant, connected, n8n_api, django_capture_on_commit_callbacks
):
    event = ingest(client, django_capture_on_commit_callbacks)
    dlq_connections.n8n_connection_delete(tenant=tenant, actor="test")
    assert_left_as_reported(run_task(event), reason="connection was removed or switched off")
    assert n8n_api.asked == []


# --- the reader, on its own ------------------------------------------------------------------------


def test_the_items_come_from_the_nodes_sources_when_the_stack_does_not_hold_it():
    execution = copy.deepcopy(EXECUTION)
    execution["data"]["executionData"]["nodeExecutionStack"] = []
    found = n8n.failed_input_items(execution, execution_id="4812")
    assert (found.node, found.items) == ("CRM: Create Contact", [CONTACT])


def test_the_failed_node_is_the_one_the_error_names():
    execution = copy.deepcopy(EXECUTION)
    execution["data"]["resultData"]["lastNodeExecuted"] = "Something else"
    found = n8n.failed_input_items(execution, execution_id="4812", node_hint="Something else")
    assert found.node == "CRM: Create Contact"


# --- the connection ---------------------------------------------------------------------------------


def test_the_connection_stores_the_key_sealed_and_the_trail_masks_it(tenant, n8n_api):
    connection = dlq_connections.n8n_connection_save(
        tenant=tenant, base_url=n8n_api.url + "/", api_key=KEY, actor="cli:ops"
    )
    assert connection.base_url == n8n_api.url
    assert is_sealed(connection.api_key_secret) and open_json(connection.api_key_secret) == KEY
    assert KEY not in json.dumps(list(N8nConnection.objects.values("api_key_secret")))
    dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, api_key=KEY + "2", actor="cli:ops")
    created, replaced = ConfigChange.objects.filter(object_type="dlq.n8nconnection").order_by("id")
    assert created.after["api_key_secret"] == "‹secret›" and created.actor == "cli:ops"
    assert replaced.after["api_key_secret"] == "‹secret, replaced›"
    assert KEY not in json.dumps([created.before, created.after, replaced.before, replaced.after])


def test_a_url_the_outbound_policy_refuses_is_not_saved(tenant):
    for url in ("http://169.254.169.254/", "http://127.0.0.1:5678", "http://10.0.0.5:5678", "file:///etc/passwd"):
        with pytest.raises(DestinationNotAllowed):
            dlq_connections.n8n_connection_save(tenant=tenant, base_url=url, api_key=KEY, actor="test")
    assert not N8nConnection.objects.exists()


def test_a_new_connection_needs_a_key_and_a_key_has_no_spaces(tenant, n8n_api):
    with pytest.raises(ValidationFailed):
        dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, actor="test")
    with pytest.raises(ValidationFailed):
        dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, api_key="a b\r\nX-Evil: 1", actor="t")
    assert not N8nConnection.objects.exists()


def test_n8n_connect_reads_the_key_from_standard_input_and_never_prints_it(tenant, n8n_api, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    out = io.StringIO()
    call_command("n8n_connect", "--tenant", "acme", "--url", n8n_api.url, stdout=out)
    assert KEY not in out.getvalue() and n8n_api.url in out.getvalue()
    assert open_json(N8nConnection.objects.get(tenant=tenant).api_key_secret) == KEY
    assert ConfigChange.objects.get(object_type="dlq.n8nconnection").actor.startswith("cli:")

    # The URL alone, keeping the key; then off; then gone.
    call_command("n8n_connect", "--tenant", "acme", "--url", n8n_api.url, "--keep-key", "--off", stdout=out)
    assert not N8nConnection.objects.get(tenant=tenant).active
    call_command("n8n_connect", "--tenant", "acme", "--disconnect", stdout=out)
    assert not N8nConnection.objects.exists()

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandError, match="No n8n API key"):
        call_command("n8n_connect", "--tenant", "acme", "--url", n8n_api.url, stdout=out)
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY))
    with pytest.raises(CommandError, match="n8n connection"):
        call_command("n8n_connect", "--tenant", "acme", "--url", "http://10.1.2.3:5678", stdout=out)


def test_a_tenant_admin_sets_the_connection_in_the_console_and_never_sees_the_key_again(tenant, other_tenant, n8n_api):
    admin = staff("ada", role="admin", tenants=[tenant])
    console = client_for(admin)
    response = console.post(
        "/admin/dlq/n8nconnection/add/",
        {"tenant": tenant.pk, "base_url": n8n_api.url, "timeout_seconds": "5", "active": "on", "new_api_key": KEY},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    connection = N8nConnection.objects.get(tenant=tenant)
    assert open_json(connection.api_key_secret) == KEY
    page = console.get(f"/admin/dlq/n8nconnection/{connection.pk}/change/").content.decode()
    assert KEY not in page and "set (stored encrypted; never shown)" in page
    (change,) = ConfigChange.objects.filter(object_type="dlq.n8nconnection")
    assert change.actor == "user:ada" and change.tenant_id == tenant.pk
    assert change.after["api_key_secret"] == "‹secret›"

    # Saving without typing a key keeps it.
    response = console.post(
        f"/admin/dlq/n8nconnection/{connection.pk}/change/",
        {"base_url": n8n_api.url, "timeout_seconds": "3", "active": "on", "new_api_key": ""},
    )
    assert response.status_code == 302
    connection.refresh_from_db()
    assert open_json(connection.api_key_secret) == KEY and connection.timeout_seconds == 3

    # Another tenant cannot be chosen; a refused URL is a form error, not a save.
    refused = console.post(
        "/admin/dlq/n8nconnection/add/",
        {"tenant": other_tenant.pk, "base_url": "http://10.0.0.5:5678", "timeout_seconds": "5", "new_api_key": KEY},
    )
    assert refused.status_code == 200
    assert N8nConnection.objects.count() == 1
    # An operator may look but not change it.
    operator = client_for(staff("otto", role="operator", tenants=[tenant]))
    assert operator.get(f"/admin/dlq/n8nconnection/{connection.pk}/change/").status_code == 200
    assert operator.post("/admin/dlq/n8nconnection/add/", {"tenant": tenant.pk}).status_code == 403
