"""POST /api/v1/claims answers exactly as DESIGN §5's table, with problem+json codes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from ledger.models import Attempt, ErrorClass, Operation, OperationMode, OperationStatus
from ledger.protocol import services
from ledger.protocol.transitions.claim import guarded_move
from ledger.store import sql
from tests.ledger.support import (
    CLAIM_URL,
    PROBLEM_JSON,
    assert_problem,
    attempts_of,
    claim_body,
    expire_lease,
    ledger_counts,
    make_retry_due,
    op_url,
    row,
    schedule_retry_in,
)

S = OperationStatus
pytestmark = pytest.mark.django_db


def post(api: Any, url: str, body: Any, **headers: Any) -> Any:
    return api.post(url, body, format="json", **headers)


def claim(api: Any, key: str | None = "order-1001:charge:v1", **overrides: Any) -> Any:
    return post(api, CLAIM_URL, claim_body(key, **overrides))


def fail(api: Any, created: dict[str, Any], error_class: str, message: str = "") -> Any:
    return post(
        api,
        op_url(created["id"], "fail"),
        {"lease_token": created["lease_token"], "error_class": error_class, "message": message},
    )


# --- 201 ---------------------------------------------------------------------------------


def test_new_key_gets_201_with_lease_token_attempt_and_location(api):
    response = claim(api, lease_seconds=30)

    assert response.status_code == 201
    body = response.json()
    assert body["status"] == S.CLAIMED
    assert body["attempt"] == 1
    assert len(body["lease_token"]) == 32
    assert body["lease_expires_at"] is not None
    assert response["Location"] == op_url(body["id"])
    assert "Idempotent-Replayed" not in response
    op = Operation.objects.get(pk=body["id"])
    assert (op.key, op.status, op.attempts, op.lease_token) == (
        "order-1001:charge:v1",
        S.CLAIMED,
        1,
        body["lease_token"],
    )
    # The lease wish (30 s) is kept when it lies inside the configured range: exactly 30 s
    # from the claim, both written by the claim's one statement from one reading of the
    # database's clock (was: 25..31 s, as if read at two moments).
    assert op.lease_expires_at - op.claimed_at == timedelta(seconds=30)


def test_claim_takes_the_key_from_the_idempotency_key_header(api):
    response = post(api, CLAIM_URL, claim_body(None), HTTP_IDEMPOTENCY_KEY="hdr-key:1")

    assert response.status_code == 201
    assert response.json()["key"] == "hdr-key:1"


def test_body_key_and_header_key_that_disagree_are_a_400_and_write_nothing(api):
    before = ledger_counts()

    response = post(api, CLAIM_URL, claim_body("body-key"), HTTP_IDEMPOTENCY_KEY="header-key")

    assert_problem(response, 400, "invalid_idempotency_key")
    assert ledger_counts() == before


def test_a_255_character_key_is_accepted(api):
    response = claim(api, "k" * 255)

    assert response.status_code == 201, response.content


# --- 409 in progress / retry scheduled ---------------------------------------------------


def test_second_claim_of_a_live_lease_gets_409_in_progress_with_retry_after(api):
    started = sql.db_now()
    first = claim(api, lease_seconds=120).json()
    before = row(first["id"])

    response = claim(api)
    ended = sql.db_now()

    body = assert_problem(response, 409, "operation_in_progress")
    assert body["operation_id"] == first["id"]
    # What is left of the 120-second lease, bracketed by the database's clock read before the
    # claim and after the answer (was: 100–120 s whatever the machine's pace).
    spent = (ended - started).total_seconds()
    assert 120 - spent - 1 <= int(response["Retry-After"]) <= 120
    assert row(first["id"]) == before


def test_claim_of_an_expired_but_unswept_lease_is_still_in_progress(api):
    first = claim(api).json()
    expire_lease(first["id"])

    response = claim(api)

    assert_problem(response, 409, "operation_in_progress")
    assert int(response["Retry-After"]) >= 1
    assert Operation.objects.get(pk=first["id"]).attempts == 1


def test_retry_wait_not_yet_due_gets_409_retry_scheduled_with_retry_after(api):
    first = claim(api).json()
    failed = fail(api, first, ErrorClass.TRANSIENT, "503 before send")
    assert failed.json()["status"] == S.RETRY_WAIT
    schedule_retry_in(first["id"], 600)

    response = claim(api)

    assert_problem(response, 409, "operation_retry_scheduled")
    assert 500 <= int(response["Retry-After"]) <= 601
    assert Operation.objects.get(pk=first["id"]).attempts == 1


def test_due_retry_wait_gets_201_with_a_new_attempt_on_the_same_operation(api):
    first = claim(api).json()
    fail(api, first, ErrorClass.TRANSIENT, "refused before send")
    make_retry_due(first["id"])

    response = claim(api)

    assert response.status_code == 201, response.content
    second = response.json()
    assert second["id"] == first["id"]
    assert second["attempt"] == 2
    assert second["lease_token"] != first["lease_token"]
    assert second["status"] == S.CLAIMED
    assert "Idempotent-Replayed" not in response
    attempts = attempts_of(first["id"])
    assert [(a["number"], a["outcome"]) for a in attempts] == [(1, "transient"), (2, "pending")]
    assert attempts[1]["lease_token"] == second["lease_token"]


# --- 409 needs reconciliation --------------------------------------------------------------


def test_uncertain_operation_gets_409_needs_reconciliation(api):
    first = claim(api).json()
    fail(api, first, ErrorClass.AMBIGUOUS, "timeout after send")
    assert Operation.objects.get(pk=first["id"]).status == S.UNCERTAIN

    response = claim(api)

    body = assert_problem(response, 409, "operation_needs_reconciliation")
    assert body["operation_status"] == S.UNCERTAIN
    assert "Retry-After" not in response


def test_review_operation_gets_409_needs_reconciliation(api):
    first = claim(api).json()
    fail(api, first, ErrorClass.AMBIGUOUS)
    op = Operation.objects.get(pk=first["id"])
    guarded_move(operation=op, to=S.REVIEW, actor="sweeper", reason="advisory provider")

    response = claim(api)

    body = assert_problem(response, 409, "operation_needs_reconciliation")
    assert body["operation_status"] == S.REVIEW


# --- 200 replays ---------------------------------------------------------------------------


def test_succeeded_key_replays_200_with_idempotent_replayed_and_the_operation(api):
    first = claim(api).json()
    done = post(
        api,
        op_url(first["id"], "complete"),
        {"lease_token": first["lease_token"], "provider_ref": "ch_1", "response": {"id": "ch_1", "paid": True}},
    )
    assert done.status_code == 200
    assert "Idempotent-Replayed" not in done

    response = claim(api)

    assert response.status_code == 200
    assert response["Idempotent-Replayed"] == "true"
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["id"] == first["id"]
    assert body["status"] == S.SUCCEEDED
    assert body["provider_ref"] == "ch_1"
    # The replaying claim is the one answer that carries the recorded response in clear.
    assert body["response"] == {"status": 200, "body": {"id": "ch_1", "paid": True}, "masked": False}
    # A replay never hands out a lease.
    assert "lease_token" not in body


def test_replayed_terminal_failure_is_byte_identical_to_the_first_replay(api):
    first = claim(api).json()
    fail(api, first, ErrorClass.INVALID_INPUT, "card declined")

    replay_one = claim(api)
    replay_two = claim(api)

    assert replay_one.status_code == 200
    assert replay_one["Idempotent-Replayed"] == "true"
    assert replay_one.json()["status"] == S.FAILED
    assert replay_one.json()["error_class"] == ErrorClass.INVALID_INPUT
    assert replay_one.content == replay_two.content
    assert replay_two["Idempotent-Replayed"] == "true"


def test_abandoned_key_replays_200(api):
    first = claim(api).json()
    fail(api, first, ErrorClass.AMBIGUOUS)
    op = guarded_move(operation=Operation.objects.get(pk=first["id"]), to=S.REVIEW, actor="sweeper", reason="advisory")
    guarded_move(operation=op, to=S.ABANDONED, actor="reviewer:ann", reason="not needed")

    response = claim(api)

    assert response.status_code == 200
    assert response["Idempotent-Replayed"] == "true"
    assert response.json()["status"] == S.ABANDONED


# --- 422 / managed by service --------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"request": {"amount": 9999, "currency": "eur"}},
        {"action": "refund"},
        {"request": None},
    ],
    ids=["other-request", "other-action", "no-request"],
)
def test_same_key_with_a_different_request_gets_422(api, change):
    first = claim(api).json()
    before = row(first["id"])

    response = claim(api, **change)

    body = assert_problem(response, 422, "key_reused_with_different_request")
    assert body["operation_id"] == first["id"]
    assert row(first["id"]) == before


def test_same_key_same_request_in_another_key_order_is_the_same_fingerprint(api):
    claim(api, request={"amount": 1200, "currency": "eur"})

    response = claim(api, request={"currency": "eur", "amount": 1200})

    assert_problem(response, 409, "operation_in_progress")


def test_same_key_reused_after_success_with_a_different_request_is_still_422(api):
    first = claim(api).json()
    post(api, op_url(first["id"], "complete"), {"lease_token": first["lease_token"], "provider_ref": "ch_1"})

    response = claim(api, request={"amount": 1})

    assert_problem(response, 422, "key_reused_with_different_request")


def test_execute_mode_key_claimed_through_claims_gets_409_managed_by_service(api, tenant, provider):
    request = {"amount": 1200, "currency": "eur"}
    executed = services.operation_claim(
        tenant=tenant,
        key="order-1001:charge:v1",
        provider=provider,
        action="charge",
        request=request,
        mode=OperationMode.EXECUTE,
        via_claims=False,
    ).operation
    assert executed.status == S.QUEUED
    before = row(executed.pk)

    response = claim(api, request=request)

    body = assert_problem(response, 409, "operation_managed_by_service")
    assert body["operation_id"] == executed.pk
    assert row(executed.pk) == before


# --- 400 / 401 / 403 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [None, "", "k" * 256, "bad\x00key", "line\nbreak", "esc\x1b[0m", "del\x7f", "tab\tkey", " padded", "padded "],
    ids=["missing", "empty", "256-chars", "nul", "newline", "escape", "del", "tab", "leading-blank", "trailing-blank"],
)
def test_invalid_keys_are_a_400_problem_and_write_nothing(api, key):
    before = ledger_counts()

    response = claim(api, key)

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM_JSON
    assert response.json()["code"] in {"invalid_idempotency_key", "validation_error"}
    assert ledger_counts() == before


@pytest.mark.parametrize("key", [None, "", "k" * 256, "esc\x1b[0m"], ids=["missing", "empty", "256", "escape"])
def test_invalid_keys_are_named_invalid_idempotency_key(api, key):
    response = claim(api, key)

    assert_problem(response, 400, "invalid_idempotency_key")


def test_unknown_provider_is_a_400_and_writes_nothing(api):
    before = ledger_counts()

    response = claim(api, provider="paypal")

    assert_problem(response, 400, "unknown_provider")
    assert ledger_counts() == before


def test_another_tenants_provider_is_unknown(api, other_tenant):
    services.provider_upsert(tenant=other_tenant, slug="mailer", idempotency_class="key_advisory")

    response = claim(api, provider="mailer")

    assert_problem(response, 400, "unknown_provider")


def test_claim_without_credentials_is_401_and_writes_nothing(db):
    before = ledger_counts()

    response = post(APIClient(), CLAIM_URL, claim_body())

    assert_problem(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert ledger_counts() == before


@pytest.mark.parametrize(
    "header",
    ["Bearer og_nope_notakey", "Basic dXNlcjpwYXNz", "Bearer ", "Token abc"],
    ids=["unknown-key", "basic", "empty-bearer", "other-scheme"],
)
def test_claim_with_a_bad_api_key_is_401(provider, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    before = ledger_counts()

    response = post(client, CLAIM_URL, claim_body())

    assert_problem(response, 401, "unauthenticated")
    assert ledger_counts() == before


def test_a_revoked_api_key_is_401(tenant, provider):
    api_key, secret = services.apikey_create(tenant=tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/operations").status_code == 200
    services.apikey_revoke(api_key_id=api_key.pk)

    assert_problem(client.get("/api/v1/operations"), 401, "unauthenticated")


def test_a_read_only_key_cannot_claim_but_can_read(tenant, provider, make_client):
    reader = make_client(tenant, scopes=["read"])
    before = ledger_counts()

    response = post(reader, CLAIM_URL, claim_body())

    assert_problem(response, 403, "forbidden")
    assert ledger_counts() == before
    assert reader.get("/api/v1/operations").status_code == 200


def test_a_read_only_key_cannot_complete_a_claim(api, tenant, make_client):
    first = claim(api).json()
    reader = make_client(tenant, scopes=["read"])
    before = row(first["id"])

    response = post(reader, op_url(first["id"], "complete"), {"lease_token": first["lease_token"]})

    assert_problem(response, 403, "forbidden")
    assert row(first["id"]) == before


def test_a_write_only_key_cannot_list(tenant, provider, make_client):
    writer = make_client(tenant, scopes=["write"])

    assert_problem(writer.get("/api/v1/operations"), 403, "forbidden")
    assert post(writer, CLAIM_URL, claim_body()).status_code == 201


# --- holder calls over HTTP ------------------------------------------------------------------


def test_holder_flow_sent_heartbeat_complete_over_http(api):
    first = claim(api, lease_seconds=10).json()
    token = first["lease_token"]

    sent = post(api, op_url(first["id"], "sent"), {"lease_token": token, "reconciliation_handle": "pi_123"})
    beat = post(api, op_url(first["id"], "heartbeat"), {"lease_token": token, "lease_seconds": 600})
    done = post(api, op_url(first["id"], "complete"), {"lease_token": token, "provider_ref": "ch_9"})

    assert sent.status_code == 200 and sent.json()["sent_at"] is not None
    assert sent.json()["reconciliation_handle"] == "pi_123"
    assert beat.status_code == 200
    assert _parse(beat.json()["lease_expires_at"]) > _parse(first["lease_expires_at"])
    assert done.status_code == 200 and done.json()["status"] == S.SUCCEEDED
    for answer in (sent, beat, done):
        assert "Idempotent-Replayed" not in answer
    got = api.get(op_url(first["id"]))
    assert got.status_code == 200
    assert "Idempotent-Replayed" not in got
    assert got.json()["provider_ref"] == "ch_9"


@pytest.mark.parametrize("verb", ["sent", "complete", "heartbeat", "fail"])
def test_holder_calls_with_a_wrong_token_are_409_lease_lost(api, verb):
    first = claim(api).json()
    before = row(first["id"])
    body: dict[str, Any] = {"lease_token": "0" * 32}
    if verb == "fail":
        body["error_class"] = ErrorClass.TRANSIENT

    response = post(api, op_url(first["id"], verb), body)

    assert_problem(response, 409, "lease_lost")
    assert row(first["id"]) == before
    assert Attempt.objects.get(operation_id=first["id"]).outcome == "pending"


def test_sent_after_the_lease_expired_is_refused_so_the_effect_is_not_started(api):
    first = claim(api).json()
    expire_lease(first["id"])

    response = post(api, op_url(first["id"], "sent"), {"lease_token": first["lease_token"]})

    assert_problem(response, 409, "lease_expired")
    assert row(first["id"])["sent_at"] is None


def test_complete_after_success_is_409_already_finished_for_another_ref(api):
    first = claim(api).json()
    token = first["lease_token"]
    post(api, op_url(first["id"], "complete"), {"lease_token": token, "provider_ref": "ch_1"})

    same = post(api, op_url(first["id"], "complete"), {"lease_token": token, "provider_ref": "ch_1"})
    other = post(api, op_url(first["id"], "complete"), {"lease_token": token, "provider_ref": "ch_2"})

    assert same.status_code == 200
    assert_problem(other, 409, "operation_already_finished")


def test_unknown_operation_is_a_404_problem(api):
    assert_problem(api.get(op_url(999_999)), 404, "not_found")
    assert_problem(post(api, op_url(999_999, "complete"), {"lease_token": "x"}), 404, "not_found")


def test_openapi_schema_is_served(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    assert "/api/v1/claims" in response.content.decode()


def _parse(value: str) -> datetime:
    parsed = parse_datetime(value)
    assert parsed is not None
    return parsed


def test_problem_bodies_carry_type_title_status_detail(api):
    claim(api)

    body = json.loads(claim(api).content)

    assert set(body) >= {"type", "title", "status", "code", "detail"}
    assert body["type"].endswith("/operation_in_progress")


def test_api_transitions_record_the_api_key_as_actor(api):
    from ledger.models import ApiKey
    from tests.ledger.support import events_of

    first = claim(api).json()
    token = first["lease_token"]
    post(api, op_url(first["id"], "sent"), {"lease_token": token})
    post(api, op_url(first["id"], "fail"), {"lease_token": token, "error_class": "ambiguous", "message": "reset"})

    actor = f"apikey:{ApiKey.objects.get().prefix}"
    events = events_of(first["id"])
    assert [(old, new, who) for old, new, who, _ in events] == [
        ("", S.CLAIMED, actor),
        (S.CLAIMED, S.CLAIMED, actor),
        (S.CLAIMED, S.UNCERTAIN, actor),
    ]
    assert "reset" in events[-1][3]
