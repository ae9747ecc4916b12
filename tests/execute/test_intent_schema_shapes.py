"""An intent schema a tenant admin sends in any JSON shape is a 400 problem, never a 500
(DESIGN §5, intents; §9: problem+json, never a 5xx). A field declared as something other than
an object used to reach ``member_names`` (``spec.get`` on a list or a string)."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.rules import intents
from tests.execute.test_intents import TEMPLATE

pytestmark = pytest.mark.django_db

ENUM = {"type": "enum", "values": ["square", "portrait"]}


@pytest.mark.parametrize("spec", [[1], "x", None, 3, [{"type": "upload"}]])
def test_a_field_that_is_not_an_object_is_a_400_problem(tenant, provider, make_client, spec: Any):
    admin = make_client(tenant, ["admin"])
    schema = {"fields": {"a": spec, "aspect_class": ENUM}}

    answer = admin.put(
        f"/api/v1/providers/{provider.slug}/intent",
        {"intent_schema": schema, "request_template": TEMPLATE, "reason": "shapes"},
        format="json",
    )

    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["code"] == "request_template_invalid"
    assert "field 'a' must be an object" in answer.json()["detail"]
    assert intents.member_names(schema) == ["a", "aspect_class"]
