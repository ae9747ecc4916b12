"""A worker that holds a provider's answer does not drop it for a database blip (issue 11
item 7): the record step is retried on a fresh connection with the same token, within
RECORD_RETRY_SECONDS, and a try after a commit that did land counts as stored. The outage
is simulated at the service boundary here, on a clock the test moves; the real one (a TCP
proxy cut in front of PostgreSQL) is tests/e2e/test_database_outage.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, transaction

from dlq.models import FailedEvent
from ledger.execution import attempts as execute
from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, AttemptOutcome, Operation, OperationStatus
from ledger.protocol import transitions
from ledger.providers import adapters
from tests.support.clocks import FakeClock

S = OperationStatus

# The worker's thread is never inside a transaction; only there does the retry apply.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(execute, "time", fake)
    return fake


@pytest.fixture
def discards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the connections the retry threw away (and still throws them away)."""
    calls: list[int] = []
    real = execute.connection_discard

    def spy() -> None:
        calls.append(1)
        real()

    monkeypatch.setattr(execute, "connection_discard", spy)
    return calls


def outage(
    monkeypatch: pytest.MonkeyPatch, name: str, *, failures: int, landed: bool = False, raw: bool = False
) -> list[int]:
    """``transitions.<name>`` fails ``failures`` times as on a dropped connection. ``landed``:
    the statement commits and only the answer is lost. ``raw``: psycopg's own error."""
    real: Callable[..., Any] = getattr(transitions, name)
    calls: list[int] = []

    def flaky(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= failures:
            if landed:
                real(**kwargs)
            error = psycopg.OperationalError if raw else OperationalError
            raise error("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(transitions, name, flaky)
    return calls


@pytest.fixture
def retry_budget(settings: Any) -> Callable[[float], None]:
    def set_budget(seconds: float) -> None:
        settings.ONCEGUARD = {**settings.ONCEGUARD, "RECORD_RETRY_SECONDS": seconds}

    return set_budget


def take(tenant: Any, key: str, provider: str) -> Operation:
    operation_submit(tenant=tenant, key=key, provider=provider, request={"method": "POST", "path": "/charges"})
    [op] = operations_take(limit=1, actor="test-worker")
    return op


def execute_one(op: Operation) -> Operation | None:
    with adapters.http_client() as client:
        return operation_execute(operation=op, client=client, actor="test-worker")


def moves(op: Operation) -> list[str]:
    return list(op.events.order_by("id").values_list("to_status", flat=True))


@pytest.fixture
def execute_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="onceguard.execute")
    yield caplog


def test_a_success_met_by_a_dropped_connection_is_recorded_on_a_fresh_one(
    tenant, advisory, monkeypatch, clock, discards, execute_logs
):
    provider, mock = advisory
    op = take(tenant, "order-1:notify:v1", provider.slug)
    calls = outage(monkeypatch, "operation_complete", failures=3)
    recorded = execute_one(op)
    assert recorded is not None and recorded.status == S.SUCCEEDED
    assert len(calls) == 4 and len(discards) == 3  # one fresh connection per retry
    assert recorded.lease_token == op.lease_token and recorded.attempts == 1
    assert moves(recorded) == [S.QUEUED, S.CLAIMED, S.SUCCEEDED]
    assert mock.effects()["count"] == 1
    # Backing off, each retry logged.
    assert clock.sleeps == sorted(clock.sleeps) and max(clock.sleeps) <= execute.RECORD_RETRY_MAX_DELAY
    retries = [r for r in execute_logs.records if r.getMessage().startswith("execute_record_retry")]
    assert len(retries) == 3 and "error=OperationalError" in retries[0].getMessage()


def test_psycopgs_own_connection_error_is_retried_too(tenant, advisory, monkeypatch, clock, discards):
    provider, _ = advisory
    op = take(tenant, "order-2:notify:v1", provider.slug)
    outage(monkeypatch, "operation_complete", failures=1, raw=True)
    assert execute_one(op).status == S.SUCCEEDED
    assert len(discards) == 1


def test_a_completion_whose_commit_landed_before_the_drop_is_not_recorded_twice(
    tenant, advisory, monkeypatch, clock, discards
):
    provider, _ = advisory
    op = take(tenant, "order-3:notify:v1", provider.slug)
    calls = outage(monkeypatch, "operation_complete", failures=1, landed=True)
    recorded = execute_one(op)
    assert len(calls) == 2 and recorded.status == S.SUCCEEDED
    assert moves(recorded) == [S.QUEUED, S.CLAIMED, S.SUCCEEDED]


@pytest.mark.parametrize(
    ("answer", "status", "outcome"),
    [
        ({"status": 400}, S.FAILED, AttemptOutcome.FAILED),
        ({"status": 503, "retry_after": 1}, S.RETRY_WAIT, AttemptOutcome.TRANSIENT),
    ],
)
def test_a_failure_whose_commit_landed_before_the_drop_counts_as_stored(
    tenant, enforced, monkeypatch, clock, discards, execute_logs, answer, status, outcome
):
    provider, mock = enforced
    mock.script([answer])
    op = take(tenant, f"order-4:{status}:v1", provider.slug)
    calls = outage(monkeypatch, "operation_fail", failures=1, landed=True)
    recorded = execute_one(op)
    # The second try is refused (the row already moved, by this very attempt): stored.
    assert len(calls) == 2 and recorded is not None and recorded.status == status
    assert moves(recorded) == [S.QUEUED, S.CLAIMED, status]
    assert Attempt.objects.get(operation=op, lease_token=op.lease_token).outcome == outcome
    assert FailedEvent.objects.filter(operation_id=op.pk).count() == (1 if status == S.FAILED else 0)
    assert any(r.getMessage().startswith("execute_record_found_stored") for r in execute_logs.records)


def test_the_record_step_gives_up_after_its_budget_and_leaves_the_row_to_the_sweeper(
    tenant, advisory, monkeypatch, clock, discards, retry_budget, execute_logs
):
    retry_budget(5.0)
    provider, mock = advisory
    op = take(tenant, "order-5:notify:v1", provider.slug)
    calls = outage(monkeypatch, "operation_complete", failures=10_000)
    with pytest.raises(OperationalError):
        execute_one(op)
    assert abs(sum(clock.sleeps) - 5.0) < 1e-6 and 3 <= len(calls) < 40
    assert max(clock.sleeps) <= execute.RECORD_RETRY_MAX_DELAY
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED  # the sweeper's, at lease expiry
    assert any(r.getMessage().startswith("execute_record_gave_up") for r in execute_logs.records)
    assert mock.effects()["count"] == 1


def test_no_budget_means_no_retry(tenant, advisory, monkeypatch, clock, discards, retry_budget):
    retry_budget(0)
    provider, _ = advisory
    op = take(tenant, "order-6:notify:v1", provider.slug)
    calls = outage(monkeypatch, "operation_complete", failures=1)
    with pytest.raises(OperationalError):
        execute_one(op)
    assert len(calls) == 1 and clock.sleeps == [] and discards == []


def test_other_errors_are_not_retried(tenant, advisory, monkeypatch, clock, discards):
    provider, _ = advisory
    op = take(tenant, "order-7:notify:v1", provider.slug)
    calls: list[int] = []

    def broken(**kwargs: Any) -> Any:
        calls.append(1)
        raise ValueError("a bug, not a blip")

    monkeypatch.setattr(transitions, "operation_complete", broken)
    with pytest.raises(ValueError):
        execute_one(op)
    assert len(calls) == 1 and clock.sleeps == [] and discards == []


def test_inside_a_callers_transaction_nothing_is_retried(tenant, advisory, monkeypatch, clock, discards):
    provider, _ = advisory
    op = take(tenant, "order-8:notify:v1", provider.slug)
    calls = outage(monkeypatch, "operation_complete", failures=1)
    # The broken connection broke the caller's transaction: a retry in it could not commit.
    with pytest.raises(OperationalError), transaction.atomic():
        execute_one(op)
    assert len(calls) == 1 and discards == []


def test_the_worker_lease_covers_two_timeouts_the_record_retry_budget_and_a_margin(tenant, advisory, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "RECORD_RETRY_SECONDS": 30.0, "WORKER_LEASE_MARGIN_SECONDS": 5.0}
    provider, _ = advisory
    provider.timeout_seconds = 4.0
    provider.save(update_fields=["timeout_seconds"])
    op = take(tenant, "order-9:notify:v1", provider.slug)
    lease = op.lease_expires_at - op.claimed_at
    assert abs(lease - timedelta(seconds=2 * 4.0 + 30.0 + 5.0)) < timedelta(seconds=0.01)
    assert adapters.worker_lease_seconds(4.0) == 43.0
