"""Tenants are isolated (same key → two operations; another tenant's row is a 404), and the
operation list filters and paginates within the caller's tenant only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import Operation, OperationStatus
from ledger.protocol import services
from tests.ledger.support import CLAIM_URL, assert_problem, attempts_of, claim_body, ledger_counts, op_url, row

S = OperationStatus
pytestmark = pytest.mark.django_db


@pytest.fixture
def other_api(other_tenant: Any, make_client: Any) -> Any:
    services.provider_upsert(tenant=other_tenant, slug="stripe", idempotency_class="key_enforced")
    return make_client(other_tenant)


def claim(api: Any, key: str = "order-1:charge:v1", **overrides: Any) -> dict[str, Any]:
    response = api.post(CLAIM_URL, claim_body(key, **overrides), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_the_same_key_under_two_tenants_is_two_independent_operations(api, other_api, tenant, other_tenant):
    mine = claim(api)
    theirs = claim(other_api)

    assert mine["id"] != theirs["id"]
    assert Operation.objects.get(pk=mine["id"]).tenant_id == tenant.pk
    assert Operation.objects.get(pk=theirs["id"]).tenant_id == other_tenant.pk
    # Finishing one leaves the other untouched and still held.
    api.post(op_url(mine["id"], "complete"), {"lease_token": mine["lease_token"]}, format="json")
    assert row(theirs["id"])["status"] == S.CLAIMED
    assert api.post(CLAIM_URL, claim_body("order-1:charge:v1"), format="json").status_code == 200
    assert_problem(
        other_api.post(CLAIM_URL, claim_body("order-1:charge:v1"), format="json"), 409, "operation_in_progress"
    )


def test_a_different_request_under_another_tenant_is_not_a_key_reuse(api, other_api):
    claim(api, request={"amount": 1})

    assert other_api.post(CLAIM_URL, claim_body(request={"amount": 2}), format="json").status_code == 201


def test_another_tenants_operation_is_a_404_on_get(api, other_api):
    theirs = claim(other_api)

    assert_problem(api.get(op_url(theirs["id"])), 404, "not_found")


@pytest.mark.parametrize("verb", ["sent", "complete", "fail", "heartbeat"])
def test_another_tenants_operation_is_a_404_on_holder_calls_even_with_the_right_token(api, other_api, verb):
    theirs = claim(other_api)
    before, attempts, counts = row(theirs["id"]), attempts_of(theirs["id"]), ledger_counts()
    body: dict[str, Any] = {"lease_token": theirs["lease_token"]}
    if verb == "fail":
        body["error_class"] = "invalid_input"

    response = api.post(op_url(theirs["id"], verb), body, format="json")

    assert_problem(response, 404, "not_found")
    assert row(theirs["id"]) == before
    assert attempts_of(theirs["id"]) == attempts
    assert ledger_counts() == counts


def test_the_404_for_another_tenant_is_the_same_as_for_a_missing_id(api, other_api):
    theirs = claim(other_api)

    foreign = api.get(op_url(theirs["id"])).json()
    missing = api.get(op_url(theirs["id"] + 10_000)).json()

    assert {k: v for k, v in foreign.items() if k != "instance"} == {
        k: v for k, v in missing.items() if k != "instance"
    }


def test_the_list_never_shows_another_tenants_rows(api, other_api):
    mine = claim(api, "shared-key")
    claim(other_api, "shared-key")
    claim(other_api, "only-theirs")

    listed = api.get("/api/v1/operations").json()["results"]

    assert [op["id"] for op in listed] == [mine["id"]]
    assert api.get("/api/v1/operations?key=only-theirs").json()["results"] == []


# --- filters and pagination ------------------------------------------------------------


@pytest.fixture
def spread(api: Any, tenant: Any) -> dict[str, int]:
    """Five operations in different states, two providers, known update times."""
    services.provider_upsert(tenant=tenant, slug="mailer", idempotency_class="key_advisory")
    ids: dict[str, int] = {}
    for name in ("a", "b", "c"):
        ids[name] = claim(api, f"key-{name}")["id"]
    done = claim(api, "key-done")
    api.post(op_url(done["id"], "complete"), {"lease_token": done["lease_token"]}, format="json")
    ids["done"] = done["id"]
    ids["mail"] = claim(api, "key-mail", provider="mailer")["id"]
    for name, year in (("a", 2020), ("b", 2021), ("c", 2022)):
        Operation.objects.filter(pk=ids[name]).update(updated_at=datetime(year, 6, 1, tzinfo=UTC))
    return ids


def listed_ids(api: Any, query: str) -> list[int]:
    response = api.get(f"/api/v1/operations?{query}")
    assert response.status_code == 200, response.content
    return [op["id"] for op in response.json()["results"]]


def test_filter_by_key(api, spread):
    assert listed_ids(api, "key=key-b") == [spread["b"]]
    assert listed_ids(api, "key=key-") == []


def test_filter_by_status(api, spread):
    assert listed_ids(api, "status=succeeded") == [spread["done"]]
    assert sorted(listed_ids(api, "status=claimed")) == sorted([spread["a"], spread["b"], spread["c"], spread["mail"]])


def test_filter_by_provider(api, spread):
    assert listed_ids(api, "provider=mailer") == [spread["mail"]]
    assert spread["mail"] not in listed_ids(api, "provider=stripe")


def test_a_provider_filter_naming_no_provider_of_the_tenant_lists_nothing_without_reading_operations(
    api, other_api, other_tenant, spread
):
    # Another tenant's provider of that slug is not the caller's: nothing of theirs, nothing of ours.
    services.provider_upsert(tenant=other_tenant, slug="elsewhere", idempotency_class="key_advisory")
    claim(other_api, "theirs", provider="elsewhere")
    assert listed_ids(api, "provider=elsewhere") == []
    with CaptureQueriesContext(connection) as seen:
        assert listed_ids(api, "provider=no-such-provider") == []
    assert not [q["sql"] for q in seen.captured_queries if "ledger_operation" in q["sql"]]
    assert [op["key"] for op in api.get("/api/v1/operations?provider=mailer").json()["results"]] == ["key-mail"]


def test_filter_by_updated_after(api, spread):
    got = listed_ids(api, "updated_after=2021-01-01T00:00:00Z")

    assert spread["a"] not in got
    assert {spread["b"], spread["c"], spread["done"], spread["mail"]} <= set(got)
    assert listed_ids(api, "updated_after=2099-01-01T00:00:00Z") == []


def test_filters_combine(api, spread):
    assert listed_ids(api, "status=claimed&provider=stripe&updated_after=2021-01-01T00:00:00Z") == sorted(
        [spread["b"], spread["c"]], reverse=True
    )


def test_an_invalid_status_filter_is_a_400_problem(api, spread):
    assert_problem(api.get("/api/v1/operations?status=bogus"), 400, "validation_error")


def test_cursor_pagination_walks_every_row_once_newest_first(api, other_api):
    mine = [claim(api, f"page-{i}")["id"] for i in range(7)]
    for i in range(4):
        claim(other_api, f"page-{i}")

    seen: list[int] = []
    url = "/api/v1/operations?page_size=3"
    pages = 0
    while url:
        body = api.get(url).json()
        assert len(body["results"]) <= 3
        seen += [op["id"] for op in body["results"]]
        url = body["next"]
        pages += 1

    assert pages == 3
    assert seen == sorted(mine, reverse=True)


def test_cursor_pagination_keeps_filters_across_pages(api):
    for i in range(5):
        claim(api, f"f-{i}")
    done = claim(api, "f-done")
    api.post(op_url(done["id"], "complete"), {"lease_token": done["lease_token"]}, format="json")

    first = api.get("/api/v1/operations?status=claimed&page_size=2").json()
    second = api.get(first["next"]).json()

    assert len(first["results"]) == 2
    assert all(op["status"] == S.CLAIMED for op in first["results"] + second["results"])
    assert "status=claimed" in first["next"]


def test_the_list_never_exposes_lease_tokens_or_payloads(api):
    claim(api, "secret-bits", payload={"email": "a@example.com"})

    body = api.get("/api/v1/operations").content.decode()

    assert "a@example.com" not in body
    assert "lease_token" not in body
