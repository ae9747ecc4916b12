"""Property (issue 11 §4): whatever the DLQ parser accepts is readable forever. Any body —
our envelope, n8n's two shapes, other JSON, any bytes, with hostile values in every field —
is either refused with a 400 problem+json and stores nothing, or stored as an entry that
then answers in the API list and detail, the console's detail page and its CSV export,
with the values the parser read. Runs on both databases, bounded (PROPERTY_EXAMPLES).
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

from dlq.ingest.parsing import parse_failure
from dlq.models import FailedEvent
from ledger.models import Tenant
from ledger.platform.errors import DomainError
from tests.console.support import client_for, staff

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "60"))
DLQ_URL = "/api/v1/dlq/events"

# Every code point, lone surrogates and NUL included.
any_text = st.text(st.characters(exclude_categories=()), max_size=12)
short_text = st.one_of(
    any_text, st.sampled_from(["", "17", "4812", "Webhook", "a:b", " padded ", "é\U0001f600", "a\x00", "\ud800"])
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
times = st.one_of(
    st.datetimes(timezones=st.sampled_from([None])).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat() + st_offset(d)),
    st.sampled_from(["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "2026-13-40T00:00:00Z", "soon"]),
    numbers,
)


def st_offset(d: Any) -> str:
    # A spread of offsets without another strategy: derived from the drawn time itself.
    hours = (d.microsecond % 27) - 13
    return f"{'+' if hours >= 0 else '-'}{abs(hours):02d}:00"


envelopes = st.fixed_dictionaries(
    {"payload": json_values},
    optional={
        "event_id": st.one_of(short_text, st.integers(min_value=-(2**64), max_value=2**64)),
        "idempotency_key": short_text,
        "error": st.one_of(short_text, st.fixed_dictionaries({}, optional={"message": json_values, "class": scalars})),
        "error_class": st.sampled_from(["", "transient", "invalid_input", "permission", "ambiguous", "bogus"]),
        "failed_at": times,
        "retry_count": numbers,
        "source": st.dictionaries(
            st.sampled_from(["workflow_id", "workflow_name", "execution_id", "execution_url", "node", "mode"]),
            json_values,
            max_size=6,
        ),
        "replay_target": short_text,
    },
)
n8n_executions = st.fixed_dictionaries(
    {
        "execution": st.fixed_dictionaries(
            {"id": scalars},
            optional={
                "error": st.fixed_dictionaries(
                    {}, optional={"message": json_values, "httpCode": st.one_of(scalars, st.just("²²²"))}
                ),
                "retryOf": scalars,
                "lastNodeExecuted": json_values,
                "url": json_values,
                "mode": json_values,
            },
        ),
        "workflow": st.fixed_dictionaries({"id": scalars}, optional={"name": json_values}),
    }
)
n8n_triggers = st.fixed_dictionaries(
    {
        "trigger": st.fixed_dictionaries(
            {
                "error": st.fixed_dictionaries(
                    {},
                    optional={
                        "message": json_values,
                        "timestamp": times,
                        "node": st.fixed_dictionaries({}, optional={"name": scalars}),
                        "cause": st.fixed_dictionaries({}, optional={"message": json_values}),
                    },
                )
            },
            optional={"mode": json_values},
        ),
        "workflow": st.fixed_dictionaries({"id": scalars}, optional={"name": json_values}),
    }
)


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


bodies = st.one_of(
    envelopes.map(encoded),
    n8n_executions.map(encoded),
    n8n_triggers.map(encoded),
    json_values.map(encoded),
    st.lists(n8n_executions, min_size=1, max_size=1).map(encoded),
    st.binary(max_size=40),
    st.integers(min_value=60, max_value=70).map(lambda depth: b"[" * depth + b"]" * depth),
)


@pytest.fixture
def console(tenant: Tenant) -> Client:
    return client_for(staff("auditor", role="admin", tenants=[tenant]))


def csv_rows(client: Client, url: str) -> list[list[str]]:
    response = client.get(url)
    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))[1:]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw=bodies)
def test_what_the_parser_accepts_round_trips_through_list_detail_and_export(
    api: APIClient, console: Client, raw: bytes
) -> None:
    before = FailedEvent.objects.count()
    try:
        parsed = parse_failure(raw)
    except DomainError as exc:
        refused = exc
    else:
        refused = None

    response = api.generic("POST", DLQ_URL, raw, content_type="application/json")

    event(f"refused {refused.code}" if refused is not None else f"stored {response.status_code}")
    if refused is not None:
        assert response.status_code == 400, response.content[:300]
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == refused.code
        assert FailedEvent.objects.count() == before
        return
    assert response.status_code in (200, 201), response.content[:300]
    entry = response.json()
    assert entry["shape"] == parsed.shape and entry["error_message"] == parsed.error_message
    if parsed.failed_at is not None and response.status_code == 201:
        assert FailedEvent.objects.get(pk=entry["id"]).failed_at == parsed.failed_at

    detail = api.get(f"{DLQ_URL}/{entry['id']}")
    assert detail.status_code == 200 and detail.json()["event_id"] == entry["event_id"]
    listed = api.get(DLQ_URL, {"page_size": 500})
    assert listed.status_code == 200
    assert entry["id"] in [row["id"] for row in listed.json()["results"]]
    assert console.get(f"/admin/dlq/failedevent/{entry['id']}/change/").status_code == 200
    assert len(csv_rows(console, "/admin/dlq/failedevent/export.csv")) == FailedEvent.objects.count()
