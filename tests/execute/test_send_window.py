"""A worker sends only within the send window after its take (DESIGN: claim protocol). A
holder that stalls longer — a paused process, starved threads — may not have lease enough
left to cover its request, and the sweeper may already have moved the row to review, where a
reviewer can abandon it: it records the attempt as not sent and the row retries instead."""

from __future__ import annotations

import time

import pytest

from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, AttemptOutcome, OperationStatus
from ledger.providers import adapters
from tests.execute.support import child_env, start_worker, stop_process, wait_until

S = OperationStatus
REQUEST = {"method": "POST", "path": "/charges", "body": {"amount": 1000}}


def test_a_holder_stalled_past_the_send_window_records_not_sent_and_sends_nothing(tenant, enforced):
    _, mock = enforced
    op = operation_submit(tenant=tenant, key="order-7:charge:v1", provider="charges", request=REQUEST).operation
    (taken,) = operations_take(limit=1, actor="test-worker")
    stalled_since = time.monotonic() - adapters.send_window_seconds() - 1
    with adapters.http_client() as client:
        row = operation_execute(operation=taken, client=client, actor="test-worker", taken_at=stalled_since)
    assert row is not None and row.pk == op.pk
    assert row.status == S.RETRY_WAIT and row.error_class == "transient"
    assert "send window" in row.last_error
    (attempt,) = Attempt.objects.filter(operation_id=op.pk)
    assert attempt.outcome == AttemptOutcome.TRANSIENT
    assert mock.effects()["by_key"] == {}


def test_a_holder_within_the_send_window_sends(tenant, enforced):
    _, mock = enforced
    op = operation_submit(tenant=tenant, key="order-8:charge:v1", provider="charges", request=REQUEST).operation
    taken_at = time.monotonic()
    (taken,) = operations_take(limit=1, actor="test-worker")
    with adapters.http_client() as client:
        row = operation_execute(operation=taken, client=client, actor="test-worker", taken_at=taken_at)
    assert row is not None and row.status == S.SUCCEEDED
    assert mock.effects()["by_key"] == {op.key: 1}


@pytest.mark.django_db(transaction=True)
def test_the_worker_process_measures_the_window_from_its_take(tenant, enforced):
    # With no margin every send starts "too late": the worker must refuse each one, which
    # shows it hands its take time to the send step.
    _, mock = enforced
    op = operation_submit(tenant=tenant, key="order-9:charge:v1", provider="charges", request=REQUEST).operation
    worker = start_worker(env=child_env(WORKER_LEASE_MARGIN_SECONDS="0", LOG_LEVEL="INFO"), concurrency=1)
    try:
        assert wait_until(
            lambda: Attempt.objects.filter(operation_id=op.pk).exclude(outcome=AttemptOutcome.PENDING).exists(),
            timeout=60,
        )
    finally:
        output = stop_process(worker)
    assert "execute_send_skipped_stalled" in output, output[-2000:]
    assert mock.effects()["by_key"] == {}
    assert not Attempt.objects.filter(operation_id=op.pk, outcome=AttemptOutcome.SUCCEEDED).exists()
