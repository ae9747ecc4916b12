"""An erasure reaches a real n8n (1.123): a lead's webhook execution, saved by n8n with the
person's data, is deleted through n8n's public API (``DELETE /api/v1/executions/{id}``) with
the key the tenant's n8n connection holds — gone from n8n's own database, an access-log row
here — while an execution still running is refused by n8n (400) and one n8n does not have
(404) are listed on the run, never dropped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dlq.n8n import connections as dlq_connections
from ledger.models import IdempotencyClass, Tenant
from ledger.protocol import services
from review.models import AccessAction, AccessLog, ErasureState
from review.privacy import erasure
from review.privacy.subjects import erasure_summary, subject_resolve
from tests.execute.support import wait_until
from tests.n8n.conftest import TIMINGS
from tests.n8n.support import N8n
from tests.n8n.test_workflow_audit import api_key_when_ready
from tests.support import outbound

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

LEAD, SLOW = "ogErasureLead001", "ogErasureSlow001"
EMAIL = "priya.raman@example.invalid"
CALL = {"call_id": "call_7f3c2a9e41b04d6f", "email": EMAIL, "name": "Priya Raman", "phone": "+61412345678"}


def _workflow(workflow_id: str, path: str, *, wait_seconds: int = 0) -> dict[str, Any]:
    """Webhook → (Wait) → Set: n8n keeps the execution, the lead's fields in it."""
    nodes: list[dict[str, Any]] = [
        {
            "parameters": {"httpMethod": "POST", "path": path, "options": {}},
            "id": f"{workflow_id}-hook",
            "name": "Lead",
            "type": "n8n-nodes-base.webhook",
            "typeVersion": 2.1,
            "position": [0, 0],
            "webhookId": f"{workflow_id}-hook",
        },
        {
            "parameters": {"mode": "raw", "jsonOutput": "={{ $json.body }}", "options": {}},
            "id": f"{workflow_id}-set",
            "name": "Contact",
            "type": "n8n-nodes-base.set",
            "typeVersion": 3.4,
            "position": [400, 0],
        },
    ]
    connections: dict[str, Any] = {"Lead": {"main": [[{"node": "Contact", "type": "main", "index": 0}]]}}
    if wait_seconds:
        nodes.append(
            {
                "parameters": {"amount": wait_seconds},
                "id": f"{workflow_id}-wait",
                "name": "Wait",
                "type": "n8n-nodes-base.wait",
                "typeVersion": 1.1,
                "position": [200, 0],
                "webhookId": f"{workflow_id}-wait",
            }
        )
        connections = {
            "Lead": {"main": [[{"node": "Wait", "type": "main", "index": 0}]]},
            "Wait": {"main": [[{"node": "Contact", "type": "main", "index": 0}]]},
        }
    return {
        "id": workflow_id,
        "name": f"erasure: {path}",
        "active": True,
        "nodes": nodes,
        "connections": connections,
        "settings": {"executionOrder": "v1", "saveDataSuccessExecution": "all"},
    }


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, tmp_path_factory: pytest.TempPathFactory) -> Iterator[N8n]:
    started = time.monotonic()
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-erasure"))
    instance.import_workflows([_workflow(LEAD, "og-erasure-lead"), _workflow(SLOW, "og-erasure-slow", wait_seconds=40)])
    instance.activate(LEAD, SLOW)
    instance.start(active=[LEAD, SLOW])
    outbound.announce(instance.url)
    TIMINGS["erasure: n8n start"] = time.monotonic() - started
    yield instance
    instance.stop()


def claim(tenant: Tenant, n: int, workflow_id: str, execution_id: str) -> None:
    """What the Onceguard node's claim records: the lead, with n8n's workflow and execution."""
    provider = services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )
    services.operation_claim(
        tenant=tenant,
        key=f"call-{n}:crm-contact:v1",
        provider=provider,
        payload=CALL,
        execution_id=execution_id,
        workflow_id=workflow_id,
    )


def test_an_erasure_deletes_the_leads_execution_in_n8n_and_lists_what_n8n_refused_or_lacks(
    n8n: N8n, tenant: Tenant
) -> None:
    key = api_key_when_ready(n8n, ("execution:read", "execution:delete"))
    dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n.url, api_key=key, actor="test")
    # The lead's execution, finished and saved with the person's data.
    assert n8n.webhook("og-erasure-lead", CALL).status_code == 200
    (done,) = n8n.wait_for_executions(LEAD, count=1, statuses=("success",))
    # Another lead's execution, still running (waiting 40 s inside n8n) when the erasure comes.
    assert n8n.webhook("og-erasure-slow", CALL).status_code == 200
    assert wait_until(lambda: [e for e in n8n.executions(SLOW) if e["status"] == "running"], timeout=30)
    (running,) = n8n.executions(SLOW)
    claim(tenant, 1, LEAD, str(done["id"]))
    claim(tenant, 2, SLOW, str(running["id"]))
    # An execution n8n pruned already.
    claim(tenant, 3, LEAD, "987654")

    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": EMAIL}),
        actor="user:ada",
        reason="Erasure request ER-401",
        enqueue=False,
    )
    assert run.n8n_delete  # the tenant has an active n8n connection
    run = erasure.erasure_continue(run_id=run.pk)

    assert run.state == ErasureState.DONE and run.n8n_deleted == 1
    # Gone from n8n's own database; the running one stays, as n8n refused it.
    assert n8n.executions(LEAD) == []
    assert [e["id"] for e in n8n.executions(SLOW)] == [running["id"]]
    left = {item["execution"]: item["outcome"] for item in run.n8n_left}
    assert left == {str(running["id"]): "refused", "987654": "not_found"}
    (row,) = AccessLog.objects.filter(tenant=tenant, action=AccessAction.N8N_DELETE)
    assert row.fields == [f"n8n execution {done['id']}"] and row.object_id == str(run.pk)
    assert "1 n8n execution deleted, 1 n8n execution to remove by hand, 1 n8n execution not found in n8n" in (
        erasure_summary(run)
    )
