"""DLQ payloads at rest: sealed under the configured key, in the stored row itself, and
opened back whole; the seam is the ledger's encryption module, imported plainly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from dlq.entries import payloads
from dlq.models import FailedEvent
from ledger.platform import crypto
from tests.dlq.conftest import example

pytestmark = pytest.mark.django_db

SECRET_VALUE = "priya.raman@example.invalid"


@pytest.fixture
def configured_key(monkeypatch: pytest.MonkeyPatch, settings: Any) -> str:
    key_id = "dlqtest"
    monkeypatch.setenv(crypto.KEYS_ENV, f"{key_id}:{Fernet.generate_key().decode()}")
    settings.ONCEGUARD_PRIVACY = {**getattr(settings, "ONCEGUARD_PRIVACY", {}), "ENCRYPT": True}
    return key_id


def _stored_payload_text(pk: int) -> str:
    """The column as the database holds it (no model field, no decoding on the way)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM dlq_failedevent WHERE id = %s", [pk])
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


def test_an_ingested_payload_is_stored_encrypted_under_the_configured_key(client, configured_key):
    body = example("voice-call-analyzed.json") | {"event_id": "sealed-1", "contact": {"email": SECRET_VALUE}}

    response = client.post("/api/v1/dlq/events", body, format="json")

    assert response.status_code == 201
    event = FailedEvent.objects.get()
    stored = _stored_payload_text(event.pk)
    assert SECRET_VALUE not in stored
    assert crypto.is_sealed(event.payload) and crypto.key_id_of(event.payload) == configured_key
    assert payloads.open_payload(event.payload)["contact"]["email"] == SECRET_VALUE


def test_the_seam_is_the_encryption_module_itself_not_a_fallback():
    # A broken import of ledger.platform.crypto must fail loudly, never leave payloads in clear: the
    # seam holds the module's own functions.
    assert payloads.seal_payload is crypto.seal_json
    assert payloads.open_payload is crypto.open_json
    assert payloads.is_redacted is crypto.is_redacted
