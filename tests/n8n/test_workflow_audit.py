"""The workflow audit against a real n8n (1.123): a bad and a good lead workflow imported into
n8n, read back through its public API (``GET /api/v1/workflows``, paged by cursor) with an n8n
API key the tenant's n8n connection holds, and audited by ``manage.py n8n_audit --json``: the
bad one's findings, none for the good one."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from dlq.n8n import api as n8n_api
from dlq.n8n import connections as dlq_connections
from ledger.models import Tenant
from tests.n8n.conftest import TIMINGS
from tests.n8n.support import ONCEGUARD_CREDENTIAL_ID, PACKAGE_NODE_TYPE, CliError, N8n
from tests.support import outbound

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

BAD, GOOD = "ogAuditBadFlow01", "ogAuditGoodFlow1"


def _node(name: str, type_: str, x: int, parameters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "parameters": parameters,
        "id": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
        "name": name,
        "type": type_,
        "typeVersion": extra.pop("typeVersion", 1),
        "position": [x, 0],
        **extra,
    }


def _webhook(path: str) -> dict[str, Any]:
    return _node("Lead", "n8n-nodes-base.webhook", 0, {"httpMethod": "POST", "path": path}, typeVersion=2.1)


def _crm(**extra: Any) -> dict[str, Any]:
    return _node(
        "CRM: Create Contact",
        "n8n-nodes-base.httpRequest",
        600,
        {"method": "POST", "url": "http://127.0.0.1:9/contacts", "options": {}},
        typeVersion=4.2,
        **extra,
    )


def _claim(key: str) -> dict[str, Any]:
    return _node(
        "Claim",
        PACKAGE_NODE_TYPE,
        300,
        {"operation": "claim", "keySource": "key", "key": key, "provider": "crm", "action": "crm-contact"},
        typeVersion=2,
        credentials={"onceguardApi": {"id": ONCEGUARD_CREDENTIAL_ID, "name": "Onceguard API"}},
    )


def bad_workflow() -> dict[str, Any]:
    """The CRM call straight after the webhook; a claim beside it keyed by the execution; no
    error path; every successful execution kept."""
    return {
        "id": BAD,
        "name": "audit: lead to CRM, unguarded",
        "active": False,
        "nodes": [_webhook("og-audit-bad"), _claim("={{ $execution.id }}"), _crm()],
        "connections": {
            "Lead": {
                "main": [
                    [
                        {"node": "CRM: Create Contact", "type": "main", "index": 0},
                        {"node": "Claim", "type": "main", "index": 0},
                    ]
                ]
            }
        },
        "settings": {"executionOrder": "v1", "saveDataSuccessExecution": "all"},
    }


def good_workflow() -> dict[str, Any]:
    """Claim by the call's id, then the CRM with its error output to the DLQ; successes not kept."""
    dead_letter = _node(
        "Dead-letter",
        PACKAGE_NODE_TYPE,
        900,
        {"operation": "deadLetter"},
        typeVersion=2,
        credentials={"onceguardApi": {"id": ONCEGUARD_CREDENTIAL_ID, "name": "Onceguard API"}},
    )
    return {
        "id": GOOD,
        "name": "audit: lead to CRM, guarded",
        "active": False,
        "nodes": [
            _webhook("og-audit-good"),
            _claim("={{ $json.body.call_id }}:crm-contact:v1"),
            _crm(onError="continueErrorOutput"),
            dead_letter,
        ],
        "connections": {
            "Lead": {"main": [[{"node": "Claim", "type": "main", "index": 0}]]},
            "Claim": {"main": [[{"node": "CRM: Create Contact", "type": "main", "index": 0}]]},
            "CRM: Create Contact": {"main": [[], [{"node": "Dead-letter", "type": "main", "index": 0}]]},
        },
        "settings": {"executionOrder": "v1", "saveDataSuccessExecution": "none", "saveDataErrorExecution": "all"},
    }


def api_key_when_ready(n8n: N8n, scopes: tuple[str, ...], *, timeout: float = 60) -> str:
    """An n8n API key, once n8n serves its REST routes: ``/healthz/readiness`` answers before
    they are registered (a 404 for ``/rest/owner/setup`` for a moment after a start with no
    workflow to activate)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return n8n.create_api_key(scopes=scopes)
        except CliError as exc:
            if "answered 404" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, tmp_path_factory: pytest.TempPathFactory) -> Iterator[N8n]:
    started = time.monotonic()
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-audit"))
    instance.import_workflows([bad_workflow(), good_workflow()])
    instance.start()
    outbound.announce(instance.url)
    TIMINGS["audit: n8n start"] = time.monotonic() - started
    yield instance
    instance.stop()


def test_the_audit_reads_the_real_n8ns_workflows_and_flags_the_bad_one_only(
    n8n: N8n, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = api_key_when_ready(n8n, ("workflow:list", "workflow:read"))
    dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n.url, api_key=key, actor="test")
    # One workflow per page: the second page is had through n8n's own cursor.
    monkeypatch.setattr(n8n_api, "WORKFLOWS_PAGE_SIZE", 1)

    out = io.StringIO()
    call_command("n8n_audit", "--tenant", tenant.slug, "--json", stdout=out)

    (report,) = json.loads(out.getvalue())["tenants"]
    by_id = {w["id"]: w for w in report["workflows"]}
    assert set(by_id) == {BAD, GOOD}, report
    assert sorted((f["code"], f["node"]) for f in by_id[BAD]["findings"]) == [
        ("no_error_path", "CRM: Create Contact"),
        ("success_executions_saved", ""),
        ("unguarded_side_effect", "CRM: Create Contact"),
        ("volatile_key", "Claim"),
    ]
    assert by_id[GOOD]["findings"] == [] and by_id[GOOD]["side_effects"] == 1
    assert all(f["fix_path"] for f in by_id[BAD]["findings"])
