"""Metrics selectors for execute mode (exposed at /metrics by the observability work)."""

from __future__ import annotations

from django.db import connection

from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Tenant
from ledger.protocol import selectors
from ledger.store import sql
from tests.execute.support import run_due


def submit(tenant: Tenant, key: str) -> None:
    operation_submit(
        tenant=tenant, key=key, provider="charges", request={"method": "POST", "path": "/charges", "body": {"a": 1}}
    )


def test_oldest_eligible_age_counts_only_due_rows_of_providers_that_can_be_called(tenant, enforced):
    provider, _ = enforced
    assert selectors.metrics_oldest_eligible_age_seconds() == 0.0
    submit(tenant, "m-1")
    past, params = sql.now_plus(-30)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET next_attempt_at = {past} WHERE key = %s", [*params, "m-1"])
    assert 29 <= selectors.metrics_oldest_eligible_age_seconds() <= 40
    provider.throttled_until = sql.db_now().replace(year=2100)
    provider.save()
    assert selectors.metrics_oldest_eligible_age_seconds() == 0.0  # nobody may take it now


def test_active_leases_and_attempts_by_outcome(tenant, enforced):
    _, mock = enforced
    mock.script([{"status": 400}])
    for key in ("m-a", "m-b", "m-c"):
        submit(tenant, key)
    (held,) = operations_take(limit=1)
    assert selectors.metrics_active_leases() == 1
    run_due()
    outcomes = selectors.metrics_attempts_by_outcome()
    assert outcomes["failed"] == 1 and outcomes["succeeded"] == 1 and outcomes["pending"] == 1
    assert set(outcomes) >= {"ambiguous", "transient", "fenced"}
    assert held.status == "claimed"


def test_admissions_refused_by_reason_has_every_reason(tenant, enforced, api):
    tenant.max_in_flight = 0
    tenant.save()
    body = {"key": "m-refused", "provider": "charges", "request": {"path": "/charges"}}
    assert api.post("/api/v1/operations", body, format="json").status_code == 429
    refused = selectors.metrics_admissions_refused_by_reason()
    assert refused == {
        "tenant_in_flight_limit": 1,
        "tenant_unresolved_limit": 0,
        "tenant_queued_bytes_limit": 0,
        "tenant_budget_exhausted": 0,
    }
