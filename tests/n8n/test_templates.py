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
            assert re.fullmatch(r"=\{\{ \$env\.ONCEGUARD_[A-Z_]*URL \|\| 'http://127\.0\.0\.1:80\d\d' \}\}/\S+", url), (
                url
            )
