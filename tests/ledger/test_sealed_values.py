"""Sealed values: JSON everywhere in Python, their bytes on disk (PostgreSQL; issue 16 item 3,
DESIGN §12 *Cheaper growth*; ledger.models.SealedJSONField, migration 0031)."""

from __future__ import annotations

import base64
import importlib
import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from ledger import models
from ledger.models import Attempt, Operation, bytes_to_sealed, sealed_to_bytes
from ledger.platform import crypto
from ledger.protocol import services
from ledger.store import statements
from tests.conftest import on_postgres
from tests.ledger.support import CLAIM_URL, claim_body, op_url

migration = importlib.import_module("ledger.migrations.0031_sealed_values_as_bytes")

REDACTED = {
    crypto.REDACTED: {
        "at": "2026-01-02T03:04:05.000006+00:00",
        "policy": 3,
        "run": 9,
        "hmac": "ab" * 32,
        "key_id": "local1",
        "bytes": 41,
    }
}
PLAIN = {"customer": "cus_123", "amount": 1999, "currency": "eur", "note": "ünïcödé ✓", "items": [1, 2.5, None]}


def _legacy(value: Any) -> dict[str, str]:
    """A v1 envelope (Fernet, the first format), as older rows hold them."""
    ring = crypto.keyring()
    token = ring.fernets[ring.current_id].encrypt(json.dumps(value).encode()).decode()
    return {crypto.ENVELOPE: f"{crypto.LEGACY_VERSION}:{ring.current_id}:{token}"}


def samples() -> list[tuple[str, Any, bool]]:
    """(name, stored JSON value, stored as an envelope's bytes)."""
    return [
        ("sealed", crypto.seal_json(PLAIN, always=True), True),
        ("sealed-empty-object", crypto.seal_json({}, always=True), True),
        ("legacy-fernet", _legacy(PLAIN), True),
        ("plain", PLAIN, False),
        ("redacted", REDACTED, False),
        ("string", "x", False),
        ("number", 7, False),
        ("list", [{"_enc": "v2:k:AA=="}], False),
        ("empty-object", {}, False),
        ("envelope-not-a-string", {crypto.ENVELOPE: 5}, False),
        ("envelope-with-more-keys", {crypto.ENVELOPE: "v2:k:AA==", "y": 1}, False),
        ("envelope-not-canonical", {crypto.ENVELOPE: "v2:k:AB=="}, False),
        ("envelope-unpadded", {crypto.ENVELOPE: "v2:k:AA"}, False),
        ("envelope-bad-text", {crypto.ENVELOPE: "bad"}, False),
        ("envelope-empty-token", {crypto.ENVELOPE: "v2:k:"}, True),
        ("envelope-short", {crypto.ENVELOPE: "v2:k:AA=="}, True),
    ]


NAMES = [name for name, _, _ in samples()]


def _sample(name: str) -> tuple[Any, bool]:
    return next((value, as_envelope) for n, value, as_envelope in samples() if n == name)


@pytest.mark.parametrize("name", NAMES)
def test_every_value_reads_back_as_written_and_only_envelopes_are_stored_as_their_bytes(name: str) -> None:
    value, as_envelope = _sample(name)
    stored = sealed_to_bytes(value)
    assert bytes_to_sealed(stored) == value
    assert stored[0] == (1 if as_envelope else 0)
    if as_envelope:
        head, _, token = value[crypto.ENVELOPE].rpartition(":")
        assert stored == bytes((1, len(head))) + head.encode() + base64.urlsafe_b64decode(token)


def test_the_field_knows_the_envelopes_key() -> None:
    assert models.ENVELOPE == crypto.ENVELOPE


def test_a_sealed_value_opens_after_the_round_trip_and_is_a_third_smaller() -> None:
    sealed = crypto.seal_json(PLAIN, always=True)
    assert crypto.open_json(bytes_to_sealed(sealed_to_bytes(sealed))) == PLAIN
    assert len(sealed_to_bytes(sealed)) < 0.8 * len(json.dumps(sealed))


def test_an_unknown_stored_form_is_refused() -> None:
    with pytest.raises(ValueError):
        bytes_to_sealed(b"\x07{}")
    with pytest.raises(ValueError):
        bytes_to_sealed(b"")


@pytest.fixture
def claimed(tenant: Any, provider: Any) -> Operation:
    return services.operation_claim(
        tenant=tenant, key="sealed-1", provider=provider, action="charge", payload=PLAIN
    ).operation


@pytest.mark.django_db
@pytest.mark.parametrize("name", [*NAMES, "none"])
def test_the_orm_and_the_named_statements_read_back_every_value(claimed: Operation, name: str) -> None:
    value = None if name == "none" else _sample(name)[0]
    Operation.objects.filter(pk=claimed.pk).update(payload=value, response_body=value)
    Attempt.objects.filter(operation_id=claimed.pk).update(response_body=value)
    op = Operation.objects.get(pk=claimed.pk)
    assert op.payload == value and op.response_body == value
    assert Attempt.objects.get(operation_id=claimed.pk).response_body == value
    assert Operation.objects.filter(pk=claimed.pk).values_list("payload", flat=True).get() == value
    params = {"tenant_id": claimed.tenant_id, "key": claimed.key}
    for fast in (True, False):
        statements.FAST_ROWS = fast
        try:
            row = statements.operation("operation_by_key", params)
        finally:
            statements.FAST_ROWS = True
        assert row is not None and row.payload == value and row.response_body == value
    # A model save writes it back unchanged.
    op.save()
    assert Operation.objects.get(pk=claimed.pk).payload == value
    assert Operation.objects.filter(pk=claimed.pk, payload__isnull=value is None).exists()


@pytest.mark.django_db
def test_has_key_and_sealed_under_answer_on_the_stored_form(tenant: Any, provider: Any) -> None:
    current = f"{crypto.VERSION}:{crypto.keyring().current_id}"
    rows = {}
    for name in ("sealed", "legacy-fernet", "plain", "redacted", "list", "envelope-with-more-keys"):
        op = services.operation_claim(tenant=tenant, key=f"k-{name}", provider=provider, action="charge").operation
        Operation.objects.filter(pk=op.pk).update(payload=_sample(name)[0])
        rows[name] = op.pk
    Operation.objects.filter(pk=rows["plain"]).update(payload={"_redacted_not": 1, "x": {"_redacted": {}}})

    def named(**lookup: Any) -> set[str]:
        found = set(Operation.objects.filter(tenant=tenant, **lookup).values_list("pk", flat=True))
        return {name for name, pk in rows.items() if pk in found}

    assert named(payload__has_key=crypto.REDACTED) == {"redacted"}
    assert named(payload__has_key=crypto.ENVELOPE) == {"sealed", "legacy-fernet", "envelope-with-more-keys"}
    assert named(payload__sealed_under=current) == {"sealed"}
    excluded = set(
        Operation.objects.filter(tenant=tenant, pk__in=rows.values())
        .exclude(payload__has_key=crypto.REDACTED)
        .values_list("pk", flat=True)
    )
    assert excluded == set(rows.values()) - {rows["redacted"]}


pg = pytest.mark.skipif(not on_postgres(), reason="the columns are bytea on PostgreSQL only")


@pg
@pytest.mark.django_db
def test_a_claim_and_its_completion_store_bytes_and_a_replay_answers_the_recorded_response(
    tenant: Any, api: Any
) -> None:
    response = api.post(CLAIM_URL, claim_body("sealed-2", payload=PLAIN), format="json")
    assert response.status_code == 201, response.content
    claim = response.json()
    answer = {"id": "ch_9", "paid": True, "amount": 1999}
    done = api.post(
        op_url(claim["id"], "complete"),
        {"lease_token": claim["lease_token"], "provider_ref": "ch_9", "response": answer},
        format="json",
    )
    assert done.status_code == 200, done.content
    op = Operation.objects.get(pk=claim["id"])
    assert crypto.open_json(op.payload) == PLAIN and crypto.open_json(op.response_body) == answer
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_typeof(payload)::text, get_byte(payload, 0), get_byte(response_body, 0),"
            " octet_length(payload) FROM ledger_operation WHERE id = %s",
            [op.pk],
        )
        kind, payload_form, response_form, size = cursor.fetchone()
    assert (kind, payload_form, response_form) == ("bytea", 1, 1)
    assert size == len(sealed_to_bytes(op.payload)) < len(json.dumps(op.payload))
    # The Stripe-style replay: the same key and request answer the recorded response in clear,
    # read back through the named statements.
    assert statements.combined()
    replay = api.post(CLAIM_URL, claim_body("sealed-2", payload=PLAIN), format="json")
    assert replay.status_code == 200, replay.content
    assert replay.json()["response"] == {"status": 200, "body": answer, "masked": False}


@pg
@pytest.mark.django_db
def test_a_failure_keeps_or_replaces_the_response_through_the_named_statement(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="sealed-3", provider=provider, action="charge").operation
    failed = services.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class="invalid_input",
        message="declined",
        response_status=402,
        response_body={"error": "card_declined"},
    )
    assert failed.status == "failed" and crypto.open_json(failed.response_body) == {"error": "card_declined"}
    assert crypto.open_json(Operation.objects.get(pk=op.pk).response_body) == {"error": "card_declined"}


@pg
@pytest.mark.django_db
@pytest.mark.parametrize("name", NAMES)
def test_the_migrations_sql_converts_as_the_field_does_both_ways(name: str) -> None:
    value, as_envelope = _sample(name)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {migration.to_bytes('v')} FROM (SELECT CAST(%s AS jsonb) AS v) t", [json.dumps(value)])
        (stored,) = cursor.fetchone()
        stored = bytes(stored)
        # What the migration wrote reads back equal; an envelope is stored exactly as the field
        # stores it (another value keeps jsonb's spelling of its JSON).
        assert bytes_to_sealed(stored) == value
        assert stored[0] == (1 if as_envelope else 0)
        if as_envelope:
            assert stored == sealed_to_bytes(value)
        # And back: from what the migration wrote and from what the field writes.
        for raw in (stored, sealed_to_bytes(value)):
            cursor.execute(f"SELECT ({migration.to_jsonb('v')})::text FROM (SELECT CAST(%s AS bytea) AS v) t", [raw])
            assert json.loads(cursor.fetchone()[0]) == value


@pg
@pytest.mark.django_db
def test_null_stays_null_in_the_migrations_sql() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {migration.to_bytes('v')} IS NULL FROM (SELECT CAST(NULL AS jsonb) AS v) t")
        assert cursor.fetchone() == (True,)
        cursor.execute(f"SELECT {migration.to_jsonb('v')} IS NULL FROM (SELECT CAST(NULL AS bytea) AS v) t")
        assert cursor.fetchone() == (True,)


@pytest.mark.django_db
def test_key_rotation_reseals_every_kind_of_row(tenant: Any, provider: Any, monkeypatch: Any) -> None:
    from review.privacy.keys import encryption_rotate

    old = f"old:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, old)
    sealed = services.operation_claim(
        tenant=tenant, key="rot-1", provider=provider, action="charge", payload=PLAIN
    ).operation
    services.operation_complete(
        operation_id=sealed.pk, tenant_id=sealed.tenant_id, lease_token=sealed.lease_token, response_body={"ok": 1}
    )
    legacy = services.operation_claim(tenant=tenant, key="rot-2", provider=provider, action="charge").operation
    Operation.objects.filter(pk=legacy.pk).update(payload=_legacy(PLAIN))
    redacted = services.operation_claim(tenant=tenant, key="rot-3", provider=provider, action="charge").operation
    Operation.objects.filter(pk=redacted.pk).update(payload=REDACTED)
    monkeypatch.setenv(crypto.KEYS_ENV, f"new:{Fernet.generate_key().decode()},{old}")
    report = encryption_rotate()
    assert report["ledger.Operation"]["stale"] == 2 and report["ledger.Operation"]["resealed"] == 2
    for pk in (sealed.pk, legacy.pk):
        op = Operation.objects.get(pk=pk)
        assert crypto.key_id_of(op.payload) == "new" and crypto.open_json(op.payload) == PLAIN
    assert crypto.open_json(Operation.objects.get(pk=sealed.pk).response_body) == {"ok": 1}
    assert Operation.objects.get(pk=redacted.pk).payload == REDACTED
    assert encryption_rotate()["ledger.Operation"]["stale"] == 0


@pg
@pytest.mark.django_db(transaction=True)
def test_the_migration_converts_existing_rows_and_reverses_exactly(tenant: Any, provider: Any) -> None:
    """Migration 0031 back and forth over rows holding every kind of value, the attempts'
    partitioned table included (PostgreSQL refuses some expressions there)."""
    from django.db.migrations.executor import MigrationExecutor

    cases = [(name, value) for name, value, _ in samples()]
    ids = {}
    for name, _value in cases:
        op = services.operation_claim(tenant=tenant, key=f"mig-{name}", provider=provider, action="c").operation
        ids[name] = op.pk
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        executor.migrate([("ledger", "0030_attempt_event_composite_pk")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_typeof(payload)::text FROM ledger_operation LIMIT 1")
            assert cursor.fetchone() == ("jsonb",)
            for name, value in cases:
                cursor.execute(
                    "UPDATE ledger_operation SET payload = %s::jsonb, request = %s::jsonb WHERE id = %s",
                    [json.dumps(value), json.dumps(value), ids[name]],
                )
                cursor.execute(
                    "UPDATE ledger_attempt SET response_body = %s::jsonb WHERE operation_id = %s",
                    [json.dumps(value), ids[name]],
                )
            cursor.execute("SELECT id, payload::text FROM ledger_operation ORDER BY id")
            before = cursor.fetchall()
        MigrationExecutor(connection).migrate(leaves)
        for name, value in cases:
            op = Operation.objects.get(pk=ids[name])
            assert op.payload == value and op.request == value and op.response_body is None, name
            assert Attempt.objects.get(operation_id=ids[name]).response_body == value, name
        # And back: the same jsonb as before.
        MigrationExecutor(connection).migrate([("ledger", "0030_attempt_event_composite_pk")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, payload::text FROM ledger_operation ORDER BY id")
            assert cursor.fetchall() == before
    finally:
        MigrationExecutor(connection).migrate(leaves)
