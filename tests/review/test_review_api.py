"""Review decisions through the API: every one a guarded move with the reviewer as actor."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import AttemptOutcome, IdempotencyClass, OperationStatus
from ledger.protocol import services
from ledger.recovery.sweeper import sweep
from tests.ledger.support import assert_problem, attempts_of, events_of, expire_lease

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def advisory(tenant: Any) -> Any:
    return services.provider_upsert(
        tenant=tenant, slug="mailer", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )


def _in_review(tenant: Any, provider: Any, key: str, handle: str = "") -> Any:
    op = services.operation_claim(
        tenant=tenant, key=key, provider=provider, request={"to": "x"}, mark_sent=True, reconciliation_handle=handle
    ).operation
    expire_lease(op.pk)
    sweep()
    op.refresh_from_db()
    assert op.status == S.REVIEW
    return op


def test_reviewer_finds_an_item_by_reconciliation_handle(api, tenant, advisory):
    _in_review(tenant, advisory, "mail:1", handle="msg-7781")
    _in_review(tenant, advisory, "mail:2", handle="msg-7782")
    body = api.get("/api/v1/review/items?q=msg-7781").json()
    assert [item["key"] for item in body["results"]] == ["mail:1"]
    assert body["results"][0]["attempts_detail"][0]["outcome"] == AttemptOutcome.AMBIGUOUS
    assert api.get("/api/v1/review/items?provider=mailer").json()["results"].__len__() == 2


def test_a_provider_filter_naming_no_provider_of_the_tenant_lists_no_item_without_reading_operations(
    api, tenant, other_tenant, advisory
):
    _in_review(tenant, advisory, "mail:9")
    # Another tenant's provider of that slug is not the caller's.
    services.provider_upsert(
        tenant=other_tenant,
        slug="elsewhere",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
    )
    assert api.get("/api/v1/review/items?provider=elsewhere").json()["results"] == []
    with CaptureQueriesContext(connection) as seen:
        assert api.get("/api/v1/review/items?provider=no-such-provider").json()["results"] == []
    assert not [q["sql"] for q in seen.captured_queries if "ledger_operation" in q["sql"]]
    assert [item["key"] for item in api.get("/api/v1/review/items?provider=mailer").json()["results"]] == ["mail:9"]


def test_review_items_are_read_through_the_work_queue_mirror(api, tenant, advisory):
    # The console's review list (ReviewItem's manager) reads the state from the open rows'
    # index (ADR 0017), not from a scan of the operation rows; a decided item leaves it.
    from review.models import ReviewItem

    op = _in_review(tenant, advisory, "mail:8")
    assert "ledger_open_operation" in str(ReviewItem.objects.all().query)
    assert list(ReviewItem.objects.values_list("key", flat=True)) == ["mail:8"]
    decided = api.post(
        f"/api/v1/review/items/{op.pk}/decision", {"decision": "abandon", "note": "customer cancelled"}, format="json"
    )
    assert decided.status_code == 200, decided.content
    assert not ReviewItem.objects.exists()


def test_confirm_succeeded_records_the_ref_and_later_claims_replay_it(api, tenant, advisory):
    op = _in_review(tenant, advisory, "mail:3")
    r = api.post(
        f"/api/v1/review/items/{op.pk}/decision",
        {"decision": "confirm_succeeded", "provider_ref": "msg-1", "note": "seen in the mail log"},
        format="json",
    )
    assert r.status_code == 200, r.content
    assert r.json()["status"] == S.SUCCEEDED and r.json()["provider_ref"] == "msg-1"
    actor, reason = events_of(op.pk)[-1][2:]
    assert actor.startswith("apikey:") and "seen in the mail log" in reason
    replay = api.post("/api/v1/claims", {"key": "mail:3", "provider": "mailer", "request": {"to": "x"}}, format="json")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["provider_ref"] == "msg-1"


def test_safe_to_retry_lets_the_original_key_be_claimed_again(api, tenant, advisory):
    op = _in_review(tenant, advisory, "mail:4")
    r = api.post(
        f"/api/v1/review/items/{op.pk}/decision", {"decision": "safe_to_retry", "note": "bounced"}, format="json"
    )
    assert r.json()["status"] == S.RETRY_WAIT
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.NOT_FOUND
    again = api.post("/api/v1/claims", {"key": "mail:4", "provider": "mailer", "request": {"to": "x"}}, format="json")
    assert again.status_code == 201 and again.json()["id"] == op.pk and again.json()["attempt"] == 2


def test_abandon_is_terminal(api, tenant, advisory):
    op = _in_review(tenant, advisory, "mail:5")
    r = api.post(
        f"/api/v1/review/items/{op.pk}/decision", {"decision": "abandon", "note": "customer cancelled"}, format="json"
    )
    assert r.json()["status"] == S.ABANDONED and r.json()["done_at"]


def test_a_decision_needs_a_note_and_writes_nothing_without_one(api, tenant, advisory):
    op = _in_review(tenant, advisory, "mail:6")
    before = len(events_of(op.pk))
    r = api.post(f"/api/v1/review/items/{op.pk}/decision", {"decision": "abandon", "note": "  "}, format="json")
    assert r.status_code == 400
    assert len(events_of(op.pk)) == before


def test_second_decision_on_the_same_item_is_refused(api, tenant, advisory):
    op = _in_review(tenant, advisory, "mail:7")
    api.post(f"/api/v1/review/items/{op.pk}/decision", {"decision": "abandon", "note": "x"}, format="json")
    r = api.post(
        f"/api/v1/review/items/{op.pk}/decision", {"decision": "confirm_succeeded", "note": "y"}, format="json"
    )
    assert_problem(r, 409, "review_not_open")


def test_another_tenants_item_is_not_found(api, tenant, advisory, other_tenant, make_client):
    op = _in_review(tenant, advisory, "mail:8")
    other = make_client(other_tenant)
    assert other.get("/api/v1/review/items").json()["results"] == []
    r = other.post(f"/api/v1/review/items/{op.pk}/decision", {"decision": "abandon", "note": "x"}, format="json")
    assert_problem(r, 404, "not_found")
