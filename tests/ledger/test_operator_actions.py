"""An operator's cancel (queued / retry_wait → abandoned, with a reason) and retry now."""

from __future__ import annotations

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import ErrorClass, Operation, OperationMode, OperationStatus, Provider, Tenant
from ledger.platform.errors import OperationNotCancellable, OperationNotFound, ValidationFailed
from ledger.protocol import services
from ledger.protocol.transitions import claim as transitions_claim
from tests.ledger.support import events_of

S = OperationStatus
pytestmark = pytest.mark.django_db


def submit(tenant: Tenant, provider: Provider, key: str = "order-9:charge:v1") -> Operation:
    result = operation_submit(
        tenant=tenant, key=key, provider=provider.slug, request={"method": "POST", "path": "/charges"}
    )
    return Operation.objects.get(pk=result.operation.pk)


def in_retry_wait(tenant: Tenant, provider: Provider, key: str = "order-8:charge:v1") -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, request={"amount": 1}).operation
    return services.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=ErrorClass.TRANSIENT,
        message="503",
    )


def test_cancelling_a_queued_operation_abandons_it_with_the_reason_and_actor(tenant, provider):
    op = submit(tenant, provider)

    moved = services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="customer withdrew the order")

    assert moved.status == S.ABANDONED and moved.done_at is not None and moved.next_attempt_at is None
    old, new, actor, reason = events_of(op.pk)[-1]
    assert (old, new, actor) == (S.QUEUED, S.ABANDONED, "user:otto")
    assert reason == "cancelled: customer withdrew the order"


def test_a_cancelled_guard_key_is_replayed_as_abandoned_and_never_sent_again(tenant, provider):
    op = in_retry_wait(tenant, provider)
    assert op.status == S.RETRY_WAIT

    services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="duplicate order")
    again = services.operation_claim(tenant=tenant, key=op.key, provider=provider, request={"amount": 1})

    assert again.replayed and not again.acquired and again.operation.status == S.ABANDONED


@pytest.mark.parametrize("status", [S.CLAIMED, S.UNCERTAIN, S.REVIEW, S.SUCCEEDED, S.FAILED])
def test_cancel_is_refused_where_something_may_be_under_way_or_it_is_over(tenant, provider, status):
    op = services.operation_claim(tenant=tenant, key="k:1", provider=provider, request={}).operation
    done = op.claimed_at if status in (S.SUCCEEDED, S.FAILED) else None
    Operation.objects.filter(pk=op.pk).update(status=status, done_at=done)
    events = len(events_of(op.pk))

    with pytest.raises(OperationNotCancellable):
        services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="no")

    assert Operation.objects.get(pk=op.pk).status == status and len(events_of(op.pk)) == events


def test_cancel_needs_a_reason_and_a_tenant_of_the_caller(tenant, other_tenant, provider):
    op = submit(tenant, provider)

    with pytest.raises(ValidationFailed):
        services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="   ")
    with pytest.raises(OperationNotFound):
        services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="x", tenant_ids=[other_tenant.pk])
    assert Operation.objects.get(pk=op.pk).status == S.QUEUED


def test_a_worker_that_took_the_row_first_wins_over_the_cancel(tenant, provider, monkeypatch):
    op = submit(tenant, provider)
    # The worker's take happens between the operator's read and the cancel's UPDATE.
    monkeypatch.setattr(transitions_claim, "operator_target", lambda **_: op)
    Operation.objects.filter(pk=op.pk).update(
        status=S.CLAIMED, lease_token="taken-by-worker", lease_expires_at=op.created_at
    )

    with pytest.raises(OperationNotCancellable):
        services.operation_cancel(operation_id=op.pk, actor="user:otto", reason="too late")
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED


def test_retry_now_makes_an_execute_mode_retry_due_at_once_and_records_who_asked(tenant, provider):
    op = submit(tenant, provider)
    Operation.objects.filter(pk=op.pk).update(status=S.RETRY_WAIT, next_attempt_at=op.created_at.replace(year=2999))

    moved = services.operation_retry_now(operation_id=op.pk, actor="user:otto", reason="limit lifted")

    assert moved.status == S.RETRY_WAIT and moved.next_attempt_at.year < 2999
    assert events_of(op.pk)[-1][:3] == (S.RETRY_WAIT, S.RETRY_WAIT, "user:otto")


def test_retry_now_refuses_a_guard_mode_row_whose_caller_must_claim_again(tenant, provider):
    op = in_retry_wait(tenant, provider)
    assert op.mode == OperationMode.GUARD

    with pytest.raises(OperationNotCancellable, match="caller"):
        services.operation_retry_now(operation_id=op.pk, actor="user:otto")
