"""Four-eyes races, with real threads on separate PostgreSQL connections (ADR 0013): approvers
who click at once send the re-send once; an approval and a rejection at once, one wins."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from dlq.models import Replay
from ledger.models import ApprovalRequest, Tenant
from ledger.protocol import services as ledger
from tests.conftest import on_postgres

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not on_postgres(), reason="a race needs real concurrent transactions"),
]

N = 8


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _pending_replay(tenant: Tenant, target: Any) -> int:
    requester = _client(ledger.apikey_create(tenant=tenant, scopes=["read", "write"])[1])
    event_id = requester.post(
        "/api/v1/dlq/events",
        {"event_id": "pay-1", "idempotency_key": "pay-1:charge:v1", "payload": {"amount": 5}},
        format="json",
    ).json()["id"]
    Tenant.objects.filter(pk=tenant.pk).update(resend_approval_required=True)
    response = requester.post(f"/api/v1/dlq/events/{event_id}/replay", {"note": "charge missing"}, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def _together(calls: list[Any]) -> list[Any]:
    barrier = threading.Barrier(len(calls), timeout=20)

    def run(call: Any) -> Any:
        try:
            barrier.wait()
            return call()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def test_approvers_who_click_at_once_send_the_re_send_once(tenant, target, sink):
    approval = _pending_replay(tenant, target)
    sink.mode, sink.delay = "slow", 0.3
    approvers = [_client(ledger.apikey_create(tenant=tenant, scopes=["approve"])[1]) for _ in range(N)]

    responses = _together(
        [
            (lambda c=c: c.post(f"/api/v1/approvals/{approval}/approve", {"reason": "ok"}, format="json"))
            for c in approvers
        ]
    )

    assert sorted(r.status_code for r in responses) == [200] + [409] * (N - 1)
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"approval_not_pending"}
    assert len(sink.received()) == 1 and Replay.objects.count() == 1
    assert ApprovalRequest.objects.get(pk=approval).status == "executed"


def test_an_approval_and_a_rejection_at_once_one_wins(tenant, target, sink):
    approval = _pending_replay(tenant, target)
    a = _client(ledger.apikey_create(tenant=tenant, scopes=["approve"])[1])
    b = _client(ledger.apikey_create(tenant=tenant, scopes=["approve"])[1])

    responses = _together(
        [
            lambda: a.post(f"/api/v1/approvals/{approval}/approve", {"reason": "ok"}, format="json"),
            lambda: b.post(f"/api/v1/approvals/{approval}/reject", {"reason": "no"}, format="json"),
        ]
    )

    assert sorted(r.status_code for r in responses) == [200, 409]
    status = ApprovalRequest.objects.get(pk=approval).status
    assert status in ("executed", "rejected")
    assert len(sink.received()) == (1 if status == "executed" else 0)
