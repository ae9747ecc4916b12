"""Monthly partitions of attempts and events (issue 16, item 4; DESIGN §12, *Partitions*):
created ahead, dropped by retention only when nothing in them may be kept, and a database with
rows converted by the migration (PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from ledger.models import Attempt, Operation, OperationEvent, Tenant, Tombstone
from ledger.platform import partitions
from ledger.protocol import services
from ledger.store import sql
from review.models import RetentionPolicy
from review.retention.purge import retention_purge
from tests.conftest import on_postgres

pytestmark = pytest.mark.skipif(not on_postgres(), reason="declarative partitioning is PostgreSQL's")

TABLES = list(partitions.PARTITIONED)


def names(table: str) -> set[str]:
    return {p.name for p in partitions.partitions(table)}


def monthly_from(first: Any) -> None:
    """Replace the legacy partition (everything before the migration's boundary; empty in a test
    database) by one partition per month from ``first``: the shape of a database that has run
    on partitions for a while."""
    for table in TABLES:
        legacy = next(p for p in partitions.partitions(table) if p.lower is None)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {legacy.name}")
            assert cursor.fetchone() == (0,)
            cursor.execute(f"DROP TABLE {legacy.name}")
    months = 0
    while partitions.month_start(first, plus=months) < legacy.upper:
        months += 1
    partitions.partitions_ensure(now=first, months_ahead=months)


def finished_in(tenant: Tenant, provider: Any, key: str, month: Any) -> Operation:
    """An operation claimed and completed through the service, then moved (with its attempt
    and events, into that month's partitions) to the middle of ``month``."""
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, action="charge").operation
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"ch_{key}"
    )
    at = month + timedelta(days=14)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_operation SET created_at = %s, updated_at = %s, done_at = %s, claimed_at = %s WHERE id = %s",
            [at, at, at, at, op.pk],
        )
        # Moving the partition key moves the row to its month's partition.
        cursor.execute("UPDATE ledger_attempt SET started_at = %s WHERE operation_id = %s", [at, op.pk])
        cursor.execute("UPDATE ledger_operationevent SET at = %s WHERE operation_id = %s", [at, op.pk])
    return op


def settle() -> None:
    """Check the deferred foreign keys of the rows moved above now: PostgreSQL refuses to drop
    a table with trigger events pending in the transaction (the purge runs in its own)."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def rows_in(partition: str, op: Operation) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {partition} WHERE operation_id = %s", [op.pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_retention_drops_a_month_only_when_nothing_in_it_may_be_kept(tenant: Tenant, provider: Any) -> None:
    now = sql.db_now()
    this_month = partitions.month_start(now)
    old, mixed, held = (partitions.month_start(now, plus=-n) for n in (14, 13, 12))
    monthly_from(partitions.month_start(now, plus=-15))
    # Two tenants on different TTLs and one on legal hold; every row below is a year old.
    short = tenant
    long_ttl = services.tenant_create(slug="long")
    on_hold = services.tenant_create(slug="hold")
    providers = {
        t.pk: services.provider_upsert(tenant=t, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class="none")
        for t in (long_ttl, on_hold)
    }
    providers[short.pk] = provider
    RetentionPolicy.objects.create(tenant=short, record_type="operations", record_ttl=timedelta(days=30))
    RetentionPolicy.objects.create(tenant=long_ttl, record_type="operations", record_ttl=timedelta(days=3650))
    RetentionPolicy.objects.create(
        tenant=on_hold, record_type="operations", record_ttl=timedelta(days=30), legal_hold=True
    )
    # `old`: the short-TTL tenant's rows only → dropped whole.
    gone = [finished_in(short, provider, f"old-{i}", old) for i in range(3)]
    # `mixed`: the short-TTL tenant's and the ten-year tenant's → kept; the short tenant's rows
    # go in batches as before.
    mixed_short = finished_in(short, provider, "mixed-short", mixed)
    mixed_long = finished_in(long_ttl, providers[long_ttl.pk], "mixed-long", mixed)
    # `held`: the short-TTL tenant's and a held tenant's past its TTL → kept.
    held_short = finished_in(short, provider, "held-short", held)
    held_op = finished_in(on_hold, providers[on_hold.pk], "held-held", held)
    name = {m: {t: partitions.partition_name(t, m) for t in TABLES} for m in (old, mixed, held)}
    for table in TABLES:
        # One event row per claim→complete pair: the claim is kept on the operation row (ADR 0024).
        assert rows_in(name[old][table], gone[0]) == 1

    settle()
    retention_purge(now=now, trigger="test")

    for table in TABLES:
        current = names(table)
        assert name[old][table] not in current
        assert name[mixed][table] in current and name[held][table] in current
        assert partitions.partition_name(table, this_month) in current
        # What stayed keeps only what may be kept.
        assert rows_in(name[mixed][table], mixed_short) == 0
        assert rows_in(name[mixed][table], mixed_long) > 0
        assert rows_in(name[held][table], held_short) == 0
        assert rows_in(name[held][table], held_op) > 0
    assert not Operation.objects.filter(pk__in=[op.pk for op in [*gone, mixed_short, held_short]]).exists()
    assert Operation.objects.filter(pk__in=[mixed_long.pk, held_op.pk]).count() == 2
    assert Attempt.objects.filter(operation_id=held_op.pk).count() == 1
    assert OperationEvent.objects.filter(operation_id=mixed_long.pk).count() == 1  # one per pair (ADR 0024)
    # Tombstones keep answering late retries of the dropped month's keys.
    assert Tombstone.objects.filter(tenant=short, key="old-0").exists()
    late = services.operation_claim(tenant=short, key="old-0", provider=provider, action="charge")
    assert late.replayed and late.operation.status == "succeeded"


@pytest.mark.django_db
def test_a_month_is_kept_while_one_of_its_operations_is_not_finished(tenant: Tenant, provider: Any) -> None:
    now = sql.db_now()
    month = partitions.month_start(now, plus=-14)
    monthly_from(partitions.month_start(now, plus=-15))
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=timedelta(days=30))
    finished_in(tenant, provider, "done", month)
    open_op = services.operation_claim(tenant=tenant, key="open", provider=provider, action="charge").operation
    # An event row of the open operation to move into the month: its claim is kept on its row
    # (ADR 0024), its sent marker is a row.
    services.operation_mark_sent(operation_id=open_op.pk, tenant_id=open_op.tenant_id, lease_token=open_op.lease_token)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_operationevent SET at = %s WHERE operation_id = %s", [month, open_op.pk])

    settle()
    retention_purge(now=now, trigger="test")

    assert partitions.partition_name("ledger_operationevent", month) in names("ledger_operationevent")
    # Its attempts' month held nothing of the open operation: dropped.
    assert partitions.partition_name("ledger_attempt", month) not in names("ledger_attempt")


@pytest.mark.django_db
def test_partitions_are_created_ahead_and_a_row_outside_them_lands_in_the_default(
    tenant: Tenant, provider: Any
) -> None:
    now = sql.db_now()
    far = partitions.month_start(now, plus=8)
    assert partitions.partition_name("ledger_attempt", far) not in names("ledger_attempt")
    created = partitions.partitions_ensure(now=far, months_ahead=1)
    expected = {partitions.partition_name(t, m) for t in TABLES for m in (far, partitions.month_start(far, plus=1))}
    assert set(created) == expected
    assert partitions.partitions_ensure(now=far, months_ahead=1) == []
    op = services.operation_claim(tenant=tenant, key="k", provider=provider, action="charge").operation
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch"
    )
    # Rows of this month land in the partition covering it (here the legacy one: a test
    # database is converted empty); a row no partition covers, in the default.
    assert rows_in("ledger_operationevent_default", op) == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason, at)"
            " VALUES (%s, %s, 'succeeded', 'succeeded', 'test', '', %s)",
            [op.tenant_id, op.pk, partitions.month_start(now, plus=40)],
        )
    assert rows_in("ledger_operationevent_default", op) == 1


# The conversion: a database from before it, with rows, migrated forward.
BEFORE = [("ledger", "0024_open_rows_in_list_order")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_converts_a_database_with_rows_and_keeps_them() -> None:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate(BEFORE).apps
        assert not partitions.is_partitioned("ledger_attempt")
        now = sql.db_now()
        tenant = old.get_model("ledger", "Tenant").objects.create(slug="conv", name="conv")
        op_model = old.get_model("ledger", "Operation")
        ops = [
            op_model.objects.create(
                tenant=tenant, key=f"k-{i}", mode="guard", status="succeeded", fingerprint="f" * 64,
                created_at=now, updated_at=now, done_at=now,
            )
            for i in range(5)
        ]  # fmt: skip
        for op in ops:
            old.get_model("ledger", "Attempt").objects.create(
                operation=op, number=1, lease_token="t" * 32, started_at=now, outcome="succeeded"
            )
            old.get_model("ledger", "OperationEvent").objects.create(
                operation=op, from_status="", to_status="claimed", actor="api", at=now
            )
        executor.loader.build_graph()
        executor.migrate(leaves)

        for table in TABLES:
            assert partitions.is_partitioned(table)
            legacy = f"{table}_legacy"
            assert legacy in names(table)
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {legacy}")
                assert cursor.fetchone() == (5,)
        assert Attempt.objects.filter(operation__tenant__slug="conv").count() == 5
        # New rows take ids after the old ones, through the service.
        last_attempt = Attempt.objects.order_by("-id").first()
        tenant_now = Tenant.objects.get(slug="conv")
        provider = services.provider_upsert(
            tenant=tenant_now, slug="pay", base_url="http://127.0.0.1:9", idempotency_class="none"
        )
        claimed = services.operation_claim(tenant=tenant_now, key="after", provider=provider, action="x").operation
        services.operation_complete(
            operation_id=claimed.pk, tenant_id=claimed.tenant_id, lease_token=claimed.lease_token, provider_ref="r"
        )
        assert Attempt.objects.get(operation_id=claimed.pk).pk > last_attempt.pk
        assert OperationEvent.objects.filter(operation_id=claimed.pk).count() == 1  # one per pair (ADR 0024)
    finally:
        executor.loader.build_graph()
        executor.migrate(leaves)


@pytest.mark.django_db
def test_a_completion_updates_its_attempt_in_one_partition_not_every_months(tenant: Tenant, provider: Any) -> None:
    """operation_complete_pg's attempt update carries the attempt's time range (the
    operation's creation to now): on a year of monthly partitions its generic plan (what a
    prepared statement runs) reads one partition's index, not every month's."""
    from ledger.store import statements

    now = sql.db_now()
    monthly_from(partitions.month_start(now, plus=-12))
    op = services.operation_claim(tenant=tenant, key="pruned-1", provider=provider, action="charge").operation
    params = {
        "id": op.pk,
        # In its stored form, as ledger.store.statements passes it (bytes on PostgreSQL).
        "lease_token": Operation._meta.get_field("lease_token").get_db_prep_value(op.lease_token, connection),
        "tenant_id": tenant.pk,
        "provider_ref": "ch_1",
        "response_status": 200,
        "response_body": None,
        "actor": "api",
        "reason": "completed",
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'ledger_attempt'::regclass")
        assert cursor.fetchone()[0] >= 12
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + statements.text("operation_complete_pg"), params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET LOCAL plan_cache_mode = auto")
    attempt_part = plan.split("CTE attempt")[1].split("CTE event")[0]
    scans = [line for line in attempt_part.splitlines() if "Index Scan" in line or "Seq Scan" in line]
    executed = [line for line in scans if "never executed" not in line]
    assert len(executed) == 1, plan
    assert "Subplans Removed" in attempt_part, plan
    # And the move itself is whole: the attempt succeeded, the row too.
    attempt = Attempt.objects.get(operation_id=op.pk)
    assert attempt.outcome == "succeeded" and attempt.provider_ref == "ch_1"


@pytest.mark.django_db
def test_a_retry_claimed_months_after_its_operation_began_is_the_attempt_its_completion_finishes(
    tenant: Tenant, provider: Any
) -> None:
    """The completion's attempt update reads the months from the operation's creation to now:
    an operation created two months ago whose first attempt failed then and whose retry was
    claimed this month has its retry — in this month's partition — marked succeeded, and its
    first attempt left as it failed (transient)."""
    now = sql.db_now()
    monthly_from(partitions.month_start(now, plus=-3))
    op = services.operation_claim(tenant=tenant, key="late-retry", provider=provider, action="charge").operation
    services.operation_fail(
        operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, error_class="transient", message="503"
    )
    then = partitions.month_start(now, plus=-2) + timedelta(days=3)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_operation SET created_at = %s, claimed_at = %s, next_attempt_at = %s WHERE id = %s",
            [then, then, then, op.pk],
        )
        cursor.execute("UPDATE ledger_attempt SET started_at = %s WHERE operation_id = %s", [then, op.pk])
    retry = services.operation_reclaim(operation_id=op.pk, tenant_id=tenant.pk, lease_seconds=30, actor="api")
    assert retry is not None and retry.attempts == 2
    services.operation_complete(
        operation_id=op.pk, tenant_id=tenant.pk, lease_token=retry.lease_token, provider_ref="ch_late"
    )
    first, second = Attempt.objects.filter(operation_id=op.pk).order_by("number")
    assert (first.outcome, second.outcome) == ("transient", "succeeded"), (first.outcome, second.outcome)
    assert second.provider_ref == "ch_late" and second.finished_at is not None
    assert first.started_at.month != second.started_at.month


@pytest.mark.django_db
def test_a_month_is_kept_while_a_dlq_entry_or_a_later_version_still_points_into_it(
    tenant: Tenant, provider: Any
) -> None:
    """The references of _delete_operations hold a month too: an operation with a DLQ entry,
    and one that a superseded version still points at (it goes once that version is gone)."""
    from dlq.ingest.services import failed_event_record_for_operation

    now = sql.db_now()
    with_dlq, with_version, control = (partitions.month_start(now, plus=-n) for n in (14, 13, 12))
    monthly_from(partitions.month_start(now, plus=-15))
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=timedelta(days=30))
    in_dlq = finished_in(tenant, provider, "in-dlq", with_dlq)
    failed_event_record_for_operation(operation=in_dlq)
    earlier = finished_in(tenant, provider, "v1", with_version)
    later = finished_in(tenant, provider, "v2", with_version)
    Operation.objects.filter(pk=earlier.pk).update(superseded_by=later)
    finished_in(tenant, provider, "plain", control)

    settle()
    retention_purge(now=now, trigger="test")

    for table in TABLES:
        current = names(table)
        assert partitions.partition_name(table, control) not in current
        assert partitions.partition_name(table, with_dlq) in current
        assert partitions.partition_name(table, with_version) in current
        assert rows_in(partitions.partition_name(table, with_dlq), in_dlq) > 0
        assert rows_in(partitions.partition_name(table, with_version), later) > 0
    assert Operation.objects.filter(pk__in=[in_dlq.pk, later.pk]).count() == 2
