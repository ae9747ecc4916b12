"""The workflow audit's analysis (dlq.n8n.audit.workflow_audit) on workflow JSON fixtures:
what it flags, what it leaves alone, and that every finding names its fix."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dlq.n8n.audit import FIXES, WorkflowReport, workflow_audit

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "integrations" / "n8n" / "workflows"


def node(name: str, type_: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "parameters": extra.pop("parameters", {}), **extra}


def wire(*pairs: tuple[str, str] | tuple[str, str, int]) -> dict[str, Any]:
    connections: dict[str, Any] = {}
    for pair in pairs:
        source, target, output = (*pair, 0) if len(pair) == 2 else pair
        outputs = connections.setdefault(source, {"main": []})["main"]
        while len(outputs) <= output:
            outputs.append([])
        outputs[output].append({"node": target, "type": "main", "index": 0})
    return connections


def workflow(nodes: list[dict[str, Any]], connections: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "id": "wf1",
        "name": "Leads",
        "active": True,
        "nodes": nodes,
        "connections": connections,
        "settings": settings,
    }


def codes(report: WorkflowReport) -> list[tuple[str, str]]:
    return sorted((f.code, f.node) for f in report.findings)


WEBHOOK = node("Lead", "n8n-nodes-base.webhook")
CLAIM = node("Claim", "n8n-nodes-onceguard.onceguard", parameters={"operation": "claim", "record": "={{ $json.id }}"})
CRM = node("CRM", "n8n-nodes-base.hubspot")
DLQ = node("Dead-letter", "n8n-nodes-onceguard.onceguard", parameters={"operation": "deadLetter"})


def test_crm_node_straight_after_the_webhook_is_unguarded_without_error_path_and_saves_successes() -> None:
    report = workflow_audit(workflow([WEBHOOK, CRM], wire(("Lead", "CRM"))))

    assert codes(report) == [
        ("no_error_path", "CRM"),
        ("success_executions_saved", ""),
        ("unguarded_side_effect", "CRM"),
    ]
    assert report.side_effects == 1
    unguarded = next(f for f in report.findings if f.code == "unguarded_side_effect")
    assert unguarded.message.startswith("CRM node with no Onceguard claim before it")


def test_claimed_crm_with_error_output_and_no_saved_successes_has_no_finding() -> None:
    crm = {**CRM, "onError": "continueErrorOutput"}
    report = workflow_audit(
        workflow(
            [WEBHOOK, CLAIM, crm, DLQ],
            wire(("Lead", "Claim"), ("Claim", "CRM"), ("CRM", "Dead-letter", 1)),
            saveDataSuccessExecution="none",
        )
    )

    assert report.findings == []
    assert report.side_effects == 1


def test_an_error_workflow_is_an_error_path_for_every_node() -> None:
    report = workflow_audit(
        workflow(
            [WEBHOOK, CLAIM, CRM],
            wire(("Lead", "Claim"), ("Claim", "CRM")),
            errorWorkflow="ogErrorWorkflow1",
            saveDataSuccessExecution="none",
        )
    )

    assert report.findings == []


def test_error_output_declared_but_not_connected_is_no_error_path() -> None:
    crm = {**CRM, "onError": "continueErrorOutput"}
    report = workflow_audit(
        workflow([WEBHOOK, CLAIM, crm], wire(("Lead", "Claim"), ("Claim", "CRM")), saveDataSuccessExecution="none")
    )

    assert codes(report) == [("no_error_path", "CRM")]


def test_a_claim_after_the_side_effect_does_not_guard_it() -> None:
    report = workflow_audit(
        workflow(
            [WEBHOOK, CRM, CLAIM],
            wire(("Lead", "CRM"), ("CRM", "Claim")),
            errorWorkflow="x",
            saveDataSuccessExecution="none",
        )
    )

    assert codes(report) == [("unguarded_side_effect", "CRM")]


def test_a_disabled_claim_guards_nothing() -> None:
    report = workflow_audit(
        workflow(
            [WEBHOOK, {**CLAIM, "disabled": True}, CRM],
            wire(("Lead", "Claim"), ("Claim", "CRM")),
            errorWorkflow="x",
            saveDataSuccessExecution="none",
        )
    )

    assert codes(report) == [("unguarded_side_effect", "CRM")]


@pytest.mark.parametrize(
    ("type_", "kind"),
    [
        ("n8n-nodes-base.httpRequest", "HTTP request"),
        ("n8n-nodes-base.emailSend", "e-mail"),
        ("n8n-nodes-base.gmailTool", "e-mail"),
        ("n8n-nodes-base.twilio", "SMS"),
        ("n8n-nodes-base.stripe", "payment"),
        ("n8n-nodes-base.salesforce", "CRM"),
    ],
)
def test_side_effect_kinds_by_node_type(type_: str, kind: str) -> None:
    report = workflow_audit(
        workflow([WEBHOOK, node("Effect", type_)], wire(("Lead", "Effect")), saveDataSuccessExecution="none")
    )

    unguarded = next(f for f in report.findings if f.code == "unguarded_side_effect")
    assert unguarded.message.startswith(f"{kind} node")


@pytest.mark.parametrize(
    "type_", ["n8n-nodes-base.set", "n8n-nodes-base.hubspotTrigger", "n8n-nodes-base.respondToWebhook"]
)
def test_nodes_without_outside_effect_are_not_flagged(type_: str) -> None:
    report = workflow_audit(
        workflow([WEBHOOK, node("Step", type_)], wire(("Lead", "Step")), saveDataSuccessExecution="none")
    )

    assert report.findings == [] and report.side_effects == 0


def test_http_request_to_onceguard_itself_is_not_a_side_effect_and_one_to_claims_is_a_claim() -> None:
    report_to_dlq = node(
        "Report",
        "n8n-nodes-base.httpRequest",
        parameters={"method": "POST", "url": "={{ $env.ONCEGUARD_URL }}/api/v1/dlq/events"},
    )
    hardcoded = node(
        "Report too", "n8n-nodes-base.httpRequest", parameters={"url": "http://127.0.0.1:8000/api/v1/dlq/events"}
    )
    http_claim = node(
        "HTTP claim",
        "n8n-nodes-base.httpRequest",
        parameters={
            "url": "http://127.0.0.1:8000/api/v1/claims",
            "headerParameters": {"parameters": [{"name": "Idempotency-Key", "value": "={{ $json.call_id }}:crm:v1"}]},
        },
    )
    crm = node("CRM", "n8n-nodes-base.httpRequest", parameters={"url": "={{ $env.ONCEGUARD_CRM_URL }}/contacts"})
    report = workflow_audit(
        workflow(
            [WEBHOOK, report_to_dlq, hardcoded, http_claim, crm],
            wire(("Lead", "Report"), ("Lead", "Report too"), ("Lead", "HTTP claim"), ("HTTP claim", "CRM")),
            errorWorkflow="x",
            saveDataSuccessExecution="none",
        )
    )

    # Three HTTP Requests to Onceguard, one effect (the CRM), guarded by the claim over HTTP.
    assert report.side_effects == 1
    assert report.findings == []


@pytest.mark.parametrize(
    ("parameters", "label"),
    [
        ({"keySource": "key", "key": "={{ $execution.id }}:crm:v1"}, "$execution.id"),
        ({"record": "={{ $json.id }}-{{ $now.toMillis() }}"}, "$now"),
        ({"record": "={{ Math.random() }}"}, "Math.random()"),
        ({"keySource": "key", "key": "={{ $randomInt(1, 1000000) }}"}, "$randomInt"),
        ({"keySource": "key", "key": "={{ $json.uuid }}"}, "a uuid"),
        ({"record": "={{ Date.now() }}"}, "Date.now()"),
    ],
)
def test_keys_from_the_execution_the_clock_or_chance_are_flagged(parameters: dict[str, Any], label: str) -> None:
    claim = node("Claim", "n8n-nodes-onceguard.onceguard", parameters={"operation": "claim", **parameters})
    report = workflow_audit(
        workflow([WEBHOOK, claim], wire(("Lead", "Claim")), saveDataSuccessExecution="none", errorWorkflow="x")
    )

    assert codes(report) == [("volatile_key", "Claim")]
    assert label in report.findings[0].message


def test_volatile_idempotency_header_of_an_http_claim_is_flagged() -> None:
    http_claim = node(
        "HTTP claim",
        "n8n-nodes-base.httpRequest",
        parameters={
            "url": "={{ $env.ONCEGUARD_URL }}/api/v1/claims",
            "headerParameters": {"parameters": [{"name": "Idempotency-Key", "value": "={{ $execution.id }}"}]},
        },
    )
    report = workflow_audit(
        workflow([WEBHOOK, http_claim], wire(("Lead", "HTTP claim")), saveDataSuccessExecution="none")
    )

    assert codes(report) == [("volatile_key", "HTTP claim")]


def test_a_business_key_with_an_execution_word_in_another_parameter_is_not_flagged() -> None:
    # Only the key parameters count: a payload that mentions the execution is fine.
    claim = node(
        "Claim",
        "n8n-nodes-onceguard.onceguard",
        parameters={"operation": "claim", "record": "={{ $json.order_id }}", "payloadJson": "={{ $execution.id }}"},
    )
    report = workflow_audit(
        workflow([WEBHOOK, claim], wire(("Lead", "Claim")), saveDataSuccessExecution="none", errorWorkflow="x")
    )

    assert report.findings == []


@pytest.mark.parametrize(("saved", "word"), [("all", "(all)"), (None, "not set")])
def test_successful_executions_saved_or_left_to_the_instance_default_are_flagged(saved: str | None, word: str) -> None:
    settings = {"saveDataSuccessExecution": saved} if saved else {}
    report = workflow_audit(workflow([WEBHOOK], {}, **settings))

    assert codes(report) == [("success_executions_saved", "")]
    assert word in report.findings[0].message


def test_malformed_workflow_json_is_audited_without_raising() -> None:
    report = workflow_audit({"id": 7, "nodes": [None, {"name": 3}, {"name": "A"}], "connections": {"A": {"main": "x"}}})

    assert report.id == "7"
    assert codes(report) == [("success_executions_saved", "")]


def test_every_finding_names_a_fix_that_exists_in_the_repository() -> None:
    for title, path in FIXES.values():
        assert title
        assert (REPO / path.split("#")[0]).exists(), path


def test_the_shipped_templates_are_audited_and_the_guarded_charge_has_its_claim() -> None:
    reports = {p.stem: workflow_audit(json.loads(p.read_text())) for p in sorted(TEMPLATES.glob("*.json"))}

    charge = reports["guarded-charge"]
    assert ("unguarded_side_effect", "Charge") not in codes(charge)
    assert ("no_error_path", "Charge") not in codes(charge)
    # The error workflow reports to Onceguard over HTTP: not a side effect.
    assert reports["error-workflow"].side_effects == 0


# --- Read from n8n: the command and the console page (a loopback n8n API) ----------------------------

KEY = "n8n-api-key.eyJhbGciOiJIUzI1NiJ9.audit-test-only"
BAD = {
    "id": "wfBad",
    "name": "Lead to CRM (unguarded)",
    "active": True,
    "nodes": [
        WEBHOOK,
        node("Claim", "n8n-nodes-onceguard.onceguard", parameters={"keySource": "key", "key": "={{ $execution.id }}"}),
        node("CRM", "n8n-nodes-base.httpRequest", parameters={"url": "https://crm.example.invalid/contacts"}),
    ],
    "connections": wire(("Lead", "CRM"), ("Lead", "Claim")),
    "settings": {"saveDataSuccessExecution": "all"},
}
GOOD = workflow(
    [WEBHOOK, CLAIM, {**CRM, "onError": "continueErrorOutput"}, DLQ],
    wire(("Lead", "Claim"), ("Claim", "CRM"), ("CRM", "Dead-letter", 1)),
    saveDataSuccessExecution="none",
) | {"id": "wfGood", "name": "Lead to CRM (guarded)"}
PLAIN = workflow([WEBHOOK], {}, saveDataSuccessExecution="none") | {"id": "wfPlain", "name": "Just a webhook"}


@pytest.fixture
def n8n_api() -> Any:
    from tests.dlq.n8n_api import FakeN8nApi

    api = FakeN8nApi().start()
    api.workflows = [BAD, GOOD, PLAIN]
    yield api
    api.stop()


@pytest.fixture
def connected(tenant: Any, n8n_api: Any) -> Any:
    from dlq.n8n import connections as dlq_connections

    return dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, api_key=KEY, actor="test")


def audit_json(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("n8n_audit", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_the_command_reads_every_page_of_workflows_and_lists_the_findings(tenant, connected, n8n_api):
    document = audit_json("--tenant", tenant.slug)

    (report,) = document["tenants"]
    by_id = {w["id"]: w for w in report["workflows"]}
    assert set(by_id) == {"wfBad", "wfGood", "wfPlain"}
    assert sorted((f["code"], f["node"]) for f in by_id["wfBad"]["findings"]) == [
        ("no_error_path", "CRM"),
        ("success_executions_saved", ""),
        ("unguarded_side_effect", "CRM"),
        ("volatile_key", "Claim"),
    ]
    assert by_id["wfGood"]["findings"] == [] and by_id["wfPlain"]["findings"] == []
    # Worst first; every finding names its fix.
    assert report["workflows"][0]["id"] == "wfBad" and report["findings"] == 4
    assert all(f["fix"] and f["fix_path"] for f in by_id["wfBad"]["findings"])
    # Two pages (two per page), the second by n8n's cursor, each with the connection's key.
    assert [path for _, path in n8n_api.calls] == [
        "/api/v1/workflows?limit=100",
        "/api/v1/workflows?limit=100&cursor=2",
    ]
    assert {a.header("X-N8N-API-KEY") for a in n8n_api.asked} == {KEY}


def test_the_command_in_words_names_each_finding_and_its_fix(tenant, connected, n8n_api):
    out = io.StringIO()
    call_command("n8n_audit", stdout=out)

    text = out.getvalue()
    assert "acme: " in text and "3 workflow(s), 1 with findings, 4 finding(s)" in text
    assert "unguarded_side_effect: CRM: HTTP request node with no Onceguard claim" in text
    assert "fix: " in text and "integrations/n8n/workflows/guarded-charge.json" in text


def test_the_command_says_why_the_workflows_cannot_be_read(tenant, connected, n8n_api, other_tenant):
    n8n_api.script = [403]
    err = io.StringIO()
    with pytest.raises(CommandError, match="could not be read"):
        call_command("n8n_audit", "--tenant", tenant.slug, stderr=err)
    assert "workflow:list" in err.getvalue()
    with pytest.raises(CommandError, match="No tenant"):
        call_command("n8n_audit", "--tenant", "nobody")
    err = io.StringIO()
    with pytest.raises(CommandError, match="could not be read"):
        call_command("n8n_audit", "--tenant", other_tenant.slug, stderr=err)
    assert "globex: The tenant has no n8n connection" in err.getvalue()


def test_the_console_page_shows_the_findings_to_those_who_may_see_the_n8n_connection(
    tenant, other_tenant, connected, n8n_api
):
    from tests.console.support import client_for, staff

    operator = client_for(staff("olga", role="operator", tenants=[tenant]))
    page = operator.get("/admin/onceguard/n8n-audit/")
    html = page.content.decode()
    assert page.status_code == 200 and page["Cache-Control"].startswith("no-store")
    assert 'data-workflow="wfBad"' in html and 'data-finding="unguarded_side_effect"' in html
    assert "guarded-charge.json" in html
    # A reviewer may not see n8n's configuration; another tenant's user sees no connection.
    reviewer = client_for(staff("rita", role="reviewer", tenants=[tenant]))
    assert reviewer.get("/admin/onceguard/n8n-audit/").status_code == 403
    stranger = client_for(staff("sam", role="admin", tenants=[other_tenant]))
    calls = len(n8n_api.calls)
    html = stranger.get(f"/admin/onceguard/n8n-audit/?tenant={tenant.pk}").content.decode()
    assert 'data-testid="audit-none"' in html and len(n8n_api.calls) == calls
    # n8n refusing shows why, not a server error.
    n8n_api.script = [403]
    html = operator.get(f"/admin/onceguard/n8n-audit/?tenant={tenant.pk}").content.decode()
    assert 'data-testid="audit-problem"' in html and "workflow:list" in html
