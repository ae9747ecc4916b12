"""Operations are found by their workflow's name (issue 14 item 2): any part of it, in any
case, in the console's search and the API's ``?workflow_name=``. An operation carries its
workflow's id; the names come once each from claims, submissions and n8n's failed events,
and match within their own tenant only."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection

from dlq.ingest import services as dlq_ingest
from ledger.models import Operation, Tenant, WorkflowName
from ledger.protocol import services
from ledger.protocol.selectors import operation_search
from tests.conftest import on_postgres
from tests.console.support import client_for, enforced_provider, seq_scan_free_plan, staff
from tests.ledger.support import CLAIM_URL, claim_body

pytestmark = pytest.mark.django_db


def failed_in_workflow(tenant: Tenant, workflow_id: str, name: str, execution: str) -> None:
    """n8n's Error Trigger reports the workflow's id and name."""
    envelope = {
        "event_id": f"n8n:{workflow_id}:{execution}",
        "payload": {"lead": "x"},
        "error": {"message": "too many requests [429]", "class": "transient"},
        "source": {"workflow_id": workflow_id, "workflow_name": name, "node": "CRM: Create Contact"},
    }
    dlq_ingest.failed_event_ingest(tenant=tenant, raw=json.dumps(envelope).encode(), actor="t")


@pytest.fixture
def spread(tenant, other_tenant, api, make_client) -> dict[str, Any]:
    """Workflow 17 is "Voice call analyzed -> CRM lead" for one tenant and "Payroll export"
    for the other; workflow 31 ("Billing: Stripe charge", later renamed) names itself on
    its claims."""
    made: dict[str, Any] = {}
    crm = enforced_provider(tenant)
    theirs = enforced_provider(other_tenant)
    failed_in_workflow(tenant, "17", "Voice call analyzed -> CRM lead", "4812")
    failed_in_workflow(other_tenant, "17", "Payroll export", "90")
    for name, owner, provider in (("lead", tenant, crm), ("payroll", other_tenant, theirs)):
        made[name] = services.operation_claim(
            tenant=owner, key=f"{name}:call_1:v1", provider=provider, request={}, workflow_id="17"
        ).operation.pk
    made["unnamed"] = services.operation_claim(
        tenant=tenant, key="other:call_2:v1", provider=crm, request={}, workflow_id="99"
    ).operation.pk
    for key, name in (("charge-1", "Billing: Stripe charge"), ("charge-2", ""), ("charge-3", "Billing v2 (Stripe)")):
        response = api.post(CLAIM_URL, claim_body(f"{key}:v1", workflow_id="31", workflow_name=name), format="json")
        assert response.status_code == 201, response.content
        made[key] = response.json()["id"]
    return made


def found(text: str) -> set[int]:
    return set(operation_search(Operation.objects.all(), text).values_list("pk", flat=True))


def test_any_part_of_a_workflow_name_in_any_case_finds_its_operations_in_their_tenant_only(spread):
    lead = {spread["lead"]}
    assert found("crm lead") == found("CRM LEAD") == found("Voice Call ANALYZED") == lead
    assert found("payroll") == {spread["payroll"]}
    # A claim without a name is found by the name its workflow was given on another claim.
    billing = {spread["charge-1"], spread["charge-2"], spread["charge-3"]}
    assert found("stripe") == found("billing:") == billing
    # Renamed: both names find the workflow's operations.
    assert found("billing v2") == found("billing: stripe") == billing
    assert found("no such workflow") == set()


def test_a_name_is_kept_once_however_many_claims_carry_it(spread, api):
    for n in range(3):
        body = claim_body(f"charge-again-{n}:v1", workflow_id="31", workflow_name="Billing: Stripe charge")
        assert api.post(CLAIM_URL, body, format="json").status_code == 201
    names = WorkflowName.objects.filter(workflow_id="31").values_list("name", flat=True)
    assert sorted(names) == ["Billing v2 (Stripe)", "Billing: Stripe charge"]


def test_the_api_filters_by_workflow_name_and_id_within_the_callers_tenant(spread, api):
    def listed(query: str) -> set[int]:
        response = api.get(f"/api/v1/operations?{query}")
        assert response.status_code == 200, response.content
        return {op["id"] for op in response.json()["results"]}

    assert listed("workflow_name=crm%20LEAD") == {spread["lead"]}
    assert listed("workflow_name=STRIPE") == {spread["charge-1"], spread["charge-2"], spread["charge-3"]}
    assert listed("workflow_name=payroll") == set()  # the other tenant's workflow 17
    assert listed("workflow_name=nothing-like-it") == set()
    assert listed("workflow_id=17") == {spread["lead"]}


def test_the_console_search_finds_operations_by_workflow_name_and_the_list_shows_it(spread, tenant):
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = ada.get("/admin/ledger/operation/", {"q": "Crm Lead"})
    assert response.status_code == 200
    body = response.content.decode()
    rows = re.findall(r'<tr[^>]*>\s*<td class="action-checkbox">.*?</tr>', body, flags=re.S)
    assert len(rows) == 1 and "lead:call_1:v1" in rows[0], rows
    assert "Voice call analyzed -&gt; CRM lead" in rows[0] and "wf 17" in rows[0]
    # The other tenant's "Payroll export" is not this admin's to find.
    body = ada.get("/admin/ledger/operation/", {"q": "payroll"}).content.decode()
    assert "payroll:call_1" not in body and "Payroll export" not in body and "0 operations" in body


@pytest.mark.skipif(not on_postgres(), reason="trigram indexes exist on PostgreSQL only")
def test_on_postgresql_a_workflow_name_search_has_its_indexes(spread):
    # The operations: every arm of the search, the names' one too, is an index scan. (On a
    # nearly empty table the planner may serve the tenant with another tenant-led index.)
    ops_plan = seq_scan_free_plan(operation_search(Operation.objects.all(), "crm lead"))
    assert "Seq Scan" not in ops_plan and "workflow_id" in ops_plan, ops_plan
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'op_workflow_idx'")
        [(definition,)] = cursor.fetchall()
    assert "(tenant_id, workflow_id) WHERE (NOT ((workflow_id)::text = ''::text))" in definition, definition
    # The names: a trigram index on the expression icontains compares. (A deployment has a
    # few hundred names, where the planner rightly reads the table; the index is there for
    # the tenant with tens of thousands of generated workflows.)
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'wfname_name_trgm'")
        [(definition,)] = cursor.fetchall()
    assert "USING gin (upper((name)::text) gin_trgm_ops)" in definition, definition
