"""The ledger's hooks: typed, synchronous, in the caller's transaction — how the DLQ, the
console and the alerts act on a ledger write without the ledger importing them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

import alerts.services
import review.privacy.payloads
from alerts.models import Alert
from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent
from dlq.replays import services as dlq_replays
from ledger.models import ErrorClass, Operation, OperationStatus, Provider, Tenant
from ledger.platform import hooks
from ledger.platform.hooks import Hook, hook
from ledger.protocol import services

S = OperationStatus


@hook
def _example(*, n: int, who: str) -> None:
    """A hook for these tests."""


@pytest.fixture
def example() -> Hook[Any]:
    with _example.replaced():
        yield _example


def test_receivers_run_in_connection_order_with_the_declared_arguments_and_once_each(example):
    calls: list[tuple[str, int, str]] = []

    def first(*, n: int, who: str) -> None:
        calls.append(("first", n, who))

    def second(*, n: int, who: str) -> None:
        calls.append(("second", n, who))

    example.connect(first)
    example.connect(second)
    example.connect(first)  # connecting again changes nothing
    example.send(n=1, who="ledger")

    assert calls == [("first", 1, "ledger"), ("second", 1, "ledger")]
    assert example.name == "_example" and example.__doc__ == "A hook for these tests."


def test_a_receivers_error_reaches_the_sender_and_stops_the_rest(example):
    calls: list[str] = []

    def broken(*, n: int, who: str) -> None:
        raise RuntimeError("receiver down")

    example.connect(broken)
    example.connect(lambda **kwargs: calls.append("after"))
    with pytest.raises(RuntimeError, match="receiver down"):
        example.send(n=1, who="ledger")
    assert calls == []


def test_connected_and_replaced_put_the_receivers_back(example):
    def kept(*, n: int, who: str) -> None: ...

    def extra(*, n: int, who: str) -> None: ...

    example.connect(kept)
    with example.connected(extra):
        assert example.receivers == (kept, extra)
    assert example.receivers == (kept,)
    with example.replaced():
        assert example.receivers == ()
    assert example.receivers == (kept,)
    example.disconnect(kept)
    assert example.receivers == ()


def test_every_app_connects_its_receivers_when_django_starts():
    assert dlq_ingest.failed_event_record_for_operation in hooks.operation_failed.receivers
    assert dlq_replays.replay_settle_for_operation in hooks.operation_finished.receivers
    assert review.privacy.payloads.subject_index_record in hooks.payload_written.receivers
    assert alerts.services.alert_raise in hooks.alert_raised.receivers


def _failed_claim(tenant: Tenant, provider: Provider) -> Operation:
    op = services.operation_claim(
        tenant=tenant, key="order-7:charge:v1", provider=provider, action="charge", request={"amount": 1}
    ).operation
    return op


@pytest.mark.django_db(transaction=True)
def test_the_dlq_entry_of_a_failed_operation_is_written_inside_the_ledgers_transaction(tenant, provider):
    op = _failed_claim(tenant, provider)
    seen: list[tuple[bool, str, bool]] = []

    def after_the_dlq(*, operation: Operation) -> None:
        # Connected after the DLQ's receiver: the row is failed and its entry exists, and
        # neither is committed yet.
        row = Operation.objects.get(pk=operation.pk)
        entry = FailedEvent.objects.filter(operation_id=operation.pk).exists()
        seen.append((connection.in_atomic_block, row.status, entry))

    with hooks.operation_failed.connected(after_the_dlq):
        services.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=ErrorClass.INVALID_INPUT
        )

    assert seen == [(True, S.FAILED, True)]


@pytest.mark.django_db(transaction=True)
def test_a_failed_operations_dlq_entry_rolls_back_with_the_callers_transaction(tenant, provider):
    op = _failed_claim(tenant, provider)

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        services.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=ErrorClass.INVALID_INPUT
        )
        assert FailedEvent.objects.filter(operation_id=op.pk).exists()
        raise Abandon

    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert not FailedEvent.objects.exists() and not Alert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_alert_the_ledger_raises_is_written_and_rolled_back_with_its_cause(tenant, provider):
    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        assert services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
        assert Alert.objects.filter(kind="provider_paused", ref=provider.slug).exists()
        raise Abandon

    assert not Alert.objects.exists()
    assert Provider.objects.get(pk=provider.pk).paused_at is None


@pytest.mark.django_db
def test_a_failing_subject_index_never_fails_the_claim_that_stored_the_payload(tenant, provider):
    called: list[str] = []

    def broken(**kwargs: Any) -> None:
        called.append(kwargs["record_type"])
        raise RuntimeError("index down")

    with hooks.payload_written.replaced(broken):
        result = services.operation_claim(
            tenant=tenant, key="k-1", provider=provider, action="charge", payload={"email": "a@example.invalid"}
        )
    assert called == ["operations"]
    assert result.acquired and Operation.objects.filter(pk=result.operation.pk).exists()
