"""The write-once search rows (ADR 0018) and the references without database constraints
(ADR 0019): the API's provider_ref filter reads the rows and stays exact, erasure cuts the
person's values out of them, retention deletes them with their operation, the backfill fills
them for older operations once, and the nightly check finds a planted orphan."""

from __future__ import annotations

import importlib
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from ledger.models import Operation, OperationSearch, Tenant
from ledger.protocol import services
from ledger.protocol.selectors import operation_search
from ledger.store.orphans import orphans_count
from ledger.store.search_rows import search_rows_backfill
from review.models import RetentionPolicy
from review.privacy import erasure
from review.privacy.subjects import subject_resolve
from review.retention.purge import retention_purge_tenant
from tests.conftest import on_postgres
from tests.console.support import enforced_provider, succeeded_op

pytestmark = pytest.mark.django_db

EMAIL = "mei.lin@example.invalid"


def found(text: str) -> set[str]:
    return set(operation_search(Operation.objects.all(), text).values_list("key", flat=True))


def test_the_api_provider_ref_filter_finds_the_row_by_its_current_reference_only(tenant, make_client):
    crm = enforced_provider(tenant)
    succeeded_op(tenant, crm, "ref-filter-1")
    claimed = services.operation_claim(tenant=tenant, key="ref-filter-2", provider=crm, request={}).operation
    services.operation_complete(
        operation_id=claimed.pk,
        tenant_id=claimed.tenant_id,
        lease_token=claimed.lease_token,
        provider_ref="ch_77",
        actor="t",
    )
    api = make_client(tenant, ["read"])
    answer = api.get("/api/v1/operations", {"provider_ref": "ch_77"}).json()
    assert [row["key"] for row in answer["results"]] == ["ref-filter-2"]
    # Not a prefix filter, and a reference the row no longer holds does not match.
    assert api.get("/api/v1/operations", {"provider_ref": "ch_7"}).json()["results"] == []
    Operation.objects.filter(pk=claimed.pk).update(provider_ref="ch_78")
    assert api.get("/api/v1/operations", {"provider_ref": "ch_77"}).json()["results"] == []


def test_an_erasure_cuts_the_persons_values_out_of_the_search_rows(tenant: Tenant, django_capture_on_commit_callbacks):
    Tenant.objects.filter(pk=tenant.pk).update(personal_data_in_keys_allowed=True)
    crm = enforced_provider(tenant)
    op = services.operation_claim(
        tenant=tenant,
        key=f"welcome:{EMAIL}",
        provider=crm,
        request={},
        payload={"email": EMAIL, "name": "Mei Lin"},
        correlation_id="run-5",
    ).operation
    assert found("mei.lin@") == {op.key}

    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": EMAIL}),
        actor="user:ada",
        reason="Erasure request ER-91, verified",
        enqueue=False,
    )
    with django_capture_on_commit_callbacks(execute=True):
        erasure.erasure_continue(run_id=run.pk)

    texts = list(OperationSearch.objects.filter(operation_id=op.pk).values_list("text", flat=True))
    assert texts and not any(EMAIL in t for t in texts), texts
    assert found("mei.lin@") == set()
    # What is not the person's stays findable.
    assert found("run-5") == {op.key}


@pytest.mark.django_db(transaction=True)
def test_retention_deletes_the_search_rows_with_their_operation(tenant):
    crm = enforced_provider(tenant)
    RetentionPolicy.objects.create(
        tenant=tenant, record_type="operations", payload_ttl=timedelta(days=30), record_ttl=timedelta(days=365)
    )
    claimed = services.operation_claim(tenant=tenant, key="year-old", provider=crm, request={}).operation
    old = services.operation_complete(
        operation_id=claimed.pk,
        tenant_id=claimed.tenant_id,
        lease_token=claimed.lease_token,
        provider_ref="re_1",
        actor="t",
    )
    kept = succeeded_op(tenant, crm, "fresh")
    assert OperationSearch.objects.filter(operation_id=old.pk).count() == 2
    past = timezone.now() - timedelta(days=400)
    Operation.objects.filter(pk=old.pk).update(created_at=past, updated_at=past, done_at=past)

    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert run.deleted == 1
    assert not OperationSearch.objects.filter(operation_id=old.pk).exists()
    assert OperationSearch.objects.filter(operation_id=kept.pk).exists()
    assert orphans_count()["ledger_operation_search.operation_id"] == 0


def test_the_backfill_writes_the_rows_of_older_operations_once_and_resumes_anywhere(tenant):
    crm = enforced_provider(tenant)
    ops = [succeeded_op(tenant, crm, f"older-{i}") for i in range(3)]
    Operation.objects.filter(pk=ops[0].pk).update(provider_ref="job-1")
    # As if written before the search rows existed.
    OperationSearch.objects.filter(operation_id__in=[op.pk for op in ops]).delete()
    assert found("older-") == set()

    first = ops[1].pk
    written = sum(step.written for step in search_rows_backfill(after=first - 1, batch=1))
    written += sum(step.written for step in search_rows_backfill(after=0, batch=2))
    # Identifiers and a provider reference each; the second pass, over everything, wrote only
    # what the first had not.
    assert written == 6
    assert sum(step.written for step in search_rows_backfill(after=0)) == 0
    assert found("older-") == {"older-0", "older-1", "older-2"}
    assert found("job-") == {"older-0"}


def test_the_nightly_check_finds_an_operation_whose_tenant_is_gone(tenant, other_tenant):
    assert not any(orphans_count().values())
    op = services.operation_claim(tenant=tenant, key="orphan-1", provider=None, request={}).operation
    # Planted: no constraint stops a row naming a tenant that does not exist (ADR 0019), and
    # none stops a search row naming an operation that does not either.
    missing = other_tenant.pk + 1000
    Operation.objects.filter(pk=op.pk).update(tenant_id=missing)
    OperationSearch.objects.create(operation_id=op.pk + 1000, seq=0, tenant_id=tenant.pk, text="x")

    found_now = orphans_count(chunk=2)

    assert found_now == {
        "ledger_operation.tenant_id": 1,
        "ledger_operation.provider_id": 0,
        "ledger_operation_search.operation_id": 1,
        # ADR 0023: the attempts' and events' operation, checked the same way.
        "ledger_attempt.operation_id": 0,
        "ledger_operationevent.operation_id": 0,
        "ledger_open_operation.id": 0,
        "ledger_open_operation.drift": 0,
    }
    with pytest.raises(SystemExit) as exit_:
        call_command("ledger_orphans")
    assert exit_.value.code == 3
    # SQLite keeps its deferred constraint, checked when the test ends: put the row back.
    Operation.objects.filter(pk=op.pk).update(tenant_id=tenant.pk)


@pytest.mark.skipif(not on_postgres(), reason="constraints are PostgreSQL's")
def test_on_postgresql_a_claim_names_tenant_and_provider_without_a_foreign_key_constraint():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT confrelid::regclass::text FROM pg_constraint"
            " WHERE conrelid = 'ledger_operation'::regclass AND contype = 'f'"
        )
        referenced = {row[0] for row in cursor.fetchall()}
    assert not {"ledger_tenant", "ledger_provider"} & referenced, referenced


def test_the_migration_fills_the_rows_of_a_small_table_itself(tenant):
    # Migration 0043's own (frozen) copy of the fill statements, on this database.
    migration = importlib.import_module("ledger.migrations.0043_operation_search_rows")
    crm = enforced_provider(tenant)
    ops = [succeeded_op(tenant, crm, f"before-{i}") for i in range(2)]
    OperationSearch.objects.filter(operation_id__in=[op.pk for op in ops]).delete()

    assert migration.fill(SimpleNamespace(connection=connection)) is True
    assert migration.fill(SimpleNamespace(connection=connection)) is True  # again: nothing twice

    rows = set(OperationSearch.objects.filter(operation_id=ops[0].pk).values_list("seq", "ref", "text"))
    assert rows == {(0, False, "before-0\x01\x01\x01"), (1, True, "ref-before-0")}
    assert found("before-") == {"before-0", "before-1"}
