"""The workflow templates as files (no n8n needed): every dead-letter step is retried with a
pause and has an error output to n8n's Stop and Error naming the lead's key, so a DLQ that is
briefly unreachable never loses a lead silently (the execution fails visibly in n8n)."""

from __future__ import annotations

import json
import re

import pytest

from tests.n8n.support import WORKFLOWS_DIR

DLQ_STEPS = {
    "lead-to-crm": "Dead-letter the lead",
    "lead-to-crm-http": "Dead-letter the lead",
    "error-workflow": "Report to Onceguard DLQ",
}


@pytest.mark.parametrize("name", sorted(DLQ_STEPS))
def test_every_dead_letter_step_retries_then_stops_with_the_leads_key(name: str) -> None:
    workflow = json.loads((WORKFLOWS_DIR / f"{name}.json").read_text())
    nodes = {node["name"]: node for node in workflow["nodes"]}
    step = nodes[DLQ_STEPS[name]]
    assert step["retryOnFail"] is True and step["maxTries"] >= 3 and step["waitBetweenTries"] >= 1000
    assert step["onError"] == "continueErrorOutput"
    (error_branch,) = workflow["connections"][step["name"]]["main"][1]
    stop = nodes[error_branch["node"]]
    assert stop["type"] == "n8n-nodes-base.stopAndError"
    assert "key" in stop["parameters"]["errorMessage"] and "not stored" in stop["parameters"]["errorMessage"]


@pytest.mark.parametrize("path", sorted(WORKFLOWS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_url_a_template_calls_comes_from_an_n8n_environment_variable(path) -> None:
    # Imported as they are, the templates call what the n8n's environment names
    # (ONCEGUARD_URL, ONCEGUARD_CRM_URL, ONCEGUARD_CHARGES_URL), `make run`'s demo ports otherwise.
    for node in json.loads(path.read_text())["nodes"]:
        url = node["parameters"].get("url")
        if url is not None:
            assert re.fullmatch(r"=\{\{ \$env\.ONCEGUARD_[A-Z_]*URL \|\| 'http://127\.0\.0\.1:80\d\d' \}\}/.+", url), (
                url
            )


TEMPLATES = sorted(WORKFLOWS_DIR.glob("*.json"))


def load(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_every_template_keeps_failed_executions_and_no_successful_one(path) -> None:
    # n8n keeps an execution's data (the lead's name, e-mail, phone) as long as it keeps the
    # execution: successful ones are not kept at all, failed ones are, for a person to retry.
    settings = load(path)["settings"]
    assert settings["saveDataSuccessExecution"] == "none" and settings["saveDataErrorExecution"] == "all"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_every_onceguard_node_of_a_template_is_version_2(path) -> None:
    nodes = [n for n in load(path)["nodes"] if n["type"] == "n8n-nodes-onceguard.onceguard"]
    assert all(n["typeVersion"] == 2 for n in nodes), [(n["name"], n["typeVersion"]) for n in nodes]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_every_webhook_of_a_template_authenticates_its_caller(path) -> None:
    workflow = load(path)
    for hook in (n for n in workflow["nodes"] if n["type"] == "n8n-nodes-base.webhook"):
        if hook["parameters"].get("authentication") == "headerAuth":
            assert hook["credentials"]["httpHeaderAuth"]["id"] == "ogCredWebhookIn1"
            continue
        # The replay receiver checks Onceguard's signature over the raw body instead: the body
        # as text (Extract from File, whatever n8n's binary data mode), then its HMAC.
        assert hook["parameters"]["options"].get("rawBody") is True, hook["name"]
        nodes = {n["name"]: n for n in workflow["nodes"]}
        (after,) = workflow["connections"][hook["name"]]["main"][0]
        assert nodes[after["node"]]["type"] == "n8n-nodes-base.extractFromFile"
        (after,) = workflow["connections"][after["node"]]["main"][0]
        crypto = nodes[after["node"]]
        assert crypto["type"] == "n8n-nodes-base.crypto" and crypto["parameters"]["action"] == "hmac"
        assert "ONCEGUARD_REPLAY_SIGNING_SECRET" in crypto["parameters"]["secret"]


@pytest.mark.parametrize("name", ["lead-to-crm", "lead-to-crm-http"])
def test_a_lead_template_answers_the_sender_first_then_claims_before_the_crm_and_completes_after(name) -> None:
    workflow = json.loads((WORKFLOWS_DIR / f"{name}.json").read_text())
    connections = workflow["connections"]

    def next_of(node: str, output: int = 0) -> list[str]:
        return [link["node"] for link in connections.get(node, {}).get("main", [[]])[output]]

    assert next_of("Call analyzed") == ["Respond: lead received"]
    assert next_of("Contact") == ["Claim the lead"]
    path, node = [], "Claim the lead"
    while node != "CRM: Create Contact" and len(path) < 5:
        (node,) = next_of(node)
        path.append(node)
    assert path[-2:] == ["Mark sent", "CRM: Create Contact"], path
    assert next_of("CRM: Create Contact") == ["Complete"]
    assert next_of("CRM: Create Contact", 1) == ["Dead-letter the lead"] and next_of("Dead-letter the lead") == ["Fail"]


def test_the_replay_receiver_acknowledges_only_from_its_success_answer_after_the_crm_call() -> None:
    # ADR 0007: Onceguard counts a replay to an `echo` target only with Onceguard-Ack, so the
    # receiver computes it after the CRM call and answers it from the success path alone; n8n's
    # own answer for a workflow that stopped earlier carries none.
    workflow = load(WORKFLOWS_DIR / "replay-receiver.json")
    nodes = {node["name"]: node for node in workflow["nodes"]}
    connections = workflow["connections"]
    ack = nodes["Acknowledge the replay"]
    assert ack["type"] == "n8n-nodes-base.crypto" and ack["parameters"]["action"] == "hmac"
    assert ack["parameters"]["type"] == "SHA256" and ack["parameters"]["encoding"] == "hex"
    assert "'ack.' + " in ack["parameters"]["value"] and "onceguard-replay-id" in ack["parameters"]["value"]
    assert ack["parameters"]["secret"] == "={{ $env.ONCEGUARD_REPLAY_SIGNING_SECRET || '' }}"
    assert connections["CRM: Create Contact"]["main"][0] == [
        {"node": "Acknowledge the replay", "type": "main", "index": 0}
    ]
    assert connections["Acknowledge the replay"]["main"][0] == [
        {"node": "Respond: replayed", "type": "main", "index": 0}
    ]
    answering = {
        name: node["parameters"].get("options", {}).get("responseHeaders", {}).get("entries", [])
        for name, node in nodes.items()
        if node["type"] == "n8n-nodes-base.respondToWebhook"
    }
    acknowledging = {name for name, headers in answering.items() if any(h["name"] == "Onceguard-Ack" for h in headers)}
    assert acknowledging == {"Respond: replayed"}
