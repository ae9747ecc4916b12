"""Malformed input is a 4xx problem+json, never a 500, and records nothing (DESIGN §5)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings

from tests.ledger.support import CLAIM_URL, PROBLEM_JSON, assert_problem, claim_body, ledger_counts, op_url, row

pytestmark = pytest.mark.django_db


def raw_post(api: Any, url: str, body: bytes | str, content_type: str = "application/json") -> Any:
    return api.generic("POST", url, body, content_type=content_type)


def assert_refused_and_nothing_written(response: Any, before: dict[str, int], status: int | None = None) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    if status is not None:
        assert response.status_code == status
    assert response["Content-Type"] == PROBLEM_JSON
    assert isinstance(json.loads(response.content)["code"], str)
    assert ledger_counts() == before


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"key": "a", }',
        b"not json at all",
        b"\xff\xfe\x00garbage",
        b"{'key': 'single-quoted'}",
        b'{"key": "a", "lease_seconds": NaN}',
        b'{"key": "a", "lease_seconds": Infinity}',
    ],
    ids=["truncated", "trailing-comma", "text", "binary", "single-quotes", "nan", "infinity"],
)
def test_invalid_json_is_a_400_malformed_json(api, body):
    before = ledger_counts()

    response = raw_post(api, CLAIM_URL, body)

    assert_problem(response, 400, "malformed_json")
    assert_refused_and_nothing_written(response, before)


def test_the_parser_error_does_not_echo_the_body(api):
    response = raw_post(api, CLAIM_URL, b'{"key": "secret-customer@example.com" oops}')

    assert b"example.com" not in response.content


@pytest.mark.parametrize(
    "body",
    [b"[]", json.dumps([claim_body()]).encode(), b'"a string"', b"42", b"null", b"true"],
    ids=["empty-array", "array-of-claims", "string", "number", "null", "true"],
)
def test_a_json_body_that_is_not_an_object_is_a_400(api, body):
    before = ledger_counts()

    response = raw_post(api, CLAIM_URL, body)

    assert_refused_and_nothing_written(response, before, status=400)


def test_an_empty_body_is_a_400(api):
    before = ledger_counts()

    response = raw_post(api, CLAIM_URL, b"")

    assert_refused_and_nothing_written(response, before, status=400)


def test_a_non_json_content_type_is_a_415(api):
    before = ledger_counts()

    response = raw_post(api, CLAIM_URL, "key=a&provider=stripe", content_type="application/x-www-form-urlencoded")

    assert_problem(response, 415, "unsupported_media_type")
    assert_refused_and_nothing_written(response, before)


@pytest.mark.parametrize(
    "overrides",
    [
        {"lease_seconds": "abc"},
        {"lease_seconds": -5},
        {"lease_seconds": [1]},
        {"provider": 12345},
        {"provider": ["stripe"]},
        {"provider": {"slug": "stripe"}},
        {"provider": None},
        {"provider": "not a slug!"},
        {"key": {"nested": "key"}},
        {"key": ["a"]},
        {"key": True},
        {"action": ["charge"]},
        {"action": "a" * 101},
        {"execution_id": {"id": 1}},
        {"uses_sent_marker": "perhaps"},
        {"reconciliation_handle": "h" * 256},
        {"correlation_id": ["c"]},
    ],
    ids=lambda o: "-".join(f"{k}={str(v)[:12]}" for k, v in o.items()),
)
def test_wrong_types_are_a_400_and_write_nothing(api, overrides):
    before = ledger_counts()

    response = api.post(CLAIM_URL, claim_body(**overrides), format="json")

    assert_refused_and_nothing_written(response, before, status=400)


def test_a_missing_provider_is_a_400(api):
    body = claim_body()
    del body["provider"]
    before = ledger_counts()

    response = api.post(CLAIM_URL, body, format="json")

    body = assert_problem(response, 400, "validation_error")
    assert "provider" in body["errors"]
    assert ledger_counts() == before


@pytest.mark.parametrize("key", ["", "k" * 256, "ctrl\x01char", "nul\x00", "bell\x07", "newline\n", "\u2028sep"])
def test_bad_keys_are_refused_and_write_nothing(api, key):
    before = ledger_counts()

    response = api.post(CLAIM_URL, claim_body(key), format="json")

    assert_refused_and_nothing_written(response, before, status=400)


@pytest.mark.parametrize("key", ["", "k" * 256, "ctrl\x01char"], ids=["empty", "256", "ctrl"])
def test_bad_keys_in_the_header_are_refused_and_write_nothing(api, key):
    before = ledger_counts()

    response = api.post(CLAIM_URL, claim_body(None), format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert_refused_and_nothing_written(response, before, status=400)


def test_a_10_mb_body_is_a_413_payload_too_large(api):
    before = ledger_counts()
    body = json.dumps(claim_body(payload={"blob": "x" * (10 * 1024 * 1024)}))

    response = raw_post(api, CLAIM_URL, body)

    problem = assert_problem(response, 413, "payload_too_large")
    assert problem["limit"] == settings.MAX_REQUEST_BYTES
    assert_refused_and_nothing_written(response, before)


def test_a_10_mb_body_is_refused_before_authentication(db):
    from rest_framework.test import APIClient

    response = raw_post(APIClient(), CLAIM_URL, b"{" + b" " * (10 * 1024 * 1024) + b"}")

    assert_problem(response, 413, "payload_too_large")


def test_a_body_just_under_the_limit_is_accepted(api):
    envelope = len(json.dumps(claim_body(payload={"blob": ""})).encode())
    body = json.dumps(claim_body(payload={"blob": "x" * (settings.MAX_REQUEST_BYTES - envelope)}))
    assert len(body.encode()) == settings.MAX_REQUEST_BYTES

    response = raw_post(api, CLAIM_URL, body)

    assert response.status_code == 201, response.content[:300]


def test_deeply_nested_json_is_a_4xx_not_a_500(api):
    before = ledger_counts()
    depth = 100_000

    response = raw_post(
        api, CLAIM_URL, b'{"key": "deep", "provider": "stripe", "request": ' + b"[" * depth + b"]" * depth + b"}"
    )

    assert_refused_and_nothing_written(response, before)


@pytest.mark.parametrize("field", ["request", "payload"])
def test_a_nul_character_inside_json_values_is_a_4xx_not_a_500(api, field):
    before = ledger_counts()

    response = api.post(CLAIM_URL, claim_body(**{field: {"note": "a\x00b"}}), format="json")

    assert_refused_and_nothing_written(response, before, status=400)


@pytest.mark.parametrize("field", ["action", "execution_id", "workflow_id", "correlation_id", "reconciliation_handle"])
def test_a_nul_character_in_text_fields_is_a_400(api, field):
    before = ledger_counts()

    response = api.post(CLAIM_URL, claim_body(**{field: "a\x00b"}), format="json")

    assert_refused_and_nothing_written(response, before, status=400)


# --- holder calls ----------------------------------------------------------------------


@pytest.fixture
def held(api: Any) -> dict[str, Any]:
    return api.post(CLAIM_URL, claim_body(), format="json").json()


@pytest.mark.parametrize(
    ("verb", "body"),
    [
        ("complete", b"{"),
        ("complete", b"[]"),
        ("complete", {"provider_ref": "ch_1"}),
        ("complete", {"lease_token": ["x"]}),
        ("complete", {"lease_token": "t", "response_status": "ok"}),
        ("complete", {"lease_token": "t", "response_status": 99}),
        ("complete", {"lease_token": "t", "response": {"a": "\x00"}}),
        ("fail", {"lease_token": "t"}),
        ("fail", {"lease_token": "t", "error_class": "boom"}),
        ("fail", {"lease_token": "t", "error_class": "transient", "retry_after_seconds": "soon"}),
        ("sent", {"lease_token": "t", "reconciliation_handle": {"a": 1}}),
        ("heartbeat", {"lease_token": "t", "lease_seconds": "abc"}),
    ],
    ids=lambda v: v if isinstance(v, str) else json.dumps(v, default=str)[:30] if not isinstance(v, bytes) else "raw",
)
def test_malformed_holder_calls_are_a_400_and_change_nothing(api, held, verb, body):
    before = ledger_counts()
    snapshot = row(held["id"])
    if isinstance(body, dict) and body.get("lease_token") == "t":
        body = {**body, "lease_token": held["lease_token"]}

    if isinstance(body, bytes):
        response = raw_post(api, op_url(held["id"], verb), body)
    else:
        response = api.post(op_url(held["id"], verb), body, format="json")

    assert_refused_and_nothing_written(response, before, status=400)
    assert row(held["id"]) == snapshot


def test_a_non_numeric_operation_id_is_a_404_problem(api):
    response = api.get("/api/v1/operations/abc")

    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM_JSON


@pytest.mark.parametrize(
    "query",
    ["status=bogus", "updated_after=yesterday", "cursor=!!!notacursor", "page_size=abc"],
)
def test_malformed_list_queries_are_4xx_or_ignored_never_500(api, query):
    response = api.get(f"/api/v1/operations?{query}")

    assert response.status_code in (200, 400, 404), response.content
    if response.status_code != 200:
        assert response["Content-Type"] == PROBLEM_JSON


def test_an_unknown_api_path_is_a_404_problem(api):
    response = api.get("/api/v1/no-such-thing")

    assert_problem(response, 404, "not_found")


def test_an_unknown_console_path_keeps_the_html_404(client):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_json_nested_64_deep_is_accepted_and_65_deep_is_a_400(api):
    ok = api.post(CLAIM_URL, claim_body("depth-64", request=_nested(63)), format="json")
    too_deep = api.post(CLAIM_URL, claim_body("depth-65", request=_nested(64)), format="json")

    assert ok.status_code == 201, ok.content[:300]
    assert_problem(too_deep, 400, "malformed_json")


def _nested(levels: int) -> Any:
    # `levels` lists inside the claim's top-level object.
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "mistake",
    [
        {"provider": "paypal"},
        {"lease_seconds": "abc"},
        {"action": ["charge"]},
        {"payload": {"note": "a\x00b"}},
        {"payload": {"blob": "x" * (2 * 1024 * 1024)}},
    ],
    ids=["unknown-provider", "bad-lease", "bad-action", "nul-payload", "too-large"],
)
def test_a_refused_claim_leaves_no_trace_so_the_corrected_retry_succeeds(api, mistake):
    refused = api.post(CLAIM_URL, claim_body("retry-me", **mistake), format="json")
    assert refused.status_code in (400, 413)

    corrected = api.post(CLAIM_URL, claim_body("retry-me"), format="json")

    assert corrected.status_code == 201, corrected.content
    assert corrected.json()["attempt"] == 1


def test_a_claim_refused_for_auth_leaves_no_trace(api, tenant, make_client):
    reader = make_client(tenant, scopes=["read"])
    assert reader.post(CLAIM_URL, claim_body("auth-retry"), format="json").status_code == 403

    assert api.post(CLAIM_URL, claim_body("auth-retry"), format="json").status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        b'{"key": "a", "provider": "stripe", "lease_seconds": 1e400}',
        b'{"key": "a", "provider": "stripe", "request": {"n": -1e400}}',
        b'{"key": "a", "provider": "stripe", "payload": {"n": 1e400}}',
        b'{"key": "a", "provider": "stripe", "payload": {"\\ud800": "lone surrogate key"}}',
        b'{"key": "a", "provider": "stripe", "payload": ["\\udfff"]}',
        b'{"key": "\\ud800", "provider": "stripe"}',
    ],
    ids=["inf-lease", "inf-request", "inf-payload", "surrogate-key-in-payload", "surrogate-value", "surrogate-key"],
)
def test_json_that_parses_but_cannot_be_stored_is_a_400(api, body):
    before = ledger_counts()

    response = raw_post(api, CLAIM_URL, body)

    assert_problem(response, 400, "malformed_json")
    assert ledger_counts() == before


def test_an_overflowing_number_in_a_complete_response_is_a_400(api, held):
    snapshot = row(held["id"])
    body = b'{"lease_token": "%s", "response": {"amount": 1e999}}' % held["lease_token"].encode()

    response = raw_post(api, op_url(held["id"], "complete"), body)

    assert_problem(response, 400, "malformed_json")
    assert row(held["id"]) == snapshot
