"""The service's own key spaces are not the callers' (issue 11 item 9). Today a caller could
claim ``replay:{entry}:{n}`` through /claims — the DLQ's next replay then finds its key held
and sends nothing — or ``callback:{operation id}``, and the callback of that operation is
silently never sent. ``…~r{n}`` is what "re-run as new" derives."""

from __future__ import annotations

import pytest

from dlq.models import replay_ledger_key
from ledger.models import Operation
from ledger.platform.errors import ReservedKey
from ledger.protocol import services

pytestmark = pytest.mark.django_db

RESERVED = ["replay:1:1", "replay:anything", "callback:42", "callback:", "order-1001:charge:v1~r1", "k~r12"]


@pytest.mark.parametrize("key", RESERVED)
def test_claims_of_reserved_keys_are_400_with_a_stable_code_and_store_nothing(api, key):
    response = api.post("/api/v1/claims", {"key": key, "provider": "stripe"}, format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "reserved_idempotency_key"
    assert not Operation.objects.exists()


@pytest.mark.parametrize("key", RESERVED)
def test_reserved_keys_in_the_idempotency_key_header_are_refused_too(api, key):
    response = api.post("/api/v1/claims", {"provider": "stripe"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400 and response.json()["code"] == "reserved_idempotency_key"


@pytest.mark.parametrize("key", RESERVED)
def test_submissions_of_reserved_keys_are_refused(api, provider, key):
    body = {"key": key, "provider": "stripe", "request": {"method": "POST", "path": "/charges", "body": {}}}
    response = api.post("/api/v1/operations", body, format="json")
    assert response.status_code == 400 and response.json()["code"] == "reserved_idempotency_key"
    assert not Operation.objects.exists()


@pytest.mark.parametrize("key", ["replays:1", "my-callback:1", "order~r", "order~rx1", "order~r1-v2", "Replay:1:1"])
def test_keys_that_only_look_alike_are_fine(api, key):
    response = api.post("/api/v1/claims", {"key": key, "provider": "stripe"}, format="json")
    assert response.status_code == 201, response.content


def test_the_service_itself_still_uses_its_key_spaces(tenant, provider):
    """The DLQ's replay claims and the callbacks go through operation_claim without the
    caller's check (via_claims=False)."""
    key = replay_ledger_key(7, 1)
    result = services.operation_claim(tenant=tenant, key=key, provider=None, via_claims=False)
    assert result.acquired and result.operation.key == key
    with pytest.raises(ReservedKey):
        services.operation_claim(tenant=tenant, key="replay:7:2", provider=None)
