"""The ingest parser: identities by DESIGN §4, unknown shapes kept raw, error classes."""

from __future__ import annotations

import hashlib
import json

import pytest

from dlq.ingest.parsing import error_class_from_report, parse_failure
from dlq.models import FailedEventShape
from ledger.platform.errors import MalformedJson, ValidationFailed
from ledger.rules.search import search_values
from tests.dlq.conftest import example, example_bytes


def test_n8n_execution_variant_identity_is_workflow_and_execution_and_retry_of_names_the_earlier_one():
    parsed = parse_failure(example_bytes("n8n-error-trigger-execution.json"))
    assert parsed.shape == FailedEventShape.N8N_EXECUTION
    assert parsed.identity == "n8n:17:4812"
    assert parsed.retry_of == "n8n:17:4790"
    assert not parsed.weak
    assert parsed.source["execution_url"].endswith("/executions/4812")
    assert parsed.source["node"] == "CRM: Create Contact"
    assert parsed.source["mode"] == "webhook"
    # "[429]" in n8n's message: a rate limit, transient by DESIGN §3.
    assert parsed.error_class == "transient"
    assert parsed.payload == example("n8n-error-trigger-execution.json")


def test_n8n_trigger_variant_identity_is_workflow_timestamp_and_node():
    parsed = parse_failure(example_bytes("n8n-error-trigger-trigger.json"))
    assert parsed.shape == FailedEventShape.N8N_TRIGGER
    assert parsed.identity == "n8n:18:trigger:1764480000000:Webhook"
    assert not parsed.weak
    assert parsed.failed_at is not None and parsed.failed_at.year == 2025
    assert "Workflow could not be activated" in parsed.error_message


def keyed(raw: bytes) -> str:
    from ledger.platform.crypto import digest

    kid, hexdigest = digest(raw.decode("latin-1"))
    return f"hmac:{kid}:{hexdigest}"


def test_an_unsaved_n8n_execution_without_id_falls_back_to_a_weak_identity():
    body = example("n8n-error-trigger-execution.json")
    del body["execution"]["id"]
    raw = json.dumps(body).encode()
    parsed = parse_failure(raw)
    assert parsed.weak and parsed.identity == keyed(raw)
    assert parsed.shape == FailedEventShape.N8N_EXECUTION


def test_a_one_item_list_from_an_http_request_node_is_understood():
    raw = json.dumps([example("n8n-error-trigger-execution.json")]).encode()
    parsed = parse_failure(raw)
    assert parsed.identity == "n8n:17:4812"
    assert isinstance(parsed.payload, list)


def test_unknown_json_is_kept_raw_with_a_weak_identity_from_the_body_digest():
    raw = example_bytes("voice-call-analyzed.json")
    parsed = parse_failure(raw)
    assert parsed.shape == FailedEventShape.RAW
    assert parsed.weak
    assert parsed.identity == keyed(raw)
    # Never a bare hash a small body could be guessed back from (DESIGN §6).
    assert hashlib.sha256(raw).hexdigest() not in parsed.identity
    assert parsed.payload == example("voice-call-analyzed.json")


@pytest.mark.parametrize("raw", [b"\xff\xfe not json at all", b"not json", b"", b"  "])
def test_a_body_that_is_not_json_is_refused(raw):
    with pytest.raises(MalformedJson):
        parse_failure(raw)


def test_envelope_with_explicit_event_id_and_key():
    body = {
        "event_id": "crm-export:lead-77",
        "idempotency_key": "lead-77:crm:create:v1",
        "payload": example("crm-create-contact-request.json"),
        "error": {"message": "CRM answered 429", "class": "transient"},
        "source": {"workflow_id": "17", "execution_id": "9"},
        "replay_target": "crm",
    }
    parsed = parse_failure(json.dumps(body).encode())
    assert parsed.shape == FailedEventShape.ENVELOPE
    assert parsed.identity == "crm-export:lead-77"
    assert parsed.original_key == "lead-77:crm:create:v1"
    assert parsed.error_class == "transient"
    assert parsed.replay_target_slug == "crm"
    assert parsed.payload == body["payload"]


def test_envelope_without_event_id_shares_the_n8n_identity_of_its_execution():
    body = {"payload": {"a": 1}, "source": {"workflow_id": "17", "execution_id": "4812"}, "error": "boom"}
    assert parse_failure(json.dumps(body).encode()).identity == "n8n:17:4812"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"payload": {}, "error_class": "bogus"}, ValidationFailed),
        ({"payload": {}, "event_id": "x" * 300}, ValidationFailed),
        ({"payload": {}, "event_id": "e", "retry_count": -1}, ValidationFailed),
    ],
)
def test_a_malformed_envelope_is_refused_with_a_named_error(body, error):
    with pytest.raises(error):
        parse_failure(json.dumps(body).encode())


@pytest.mark.parametrize("key", [" padded ", "lead-\uff43:1", "a\x07b", "x" * 256])
def test_an_envelope_whose_key_breaks_the_key_rule_is_kept_with_no_usable_key(key):
    # Never refused for its key: the failure report is what matters (ledger.rules.key_rules).
    parsed = parse_failure(json.dumps({"payload": {}, "event_id": "e", "idempotency_key": key}).encode())
    assert parsed.original_key == ""


@pytest.mark.parametrize(
    ("message", "http_code", "expected"),
    [
        ("The service is receiving too many requests from you [429]", None, "transient"),
        ("Bad request - please check your parameters", 400, "invalid_input"),
        ("Authorization failed", "403", "permission"),
        ("Request failed with status code 502", None, "ambiguous"),
        ("connect ECONNREFUSED 10.0.0.1:443", None, "transient"),
        ("socket hang up ECONNRESET", None, "ambiguous"),
        ("Something odd happened", None, ""),
    ],
)
def test_error_class_is_read_from_the_http_code_or_network_error(message, http_code, expected):
    assert error_class_from_report(message=message, http_code=http_code) == expected


def test_search_values_copy_only_the_configured_scalar_paths_as_text():
    payload = example("voice-call-analyzed.json")
    found = search_values(payload, ["event_type", "call.agent_id", "call.call_analysis", "call.missing"])
    assert found == {"event_type": "call_analyzed", "call.agent_id": "agent_insurance_quotes"}
