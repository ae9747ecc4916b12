"""What an API client sees of DRF's content negotiation and rendering on the ledger's answers."""

from __future__ import annotations

import pytest

from tests.ledger.support import CLAIM_URL, PROBLEM_JSON, claim_body, op_url

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("accept", [None, "*/*", "application/json", "application/*", "text/html, */*;q=0.1"])
def test_clients_asking_for_json_or_anything_get_json(api, accept):
    extra = {"HTTP_ACCEPT": accept} if accept else {}

    response = api.post(CLAIM_URL, claim_body("render-1"), format="json", **extra)

    assert response.status_code == 201
    assert response["Content-Type"] == "application/json"
    assert response["Content-Length"] == str(len(response.content))
    assert response.json()["key"] == "render-1"


def test_a_client_that_accepts_no_json_gets_a_406_problem_and_nothing_is_claimed(api):
    from ledger.models import Operation

    response = api.post(CLAIM_URL, claim_body("render-2"), format="json", HTTP_ACCEPT="text/html")

    assert response.status_code == 406
    assert response["Content-Type"] == PROBLEM_JSON
    assert response.json()["code"] == "not_acceptable"
    assert not Operation.objects.filter(key="render-2").exists()


def test_an_indented_json_request_gets_indented_json(api):
    created = api.post(CLAIM_URL, claim_body("render-3"), format="json").json()

    response = api.get(op_url(created["id"]), HTTP_ACCEPT="application/json; indent=2")

    assert response.status_code == 200
    assert response.content.startswith(b'{\n  "id": ')


def test_a_replay_is_the_recorded_operation_with_the_replayed_header(api):
    created = api.post(CLAIM_URL, claim_body("render-4"), format="json").json()
    completed = api.post(
        op_url(created["id"], "complete"),
        {"lease_token": created["lease_token"], "response": {"ok": True, "note": "caf\u00e9 \u2028 \U0001f600"}},
        format="json",
    )

    replay = api.post(CLAIM_URL, claim_body("render-4"), format="json")

    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    # The same operation; only the replay carries the recorded response in clear (ledger.platform.masking).
    masked = {"status": 200, "body": {"ok": "‹bool›", "note": "‹text·8›"}, "masked": True}
    assert completed.json() == api.get(op_url(created["id"])).json() == {**replay.json(), "response": masked}
    assert replay.json()["response"]["body"] == {"ok": True, "note": "caf\u00e9 \u2028 \U0001f600"}
    assert "lease_token" not in replay.json()
    # DRF's JSON: UTF-8 as is, U+2028 escaped (safe inside a <script>).
    assert b"\\u2028" in replay.content and "caf\u00e9".encode() in replay.content
