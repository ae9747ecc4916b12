"""Admission control per tenant: limits derived from open rows under a per-tenant lock."""

from __future__ import annotations

import threading
from decimal import Decimal

import httpx
import pytest
from django.db import connection

from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import AdmissionRefusalCount, Operation, OperationStatus, Tenant
from ledger.protocol import selectors
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.execute.support import run_due

S = OperationStatus
URL = "/api/v1/operations"


def body(key, amount=1000, blob=""):
    request = {"method": "POST", "path": "/charges", "body": {"amount": amount, **({"blob": blob} if blob else {})}}
    return {"key": key, "provider": "charges", "request": request}


def limit(tenant: Tenant, **limits) -> None:
    for name, value in limits.items():
        setattr(tenant, name, value)
    tenant.save()


def refusals(reason: str) -> int:
    return selectors.metrics_admissions_refused_by_reason()[reason]


def test_in_flight_limit_refuses_with_429_problem_and_writes_nothing(api, tenant, enforced):
    limit(tenant, max_in_flight=2)
    assert api.post(URL, body("a"), format="json").status_code == 202
    assert api.post(URL, body("b"), format="json").status_code == 202
    refused = api.post(URL, body("c"), format="json")
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "tenant_in_flight_limit"
    assert refused.json()["limit"] == 2 and refused.json()["current"] == 2
    assert "Retry-After" in refused
    assert not Operation.objects.filter(key="c").exists()
    assert refusals("tenant_in_flight_limit") == 1


def test_capacity_comes_back_when_operations_finish(api, tenant, enforced):
    limit(tenant, max_in_flight=1)
    assert api.post(URL, body("first"), format="json").status_code == 202
    assert api.post(URL, body("second"), format="json").status_code == 429
    run_due()
    # The refused request left nothing behind: the same key is now accepted.
    assert api.post(URL, body("second"), format="json").status_code == 202


def test_replay_of_a_finished_key_is_never_refused(api, tenant, enforced):
    limit(tenant, max_in_flight=1, budget_amount=Decimal("1"))
    enforced[0].unit_price = Decimal("1")
    enforced[0].save()
    assert api.post(URL, body("done"), format="json").status_code == 202
    run_due()
    assert api.post(URL, body("waiting", amount=1), format="json").status_code == 429  # budget spent
    replay = api.post(URL, body("done"), format="json")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"


def test_unresolved_rows_have_their_own_limit_and_do_not_count_as_in_flight(api, tenant, enforced):
    _, mock = enforced
    limit(tenant, max_in_flight=1, max_unresolved=1)
    mock.script([{"status": 500}])
    assert api.post(URL, body("ambiguous"), format="json").status_code == 202
    (row,) = run_due()
    assert row.status == S.UNCERTAIN
    refused = api.post(URL, body("next"), format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "tenant_unresolved_limit"
    limit(tenant, max_unresolved=2)
    # The uncertain row does not hold an in-flight slot: new work still flows.
    assert api.post(URL, body("next"), format="json").status_code == 202


def test_queued_bytes_limit(api, tenant, enforced):
    limit(tenant, max_queued_bytes=600)
    assert api.post(URL, body("small"), format="json").status_code == 202
    refused = api.post(URL, body("big", blob="x" * 600), format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "tenant_queued_bytes_limit"
    run_due()  # sent: no longer queued
    assert api.post(URL, body("small-2"), format="json").status_code == 202


def test_budget_from_unit_price_is_refunded_by_failed_operations(api, tenant, enforced):
    provider, mock = enforced
    provider.unit_price = Decimal("1.50")
    provider.save()
    limit(tenant, budget_amount=Decimal("3.00"), budget_period_seconds=86400)
    mock.script([{"status": 422}])
    assert api.post(URL, body("p1"), format="json").status_code == 202
    assert api.post(URL, body("p2"), format="json").status_code == 202
    refused = api.post(URL, body("p3"), format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "tenant_budget_exhausted"
    assert int(refused["Retry-After"]) >= 1
    failed = [r for r in run_due() if r.status == S.FAILED]
    assert len(failed) == 1  # the declined one costs nothing
    assert api.post(URL, body("p3"), format="json").status_code == 202


def test_capacity_comes_back_after_a_worker_crash(tenant, enforced):
    limit(tenant, max_in_flight=1)
    request = {"method": "POST", "path": "/charges", "body": {"amount": 1}}
    operation_submit(tenant=tenant, key="crashed", provider="charges", request=request)
    (taken,) = operations_take(limit=1)  # a worker took it and died before recording
    with pytest.raises(Exception) as refused:
        operation_submit(tenant=tenant, key="blocked", provider="charges", request=request)
    assert getattr(refused.value, "code", "") == "tenant_in_flight_limit"
    past, params = sql.now_plus(-1)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET lease_expires_at = {past} WHERE id = %s", [*params, taken.pk])
    sweep()  # lease expired after `sent` → uncertain: reconciled on the unresolved budget
    assert Operation.objects.get(pk=taken.pk).status == S.UNCERTAIN
    operation_submit(tenant=tenant, key="blocked", provider="charges", request=request)
    assert Operation.objects.get(key="blocked").status == S.QUEUED


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_at_the_limit_never_exceed_it(live_server, tenant, enforced, make_client):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency on PostgreSQL")
    limit(tenant, max_in_flight=5)
    client = make_client(tenant)
    auth = client._credentials["HTTP_AUTHORIZATION"]
    results: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def one(i: int) -> None:
        with httpx.Client(base_url=live_server.url, timeout=30, trust_env=False) as http:
            start.wait(timeout=10)
            response = http.post(URL, json=body(f"race-{i}"), headers={"Authorization": auth})
        with lock:
            results.append(response.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [202] * 5 + [429] * 15
    assert Operation.objects.filter(tenant=tenant, status=S.QUEUED).count() == 5
    assert AdmissionRefusalCount.objects.get(tenant=tenant, reason="tenant_in_flight_limit").count == 15
