"""A repeated execute-mode submission (issue 12, item 5): the same tenant, key and request as
an accepted one answers `202` with the same operation and `Idempotent-Replayed: true` while
the operation is open, and `200` with its recorded outcome once it is finished — never a
`409`, which would send an n8n HTTP Request node's "Retry On Fail" (a submit whose 202 was
lost) down its error path. Another request under the key stays a `422`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ledger.execution.attempts import operations_take
from ledger.models import Attempt, Operation, OperationEvent, OperationStatus, Tenant
from ledger.protocol import services
from ledger.recovery.sweeper import sweep
from tests.conftest import on_postgres
from tests.execute.support import run_due
from tests.ledger.test_concurrency import race

S = OperationStatus
URL = "/api/v1/operations"


def submit(api: Any, body: dict[str, Any], **headers: Any) -> Any:
    return api.post(URL, body, format="json", **headers)


def trail(op_id: int) -> list[tuple[str, str]]:
    return list(
        OperationEvent.objects.filter(operation_id=op_id).order_by("id").values_list("from_status", "to_status")
    )


def assert_same_operation_again(first: Any, again: Any, *, status: str) -> None:
    assert again.status_code == 202, again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
    assert again["Content-Type"].startswith("application/json")
    body = again.json()
    assert body["id"] == first.json()["id"] and body["key"] == first.json()["key"]
    assert body["status"] == status
    assert Operation.objects.count() == 1


def test_the_first_submission_is_not_marked_replayed(api, enforced, charge_envelope):
    first = submit(api, {"key": "order-10:charge:v1", "provider": "charges", "request": charge_envelope()})
    assert first.status_code == 202
    assert "Idempotent-Replayed" not in first


def test_a_repeat_while_queued_answers_202_with_the_same_operation_and_writes_nothing(api, enforced, charge_envelope):
    body = {"key": "order-11:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    before = trail(first.json()["id"])
    for _ in range(3):
        assert_same_operation_again(first, submit(api, body), status=S.QUEUED)
    # Nothing new: no event, no attempt, the row untouched.
    assert trail(first.json()["id"]) == before
    assert not Attempt.objects.exists()
    # The key in the header instead of the body is the same submission.
    header = {k: v for k, v in body.items() if k != "key"}
    assert_same_operation_again(first, submit(api, header, HTTP_IDEMPOTENCY_KEY=body["key"]), status=S.QUEUED)


def test_a_repeat_while_a_worker_holds_it_answers_202_and_sends_nothing(api, enforced, charge_envelope):
    _, mock = enforced
    body = {"key": "order-12:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    (taken,) = operations_take(limit=5, actor="test-worker")
    assert taken.status == S.CLAIMED
    assert_same_operation_again(first, submit(api, body), status=S.CLAIMED)
    assert mock.effects()["requests"] == 0


def test_a_repeat_while_a_retry_waits_answers_202(api, enforced, charge_envelope):
    _, mock = enforced
    mock.script([{"status": 408}])
    body = {"key": "order-13:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    (waiting,) = run_due()
    assert waiting.status == S.RETRY_WAIT
    again = submit(api, body)
    assert_same_operation_again(first, again, status=S.RETRY_WAIT)
    assert again.json()["attempts"] == 1
    assert mock.effects()["requests"] == 1


def test_a_repeat_while_the_outcome_is_uncertain_or_in_review_answers_202_and_never_resends(
    api, advisory, charge_envelope
):
    _, mock = advisory
    mock.script([{"status": 500}])
    body = {"key": "order-14:notify:v1", "provider": "webhook", "request": charge_envelope()}
    first = submit(api, body)
    (unknown,) = run_due()
    assert unknown.status == S.UNCERTAIN
    assert_same_operation_again(first, submit(api, body), status=S.UNCERTAIN)
    # A key-advisory row the sweeper cannot settle goes to a human.
    sweep()
    assert Operation.objects.get().status == S.REVIEW
    assert_same_operation_again(first, submit(api, body), status=S.REVIEW)
    assert run_due() == []
    assert mock.effects()["requests"] == 1


def test_once_finished_the_repeat_answers_200_with_the_recorded_outcome(api, enforced, charge_envelope):
    body = {"key": "order-15:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    assert_same_operation_again(first, submit(api, body), status=S.QUEUED)
    (done,) = run_due()
    replay = submit(api, body)
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["status"] == S.SUCCEEDED and replay.json()["provider_ref"] == done.provider_ref
    # The replay of a finished key carries the recorded response in clear (DESIGN §8).
    assert replay.json()["response"]["body"]["id"] == done.provider_ref


def test_a_repeat_with_another_request_is_still_422_while_open(api, enforced, charge_envelope):
    assert (
        submit(api, {"key": "order-16:charge:v1", "provider": "charges", "request": charge_envelope(1)}).status_code
        == 202
    )
    other = submit(api, {"key": "order-16:charge:v1", "provider": "charges", "request": charge_envelope(2)})
    assert other.status_code == 422
    assert other.json()["code"] == "key_reused_with_different_request"
    assert other.json()["operation_id"] == Operation.objects.get().pk


def test_a_repeat_is_never_refused_by_admission(api, tenant, enforced, charge_envelope):
    Tenant.objects.filter(pk=tenant.pk).update(max_in_flight=1)
    body = {"key": "order-17:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    assert first.status_code == 202
    # The tenant is at its limit: a new key is refused, the accepted one answers as itself.
    refused = submit(api, {**body, "key": "order-18:charge:v1"})
    assert refused.status_code == 429 and refused.json()["code"] == "tenant_in_flight_limit"
    assert_same_operation_again(first, submit(api, body), status=S.QUEUED)


def test_a_versioned_key_sent_as_parts_repeats_the_same_way(api, enforced, charge_envelope):
    body = {"record": "order-19", "action": "charge", "version": 1, "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    assert first.status_code == 202 and first.json()["key"] == "order-19:charge:v1"
    assert_same_operation_again(first, submit(api, body), status=S.QUEUED)


def test_the_answer_of_a_repeat_masks_nothing_it_did_not_mask_before(api, enforced, charge_envelope):
    body = {"key": "order-20:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    again = submit(api, body)
    assert set(again.json()) == set(first.json())
    assert again.json()["response"] == first.json()["response"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_submissions_make_one_operation_and_all_answer_202(
    tenant, enforced, charge_envelope, live_server
):
    """Real connections per request (the live server's threads): one INSERT wins, the others
    read the winner's row. Every answer is the same operation; exactly one is the first."""
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write"])
    base = live_server.url.replace("localhost", "127.0.0.1")
    rounds, threads = (6, 8) if on_postgres() else (2, 4)
    for r in range(rounds):
        key = f"race-{r}:charge:v1"
        body = {"key": key, "provider": "charges", "request": charge_envelope(100 + r)}
        seen: list[tuple[int, int, str]] = []

        def send(i: int, body: dict[str, Any] = body, seen: list[tuple[int, int, str]] = seen) -> str:
            with httpx.Client(timeout=60, trust_env=False) as http:
                answer = http.post(f"{base}{URL}", json=body, headers={"Authorization": f"Bearer {secret}"})
            assert answer.status_code == 202, answer.text
            seen.append((answer.json()["id"], answer.status_code, answer.headers.get("Idempotent-Replayed", "")))
            return answer.headers.get("Idempotent-Replayed", "first")

        answers = race(threads, send)

        assert answers["first"] == 1, (r, answers)
        assert answers["true"] == threads - 1, (r, answers)
        assert len({op_id for op_id, _, _ in seen}) == 1
        (op,) = Operation.objects.filter(key=key)
        assert op.status == S.QUEUED
        assert trail(op.pk) == [("", S.QUEUED)]
    _, mock = enforced
    done = run_due(limit=rounds)
    assert len(done) == rounds and {o.status for o in done} == {S.SUCCEEDED}
    assert mock.effects()["requests"] == rounds
