"""Cheaper growth (issue 16, item 3; DESIGN §12): updates that change no indexed column are
HOT, the status lists stay index scans with fewer indexes, and the ledger tables carry their
fillfactor and autovacuum settings (PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from ledger.models import Operation
from ledger.protocol import services
from tests.conftest import on_postgres
from tests.support.plans import captured_statements, explain, sequential_scans

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not on_postgres(), reason="HOT updates, plans and storage parameters are PostgreSQL's"),
]


def updates() -> dict[str, tuple[int, int]]:
    """(updates, HOT updates) of operations and attempts in this transaction so far."""
    with connection.cursor() as cursor:
        # Counted per partition (attempts are partitioned by month): summed over each tree.
        cursor.execute(
            "SELECT t.name, sum(s.n_tup_upd), sum(s.n_tup_hot_upd)"
            " FROM unnest(ARRAY['ledger_operation', 'ledger_attempt']) AS t (name)"
            " JOIN pg_stat_xact_user_tables s ON s.relid = t.name::regclass"
            " OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.name::regclass)"
            " GROUP BY t.name"
        )
        return {name: (int(upd), int(hot)) for name, upd, hot in cursor.fetchall()}


def delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], table: str) -> tuple[int, int]:
    b, a = before.get(table, (0, 0)), after.get(table, (0, 0))
    return a[0] - b[0], a[1] - b[1]


def test_the_sent_marker_and_the_attempts_completion_are_hot_updates(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="hot-1", provider=provider, action="charge").operation
    before = updates()
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    marked = updates()
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
    )
    done = updates()

    # The marker changes sent_at only: HOT on both rows.
    assert delta(before, marked, "ledger_operation") == (1, 1)
    assert delta(before, marked, "ledger_attempt") == (1, 1)
    # The completion moves the state and brings a provider reference: neither is indexed on the
    # operation row (the open rows' mirror holds the state, ADR 0017; the search rows the
    # reference, ADR 0018), so it is HOT too; its attempt's outcome and finishing time are in
    # no index, so that update is HOT.
    assert delta(marked, done, "ledger_operation") == (1, 1)
    assert delta(marked, done, "ledger_attempt") == (1, 1)


def test_a_sent_marker_that_brings_a_new_reconciliation_handle_is_hot_too(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="hot-2", provider=provider, action="charge").operation
    before = updates()
    services.operation_mark_sent(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, reconciliation_handle="h-2"
    )
    # The handle is no longer indexed on the row (ADR 0023: the exact filter and the substring
    # search read the write-once search rows), so a new one adds no index entry there.
    assert delta(before, updates(), "ledger_operation") == (1, 1)
    assert Operation.objects.get(pk=op.pk).reconciliation_handle == "h-2"


def test_the_ledger_tables_carry_their_fillfactor_and_autovacuum_settings() -> None:
    with connection.cursor() as cursor:
        # A partitioned table has no storage of its own: each of its partitions carries them
        # (all alike, or the check below fails for the one that differs).
        cursor.execute(
            "SELECT t.name, c.reloptions"
            " FROM unnest(ARRAY['ledger_operation', 'ledger_attempt', 'ledger_operationevent']) AS t (name)"
            " JOIN pg_class c ON (c.oid = t.name::regclass AND c.relkind = 'r')"
            " OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.name::regclass)"
        )
        rows = cursor.fetchall()
    options: dict[str, dict[str, str]] = {}
    for name, opts in rows:
        found = dict(o.split("=", 1) for o in opts or [])
        assert options.setdefault(name, found) == found, f"partitions of {name} differ"
    assert options["ledger_operation"]["fillfactor"] == "90"
    assert options["ledger_attempt"]["fillfactor"] == "90"
    # Events are never updated: packed full.
    assert "fillfactor" not in options["ledger_operationevent"]
    for table in options:
        assert float(options[table]["autovacuum_vacuum_insert_scale_factor"]) <= 0.05
        assert float(options[table]["autovacuum_analyze_scale_factor"]) <= 0.02
    for table in ("ledger_operation", "ledger_attempt"):
        assert float(options[table]["autovacuum_vacuum_scale_factor"]) <= 0.02


@pytest.mark.parametrize("status", ["", "succeeded", "failed", "claimed", "retry_wait"])
def test_every_status_list_can_be_served_by_an_index(tenant: Any, provider: Any, api: Any, status: str) -> None:
    """With sequential scans priced out, a list whose query no index can serve still plans one:
    so a plan without one proves an index serves it — `succeeded` through (tenant, id), the
    others through the partial (tenant, status, id)."""
    for i in range(30):
        op = services.operation_claim(tenant=tenant, key=f"list-{i}", provider=provider, action="charge").operation
        if i % 2:
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"ch_{i}"
            )
    # No ANALYZE: its row counts outlive the test's rollback (written in place) and would steer
    # later tests' plans; sequential scans are priced out below instead.
    with captured_statements() as statements:
        assert api.get(f"/api/v1/operations?status={status}").status_code == 200
    listing = [s for s in statements if 'FROM "ledger_operation"' in s.sql and "ORDER BY" in s.sql]
    assert listing, "the list's query was not captured"
    plan = explain(listing[0].sql, listing[0].params, plan="custom", enable_seqscan="off")
    assert not sequential_scans(plan, ["ledger_operation"]), plan
    if status == "failed":
        # A rare state is served by the partial (tenant, status, id) index: without (tenant, id)
        # (dropped in this test's transaction, rolled back with it) the plan must use it, or
        # fall back to the sequential scan priced out above.
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX op_tenant_id_idx")
        plan = explain(listing[0].sql, listing[0].params, plan="custom", enable_seqscan="off")
        assert "_term_status" in plan, plan
