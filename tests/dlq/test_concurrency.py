"""Races, with real threads on separate database connections (and a real commit each):
20 replays of one entry → one delivery and 19 × 409; 20 reports of one failure → one entry."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from dlq.models import FailedEvent, Replay
from ledger.models import Operation
from ledger.protocol import services as ledger
from tests.dlq.conftest import example, post_raw

pytestmark = pytest.mark.django_db(transaction=True)

N = 20


def run_together(n: int, fn: Callable[[APIClient], Any], secret: str) -> list[Any]:
    """Call ``fn`` from n threads released at once, each with its own client and connection."""
    barrier = threading.Barrier(n, timeout=20)

    def worker(_: int) -> Any:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        try:
            barrier.wait()
            return fn(client)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(worker, range(n)))


@pytest.fixture
def secret(tenant) -> str:
    return ledger.apikey_create(tenant=tenant, scopes=["read", "write"])[1]


def test_twenty_concurrent_replays_of_one_entry_deliver_once_and_nineteen_get_409(secret, client, target, sink):
    event_id = client.post(
        "/api/v1/dlq/events",
        {"event_id": "lead-77", "idempotency_key": "lead-77:crm:create:v1", "payload": {"a": 1}},
        format="json",
    ).json()["id"]
    # The winner's send takes a moment, so the losers arrive while it is in flight.
    sink.mode, sink.delay = "slow", 0.3

    responses = run_together(N, lambda c: c.post(f"/api/v1/dlq/events/{event_id}/replay", {}, format="json"), secret)

    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [409] * (N - 1), codes
    assert {r.json()["code"] for r in responses if r.status_code == 409} <= {
        "replay_in_progress",
        "replay_needs_force",
    }
    assert len(sink.received()) == 1
    assert sink.received()[0].header("Idempotency-Key") == "lead-77:crm:create:v1"
    assert Replay.objects.filter(event_id=event_id).count() == 1
    assert Operation.objects.filter(key__startswith=f"replay:{event_id}:").count() == 1
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"


def test_twenty_concurrent_reports_of_one_failure_make_one_entry(secret, tenant):
    body = json.dumps(example("n8n-error-trigger-trigger.json"))
    responses = run_together(N, lambda c: post_raw(c, body), secret)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * (N - 1) + [201], codes
    event = FailedEvent.objects.get()
    assert event.seen_count == N
    assert len({r.json()["id"] for r in responses}) == 1


def test_concurrent_retries_of_one_execution_all_count(secret, client):
    root = example("n8n-error-trigger-execution.json")
    root["execution"]["id"] = "4790"
    del root["execution"]["retryOf"]
    root_id = post_raw(client, json.dumps(root)).json()["id"]
    counter = iter(range(5000, 5000 + N))
    lock = threading.Lock()

    def report_retry(c: APIClient) -> Any:
        with lock:
            number = next(counter)
        body = example("n8n-error-trigger-execution.json")
        body["execution"].update(id=str(number), retryOf="4790")
        return post_raw(c, json.dumps(body))

    responses = run_together(N, report_retry, secret)
    assert {r.status_code for r in responses} == {200}
    assert FailedEvent.objects.count() == 1
    assert FailedEvent.objects.get(pk=root_id).retry_count == N
