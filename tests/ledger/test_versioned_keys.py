"""Versioned keys (issue 13 item 2): a claim or submission sends `record`, `action` and an
integer `version`; the key is `{record}:{action}:v{version}`. A newer version abandons the
older ones still queued or waiting for a retry and records itself as their `replaced_by`; an
older version claimed after a newer one succeeded gets `409 operation_version_superseded`."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import Operation, OperationEvent, OperationStatus
from tests.ledger.support import CLAIM_URL, assert_problem, claim_body, op_url

S = OperationStatus
pytestmark = pytest.mark.django_db


def claim_version(api: Any, version: int, *, record: str = "order-1001", **overrides: Any) -> Any:
    body = claim_body(None, record=record, version=version, **overrides)
    return api.post(CLAIM_URL, body, format="json")


def fail_transient(api: Any, created: dict[str, Any]) -> None:
    response = api.post(
        op_url(created["id"], "fail"),
        {"lease_token": created["lease_token"], "error_class": "transient", "message": "HTTP 503"},
        format="json",
    )
    assert response.json()["status"] == S.RETRY_WAIT, response.content


def complete(api: Any, created: dict[str, Any]) -> Any:
    return api.post(
        op_url(created["id"], "complete"),
        {"lease_token": created["lease_token"], "provider_ref": "ch_1"},
        format="json",
    )


def test_the_key_is_composed_from_the_parts_and_the_parts_are_stored(api):
    response = claim_version(api, 3)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["key"] == "order-1001:charge:v3"
    assert (body["record"], body["action"], body["version"], body["replaced_by"]) == ("order-1001", "charge", 3, None)
    op = Operation.objects.get(pk=body["id"])
    assert (op.record, op.version, op.workflow_version) == ("order-1001", 3, "")


def test_revision_4_supersedes_a_pending_revision_3_and_a_late_3_gets_409(api):
    v3 = claim_version(api, 3).json()
    fail_transient(api, v3)  # revision 3 waits for a retry: nothing was sent

    v4 = claim_version(api, 4)
    assert v4.status_code == 201, v4.content
    v4 = v4.json()

    old = Operation.objects.get(pk=v3["id"])
    assert old.status == S.ABANDONED and old.replaced_by_id == v4["id"]
    reasons = list(OperationEvent.objects.filter(operation_id=old.pk).values_list("reason", flat=True))
    assert any("replaced by version 4" in reason for reason in reasons), reasons
    assert complete(api, v4).status_code == 200

    late = claim_version(api, 3)
    problem = assert_problem(late, 409, "operation_version_superseded")
    assert problem["replaced_by"] == v4["id"] and problem["replaced_by_version"] == 4
    # The same key sent as a plain key is the same operation, and refused alike.
    assert_problem(
        api.post(CLAIM_URL, claim_body("order-1001:charge:v3"), format="json"), 409, "operation_version_superseded"
    )
    # Revision 4 itself still answers with its recorded outcome.
    again = claim_version(api, 4)
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"


def test_a_claimed_older_version_finishes_its_course(api):
    v3 = claim_version(api, 3).json()

    v4 = claim_version(api, 4).json()

    old = Operation.objects.get(pk=v3["id"])
    assert old.status == S.CLAIMED and old.replaced_by_id == v4["id"]
    assert complete(api, v3).json()["status"] == S.SUCCEEDED
    event = OperationEvent.objects.filter(operation_id=old.pk, from_status=S.CLAIMED, to_status=S.CLAIMED).get()
    assert "replaced by version 4" in event.reason and "finishes its course" in event.reason


def test_an_older_version_is_not_started_once_a_newer_one_exists(api):
    v4 = claim_version(api, 4).json()

    problem = assert_problem(claim_version(api, 2), 409, "operation_version_superseded")

    assert problem["replaced_by"] == v4["id"]
    assert not Operation.objects.filter(key="order-1001:charge:v2").exists()


def test_other_records_and_actions_are_not_touched(api):
    other_record = claim_version(api, 1, record="order-2002").json()
    other_action = claim_version(api, 1, action="refund").json()

    claim_version(api, 5)

    for created in (other_record, other_action):
        op = Operation.objects.get(pk=created["id"])
        assert op.status == S.CLAIMED and op.replaced_by_id is None


def test_a_key_that_is_not_the_composition_of_the_parts_is_refused(api):
    body = claim_body("order-1001:charge:v9", record="order-1001", version=3)

    assert_problem(api.post(CLAIM_URL, body, format="json"), 400, "invalid_idempotency_key")
    assert_problem(claim_version(api, 3, action=""), 400, "validation_error")
    assert_problem(api.post(CLAIM_URL, claim_body(None, version=3), format="json"), 400, "validation_error")
    assert not Operation.objects.exists()


def test_a_newer_submission_abandons_an_older_queued_one_in_execute_mode(api, tenant, provider):
    envelope = {"method": "POST", "path": "/charges", "body": {"amount": 1}}

    def submit(version: int) -> dict[str, Any]:
        body = {"provider": "stripe", "action": "charge", "record": "order-7", "version": version, "request": envelope}
        response = api.post("/api/v1/operations", body, format="json")
        assert response.status_code == 202, response.content
        return response.json()

    v1 = submit(1)
    v2 = submit(2)

    old = Operation.objects.get(pk=v1["id"])
    assert old.status == S.ABANDONED and old.replaced_by_id == v2["id"]
    assert Operation.objects.get(pk=v2["id"]).status == S.QUEUED
    assert v2["key"] == "order-7:charge:v2"
