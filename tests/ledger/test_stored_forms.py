"""Fingerprints and lease tokens: hex text everywhere, their bytes on disk (PostgreSQL; issue 16
item 3, DESIGN §12 *Cheaper growth*; ledger.models.HexBytesField, migration 0027)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.db import connection

from ledger.models import Attempt, Operation, Tombstone, bytes_to_hex, hex_to_bytes
from ledger.protocol import services
from tests.conftest import on_postgres
from tests.ledger.support import CLAIM_URL, claim_body, op_url

migration = importlib.import_module("ledger.migrations.0027_digests_and_tokens_as_bytes")

# Hex values, the empty token, and text the service never writes but a client may send or a
# hand-written row may hold — among them text exactly as long as a value's bytes, and one
# byte shorter (its escaped form would be exactly that long without the padding byte).
SAMPLES = [
    ("ab" * 32, 64),
    ("00" * 32, 64),
    ("0f" * 16, 32),
    ("", 32),
    ("", 64),
    ("taken-by-worker", 32),
    ("e" * 15, 32),
    ("t" * 16, 32),
    ("t" * 31, 64),
    ("x" * 43, 32),
    ("AB" * 16, 32),
    ("f", 64),
    ("ünïcödé-tökén", 32),
]


@pytest.mark.parametrize(("text", "digits"), SAMPLES)
def test_every_text_reads_back_as_written_and_only_hex_is_stored_as_its_bytes(text: str, digits: int) -> None:
    stored = hex_to_bytes(text, digits)
    assert bytes_to_hex(stored, digits) == text
    canonical = len(text) == digits and text == text.lower() and all(c in "0123456789abcdef" for c in text)
    assert (len(stored) == digits // 2) == canonical
    if canonical:
        assert stored == bytes.fromhex(text)


def test_text_that_is_not_hex_never_equals_a_hex_values_bytes() -> None:
    stored = {hex_to_bytes(text, 32) for text, digits in SAMPLES if digits == 32}
    assert len(stored) == len([1 for _, digits in SAMPLES if digits == 32])
    # Upper-case hex is another text, as it was when tokens were compared as strings.
    assert hex_to_bytes("AB" * 16, 32) != hex_to_bytes("ab" * 16, 32)


pg = pytest.mark.skipif(not on_postgres(), reason="the columns are bytea on PostgreSQL only")


@pg
@pytest.mark.django_db
def test_a_claim_stores_its_fingerprint_and_tokens_as_bytes_and_shows_them_as_hex(tenant: Any, api: Any) -> None:
    response = api.post(CLAIM_URL, claim_body("bytes-1"), format="json")
    assert response.status_code == 201, response.content
    token = response.json()["lease_token"]
    op = Operation.objects.get(tenant=tenant, key="bytes-1")
    assert len(token) == 32 and int(token, 16) >= 0
    assert op.lease_token == token == Attempt.objects.get(operation=op).lease_token
    body = claim_body("bytes-1")
    assert op.fingerprint == services.request_fingerprint(
        mode="guard", provider=body["provider"], action=body["action"], request=body["request"]
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_typeof(o.fingerprint)::text, octet_length(o.fingerprint), octet_length(o.lease_token),"
            " octet_length(a.lease_token), encode(o.lease_token, 'hex')"
            " FROM ledger_operation o JOIN ledger_attempt a ON a.operation_id = o.id WHERE o.id = %s",
            [op.pk],
        )
        assert cursor.fetchone() == ("bytea", 32, 16, 16, token)
    # The holder's token (text) still fences: a forged one is refused, the holder's completes.
    forged = api.post(op_url(op.pk, "complete"), {"lease_token": "0" * 32, "provider_ref": "x"}, format="json")
    assert forged.status_code == 409, forged.content
    done = api.post(op_url(op.pk, "complete"), {"lease_token": token, "provider_ref": "ch_1"}, format="json")
    assert done.status_code == 200, done.content
    replay = api.post(CLAIM_URL, claim_body("bytes-1"), format="json")
    assert replay.status_code == 200 and replay.json()["status"] == "succeeded", replay.content
    # The same key with another request is still told apart by its fingerprint.
    other = api.post(CLAIM_URL, claim_body("bytes-1", request={"amount": 1}), format="json")
    assert other.status_code == 422, other.content


@pg
@pytest.mark.django_db
def test_a_token_that_is_not_hex_is_kept_as_written_and_fences_nothing(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="bytes-2", provider=provider, action="charge").operation
    Operation.objects.filter(pk=op.pk).update(lease_token="taken-by-worker")
    assert Operation.objects.get(pk=op.pk).lease_token == "taken-by-worker"
    assert Operation.objects.filter(pk=op.pk, lease_token="taken-by-worker").exists()
    assert not Operation.objects.filter(pk=op.pk, lease_token=op.lease_token).exists()


@pg
@pytest.mark.django_db
def test_a_tombstone_keeps_the_fingerprint_bytes(tenant: Any, provider: Any) -> None:
    from ledger.protocol.tombstones import tombstones_create

    op = services.operation_claim(tenant=tenant, key="bytes-3", provider=provider, action="charge").operation
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_3"
    )
    from django.utils import timezone

    assert tombstones_create(plain_ids=[op.pk], superseded_ids=[], deleted_at=timezone.now()) == 1
    stone = Tombstone.objects.get(tenant=tenant, key="bytes-3")
    assert stone.fingerprint == Operation.objects.get(pk=op.pk).fingerprint
    with connection.cursor() as cursor:
        cursor.execute("SELECT octet_length(fingerprint) FROM ledger_tombstone WHERE id = %s", [stone.pk])
        assert cursor.fetchone() == (32,)


@pg
@pytest.mark.django_db
@pytest.mark.parametrize(("text", "digits"), SAMPLES)
def test_the_migrations_sql_converts_as_the_field_does_both_ways(text: str, digits: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {migration._to_bytes('v', digits)} FROM (SELECT CAST(%s AS varchar) AS v) t", [text])
        (stored,) = cursor.fetchone()
        assert bytes(stored) == hex_to_bytes(text, digits)
        cursor.execute(f"SELECT {migration._to_text('v', digits)} FROM (SELECT CAST(%s AS bytea) AS v) t", [stored])
        assert cursor.fetchone() == (text,)
