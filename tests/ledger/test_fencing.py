"""Fencing and monotonic completion (DESIGN §3): a superseded holder's result is evidence on
its Attempt, never on the row; the latest holder's late result is accepted; nothing leaves a
terminal state."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import AttemptOutcome, ErrorClass, Operation, OperationStatus
from ledger.platform.errors import LeaseLost, OperationAlreadyFinished
from ledger.protocol import services
from ledger.recovery.sweeper import sweep, sweep_expired_leases
from tests.ledger.support import (
    CLAIM_URL,
    assert_problem,
    attempts_of,
    claim_body,
    events_of,
    expire_lease,
    ledger_counts,
    op_url,
    plain,
    row,
)

S = OperationStatus
pytestmark = pytest.mark.django_db


def post(api: Any, url: str, body: Any) -> Any:
    return api.post(url, body, format="json")


def superseded(api: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Holder A's lease expires unsent; the sweeper frees the row; holder B re-claims it."""
    a = post(api, CLAIM_URL, claim_body(uses_sent_marker=True)).json()
    expire_lease(a["id"])
    report = sweep()
    assert report.counts.get("claimed->retry_wait") == 1, report.counts
    assert Operation.objects.get(pk=a["id"]).status == S.RETRY_WAIT
    b_answer = post(api, CLAIM_URL, claim_body(uses_sent_marker=True))
    assert b_answer.status_code == 201, b_answer.content
    b = b_answer.json()
    assert (b["id"], b["attempt"]) == (a["id"], 2)
    return a, b


def test_superseded_holder_cannot_complete_and_its_ref_is_kept_on_its_attempt(api):
    a, b = superseded(api)
    before = row(a["id"])

    response = post(
        api,
        op_url(a["id"], "complete"),
        {"lease_token": a["lease_token"], "provider_ref": "ch_from_A", "response": {"id": "ch_from_A"}},
    )

    assert_problem(response, 409, "lease_lost")
    assert row(a["id"]) == before
    assert row(a["id"])["provider_ref"] == ""
    first, second = attempts_of(a["id"])
    assert first["lease_token"] == a["lease_token"]
    assert first["outcome"] == AttemptOutcome.FENCED
    assert first["provider_ref"] == "ch_from_A"
    assert plain(first["response_body"]) == {"id": "ch_from_A"}
    assert second["outcome"] == AttemptOutcome.PENDING
    assert second["provider_ref"] == ""


def test_after_fencing_the_new_holder_still_completes_with_its_own_ref(api):
    a, b = superseded(api)
    post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_A"})

    done = post(api, op_url(b["id"], "complete"), {"lease_token": b["lease_token"], "provider_ref": "ch_B"})

    assert done.status_code == 200
    assert done.json()["provider_ref"] == "ch_B"
    assert [(x["outcome"], x["provider_ref"]) for x in attempts_of(a["id"])] == [
        (AttemptOutcome.FENCED, "ch_A"),
        (AttemptOutcome.SUCCEEDED, "ch_B"),
    ]


@pytest.mark.parametrize("verb", ["fail", "sent", "heartbeat"])
def test_superseded_holder_cannot_fail_mark_sent_or_heartbeat(api, verb):
    a, b = superseded(api)
    before = row(a["id"])
    body: dict[str, Any] = {"lease_token": a["lease_token"]}
    if verb == "fail":
        body.update(error_class=ErrorClass.INVALID_INPUT, message="declined")

    response = post(api, op_url(a["id"], verb), body)

    assert_problem(response, 409, "lease_lost")
    assert row(a["id"]) == before
    if verb == "fail":
        # The late failure is kept on A's attempt as evidence too.
        first = attempts_of(a["id"])[0]
        assert (first["outcome"], first["error_class"]) == (AttemptOutcome.FENCED, ErrorClass.INVALID_INPUT)


def test_superseded_holder_is_fenced_even_after_the_new_holder_finished(api):
    a, b = superseded(api)
    post(api, op_url(b["id"], "complete"), {"lease_token": b["lease_token"], "provider_ref": "ch_B"})
    before = row(a["id"])

    response = post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_A"})

    assert_problem(response, 409, "lease_lost")
    assert row(a["id"]) == before
    assert attempts_of(a["id"])[0]["provider_ref"] == "ch_A"
    assert attempts_of(a["id"])[1]["provider_ref"] == "ch_B"


def test_lease_expired_after_sent_and_swept_to_uncertain_holder_can_still_complete(api):
    a = post(api, CLAIM_URL, claim_body()).json()
    post(api, op_url(a["id"], "sent"), {"lease_token": a["lease_token"], "reconciliation_handle": "pi_1"})
    expire_lease(a["id"])
    sweep_expired_leases()
    assert Operation.objects.get(pk=a["id"]).status == S.UNCERTAIN
    assert_problem(post(api, CLAIM_URL, claim_body()), 409, "operation_needs_reconciliation")

    response = post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_late"})

    assert response.status_code == 200, response.content
    op = Operation.objects.get(pk=a["id"])
    assert (op.status, op.provider_ref) == (S.SUCCEEDED, "ch_late")
    assert op.done_at is not None
    assert attempts_of(a["id"])[0]["outcome"] == AttemptOutcome.SUCCEEDED
    assert events_of(a["id"])[-1][:2] == (S.UNCERTAIN, S.SUCCEEDED)
    # And every later claim replays it.
    replay = post(api, CLAIM_URL, claim_body())
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"


def test_unmarked_holder_swept_to_uncertain_can_still_complete(api):
    # Without uses_sent_marker the sweeper must assume it may have sent: uncertain, no re-claim.
    a = post(api, CLAIM_URL, claim_body()).json()
    expire_lease(a["id"])
    sweep_expired_leases()
    assert Operation.objects.get(pk=a["id"]).status == S.UNCERTAIN

    response = post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_1"})

    assert response.status_code == 200
    assert Operation.objects.get(pk=a["id"]).status == S.SUCCEEDED


def test_holder_whose_row_went_on_to_review_can_still_complete(api):
    a = post(api, CLAIM_URL, claim_body()).json()
    post(api, op_url(a["id"], "sent"), {"lease_token": a["lease_token"]})
    expire_lease(a["id"])
    sweep()
    # Guard mode, no lookup configured: the full pass hands it to a human.
    assert Operation.objects.get(pk=a["id"]).status == S.REVIEW

    response = post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_r"})

    assert response.status_code == 200
    assert (row(a["id"])["status"], row(a["id"])["provider_ref"]) == (S.SUCCEEDED, "ch_r")


def test_holder_with_an_expired_but_unswept_lease_can_still_complete(tenant, provider):
    op = services.operation_claim(tenant=tenant, key="k", provider=provider).operation
    expire_lease(op.pk)

    done = services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch"
    )

    assert done.status == S.SUCCEEDED


def test_a_stranger_token_on_an_uncertain_row_is_refused(tenant, provider):
    op = services.operation_claim(tenant=tenant, key="k", provider=provider).operation
    expire_lease(op.pk)
    sweep_expired_leases()
    before = row(op.pk)

    with pytest.raises(LeaseLost):
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token="e" * 32, provider_ref="forged"
        )

    assert row(op.pk) == before
    assert attempts_of(op.pk)[0]["provider_ref"] == ""


# --- monotonic ---------------------------------------------------------------------------


@pytest.fixture
def held(tenant: Any, provider: Any) -> Operation:
    return services.operation_claim(tenant=tenant, key="mono", provider=provider, action="a").operation


def _complete(op: Operation, ref: str) -> Operation:
    return services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=ref
    )


def test_late_complete_after_failed_never_changes_the_row(held):
    services.operation_fail(
        operation_id=held.pk,
        tenant_id=held.tenant_id,
        lease_token=held.lease_token,
        error_class=ErrorClass.INVALID_INPUT,
    )
    before, attempts, counts = row(held.pk), attempts_of(held.pk), ledger_counts()

    with pytest.raises(OperationAlreadyFinished):
        _complete(held, "ch_late")

    assert row(held.pk) == before
    assert attempts_of(held.pk) == attempts
    assert ledger_counts() == counts


def test_second_complete_with_a_different_ref_never_changes_the_row(held):
    _complete(held, "ch_1")
    before, attempts, counts = row(held.pk), attempts_of(held.pk), ledger_counts()

    with pytest.raises(OperationAlreadyFinished):
        _complete(held, "ch_2")

    assert row(held.pk) == before
    assert attempts_of(held.pk) == attempts
    assert ledger_counts() == counts


def test_repeating_the_same_complete_returns_the_row_unchanged(held):
    first = _complete(held, "ch_1")
    before, counts = row(held.pk), ledger_counts()

    again = _complete(held, "ch_1")

    assert again.pk == first.pk
    assert row(held.pk) == before
    assert ledger_counts() == counts


@pytest.mark.parametrize("error_class", list(ErrorClass))
def test_fail_after_succeeded_never_changes_the_row(held, error_class):
    _complete(held, "ch_1")
    before, attempts, counts = row(held.pk), attempts_of(held.pk), ledger_counts()

    with pytest.raises(OperationAlreadyFinished):
        services.operation_fail(
            operation_id=held.pk, tenant_id=held.tenant_id, lease_token=held.lease_token, error_class=error_class
        )

    assert row(held.pk) == before
    assert attempts_of(held.pk) == attempts
    assert ledger_counts() == counts


def test_terminal_rows_refuse_sent_and_heartbeat(held):
    _complete(held, "ch_1")
    before = row(held.pk)

    with pytest.raises(OperationAlreadyFinished):
        services.operation_mark_sent(operation_id=held.pk, tenant_id=held.tenant_id, lease_token=held.lease_token)
    with pytest.raises(OperationAlreadyFinished):
        services.operation_heartbeat(operation_id=held.pk, tenant_id=held.tenant_id, lease_token=held.lease_token)

    assert row(held.pk) == before


def test_the_sweeper_never_touches_a_terminal_row(held):
    _complete(held, "ch_1")
    Operation.objects.filter(pk=held.pk).update(lease_expires_at=held.claimed_at)
    before = row(held.pk)

    sweep()

    assert row(held.pk) == before


def test_late_complete_after_failed_over_http_is_409_and_the_replay_is_unchanged(api):
    a = post(api, CLAIM_URL, claim_body()).json()
    post(api, op_url(a["id"], "fail"), {"lease_token": a["lease_token"], "error_class": "invalid_input"})
    first_replay = post(api, CLAIM_URL, claim_body())

    late = post(api, op_url(a["id"], "complete"), {"lease_token": a["lease_token"], "provider_ref": "ch_late"})

    body = assert_problem(late, 409, "operation_already_finished")
    assert body["operation_status"] == S.FAILED
    assert post(api, CLAIM_URL, claim_body()).content == first_replay.content
