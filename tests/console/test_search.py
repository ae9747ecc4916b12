"""Search that finds things (issue 14 item 2): substring, case-insensitive, over the columns
written once; provider refs by exact value or prefix; trigram indexes on PostgreSQL; the
person search reads local phone numbers in the default region."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from dlq.entries.selectors import failed_event_search
from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent
from ledger.models import Operation, OperationSearch
from ledger.protocol import selectors, services
from ledger.protocol.selectors import MATCHED_TEXT_MAX, operation_search, operations_matching
from review.privacy import payloads as privacy
from tests.conftest import on_postgres
from tests.console.support import enforced_provider, example, seq_scan_free_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(tenant):
    crm = enforced_provider(tenant)
    made = {}
    for key, handle, execution in (
        ("lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1", "", "4812"),
        ("order-1001:charge:v1", "pi_3NfX1001", ""),
    ):
        op = services.operation_claim(
            tenant=tenant, key=key, provider=crm, request={}, execution_id=execution, reconciliation_handle=handle
        ).operation
        made[key] = op
    done = made["order-1001:charge:v1"]
    services.operation_complete(
        operation_id=done.pk,
        tenant_id=done.tenant_id,
        lease_token=done.lease_token,
        provider_ref="ch_1QxY9",
        response_body={},
        actor="t",
    )
    envelope = {
        "event_id": "n8n:17:4812",
        "payload": example("crm-create-contact-request.json"),
        "error": {"message": "The service is receiving too many requests from you [429]", "class": "transient"},
        "source": {"workflow_id": "17", "workflow_name": "Voice call -> CRM lead", "node": "CRM: Create Contact"},
    }
    dlq_ingest.failed_event_ingest(tenant=tenant, raw=json.dumps(envelope).encode(), actor="t")
    return made


def keys(text: str) -> set[str]:
    return set(operation_search(Operation.objects.all(), text).values_list("key", flat=True))


def entries(text: str) -> set[str]:
    return set(failed_event_search(FailedEvent.objects.all(), text).values_list("event_id", flat=True))


def test_operations_are_found_by_any_part_of_key_handle_or_execution_id_in_any_case(rows):
    assert keys("lead-call") == {"lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1"}
    assert keys("CRM") == {"lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1"}
    assert keys("call_7f3c2a9e41b04d6f") == {"lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1"}
    assert keys("3nfx") == {"order-1001:charge:v1"}
    assert keys("481") == {"lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1"}
    assert keys("nothing-like-it") == set()


def test_a_search_never_matches_across_two_columns(rows):
    # PostgreSQL compares the four columns joined into one text (op_search_trgm): the end of
    # one joined to the start of the next is no match, as it never was column by column.
    assert keys("v1pi_3N") == set()
    assert keys(":v14812") == set()
    assert keys("crm-contact:v1") == {"lead-call:call_7f3c2a9e41b04d6f:crm-contact:v1"}
    # Text holding the separator is compared column by column (and finds nothing here).
    assert keys("v1\x01pi_3N") == set()
    assert keys("pi_3NfX1001") == {"order-1001:charge:v1"}


def test_provider_refs_match_exactly_or_by_prefix_never_in_the_middle(rows):
    assert keys("ch_1QxY9") == keys("ch_1Q") == {"order-1001:charge:v1"}
    assert keys("1QxY9") == set()


def test_dlq_entries_are_found_by_error_text_workflow_name_node_and_identity(rows):
    assert entries("429") == entries("crm lead") == entries("create contact") == {"n8n:17:4812"}
    assert entries("17:48") == entries("17") == {"n8n:17:4812"}
    # The payload (sealed) is never searched: the person's name is in it, not findable here.
    assert entries("Priya") == set()


def test_a_local_phone_number_finds_the_person_indexed_in_international_form(rows, tenant, settings):
    settings.DEFAULT_PHONE_REGION = "AU"
    voice = example("voice-call-analyzed.json")  # from_number +61412345678
    op = services.operation_claim(
        tenant=tenant, key="voice:call_1:v1", provider=None, request={}, payload=voice
    ).operation

    hits = privacy.subject_search(tenant_ids=None, phone="0412 345 678")

    assert op.pk in hits.operation_ids
    assert (
        privacy.subject_search(tenant_ids=None, email="PRIYA.Raman@Example.invalid").operation_ids == hits.operation_ids
    )


@pytest.mark.skipif(not on_postgres(), reason="trigram indexes exist on PostgreSQL only")
def test_on_postgresql_every_substring_search_is_an_index_scan(rows):
    # A superuser's search (every tenant): the identifiers and provider references through the
    # search rows' two indexes (ADR 0018), their ids then through the operations' primary key.
    matching = operations_matching("lead-call")[:MATCHED_TEXT_MAX]
    with connection.cursor() as cursor:
        # On tables this small a backward walk of the primary key, filtered until the page is
        # full, can cost less (the random order's statistics decide): priced out as well, so the
        # plan shows what serves the match itself.
        cursor.execute("SET LOCAL enable_indexscan = off")
        found = seq_scan_free_plan(matching)
        cursor.execute("SET LOCAL enable_indexscan = on")
    assert "Seq Scan" not in found and "opsearch_text_trgm" in found and "opsearch_ref_idx" in found, found
    ops = seq_scan_free_plan(operation_search(Operation.objects.all(), "lead-call"))
    assert "Seq Scan" not in ops and "ledger_operation_pkey" in ops, ops
    dlq = seq_scan_free_plan(failed_event_search(FailedEvent.objects.all(), "429"))
    assert "Seq Scan" not in dlq, dlq
    for index in ("fe_event_trgm", "fe_error_trgm", "fe_workflow_name_trgm", "fe_node_trgm"):
        assert index in dlq, dlq
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%%_trgm'")
        made = {r[0] for r in cursor.fetchall()}
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'ledger_operation'")
        on_the_row = {r[0] for r in cursor.fetchall()}
    assert {"opsearch_text_trgm", "fe_key_trgm", "fe_execution_trgm"} <= made
    assert not {"op_key_trgm", "op_handle_trgm", "op_execution_trgm", "op_correlation_trgm"} & made
    # Nothing on the operation row is indexed for search any more.
    assert not {"op_search_trgm", "op_ref_idx"} & on_the_row


@pytest.mark.skipif(not on_postgres(), reason="plans are PostgreSQL's")
def test_on_postgresql_the_search_stops_at_its_limit_before_reading_any_operation(rows, tenant):
    # The regression this rules out: the search rows joined to every matching operation and
    # sorted (1.5 s for a common text at a million rows). The LIMIT sits on the search rows'
    # own scan, newest first; the operation table is not in the plan at all.
    for scoped in (None, [tenant.pk]):
        plan = seq_scan_free_plan(operations_matching("order", tenant_ids=scoped)[:MATCHED_TEXT_MAX])
        assert plan.lstrip().startswith("Limit"), plan
        assert "ledger_operation_search" in plan and " ledger_operation " not in plan, plan
        assert "Join" not in plan and "Nested Loop" not in plan, plan


def test_every_identifier_is_found_by_any_part_and_a_provider_ref_only_from_its_start(rows, tenant):
    # As before the search rows (ADR 0018): key, handle, execution and correlation id by any
    # part; the provider reference exactly or by prefix.
    op = services.operation_claim(
        tenant=tenant, key="k-77", provider=None, request={}, correlation_id="corr-XYZ-9", execution_id="exec-55"
    ).operation
    assert keys("xyz-9") == keys("EXEC-5") == keys("k-7") == {"k-77"}
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="re_ABC123", actor="t"
    )
    assert keys("re_ABC") == keys("re_ABC123") == {"k-77"}
    assert keys("ABC123") == set()


def test_the_search_rows_are_written_once_and_the_completion_appends_its_provider_ref(rows, tenant):
    op = services.operation_claim(
        tenant=tenant, key="once-1", provider=None, request={}, reconciliation_handle="h-1"
    ).operation
    first = list(OperationSearch.objects.filter(operation_id=op.pk).values_list("seq", "ref", "text"))
    assert first == [(0, False, "once-1\x01h-1\x01\x01")]
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ref-9", actor="t"
    )
    after = list(OperationSearch.objects.filter(operation_id=op.pk).order_by("seq").values_list("seq", "ref", "text"))
    # The claim's row is unchanged; the reference is a second row after it.
    assert after == [*first, (1, True, "ref-9")]
    # A completion without a reference appends nothing.
    bare = services.operation_claim(tenant=tenant, key="once-2", provider=None, request={}).operation
    services.operation_complete(operation_id=bare.pk, tenant_id=bare.tenant_id, lease_token=bare.lease_token, actor="t")
    assert OperationSearch.objects.filter(operation_id=bare.pk).count() == 1


def test_no_statement_of_a_claim_or_completion_updates_a_search_row(tenant):
    seen: list[str] = []

    def spy(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        op = services.operation_claim(tenant=tenant, key="spy-1", provider=None, request={}).operation
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="r-1", actor="t"
        )
    writes = [sql for sql in seen if "ledger_operation_search" in sql]
    assert writes, seen
    assert not [sql for sql in writes if "UPDATE ledger_operation_search" in sql], writes


def test_a_whole_key_finds_that_operation_only_and_a_part_of_it_finds_every_key_containing_it(tenant):
    crm = enforced_provider(tenant)
    for key in ("order-1", "order-10", "order-100"):
        services.operation_claim(tenant=tenant, key=key, provider=crm, request={})
    assert keys("order-1") == {"order-1"}  # the whole key: the unique (tenant, key) index
    assert keys("order-10") == {"order-10"}
    assert keys("rder-1") == {"order-1", "order-10", "order-100"}  # a part: every key with it


def test_a_whole_key_of_another_tenant_changes_nothing_in_a_scoped_search(tenant, other_tenant):
    # Looked up among the searcher's tenants only: the answer must not tell whether another
    # tenant has that key.
    services.operation_claim(tenant=tenant, key="order-1x", provider=enforced_provider(tenant), request={})
    services.operation_claim(tenant=other_tenant, key="order-1", provider=enforced_provider(other_tenant), request={})
    mine = Operation.objects.filter(tenant=tenant)
    found = operation_search(mine, "order-1", tenant_ids=[tenant.pk]).values_list("key", flat=True)
    assert set(found) == {"order-1x"}


def test_a_filtered_search_reads_older_matches_until_the_page_has_what_it_shows(tenant, monkeypatch):
    # The search rows are read newest first a batch at a time (ADR 0018); a list filter that
    # drops the newest matches makes it read on, not answer with what the first batch kept.
    monkeypatch.setattr(selectors, "MATCHED_TEXT_BATCH", 2)
    made = [
        services.operation_claim(tenant=tenant, key=f"batch-{i}", provider=None, request={}).operation for i in range(5)
    ]
    oldest = made[0]
    services.operation_complete(
        operation_id=oldest.pk, tenant_id=oldest.tenant_id, lease_token=oldest.lease_token, actor="t"
    )
    done = Operation.objects.filter(status="succeeded")
    assert set(operation_search(done, "batch-", enough=1).values_list("key", flat=True)) == {"batch-0"}
    # Unfiltered, the first page's worth is all it reads: the newest.
    assert set(operation_search(Operation.objects.all(), "batch-", enough=2).values_list("key", flat=True)) == {
        "batch-4",
        "batch-3",
    }
