"""One masking rule for payloads and recorded responses (issue 11 item 6): a recorded
response is in clear only in the answer to a claim that replays the key (same tenant,
write-scoped key, same request fingerprint) and to a reveal with the `payload` scope and a
reason (logged); every other read — operation detail and list, the complete answer, review
items, console pages, exports — shows its masked shape."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest

from ledger.models import Operation
from ledger.platform.masking import mask_json
from ledger.protocol import services
from review.models import AccessLog
from tests.console.support import client_for, enforced_provider, op_in_review, page, staff

pytestmark = pytest.mark.django_db(transaction=True)

# What a CRM answered: it echoes the contact it created.
ANSWER = {"id": "crm_77", "contact": {"email": "priya.raman@example.invalid", "phone": "+61412345678"}}
SECRETS = ("priya.raman@example.invalid", "+61412345678", "crm_77")
CLAIM = {"key": "lead-7:crm:v1", "provider": "crm", "action": "create", "request": {"lead": 7}}


def _clear(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture
def finished(tenant: Any, make_client: Any) -> tuple[Any, dict[str, Any]]:
    """A lead created through the claim protocol with a write key; the CRM's answer recorded."""
    enforced_provider(tenant, "crm")
    writer = make_client(tenant, ["read", "write"])
    claimed = writer.post("/api/v1/claims", CLAIM, format="json").json()
    done = writer.post(
        f"/api/v1/operations/{claimed['id']}/complete",
        {"lease_token": claimed["lease_token"], "provider_ref": "ref-1", "response": ANSWER},
        format="json",
    )
    assert done.status_code == 200
    # Even the completing caller's answer is a read of the row: masked (it sent the value).
    assert done.json()["response"]["masked"] is True and _clear(done.content.decode()) == []
    return writer, claimed


def test_a_read_only_key_gets_the_masked_response_and_no_clear_text(tenant, finished, make_client):
    _, claimed = finished
    reader = make_client(tenant, ["read"])
    detail = reader.get(f"/api/v1/operations/{claimed['id']}")
    assert detail.status_code == 200 and _clear(detail.content.decode()) == []
    assert detail.json()["response"] == {"status": 200, "body": mask_json(ANSWER), "masked": True}
    listing = reader.get("/api/v1/operations", {"key": CLAIM["key"]})
    assert listing.status_code == 200 and _clear(listing.content.decode()) == []
    assert listing.json()["results"][0]["response"]["masked"] is True
    # An admin key reads it masked as well: `admin` does not imply `payload`.
    admin = make_client(tenant, ["read", "write", "admin"])
    assert _clear(admin.get(f"/api/v1/operations/{claimed['id']}").content.decode()) == []
    assert AccessLog.objects.count() == 0


def test_the_replaying_claim_gets_the_recorded_response_in_clear(tenant, finished, make_client):
    writer, _ = finished
    again = writer.post("/api/v1/claims", CLAIM, format="json")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["response"] == {"status": 200, "body": ANSWER, "masked": False}
    # Another write key of the same tenant replaying the same request: the protocol's answer.
    other_writer = make_client(tenant, ["write"])
    assert other_writer.post("/api/v1/claims", CLAIM, format="json").json()["response"]["body"] == ANSWER
    # The same key with another request is refused and carries nothing of the answer.
    changed = writer.post("/api/v1/claims", {**CLAIM, "request": {"lead": 8}}, format="json")
    assert changed.status_code == 422 and _clear(changed.content.decode()) == []
    assert AccessLog.objects.count() == 0


def test_another_tenant_replaying_the_same_key_learns_nothing(tenant, other_tenant, finished, make_client):
    enforced_provider(other_tenant, "crm")
    theirs = make_client(other_tenant, ["read", "write"])
    answer = theirs.post("/api/v1/claims", CLAIM, format="json")
    # Keys are per tenant: theirs is a fresh claim of their own key, nothing of ours in it.
    assert answer.status_code == 201 and _clear(answer.content.decode()) == []
    assert theirs.get(f"/api/v1/operations/{finished[1]['id']}").status_code == 404


def test_a_reveal_with_the_payload_scope_and_a_reason_gets_it_and_leaves_an_access_log_row(
    tenant, finished, make_client
):
    _, claimed = finished
    revealer = make_client(tenant, ["read", "payload"])
    url = f"/api/v1/operations/{claimed['id']}/payload"
    assert revealer.post(url, {"fields": ["response_body"]}, format="json").status_code == 400  # no reason
    response = revealer.post(
        url, {"fields": ["response_body"], "reason": "ticket OPS-9: CRM says no contact"}, format="json"
    )
    assert response.status_code == 200 and response.json()["fields"] == {"response_body": ANSWER}
    entry = AccessLog.objects.get()
    assert entry.fields == ["response_body"] and entry.reason == "ticket OPS-9: CRM says no contact"
    assert entry.actor.startswith("apikey:") and entry.object_id == str(claimed["id"])


def test_review_items_console_pages_and_exports_show_the_response_masked(tenant, make_client):
    crm = enforced_provider(tenant, "crm")
    done = services.operation_claim(tenant=tenant, key="lead-9", provider=crm).operation
    services.operation_complete(
        operation_id=done.pk,
        tenant_id=done.tenant_id,
        lease_token=done.lease_token,
        provider_ref="r",
        response_body=ANSWER,
    )
    item = op_in_review(tenant, enforced_provider(tenant, "mailer"), "mail-1")
    Operation.objects.filter(pk=item.pk).update(response_status=200, response_body=ANSWER)
    review = make_client(tenant, ["read"]).get("/api/v1/review/items")
    assert review.status_code == 200 and review.json()["results"] and _clear(review.content.decode()) == []

    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    for url in (
        "/admin/ledger/operation/",
        f"/admin/ledger/operation/{done.pk}/change/",
        f"/admin/review/reviewitem/{item.pk}/change/",
        "/admin/ledger/attempt/",
    ):
        status, body = page(auditor, url)
        assert status == 200 and _clear(body) == [], url
    status, text = page(auditor, "/admin/ledger/operation/export.csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert status == 200 and len(rows) >= 3 and _clear(json.dumps(rows)) == []
