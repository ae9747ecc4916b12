"""The workflow audit's analysis (dlq.n8n_audit.workflow_audit) on workflow JSON fixtures:
what it flags, what it leaves alone, and that every finding names its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlq.n8n_audit import FIXES, WorkflowReport, workflow_audit

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
            [WEBHOOK, report_to_dlq, http_claim, crm],
            wire(("Lead", "Report"), ("Lead", "HTTP claim"), ("HTTP claim", "CRM")),
            errorWorkflow="x",
            saveDataSuccessExecution="none",
        )
    )

    # Two HTTP Requests to Onceguard, one effect (the CRM), guarded by the claim over HTTP.
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
