"""Quarantine with a reason (issue 13 item 3): an invalid_input failure lands in the DLQ as
quarantined with the receiver's reason in words (masked), and an operator replays it with
corrected fields as the next version of its key — the original kept as evidence, the
history saying who changed which fields and why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dlq.models import FailedEvent, FailedEventChange, Replay
from ledger.models import Operation, OperationEvent, OperationStatus
from ledger.platform import caching
from ledger.platform.crypto import open_json
from ledger.protocol import selectors
from ledger.protocol import services as ledger_services
from tests.execute.conftest import configure_provider
from tests.execute.support import run_due
from tests.support.fixtures import *  # noqa: F403

S = OperationStatus
pytestmark = pytest.mark.django_db

REFUSAL = {"error": {"message": "amount must be positive; contact jane.doe@example.com for details"}}


@pytest.fixture(autouse=True)
def _forget_caches() -> Iterator[None]:
    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()
    yield
    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()


def submit(client: Any, amount: int) -> dict[str, Any]:
    body = {
        "provider": "charges",
        "action": "charge",
        "record": "order-1001",
        "version": 3,
        "run": "checkout-9",
        "step": 2,
        "request": {"method": "POST", "path": "/charges", "body": {"amount": amount, "currency": "eur"}},
    }
    response = client.post("/api/v1/operations", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def test_an_invalid_input_failure_is_quarantined_with_its_reason_in_words(client, tenant, mock_enforced):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True)
    mock_enforced.script([{"status": 422, "body": REFUSAL}])
    created = submit(client, -5)
    run_due()

    entry = FailedEvent.objects.get(operation_id=created["id"])
    assert entry.error_class == "invalid_input"
    assert entry.quarantine_reason.startswith("charges refused the input (HTTP 422): amount must be positive")
    assert "jane.doe@example.com" not in entry.quarantine_reason  # masked like every error text
    shown = client.get(f"/api/v1/dlq/events/{entry.pk}").json()
    assert shown["quarantined"] is True and shown["quarantine_reason"] == entry.quarantine_reason
    # A resume of its run leaves it alone: replayed as is, it would be refused again.
    step = client.get("/api/v1/runs/checkout-9").json()["steps"][0]
    assert step["checkpoint"] == "failed" and not step["will_resume"] and "Quarantined" in step["advice"]


def test_a_corrected_replay_is_the_next_version_and_the_original_stays_as_evidence(client, tenant, mock_enforced):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True)
    mock_enforced.script([{"status": 422, "body": REFUSAL}])
    created = submit(client, -5)
    run_due()
    entry = FailedEvent.objects.get(operation_id=created["id"])

    answer = client.post(
        f"/api/v1/dlq/events/{entry.pk}/correct",
        {"fields": {"body.amount": 1200}, "note": "the customer confirmed 12.00 EUR (ticket 881)"},
        format="json",
    )

    assert answer.status_code == 201, answer.content
    data = answer.json()
    assert data["key"] == "order-1001:charge:v4" and data["version"] == 4 and data["replay"] is None
    corrected = Operation.objects.get(pk=data["operation"]["id"])
    assert (corrected.record, corrected.version, corrected.run, corrected.step) == ("order-1001", 4, "checkout-9", 2)
    assert open_json(corrected.request)["body"] == {"amount": 1200, "currency": "eur"}
    [sent] = run_due()
    assert sent.status == S.SUCCEEDED
    assert mock_enforced.effects()["by_key"] == {"order-1001:charge:v4": 1}
    # The original: still failed, its request unchanged, pointing at its correction.
    original = Operation.objects.get(pk=created["id"])
    assert original.status == S.FAILED and original.replaced_by_id == corrected.pk
    assert open_json(original.request)["body"]["amount"] == -5
    reasons = list(OperationEvent.objects.filter(operation=original).values_list("actor", "reason"))
    assert any(
        "body.amount" in reason and "ticket 881" in reason and actor.startswith("apikey:") for actor, reason in reasons
    )
    # The entry: resolved, its payload untouched, the history says who, what and why.
    entry.refresh_from_db()
    assert entry.status == "resolved" and entry.corrected_operation_id == corrected.pk
    change = FailedEventChange.objects.filter(event=entry, to_status="resolved").get()
    assert "body.amount" in change.note and "order-1001:charge:v4" in change.note and "ticket 881" in change.note
    # The corrected version is the run's step now: its checkpoint is done.
    assert [s["checkpoint"] for s in client.get("/api/v1/runs/checkout-9").json()["steps"]] == ["failed", "done"]


def test_a_guard_mode_correction_is_replayed_to_the_target_under_the_next_version(client, tenant, target, sink):
    ledger_services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    body = {"provider": "crm", "action": "create", "record": "lead-77", "version": 1, "payload": {"email": "bad@"}}
    created = client.post("/api/v1/claims", body, format="json").json()
    client.post(
        f"/api/v1/operations/{created['id']}/fail",
        {"lease_token": created["lease_token"], "error_class": "invalid_input", "message": "email is malformed"},
        format="json",
    )
    entry = FailedEvent.objects.get(operation_id=created["id"])
    assert entry.quarantine_reason == "email is malformed"

    answer = client.post(
        f"/api/v1/dlq/events/{entry.pk}/correct",
        {"fields": {"email": "lead77@example.org"}, "note": "typo fixed with the sales team"},
        format="json",
    )

    assert answer.status_code == 201, answer.content
    assert answer.json()["key"] == "lead-77:create:v2" and answer.json()["replay"]["outcome"] == "succeeded"
    [request] = sink.received()
    assert request.header("Idempotency-Key") == "lead-77:create:v2"
    assert request.json() == {"email": "lead77@example.org"}
    replay = Replay.objects.get(event=entry)
    assert replay.corrected_fields == ["email"] and replay.sent_key == "lead-77:create:v2"
    assert open_json(FailedEvent.objects.get(pk=entry.pk).payload) == {"email": "bad@"}


def test_corrections_need_a_note_and_paths_that_exist(client, tenant, mock_enforced):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True)
    mock_enforced.script([{"status": 422, "body": REFUSAL}])
    created = submit(client, -5)
    run_due()
    entry = FailedEvent.objects.get(operation_id=created["id"])
    url = f"/api/v1/dlq/events/{entry.pk}/correct"

    assert client.post(url, {"fields": {"body.amount": 1}, "note": ""}, format="json").status_code == 400
    missing = client.post(url, {"fields": {"body.nope.deeper": 1}, "note": "x"}, format="json")
    assert missing.status_code == 400 and missing.json()["code"] == "validation_error"
    assert Operation.objects.count() == 1 and FailedEvent.objects.get(pk=entry.pk).status == "pending"
