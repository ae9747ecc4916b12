"""Operations found by their error text, as dead-letter entries are: in the console's search box
and the API list's ``error`` parameter, read from the append-only failure events (never from
the operation's ``last_error``, which a completion rewrites), through a trigram index on
PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import ErrorClass, Operation, OperationStatus, Tenant
from ledger.protocol import services
from ledger.protocol.selectors import operation_ids_failed_with, operation_search, operations_failed_with
from tests.conftest import on_postgres
from tests.console.support import enforced_provider, seq_scan_free_plan

pytestmark = pytest.mark.django_db


def _failed(tenant: Tenant, key: str, message: str, error_class: str = ErrorClass.INVALID_INPUT) -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=enforced_provider(tenant), request={}).operation
    return services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=error_class, message=message
    )


@pytest.fixture
def rows(tenant, other_tenant):
    made = {
        "duplicate": _failed(tenant, "lead:1:v1", "Contact rejected: DUPLICATE_VALUE on field email"),
        "timeout": _failed(tenant, "lead:2:v1", "upstream gateway timeout after 30 s", ErrorClass.TRANSIENT),
        "theirs": _failed(other_tenant, "lead:9:v1", "Contact rejected: DUPLICATE_VALUE on field email"),
    }
    services.operation_claim(tenant=tenant, key="lead:3:v1", provider=enforced_provider(tenant), request={})
    return made


def keys(rows, text: str, tenant: Tenant | None = None) -> set[str]:
    scoped = Operation.objects.filter(tenant=tenant) if tenant else Operation.objects.all()
    found = operation_search(scoped, text, tenant_ids=[tenant.pk] if tenant else None)
    return set(found.values_list("key", flat=True))


def test_the_console_search_finds_an_operation_by_any_part_of_its_error_in_any_case(rows, tenant):
    assert rows["duplicate"].status == OperationStatus.FAILED
    assert rows["timeout"].status == OperationStatus.RETRY_WAIT
    assert keys(rows, "duplicate_value", tenant) == {"lead:1:v1"}
    assert keys(rows, "GATEWAY TIMEOUT", tenant) == {"lead:2:v1"}
    # Every tenant's for a superuser; a tenant's own only when scoped.
    assert keys(rows, "duplicate_value") == {"lead:1:v1", "lead:9:v1"}
    assert keys(rows, "no such error text", tenant) == set()


def test_an_error_found_once_stays_findable_after_the_retry_succeeds(rows, tenant):
    # The retry's success rewrites the operation's row (its last error included); the failure
    # event that held the text is history and stays.
    waiting = rows["timeout"]
    # Its backoff over (the caller retries by claiming the key again once due).
    Operation.objects.filter(pk=waiting.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    retried = services.operation_claim(
        tenant=tenant, key=waiting.key, provider=enforced_provider(tenant), request={}
    ).operation
    done = services.operation_complete(
        operation_id=retried.pk, tenant_id=retried.tenant_id, lease_token=retried.lease_token, provider_ref="c-2"
    )
    assert done.status == OperationStatus.SUCCEEDED
    assert keys(rows, "gateway timeout", tenant) == {"lead:2:v1"}


def test_the_api_list_filters_by_error_text_within_the_callers_tenant(rows, make_client, tenant):
    api = make_client(tenant)
    answer = api.get("/api/v1/operations", {"error": "duplicate_VALUE"})
    assert answer.status_code == 200, answer.content
    assert [row["key"] for row in answer.json()["results"]] == ["lead:1:v1"]
    both = api.get("/api/v1/operations", {"error": "e"})
    assert both.status_code == 400 and both["Content-Type"].startswith("application/problem+json")
    assert both.json()["code"] == "validation_error" and "3 to 500 characters" in both.json()["detail"]
    too_long = api.get("/api/v1/operations", {"error": "x" * 501})
    assert too_long.status_code == 400 and too_long.json()["code"] == "validation_error"
    assert api.get("/api/v1/operations", {"error": "nothing like it"}).json()["results"] == []


@pytest.mark.skipif(not on_postgres(), reason="trigram indexes exist on PostgreSQL only")
def test_on_postgresql_the_error_search_reads_the_failure_events_trigram_index(rows, tenant):
    events = seq_scan_free_plan(operations_failed_with("duplicate_value", tenant_ids=[tenant.pk]))
    assert "Seq Scan" not in events and "_error_trgm" in events, events
    # The API's shape: the operations of those events, a semi-join on the matches sorted
    # newest first, so the page's order comes from them and the page stops when it is full:
    # no sort of every joined match by the operation's id.
    failed = operation_ids_failed_with("duplicate", tenant_ids=[tenant.pk])
    plan = seq_scan_free_plan(Operation.objects.filter(tenant=tenant, pk__in=failed).order_by("-id")[:51])
    assert "Seq Scan" not in plan and "_error_trgm" in plan, plan
    assert "Sort Key: ledger_operation.id" not in plan, plan
    # The console's search box: every arm indexed, the error text's included.
    box = seq_scan_free_plan(operation_search(Operation.objects.filter(tenant=tenant), "duplicate_value"))
    assert "Seq Scan" not in box, box
