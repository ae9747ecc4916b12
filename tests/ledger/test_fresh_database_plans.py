"""A fresh PostgreSQL deployment is fast from its first claim (issue 16).

Statistics taken on empty tables once made the claim path plan sequential scans of
operations and attempts (222 fresh operations/s instead of ~650 until statistics and cached
plans caught up). Here every statement a claim, its sent marker, heartbeat, completion, a
failure, a replay and a list run is planned — as a prepared statement's generic plan and as a
custom one, under the planner settings the statement ran with — on tables that are empty and
just analyzed, and none may read a ledger table sequentially.

The claim path plans its statements with sequential scans priced out for its own
transaction (ledger.store.sql.plan_with_indexes; a statement outside any transaction sends the
setting in the same pipeline). Not on the connection: there the same setting made lists'
joins worse (DESIGN §12), so the setting must not outlive the claim path's transactions.
"""

from __future__ import annotations

import pytest
from django.db import connection

from ledger.models import Operation
from ledger.protocol import services
from tests.conftest import on_postgres
from tests.support.plans import captured_statements, explain, sequential_scans

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's planner and statistics"),
]

LEDGER_TABLES = ("ledger_operation", "ledger_attempt", "ledger_operationevent", "ledger_tombstone")


def test_on_empty_just_analyzed_tables_the_claim_path_plans_no_sequential_scan(tenant, provider, api):
    with connection.cursor() as cursor:
        assert not Operation.objects.exists()
        for table in LEDGER_TABLES:
            cursor.execute(f"ANALYZE {table}")

    with captured_statements() as statements:
        first = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge").operation
        services.operation_heartbeat(
            operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, lease_seconds=30
        )
        services.operation_mark_sent(operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token)
        services.operation_complete(
            operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, provider_ref="ch_1"
        )
        services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge")
        second = services.operation_claim(tenant=tenant, key="k-2", provider=provider, action="charge").operation
        services.operation_fail(
            operation_id=second.pk,
            tenant_id=second.tenant_id,
            lease_token=second.lease_token,
            error_class="transient",
            message="timeout",
        )
        assert api.get("/api/v1/operations?status=retry_wait").status_code == 200

    touching = [s for s in statements if any(t in s.sql for t in LEDGER_TABLES)]
    assert len(touching) >= 10, "the claim path's statements were not captured"
    found = []
    for statement in touching:
        for plan in ("generic", "custom"):
            text = explain(statement.sql, statement.params, plan=plan, enable_seqscan=statement.enable_seqscan)
            scans = sequential_scans(text, LEDGER_TABLES)
            if scans:
                found.append((plan, scans, statement.sql[:200]))
    assert not found, "\n".join(map(str, found))


def test_the_claim_paths_planner_setting_does_not_outlive_its_transactions(tenant, provider):
    # Whatever ran last, the connection itself plans as PostgreSQL does by default: lists,
    # the console and batch passes are planned with sequential scans allowed.
    def enable_seqscan() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW enable_seqscan")
            return cursor.fetchone()[0]

    with captured_statements() as statements:
        op = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge").operation
        assert enable_seqscan() == "on"
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
        )
        assert enable_seqscan() == "on"
        services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge")
        assert enable_seqscan() == "on"
    claim_path = [s for s in statements if "ledger_operation" in s.sql]
    assert claim_path and all(s.enable_seqscan == "off" for s in claim_path), [
        (s.enable_seqscan, s.sql[:80]) for s in claim_path
    ]


@pytest.mark.django_db(transaction=True)
def test_a_claim_outside_any_transaction_plans_its_statements_with_indexes_and_leaves_the_connection_as_it_was(
    tenant, provider
):
    # As in production: no test transaction around it, so the replay read and a fresh claim's
    # one statement each run alone, their setting sent with them in one pipeline.
    assert not connection.in_atomic_block
    with captured_statements() as statements:
        op = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge").operation
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
        )
        services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge")
    reads = [s for s in statements if "FROM ledger_operation WHERE tenant_id" in s.sql]
    claims = [s for s in statements if s.sql.startswith("WITH op AS (\n    INSERT INTO ledger_operation")]
    assert len(reads) >= 2 and len(claims) == 1, [s.sql[:60] for s in statements]
    assert all(s.enable_seqscan == "off" for s in reads + claims)
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_seqscan")
        assert cursor.fetchone()[0] == "on"
