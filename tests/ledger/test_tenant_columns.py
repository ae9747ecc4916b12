"""Attempts, events and rate buckets carry their tenant (DESIGN §12, Citus; issue 16 item 5).

Every write fills ``tenant_id`` from the operation (the provider) it belongs to, and the
migration that added the column converts a database with rows: copied in batches, then
``NOT NULL`` — on PostgreSQL through a validated CHECK, so ``SET NOT NULL`` does not scan.
"""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import Attempt, OperationEvent, ProviderRate, Tenant
from ledger.protocol import services
from ledger.providers import ratelimit
from tests.conftest import on_postgres

MIGRATION = "0029_tenant_on_attempts_events_rates"
BEFORE = [("ledger", "0028_one_search_trigram_index")]


@pytest.mark.django_db
def test_every_write_of_an_attempt_an_event_and_a_bucket_names_the_tenant(tenant, other_tenant, provider) -> None:
    capped = services.provider_upsert(
        tenant=other_tenant, slug="capped", base_url="http://127.0.0.1:9", idempotency_class="none", rate_limit=5
    )
    ops = []
    for owner, used in ((tenant, provider), (other_tenant, capped)):
        op = services.operation_claim(tenant=owner, key="k", provider=used, action="x").operation
        services.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient"
        )
        ops.append(op)
    ratelimit.provider_rate_lower(provider=capped, operation_id=ops[1].pk)
    for op in ops:
        assert {a.tenant_id for a in Attempt.objects.filter(operation_id=op.pk)} == {op.tenant_id}
        assert {e.tenant_id for e in OperationEvent.objects.filter(operation_id=op.pk)} == {op.tenant_id}
    assert ProviderRate.objects.get(provider=capped).tenant_id == other_tenant.pk


@pytest.mark.django_db(transaction=True)
def test_the_migration_copies_each_rows_tenant_in_batches_and_requires_it(monkeypatch) -> None:
    from django.db.migrations.executor import MigrationExecutor

    migration = importlib.import_module(f"ledger.migrations.{MIGRATION}")
    # Batches of three ids: the rows below span several.
    monkeypatch.setattr(migration, "BATCH", 3)
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    notices: list[str] = []
    try:
        old = executor.migrate(BEFORE).apps
        at = timezone.now()
        tenants = [old.get_model("ledger", "Tenant").objects.create(slug=f"mig-{n}", name="") for n in range(2)]
        provider = old.get_model("ledger", "Provider").objects.create(
            tenant=tenants[1], slug="p", base_url="http://127.0.0.1:9", idempotency_class="none", rate_limit=5
        )
        old.get_model("ledger", "ProviderRate").objects.create(
            provider=provider, tokens=1.0, rate=1.0, refilled_at=at, quiet_since=at
        )
        op_model = old.get_model("ledger", "Operation")
        expected: dict[int, int] = {}
        for i in range(8):
            owner = tenants[i % 2]
            op = op_model.objects.create(
                tenant=owner, key=f"k-{i}", mode="guard", status="succeeded", fingerprint="f" * 64,
                created_at=at, updated_at=at, done_at=at,
            )  # fmt: skip
            expected[op.pk] = owner.pk
            old.get_model("ledger", "Attempt").objects.create(
                operation=op, number=1, lease_token="t" * 32, started_at=at, outcome="succeeded"
            )
            for to in ("claimed", "succeeded"):
                old.get_model("ledger", "OperationEvent").objects.create(
                    operation=op, from_status="", to_status=to, actor="api", at=at
                )
        if on_postgres():
            # PostgreSQL says at DEBUG1 when SET NOT NULL trusts a constraint instead of scanning.
            connection.ensure_connection()
            connection.connection.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            with connection.cursor() as cursor:
                cursor.execute("SET client_min_messages = debug1")
        executor.loader.build_graph()
        executor.migrate(leaves)
        if on_postgres():
            with connection.cursor() as cursor:
                cursor.execute("RESET client_min_messages")

        for model in (Attempt, OperationEvent):
            rows = dict(model.objects.values_list("operation_id", "tenant_id").distinct())
            assert rows == expected, model
        assert ProviderRate.objects.get(provider__slug="p").tenant_id == tenants[1].pk
        if on_postgres():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT c.relname, a.attnotnull FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                    " WHERE a.attname = 'tenant_id' AND c.relname = ANY(%s)",
                    [["ledger_attempt", "ledger_operationevent", "ledger_providerrate"]],
                )
                assert dict(cursor.fetchall()) == dict.fromkeys(
                    ("ledger_attempt", "ledger_operationevent", "ledger_providerrate"), True
                )
                cursor.execute("SELECT conname FROM pg_constraint WHERE conname LIKE %s", ["%tenant_id_set"])
                assert cursor.fetchall() == [], "the CHECKs that spared the scans are dropped"
            # VALIDATE scans each partition (under SHARE UPDATE EXCLUSIVE: writes go on); SET NOT
            # NULL then trusts the validated CHECK on every partition instead of scanning again
            # under its exclusive lock.
            partitions = [n.split('"')[1] for n in notices if n.startswith("verifying table")]
            proven = [n.split('"')[1].split(".")[0] for n in notices if "sufficient to prove" in n]
            assert {p for p in partitions if p.startswith(("ledger_attempt", "ledger_operationevent"))} <= set(proven)
            assert {"ledger_attempt", "ledger_operationevent", "ledger_providerrate"} <= set(proven)
            # (This migration's tables only: a later migration adding a CHECK elsewhere — the
            # tenant's secret namespace, ledger.0032 — scans its own table afterwards.)
            last_scan = max(
                i
                for i, n in enumerate(notices)
                if n.startswith("verifying table")
                and n.split('"')[1].startswith(("ledger_attempt", "ledger_operationevent", "ledger_providerrate"))
            )
            assert last_scan < min(i for i, n in enumerate(notices) if "sufficient to prove" in n), notices
        # New writes carry it too.
        tenant_now = Tenant.objects.get(slug="mig-0")
        pay = services.provider_upsert(tenant=tenant_now, slug="pay", base_url="http://127.0.0.1:9")
        op = services.operation_claim(tenant=tenant_now, key="after", provider=pay, action="x").operation
        assert Attempt.objects.get(operation_id=op.pk).tenant_id == tenant_now.pk
    finally:
        if on_postgres():
            with connection.cursor() as cursor:
                cursor.execute("RESET client_min_messages")
        executor.loader.build_graph()
        executor.migrate(leaves)
