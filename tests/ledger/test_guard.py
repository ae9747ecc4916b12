"""The in-process guard (ledger.protocol.guard): at most one call per key, durably, via the services."""

from __future__ import annotations

from typing import Any

import pytest

from dlq.models import FailedEvent
from ledger.models import AttemptOutcome, ErrorClass, Operation, OperationStatus
from ledger.platform.errors import (
    KeyReusedWithDifferentRequest,
    OperationInProgress,
    OperationNeedsReconciliation,
    OperationRetryScheduled,
    UnknownProvider,
)
from ledger.protocol import services
from ledger.protocol.guard import (
    GuardedError,
    InvalidInputError,
    OperationFailed,
    PermissionDeniedError,
    TransientError,
    default_classify,
    idempotent,
    run_once,
)
from tests.ledger.support import attempts_of, events_of, make_retry_due, plain, schedule_retry_in

S = OperationStatus
pytestmark = pytest.mark.django_db


class Calls:
    """A stand-in side effect that counts its calls and returns a JSON-able result."""

    def __init__(self, raises: BaseException | None = None):
        self.n = 0
        self.raises = raises

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.n += 1
        if self.raises is not None:
            raise self.raises
        return {"id": f"ch_{self.n}", "args": list(args), "kwargs": kwargs}


def once(tenant: Any, fn: Any, key: str = "order-1:charge:v1", **kwargs: Any) -> Any:
    kwargs.setdefault("provider", "stripe")
    kwargs.setdefault("action", "charge")
    return run_once(tenant=tenant, key=key, fn=fn, **kwargs)


def test_runs_once_and_replays_the_recorded_result_without_calling_again(tenant, provider):
    fn = Calls()

    first = once(tenant, fn, args=(7,), kwargs={"amount": 12}, ref_from=lambda v: v["id"])
    second = once(tenant, fn, args=(7,), kwargs={"amount": 12})

    assert fn.n == 1
    assert first == {"id": "ch_1", "args": [7], "kwargs": {"amount": 12}}
    assert second == first
    op = Operation.objects.get(key="order-1:charge:v1")
    assert (op.status, op.provider_ref, op.attempts) == (S.SUCCEEDED, "ch_1", 1)
    assert plain(op.response_body) == first


def test_the_sent_marker_is_written_in_the_claiming_commit(tenant, provider):
    seen: dict[str, Any] = {}

    def effect() -> str:
        op = Operation.objects.get(key="order-1:charge:v1")
        seen.update(status=op.status, sent_at=op.sent_at, uses_sent_marker=op.uses_sent_marker)
        return "ok"

    once(tenant, effect)

    assert seen["status"] == S.CLAIMED
    assert seen["sent_at"] is not None
    assert seen["uses_sent_marker"] is True
    # Two commits for a fresh key: claim+sent, then complete.
    assert [(old, new) for old, new, *_ in events_of(Operation.objects.get().pk)] == [
        ("", S.CLAIMED),
        (S.CLAIMED, S.SUCCEEDED),
    ]
    assert events_of(Operation.objects.get().pk)[0][3] == "claimed, sent"


def test_a_key_held_by_someone_else_raises_in_progress_without_calling(tenant, provider):
    services.operation_claim(tenant=tenant, key="order-1:charge:v1", provider=provider, action="charge")
    fn = Calls()

    with pytest.raises(OperationInProgress):
        once(tenant, fn)

    assert fn.n == 0


def test_an_uncertain_key_raises_needs_reconciliation_without_calling(tenant, provider):
    fn = Calls(raises=TimeoutError("read timeout"))
    with pytest.raises(TimeoutError):
        once(tenant, fn)
    assert Operation.objects.get().status == S.UNCERTAIN

    with pytest.raises(OperationNeedsReconciliation):
        once(tenant, fn)

    assert fn.n == 1


def test_a_recorded_failure_raises_operation_failed_on_every_later_call(tenant, provider):
    fn = Calls(raises=InvalidInputError("card declined"))
    with pytest.raises(InvalidInputError):
        once(tenant, fn)

    with pytest.raises(OperationFailed) as caught:
        once(tenant, fn)

    assert fn.n == 1
    assert caught.value.operation.status == S.FAILED
    assert caught.value.operation.error_class == ErrorClass.INVALID_INPUT
    assert caught.value.code == "operation_failed"
    assert FailedEvent.objects.filter(operation=caught.value.operation).exists()


def test_the_stored_failure_message_names_the_exception_class_not_its_text(tenant, provider):
    with pytest.raises(InvalidInputError):
        once(tenant, Calls(raises=InvalidInputError("card 4242424242424242 declined")))

    op = Operation.objects.get()
    assert "InvalidInputError" in op.last_error
    assert "4242" not in op.last_error
    assert "4242" not in attempts_of(op.pk)[0]["message"]


def test_a_transient_error_schedules_a_retry_that_runs_again_once_due(tenant, provider):
    fn = Calls(raises=TransientError("refused"))
    with pytest.raises(TransientError):
        once(tenant, fn)
    op = Operation.objects.get()
    assert op.status == S.RETRY_WAIT
    schedule_retry_in(op.pk, 3600)
    with pytest.raises(OperationRetryScheduled):
        once(tenant, fn)
    assert fn.n == 1

    make_retry_due(op.pk)
    fn.raises = None
    result = once(tenant, fn)

    assert result["id"] == "ch_2"
    assert fn.n == 2
    op.refresh_from_db()
    assert (op.status, op.attempts) == (S.SUCCEEDED, 2)
    assert [a["outcome"] for a in attempts_of(op.pk)] == [AttemptOutcome.TRANSIENT, AttemptOutcome.SUCCEEDED]


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (TransientError(), S.RETRY_WAIT),
        (InvalidInputError(), S.FAILED),
        (PermissionDeniedError(), S.FAILED),
        (GuardedError(), S.UNCERTAIN),
        (ValueError("boom"), S.UNCERTAIN),
        (ConnectionResetError(), S.UNCERTAIN),
        (KeyboardInterrupt(), S.UNCERTAIN),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_exceptions_are_classified_and_re_raised(tenant, provider, raised, status):
    with pytest.raises(type(raised)):
        once(tenant, Calls(raises=raised))

    assert Operation.objects.get().status == status


def test_default_classification_treats_unknown_exceptions_as_ambiguous():
    assert default_classify(TransientError()) == ErrorClass.TRANSIENT
    assert default_classify(InvalidInputError()) == ErrorClass.INVALID_INPUT
    assert default_classify(PermissionDeniedError()) == ErrorClass.PERMISSION
    assert default_classify(RuntimeError()) == ErrorClass.AMBIGUOUS
    assert default_classify(TimeoutError()) == ErrorClass.AMBIGUOUS


def test_a_custom_classifier_decides_the_failure_class(tenant, provider):
    def classify(exc: BaseException) -> str:
        return ErrorClass.TRANSIENT if isinstance(exc, ConnectionRefusedError) else ErrorClass.AMBIGUOUS

    with pytest.raises(ConnectionRefusedError):
        once(tenant, Calls(raises=ConnectionRefusedError()), classify=classify)

    assert Operation.objects.get().status == S.RETRY_WAIT


def test_the_same_key_with_another_request_is_refused(tenant, provider):
    once(tenant, Calls(), request={"amount": 1})
    fn = Calls()

    with pytest.raises(KeyReusedWithDifferentRequest):
        once(tenant, fn, request={"amount": 2})

    assert fn.n == 0


def test_the_decorator_derives_key_tenant_and_request_from_the_arguments(tenant, provider):
    calls: list[int] = []

    @idempotent(
        tenant=lambda order_id, amount: "acme",
        key=lambda order_id, amount: f"order-{order_id}:charge:v1",
        provider="stripe",
        request=lambda order_id, amount: {"amount": amount},
    )
    def charge(order_id: int, amount: int) -> dict[str, int]:
        calls.append(order_id)
        return {"charged": amount}

    assert charge(1, 100) == {"charged": 100}
    assert charge(1, 100) == {"charged": 100}
    assert charge(2, 100) == {"charged": 100}

    assert calls == [1, 2]
    assert sorted(Operation.objects.values_list("key", flat=True)) == ["order-1:charge:v1", "order-2:charge:v1"]
    assert set(Operation.objects.values_list("action", flat=True)) == {charge.__wrapped__.__qualname__}
    assert charge.__name__ == "charge"


def test_the_guard_is_tenant_scoped(tenant, provider, other_tenant):
    services.provider_upsert(tenant=other_tenant, slug="stripe", idempotency_class="key_enforced")
    fn = Calls()

    once(tenant, fn)
    once(other_tenant, fn)

    assert fn.n == 2


def test_an_unknown_provider_raises_before_anything_is_written(tenant):
    fn = Calls()

    with pytest.raises(UnknownProvider):
        once(tenant, fn, provider="nope")

    assert fn.n == 0
    assert not Operation.objects.exists()


def test_a_guard_key_is_not_claimable_through_the_api_while_running(tenant, provider, api):
    seen: dict[str, int] = {}

    def effect() -> str:
        answer = api.post(
            "/api/v1/claims", {"key": "order-1:charge:v1", "provider": "stripe", "action": "charge"}, format="json"
        )
        seen["status"] = answer.status_code
        return "ok"

    once(tenant, effect)

    # The guard's row is guard mode with the same fingerprint: the API sees it in progress.
    assert seen["status"] == 409


def test_a_result_that_is_not_json_is_still_recorded_as_succeeded(tenant, provider):
    calls: list[int] = []

    def effect() -> object:
        calls.append(1)
        return object()

    first = run_once(tenant=tenant, key="odd:1", fn=effect, provider="stripe")
    again = run_once(tenant=tenant, key="odd:1", fn=effect, provider="stripe")
    assert calls == [1]
    assert isinstance(first, object)
    assert again == {"_not_json": "object"}
    assert Operation.objects.get(key="odd:1").status == OperationStatus.SUCCEEDED


def test_a_retry_claimed_after_the_lifetime_ended_fails_instead_of_acting(tenant, provider, api):
    from django.db import connection

    from ledger.store import sql

    first = services.operation_claim(tenant=tenant, key="late:1", provider=provider, request={"a": 1})
    op = first.operation
    services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient", message="503"
    )
    past, params = sql.now_plus(-1)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_operation SET next_attempt_at = {past}, expires_at = {past} WHERE id = %s",
            [*params, *params, op.pk],
        )
    again = services.operation_claim(tenant=tenant, key="late:1", provider=provider, request={"a": 1})
    assert again.replayed and again.operation.status == S.FAILED
    assert FailedEvent.objects.filter(operation_id=op.pk).exists()
    assert Operation.objects.get(pk=op.pk).attempts == 1
