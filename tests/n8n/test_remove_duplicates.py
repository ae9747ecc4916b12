"""Why not n8n's own Remove Duplicates (docs/n8n-remove-duplicates.md): the measured cases, in a
real n8n. A webhook → Remove Duplicates ("Remove Items Processed in Previous Executions", on the
order id) → HTTP Request charging a mock provider that counts charges — the dedup an n8n user
would build without Onceguard.

- An order whose charge got a 429 is dropped as "seen" when its sender delivers it again: the
  node records the value before the charge is tried, so the order is never charged. This is
  deterministic, and asserted.
- The same order delivered 5 times at once: the check and the record are not one atomic step
  across concurrent executions, so more than one may pass. A race: the test asserts nothing
  beyond "charged at least once" and prints what it measured (the page quotes the numbers).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relay.testing import RunningServer, start_mock_provider
from tests.n8n.support import N8n

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

WORKFLOW_ID = "ogRemoveDupes001"
PATH = "og-remove-duplicates"
CONCURRENT = 5
ROUNDS = 3


def remove_duplicates_workflow(charges_url: str) -> dict[str, Any]:
    return {
        "id": WORKFLOW_ID,
        "name": "Remove Duplicates guarding a charge (no Onceguard)",
        "active": False,
        "settings": {"executionOrder": "v1", "saveDataErrorExecution": "all", "saveDataSuccessExecution": "all"},
        "nodes": [
            {
                "parameters": {"httpMethod": "POST", "path": PATH, "responseMode": "lastNode", "options": {}},
                "id": "6a0d3c52-0f0e-4d57-9e2f-5a1d1f0c0a01",
                "name": "Order webhook",
                "type": "n8n-nodes-base.webhook",
                "typeVersion": 2.1,
                "position": [0, 0],
                "webhookId": "6a0d3c52-0f0e-4d57-9e2f-5a1d1f0c0a02",
            },
            {
                "parameters": {
                    "operation": "removeItemsSeenInPreviousExecutions",
                    "logic": "removeItemsWithAlreadySeenKeyValues",
                    "dedupeValue": "={{ $json.body.order_id }}",
                    "options": {},
                },
                "id": "6a0d3c52-0f0e-4d57-9e2f-5a1d1f0c0a03",
                "name": "Remove Duplicates",
                "type": "n8n-nodes-base.removeDuplicates",
                "typeVersion": 2,
                "position": [220, 0],
            },
            {
                "parameters": {
                    "method": "POST",
                    "url": f"{charges_url.rstrip('/')}/charges",
                    "sendBody": True,
                    "specifyBody": "json",
                    "jsonBody": "={{ { order: $json.body.order_id, amount: $json.body.amount } }}",
                    "options": {"timeout": 10000},
                },
                "id": "6a0d3c52-0f0e-4d57-9e2f-5a1d1f0c0a04",
                "name": "Charge",
                "type": "n8n-nodes-base.httpRequest",
                "typeVersion": 4.2,
                "position": [440, 0],
            },
        ],
        "connections": {
            "Order webhook": {"main": [[{"node": "Remove Duplicates", "type": "main", "index": 0}]]},
            "Remove Duplicates": {"main": [[{"node": "Charge", "type": "main", "index": 0}]]},
        },
        "pinData": {},
        "tags": [],
    }


@pytest.fixture(scope="module")
def charges() -> Iterator[RunningServer]:
    # Advisory: every request that gets through is a charge, as with a webhook or an SMTP send.
    mock = start_mock_provider("advisory")
    yield mock
    mock.stop()


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, charges: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[N8n]:
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-remove-duplicates"))
    instance.import_workflows([remove_duplicates_workflow(charges.url)])
    instance.activate(WORKFLOW_ID)
    instance.start(active=[WORKFLOW_ID])
    yield instance
    instance.stop()


@pytest.fixture
def mock(charges: RunningServer) -> RunningServer:
    charges.reset()
    return charges


def deliver(n8n: N8n, order_id: str) -> int:
    return n8n.webhook(PATH, {"order_id": order_id, "amount": 1200}, timeout=60).status_code


def test_an_order_whose_charge_got_a_429_is_dropped_as_seen_when_redelivered_and_never_charged(
    n8n: N8n, mock: RunningServer
) -> None:
    mock.script([{"status": 429, "retry_after": 1}])

    first = deliver(n8n, "order-429")
    # The sender sees the failure and delivers the order again, as a webhook source does.
    again = deliver(n8n, "order-429")

    effects = mock.effects()
    assert first >= 500, first
    assert effects["requests"] == 1, "the redelivery never reached the provider"
    assert effects["count"] == 0, "the order was never charged"
    # n8n answers the redelivery with an error as well (the last node has no item to return),
    # so the sender may keep redelivering: every one is dropped the same way.
    assert again >= 500, again


def test_one_order_delivered_five_times_at_once_is_charged_at_least_once_and_the_count_is_reported(
    n8n: N8n, mock: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    charged: list[int] = []
    for round_number in range(ROUNDS):
        before = mock.effects()["count"]
        statuses = deliver_at_once(n8n, f"order-5x-{round_number}")
        assert len(statuses) == CONCURRENT
        charged.append(mock.effects()["count"] - before)

    with capsys.disabled():
        print(
            f"\nRemove Duplicates, one order delivered {CONCURRENT} times at once, {ROUNDS} rounds: charged {charged}"
        )
    assert all(count >= 1 for count in charged), charged


def deliver_at_once(n8n: N8n, order_id: str) -> list[int]:
    barrier = threading.Barrier(CONCURRENT)
    statuses: list[int] = []

    def send() -> None:
        barrier.wait()
        with httpx.Client(timeout=60, trust_env=False) as client:
            response = client.post(f"{n8n.url}/webhook/{PATH}", json={"order_id": order_id, "amount": 1200})
            statuses.append(response.status_code)

    threads = [threading.Thread(target=send) for _ in range(CONCURRENT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return statuses
