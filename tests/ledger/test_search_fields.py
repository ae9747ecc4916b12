"""Operations can be filtered on configured non-personal payload paths (DESIGN §6), in
plain text, without decrypting anything; personal values are never copied there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.models import Operation
from ledger.protocol import services
from tests.ledger.support import assert_problem

pytestmark = pytest.mark.django_db

VOICE = json.loads(
    (Path(__file__).resolve().parents[2] / "review" / "demo_examples" / "voice-call-analyzed.json").read_text()
)


def test_configured_paths_are_searchable_and_personal_values_are_not_copied(api, tenant, provider):
    services.operation_claim(tenant=tenant, key="lead:1", provider=provider, payload=VOICE)
    services.operation_claim(tenant=tenant, key="lead:2", provider=provider, payload={"event_type": "other"})
    op = Operation.objects.get(key="lead:1")
    assert op.search_fields == {"event_type": "call_analyzed", "call.agent_id": "agent_insurance_quotes"}
    text = json.dumps(op.search_fields)
    assert "Priya" not in text and "+61412345678" not in text

    found = api.get("/api/v1/operations?match=call.agent_id:agent_insurance_quotes").json()["results"]
    assert [o["key"] for o in found] == ["lead:1"]
    both = api.get("/api/v1/operations?match=event_type:other").json()["results"]
    assert [o["key"] for o in both] == ["lead:2"]


def test_matching_on_a_path_that_is_not_configured_is_a_400(api):
    assert_problem(api.get("/api/v1/operations?match=call.from_number:+61412345678"), 400, "validation_error")


def test_another_tenants_rows_never_match(api, tenant, provider, other_tenant):
    other_provider = services.provider_upsert(
        tenant=other_tenant, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    services.operation_claim(tenant=other_tenant, key="lead:9", provider=other_provider, payload=VOICE)
    assert api.get("/api/v1/operations?match=event_type:call_analyzed").json()["results"] == []
