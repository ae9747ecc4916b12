"""The OpenAPI schema generates cleanly and the docs page works offline."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client


def test_openapi_schema_generates_without_warnings(tmp_path):
    # --fail-on-warn turns any unresolved view, serializer or authenticator into an error.
    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    text = (tmp_path / "schema.yml").read_text()
    assert "/api/v1/claims:" in text
    # The Bearer API key is documented as the security scheme of every endpoint.
    assert "ApiKey:" in text and "scheme: bearer" in text


@pytest.mark.django_db
def test_docs_page_serves_swagger_from_our_own_static_files():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html


@pytest.mark.django_db
def test_schema_endpoint_answers_without_authentication():
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/operations/{operation_id}/complete" in response.content


def _openapi() -> dict[str, Any]:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def _closed(node: Any) -> Any:
    """The schema as JSON Schema (OpenAPI 3.0's ``nullable`` as a null alternative) with every
    object closed (additionalProperties: false): an answer with a field the schema does not
    declare fails validation, as one missing a required field does."""
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items() if k != "nullable"}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        if node.get("nullable"):
            return {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


def _assert_answer_matches(schema: dict[str, Any], path: str, method: str, response: Any) -> None:
    from jsonschema import Draft202012Validator

    documented = schema["paths"][path][method]["responses"][str(response.status_code)]
    body_schema = documented["content"]["application/json"]["schema"]
    validator = Draft202012Validator({**_closed(body_schema), "components": _closed(schema["components"])})
    errors = sorted(validator.iter_errors(response.json()), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


@pytest.mark.django_db
def test_operation_and_claim_answers_validate_against_the_openapi_schema(api):
    from tests.ledger.support import CLAIM_URL, claim_body, op_url

    schema = _openapi()
    claimed = api.post(CLAIM_URL, claim_body("schema-1"), format="json")
    assert claimed.status_code == 201
    _assert_answer_matches(schema, "/api/v1/claims", "post", claimed)

    op_id = claimed.json()["id"]
    in_flight = api.get(op_url(op_id))
    _assert_answer_matches(schema, "/api/v1/operations/{operation_id}", "get", in_flight)

    done = api.post(
        op_url(op_id, "complete"),
        {"lease_token": claimed.json()["lease_token"], "provider_ref": "ch_1", "response": {"id": "ch_1"}},
        format="json",
    )
    assert done.status_code == 200
    _assert_answer_matches(schema, "/api/v1/operations/{operation_id}/complete", "post", done)

    replayed = api.post(CLAIM_URL, claim_body("schema-1"), format="json")
    assert replayed.status_code == 200 and replayed["Idempotent-Replayed"] == "true"
    _assert_answer_matches(schema, "/api/v1/claims", "post", replayed)

    finished = api.get(op_url(op_id))
    # Every read masks the recorded response (ledger.platform.masking); only the replaying claim has it in clear.
    assert finished.json()["response"] == {"status": 200, "body": {"id": "‹text·4›"}, "masked": True}
    assert replayed.json()["response"] == {"status": 200, "body": {"id": "ch_1"}, "masked": False}
    _assert_answer_matches(schema, "/api/v1/operations/{operation_id}", "get", finished)
