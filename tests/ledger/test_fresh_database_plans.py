"""A fresh PostgreSQL deployment is fast from its first claim, with no planner setting sent.

Statistics taken on nearly empty tables once made the claim path plan sequential scans of
operations and attempts (222 fresh operations/s instead of ~650 until statistics and cached
plans caught up): a prepared statement's generic plan keeps the scan while the table grows.
The claim path's statements each read one row by a unique key and are sent as they are
(docs/adr/0010-claim-path-plans-from-statistics.md): what plans them with indexes is the tables'
own statistics. A table never analyzed is planned as ten pages at least; autovacuum's first
ANALYZE (and first VACUUM, which writes statistics too) waits for 1,000 changed rows (migration
0036), when the table is large enough for every look-up by key to plan its index. Here every
statement a claim, its sent marker, heartbeat,
completion, a failure and a replay run is planned — as a prepared statement's generic plan and
as a custom one — in both states, and none may read a ledger table sequentially.
"""

from __future__ import annotations

import pytest
from django.db import connection

from ledger.models import Attempt, Operation, Tombstone
from ledger.protocol import services
from tests.conftest import on_postgres
from tests.support.plans import captured_statements, explain, sequential_scans

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's planner and statistics"),
]

LEDGER_TABLES = ("ledger_operation", "ledger_attempt", "ledger_operationevent", "ledger_tombstone")
# The first ANALYZE of these comes after this many changed rows (migration 0036).
FIRST_STATISTICS_AT = 1000


def _tables_and_partitions() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent::regclass::text = ANY (%s)",
            [list(LEDGER_TABLES)],
        )
        return [*LEDGER_TABLES, *(row[0] for row in cursor.fetchall())]


def _claim_path(tenant, provider, api=None) -> list:  # type: ignore[no-untyped-def]
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
        if api is not None:
            assert api.get("/api/v1/operations?status=retry_wait").status_code == 200
    return statements


def _sequential_scans_in(statements: list) -> list:  # type: ignore[type-arg]
    touching = [s for s in statements if any(t in s.sql for t in LEDGER_TABLES)]
    assert len(touching) >= 10, "the claim path's statements were not captured"
    found = []
    for statement in touching:
        for plan in ("generic", "custom"):
            text = explain(statement.sql, statement.params, plan=plan, enable_seqscan=statement.enable_seqscan)
            scans = sequential_scans(text, LEDGER_TABLES)
            if scans:
                found.append((plan, scans, statement.sql[:200]))
    return found


def _copies(model, count: int, overrides: dict[str, str], source: str) -> str:  # type: ignore[no-untyped-def]
    """INSERT … SELECT of ``count`` copies of the rows ``source`` selects (aliased ``s``, joined
    with ``generate_series`` as ``g``), each column as it is unless ``overrides`` says."""
    columns = [f.column for f in model._meta.concrete_fields if f.column != "id"]
    values = [overrides.get(c, f"s.{c}") for c in columns]
    return (
        f"INSERT INTO {model._meta.db_table} ({', '.join(columns)})"
        f" SELECT {', '.join(values)} FROM ({source}) s CROSS JOIN generate_series(1, {count}) g"
    )


def test_on_tables_never_analyzed_the_claim_path_plans_no_sequential_scan(tenant, provider, api):
    # A fresh deployment's tables: no statistics yet (as after CREATE TABLE; the catalog's row
    # is put back by the test's rollback).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0 WHERE relname = ANY (%s)",
            [_tables_and_partitions()],
        )
    found = _sequential_scans_in(_claim_path(tenant, provider, api))
    assert not found, "\n".join(map(str, found))


def test_with_first_statistics_at_the_autovacuum_threshold_the_claim_path_plans_no_sequential_scan(tenant, provider):
    op = services.operation_claim(tenant=tenant, key="seed", provider=provider, action="charge").operation
    services.operation_complete(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    n = FIRST_STATISTICS_AT
    with connection.cursor() as cursor:
        cursor.execute(
            _copies(Operation, n, {"key": "s.key || '-' || g"}, f"SELECT * FROM ledger_operation WHERE id = {op.pk}")
        )
        cursor.execute(
            _copies(
                Attempt,
                1,
                {"operation_id": "s.copy_id"},
                "SELECT a.*, o.id AS copy_id FROM ledger_attempt a JOIN ledger_operation o ON o.key LIKE 'seed-%%'"
                f" WHERE a.operation_id = {op.pk}",
            )
        )
        tombstone = [f.column for f in Tombstone._meta.concrete_fields if f.column != "id"]
        values = {
            "key": "'gone-' || g",
            "mode": "'guard'",
            "fingerprint": "s.fingerprint",
            "final_status": "'succeeded'",
            "operation_id": "s.id",
            "action": "s.action",
            "provider_slug": "''",
            "provider_ref": "''",
            "response_status": "NULL",
            "tenant_id": "s.tenant_id",
            "created_at": "s.created_at",
            "done_at": "s.created_at",
            "deleted_at": "now()",
            "keep_until": "now() + interval '30 days'",
        }
        cursor.execute(
            f"INSERT INTO ledger_tombstone ({', '.join(tombstone)})"
            f" SELECT {', '.join(values[c] for c in tombstone)}"
            f" FROM (SELECT * FROM ledger_operation WHERE id = {op.pk}) s CROSS JOIN generate_series(1, {n}) g"
        )
        for table in ("ledger_operation", "ledger_attempt", "ledger_tombstone"):
            cursor.execute(f"ANALYZE {table}")
        cursor.execute("SELECT count(*) FROM ledger_attempt")
        assert cursor.fetchone()[0] > n
    found = _sequential_scans_in(_claim_path(tenant, provider))
    assert not found, "\n".join(map(str, found))


def test_the_claim_path_sends_no_planner_setting(tenant, provider):
    with captured_statements() as statements:
        op = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge").operation
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
        )
        services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge")
    assert not [s.sql for s in statements if "set_config" in s.sql or s.sql.lstrip().upper().startswith("SET ")]
    assert all(s.enable_seqscan == "on" for s in statements)


def test_the_claim_paths_tables_take_their_first_statistics_at_the_threshold():
    read = ["ledger_operation", "ledger_tombstone"] + [
        t for t in _tables_and_partitions() if t.startswith("ledger_attempt_")
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relname = ANY (%s) AND NOT (coalesce(reloptions, '{}') @> %s)",
            [
                read,
                [
                    f"autovacuum_analyze_threshold={FIRST_STATISTICS_AT}",
                    f"autovacuum_vacuum_threshold={FIRST_STATISTICS_AT}",
                ],
            ],
        )
        assert cursor.fetchall() == []
    assert len(read) > 3
