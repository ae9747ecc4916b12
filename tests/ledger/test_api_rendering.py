"""Success answers rendered straight from DRF's JSONRenderer are byte-for-byte what a DRF
Response renders: same status, headers and body."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer

from ledger import apis
from tests.ledger.support import CLAIM_URL, claim_body, op_url

pytestmark = pytest.mark.django_db


class _NotThePlainRenderer(JSONRenderer):
    """Makes ledger.apis.answer fall back to a DRF Response (its check is on the exact class)."""


def snapshot(response: Any) -> tuple[int, dict[str, str], bytes]:
    return response.status_code, dict(response.headers), response.content


def both_ways(monkeypatch: Any, call: Any) -> tuple[Any, Any]:
    direct = snapshot(call())
    with monkeypatch.context() as m:
        m.setattr(apis, "JSONRenderer", _NotThePlainRenderer)
        via_drf = snapshot(call())
    return direct, via_drf


def test_replays_details_and_completions_render_identically(api, monkeypatch):
    created = api.post(CLAIM_URL, claim_body("render-1", response=None), format="json").json()
    completed = api.post(
        op_url(created["id"], "complete"),
        {"lease_token": created["lease_token"], "response": {"ok": True, "note": "caf\u00e9 \u2028 \U0001f600"}},
        format="json",
    )
    assert completed.status_code == 200

    replay = both_ways(monkeypatch, lambda: api.post(CLAIM_URL, claim_body("render-1"), format="json"))
    detail = both_ways(monkeypatch, lambda: api.get(op_url(created["id"])))

    for direct, via_drf in (replay, detail):
        assert direct == via_drf
    assert replay[0][1]["Idempotent-Replayed"] == "true"
    assert b"\\u2028" in detail[0][2] and "caf\u00e9".encode() in detail[0][2]


def test_a_fresh_claim_renders_like_a_drf_response(api, monkeypatch):
    direct = snapshot(api.post(CLAIM_URL, claim_body("render-2"), format="json"))
    with monkeypatch.context() as m:
        m.setattr(apis, "JSONRenderer", _NotThePlainRenderer)
        via_drf = snapshot(api.post(CLAIM_URL, claim_body("render-3"), format="json"))

    assert direct[0] == via_drf[0] == 201
    volatile = {"Location", "Content-Length"}
    assert {k: v for k, v in direct[1].items() if k not in volatile} == {
        k: v for k, v in via_drf[1].items() if k not in volatile
    }
    body = api.get(op_url(int(direct[1]["Location"].rsplit("/", 1)[1]))).json()
    assert direct[2].startswith(JSONRenderer().render({"id": body["id"], "key": "render-2"})[:-1] + b",")


def test_an_indented_json_request_still_gets_drfs_indented_rendering(api):
    created = api.post(CLAIM_URL, claim_body("render-4"), format="json").json()

    response = api.get(op_url(created["id"]), HTTP_ACCEPT="application/json; indent=2")

    assert response.status_code == 200
    assert response.content.startswith(b'{\n  "id": ')
