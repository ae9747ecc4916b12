"""Request bodies are validated by the DRF input serializers as declared: what a client sees
for coercions, trimming, defaults and refusals (each refusal a 400 problem naming the field)."""

from __future__ import annotations

import pytest

from tests.ledger.support import CLAIM_URL, PROBLEM_JSON, claim_body, op_url

pytestmark = pytest.mark.django_db


def test_drf_coercions_and_trimming_apply_to_a_claim(api):
    response = api.post(
        CLAIM_URL,
        claim_body("input-1", action="  charge  ", lease_seconds="30", uses_sent_marker="true"),
        format="json",
    )

    assert response.status_code == 201, response.json()
    assert response.json()["action"] == "charge"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"provider": "not a slug!"}, "provider"),
        ({"action": "a" * 101}, "action"),
        ({"lease_seconds": -1}, "lease_seconds"),
        ({"lease_seconds": "soon"}, "lease_seconds"),
        ({"uses_sent_marker": "perhaps"}, "uses_sent_marker"),
        ({"request": {"note": "a\x00b"}}, "request"),
        ({"execution_id": ["not", "text"]}, "execution_id"),
    ],
)
def test_a_field_the_serializer_refuses_is_a_400_problem_naming_it(api, overrides, field):
    from ledger.models import Operation

    response = api.post(CLAIM_URL, claim_body("input-2", **overrides), format="json")

    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM_JSON
    assert response.json()["code"] == "validation_error"
    assert list(response.json()["errors"]) == [field]
    assert not Operation.objects.exists()


@pytest.mark.parametrize("body", [[], "text", 42, [{"lease_token": "t"}]])
def test_a_body_that_is_not_an_object_is_a_400_problem(api, body):
    created = api.post(CLAIM_URL, claim_body("input-3"), format="json").json()

    response = api.post(op_url(created["id"], "complete"), body, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"


def test_completion_defaults_and_range_checks(api):
    created = api.post(CLAIM_URL, claim_body("input-4"), format="json").json()
    refused = api.post(
        op_url(created["id"], "complete"),
        {"lease_token": created["lease_token"], "response_status": 600},
        format="json",
    )
    done = api.post(op_url(created["id"], "complete"), {"lease_token": created["lease_token"]}, format="json")

    assert refused.status_code == 400 and list(refused.json()["errors"]) == ["response_status"]
    assert done.status_code == 200
    assert done.json()["status"] == "succeeded"
    assert done.json()["response"] == {"status": 200, "body": None, "masked": True}
