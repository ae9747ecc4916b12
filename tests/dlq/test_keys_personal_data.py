"""The DLQ's ingest applies the key rule as the API does (ledger.rules.key_rules): a reported key
holding an e-mail address or an international phone number is "no usable key" by default, and
the entry's key where the tenant allows such keys (``Tenant.personal_data_in_keys_allowed``) —
on every path a key arrives by: the envelope's ``idempotency_key``, an ``Idempotency-Key``
header, and the failed request of an n8n Error Trigger report."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dlq.models import FailedEvent, KeySource
from ledger.models import Tenant
from tests.dlq.conftest import example, post_raw
from tests.dlq.test_n8n_occurrences import error_report, ingest

pytestmark = pytest.mark.django_db

EMAIL_KEY = "lead-priya.raman@example.com:crm-contact:v1"
PHONE_KEY = "lead:+61412345678:crm-contact:v1"
CONTACT = example("crm-create-contact-request.json")["body"]


def allow(tenant: Tenant) -> Tenant:
    Tenant.objects.filter(pk=tenant.pk).update(personal_data_in_keys_allowed=True)
    tenant.refresh_from_db()
    return tenant


def envelope(key: str, event_id: str = "") -> dict[str, Any]:
    return {
        **({"event_id": event_id} if event_id else {}),
        "idempotency_key": key,
        "payload": CONTACT,
        "error": {"message": "CRM 429", "class": "transient"},
    }


@pytest.mark.parametrize("key", [EMAIL_KEY, PHONE_KEY], ids=["e-mail", "phone"])
def test_a_reported_key_with_personal_data_is_no_usable_key_by_default(tenant, key):
    event = ingest(tenant, envelope(key, "lead-77")).event
    assert event.original_key == "lead-77" and event.key_source == KeySource.IDENTITY
    trigger = ingest(tenant, error_report("4812", key=key)).event
    assert trigger.original_key == "n8n:17:4812" and trigger.key_source == "missing"
    assert "no usable key" in trigger.key_note
    assert key not in trigger.key_note


@pytest.mark.parametrize("key", [EMAIL_KEY, PHONE_KEY], ids=["e-mail", "phone"])
def test_a_tenant_that_allows_personal_data_in_keys_gets_its_reported_key_as_the_entrys_key(tenant, key):
    allow(tenant)
    event = ingest(tenant, envelope(key, "lead-77")).event
    assert event.original_key == key and event.key_source == KeySource.REPORTED_WITH_ID
    trigger = ingest(tenant, error_report("4812", key=key)).event
    assert trigger.original_key == key and trigger.key_source == "request_header"
    # The same lead failing again is another occurrence of that entry, as for any key.
    again = ingest(tenant, error_report("4813", key=key)).event
    assert again.pk == trigger.pk and again.occurrence_count == 2


def test_the_declared_key_field_with_personal_data_follows_the_tenants_setting(tenant):
    report = error_report("4812", key=None)
    report["key_field"] = "email"
    refused = ingest(tenant, report).event
    assert refused.key_source == "missing" and "no usable key" in refused.key_note
    assert refused.original_key == "n8n:17:4812"
    allow(tenant)
    report = error_report("4813", key=None)
    report["key_field"] = "email"
    accepted = ingest(tenant, report).event
    assert accepted.original_key == CONTACT["email"] and accepted.key_source == "request_field"


def test_the_idempotency_key_header_of_a_report_follows_the_tenants_setting_through_the_api(
    tenant, other_tenant, make_client
):
    allow(tenant)
    allowed, default = make_client(tenant), make_client(other_tenant)
    body = json.dumps(envelope(EMAIL_KEY) | {"idempotency_key": None})

    kept = post_raw(allowed, body, HTTP_IDEMPOTENCY_KEY=EMAIL_KEY)
    dropped = post_raw(default, body, HTTP_IDEMPOTENCY_KEY=EMAIL_KEY)

    assert kept.status_code == 201 and kept.json()["original_key"] == EMAIL_KEY
    # Never a refusal: the other tenant's entry is stored, without the key.
    assert dropped.status_code == 201 and dropped.json()["original_key"] != EMAIL_KEY
    assert FailedEvent.objects.filter(original_key=EMAIL_KEY).count() == 1
