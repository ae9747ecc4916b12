"""Property (issue 11 §4): whatever a claim accepts is readable forever. Any body — hostile
values in every field of ClaimInputSerializer, the key in the body or the header — is either
refused with a 4xx problem+json and stores nothing, or stored as an operation that then
answers in the API list and detail, the console's detail page and its CSV export, with the
payload read back equal to what was sent. Runs on both databases, bounded
(PROPERTY_EXAMPLES).
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from ledger.models import Operation, Tenant
from ledger.platform.crypto import open_json
from ledger.web.serializers import ClaimInputSerializer
from tests.console.support import client_for, staff

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "60"))
CLAIM_URL = "/api/v1/claims"

any_text = st.text(st.characters(exclude_categories=()), max_size=12)
short_text = st.one_of(
    any_text, st.sampled_from(["", "order-1:charge:v1", " padded ", "é\U0001f600", "a\x00", "\ud800", "\u2028"])
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(10**400),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, short_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(short_text, inner, max_size=3)),
    max_leaves=12,
)
# Text a field accepts (no lone surrogates, no NUL), and keys the protocol accepts.
plain_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
plain_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        plain_text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(plain_text, inner, max_size=3)),
    max_leaves=12,
)
valid_claims = st.fixed_dictionaries(
    {"key": keys, "provider": st.just("stripe")},
    optional={
        "action": plain_text,
        "request": plain_values,
        "payload": plain_values,
        "reconciliation_handle": plain_text,
        "execution_id": plain_text,
        "workflow_id": plain_text,
        "workflow_version": plain_text,
        "correlation_id": plain_text,
        "lease_seconds": st.floats(min_value=0, max_value=1e300),
        "uses_sent_marker": st.booleans(),
    },
)
# At most a few fields made hostile on top of a claim that would be accepted.
hostile_fields = st.fixed_dictionaries(
    {},
    optional={
        "key": short_text,
        "provider": st.sampled_from(["unknown", "", "not a slug", "stripe\x00"]),
        "action": st.one_of(short_text, st.just("a" * 101)),
        "request": json_values,
        "payload": json_values,
        "execution_id": st.one_of(short_text, json_values),
        "correlation_id": short_text,
        "lease_seconds": st.one_of(numbers, short_text),
        "uses_sent_marker": short_text,
    },
)
claims = st.tuples(valid_claims, st.one_of(st.just({}), hostile_fields)).map(lambda parts: {**parts[0], **parts[1]})
header_keys = st.one_of(st.none(), st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20))


@pytest.fixture
def console(tenant: Tenant) -> Client:
    return client_for(staff("boss", role="admin", tenants=[tenant]))


def export_rows(client: Client) -> int:
    response = client.get("/admin/ledger/operation/export.csv")
    assert response.status_code == 200
    return len(list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))) - 1


def as_stored(value: Any) -> Any:
    """What JSON storage gives back: tuples become lists, and so on."""
    return json.loads(json.dumps(value))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=claims, header_key=header_keys)
def test_what_a_claim_accepts_round_trips_through_list_detail_and_export(
    api: APIClient, console: Client, body: dict[str, Any], header_key: str | None
) -> None:
    before = Operation.objects.count()
    raw = json.dumps(body).encode()
    extra = {"HTTP_IDEMPOTENCY_KEY": header_key} if header_key is not None else {}

    response = api.generic("POST", CLAIM_URL, raw, content_type="application/json", **extra)

    event(f"{response.status_code} {response.json().get('code', '') if response.status_code >= 400 else ''}")
    assert response.status_code < 500, response.content[:300]
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"]
        if response.status_code == 400:
            assert Operation.objects.count() == before
        return
    # Accepted: the serializer took the body as it came.
    assert ClaimInputSerializer(data=json.loads(raw)).is_valid()
    answer = response.json()
    op = Operation.objects.get(pk=answer["id"])
    if response.status_code == 201:
        assert open_json(op.payload) == as_stored(body.get("payload"))
    detail = api.get(f"/api/v1/operations/{op.pk}")
    assert detail.status_code == 200 and detail.json()["key"] == op.key
    listed = api.get("/api/v1/operations", {"key": op.key})
    assert listed.status_code == 200 and [row["id"] for row in listed.json()["results"]] == [op.pk]
    assert console.get(f"/admin/ledger/operation/{op.pk}/change/").status_code == 200
    assert export_rows(console) == Operation.objects.count()
