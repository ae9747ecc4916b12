"""Failed attempts' evidence kept on purpose (ADR 0016): one row per failed attempt, written in
its transaction, holding no personal data; it outlives the operation's retention and the
month of attempts, and goes only after its own period; the API lists one tenant's."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import Attempt, AttemptEvidence, ErrorClass, Operation, Provider, Tenant
from ledger.platform import partitions
from ledger.protocol import services
from ledger.store import sql
from review.models import RetentionPolicy
from review.privacy import erasure
from review.privacy.subjects import subject_resolve
from review.retention.purge import retention_purge
from tests.conftest import on_postgres
from tests.ledger.support import make_retry_due
from tests.ledger.test_partitions import monthly_from, names, settle
from tests.test_schema import _assert_answer_matches, _openapi

pytestmark = pytest.mark.django_db(transaction=True)
DAY = timedelta(days=1)

# A person in the payload, and a CRM error that echoes them back (a provider's 400 often does).
PERSON = {"contact": {"name": "Ada Lovelace", "email": "ada.lovelace@example.com", "phone": "+61 412 345 678"}}
KEY = "order-9917:crm-contact:v1"
ECHO = (
    "CRM refused contact Ada Lovelace <ada.lovelace@example.com> (+61 412 345 678) for"
    " order-9917:crm-contact:v1: duplicate of Lovelace, Ada"
)
PERSONAL_WORDS = ("ada", "lovelace", "example.com", "412", "345 678", "order-9917", "crm-contact")


def claim(tenant: Tenant, provider: Provider | None, key: str = KEY, **kwargs: Any) -> Operation:
    result = services.operation_claim(tenant=tenant, key=key, provider=provider, action="contact", **kwargs)
    assert result.acquired, result
    return result.operation


def fail(op: Operation, error_class: str = ErrorClass.INVALID_INPUT, **kwargs: Any) -> Operation:
    return services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=error_class, **kwargs
    )


def texts_of(row: AttemptEvidence) -> str:
    """Every column of the row as text, the key digest excepted (64 hex digits may spell a
    word by chance: checked on its own)."""
    return " ".join(
        str(getattr(row, f.attname)) for f in AttemptEvidence._meta.concrete_fields if f.name != "key_digest"
    )


def test_a_failed_attempt_writes_one_evidence_row_with_no_personal_data(tenant, provider):
    op = claim(tenant, provider, payload=PERSON)

    fail(op, message=ECHO, response_status=409)

    (row,) = AttemptEvidence.objects.all()
    assert (row.tenant_id, row.provider_slug, row.operation_id, row.attempt_number) == (tenant.pk, "stripe", op.pk, 1)
    assert (row.error_class, row.outcome, row.response_status) == ("invalid_input", "failed", 409)
    assert row.started_at <= row.finished_at and row.duration_ms is not None and row.duration_ms >= 0
    assert row.adapter_revision is None and row.preset_version == row.aspect_class == ""
    # The error says what happened; the person and the key it echoed are gone.
    assert row.error.startswith("CRM refused contact") and "duplicate of" in row.error
    text = texts_of(row).lower()
    assert not [word for word in PERSONAL_WORDS if word in text], row.error
    # The key only as a keyed digest: the same key gives the same digest, never the key.
    assert re.fullmatch(r"[0-9a-f]{64}", row.key_digest) and row.digest_key_id
    assert KEY not in texts_of(row)
    # The attempt itself keeps its message for the operation's life (e-mail masked as before).
    assert "Ada Lovelace" in op.attempt_set.get().message


def test_each_failed_attempt_has_its_row_and_a_success_writes_none(tenant, provider):
    flaky = claim(tenant, provider, key="retry-1")
    fail(flaky, ErrorClass.TRANSIENT, message="HTTP 503")
    done = claim(tenant, provider, key="fine-1")
    services.operation_complete(
        operation_id=done.pk, tenant_id=tenant.pk, lease_token=done.lease_token, provider_ref="r", response_body={}
    )
    ambiguous = claim(tenant, provider, key="maybe-1")
    fail(ambiguous, ErrorClass.AMBIGUOUS, message="ReadTimeout after send")

    rows = {r.operation_id: r for r in AttemptEvidence.objects.all()}
    assert set(rows) == {flaky.pk, ambiguous.pk}
    assert (rows[flaky.pk].outcome, rows[ambiguous.pk].outcome) == ("transient", "ambiguous")
    # The same key's digest is stable; another key's differs.
    make_retry_due(flaky.pk)
    again = claim(tenant, provider, key="retry-1")
    fail(again, ErrorClass.TRANSIENT, message="HTTP 503")
    digests = list(AttemptEvidence.objects.filter(operation_id=flaky.pk).values_list("key_digest", flat=True))
    assert len(digests) == 2 and digests[0] == digests[1] != rows[ambiguous.pk].key_digest


def test_the_operations_purge_keeps_the_evidence_and_its_own_period_removes_it(tenant, provider, settings):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", payload_ttl=DAY, record_ttl=30 * DAY)
    # A first attempt fails (echoing the person), the second succeeds: the operation is purged
    # with its attempts, the first attempt's evidence stays.
    op = fail(claim(tenant, provider, payload=PERSON), ErrorClass.TRANSIENT, message=ECHO)
    make_retry_due(op.pk)
    op = claim(tenant, provider, payload=PERSON)
    services.operation_complete(
        operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, provider_ref="r", response_body={}
    )
    past = timezone.now() - 40 * DAY
    Operation.objects.filter(pk=op.pk).update(created_at=past, updated_at=past, done_at=past)

    [run] = retention_purge(trigger="test")

    assert not Operation.objects.filter(pk=op.pk).exists() and run.details["operations"]["deleted"] == 1
    assert not Attempt.objects.filter(operation_id=op.pk).exists()
    (row,) = AttemptEvidence.objects.all()
    assert (row.operation_id, row.attempt_number) == (op.pk, 1) and run.details["attempt_evidence"]["deleted"] == 0

    # Past FAILED_ATTEMPT_EVIDENCE_DAYS, the next pass deletes it (and only it).
    settings.ONCEGUARD_RETENTION = {**settings.ONCEGUARD_RETENTION, "EVIDENCE_DAYS": 10}
    newer = fail(claim(tenant, provider, key="newer-1"), message="HTTP 422")
    AttemptEvidence.objects.filter(pk=row.pk).update(started_at=past, finished_at=past)

    [run] = retention_purge(trigger="test")

    assert list(AttemptEvidence.objects.values_list("operation_id", flat=True)) == [newer.pk]
    assert run.details["attempt_evidence"]["deleted"] == 1


def test_a_legal_hold_on_operations_keeps_the_evidence_past_its_period(tenant, provider, settings):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=30 * DAY, legal_hold=True)
    settings.ONCEGUARD_RETENTION = {**settings.ONCEGUARD_RETENTION, "EVIDENCE_DAYS": 10}
    fail(claim(tenant, provider), message="HTTP 422")
    past = timezone.now() - 400 * DAY
    AttemptEvidence.objects.update(started_at=past, finished_at=past)

    [run] = retention_purge(trigger="test")

    assert AttemptEvidence.objects.count() == 1 and run.details["attempt_evidence"]["held"] is True


def test_the_evidence_of_a_tenant_without_any_policy_still_expires(tenant, provider, settings):
    settings.ONCEGUARD_RETENTION = {**settings.ONCEGUARD_RETENTION, "APPLY_DEFAULTS": False, "EVIDENCE_DAYS": 10}
    fail(claim(tenant, provider), message="HTTP 422")
    past = timezone.now() - 11 * DAY
    AttemptEvidence.objects.update(started_at=past, finished_at=past)

    retention_purge(trigger="test")

    assert not AttemptEvidence.objects.exists()


def test_an_erasure_keeps_the_evidence_and_drops_its_link_to_the_key(tenant, provider):
    op = fail(claim(tenant, provider, payload=PERSON), message=ECHO)
    before = AttemptEvidence.objects.get()
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": "ada.lovelace@example.com"}),
        actor="t",
        reason="Erasure request ER-1",
        enqueue=False,
    )

    erasure.erasure_continue(run_id=run.pk)

    after = AttemptEvidence.objects.get()
    assert after.operation_id == op.pk and after.error == before.error and after.error_class == "invalid_input"
    assert after.key_digest == "" and after.digest_key_id == ""


def test_the_api_lists_only_the_callers_tenants_evidence_paginated_and_as_documented(
    tenant, other_tenant, provider, make_client
):
    theirs = services.provider_upsert(
        tenant=other_tenant, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    fail(claim(other_tenant, theirs, key="theirs-1"), message="HTTP 422")
    mine = [fail(claim(tenant, provider, key=f"mine-{n}"), ErrorClass.PERMISSION, message="HTTP 403") for n in range(3)]
    api = make_client(tenant, scopes=["read"])

    first = api.get("/api/v1/attempt-evidence", {"page_size": 2})

    assert first.status_code == 200, first.json()
    _assert_answer_matches(_openapi(), "/api/v1/attempt-evidence", "get", first)
    body = first.json()
    assert [r["operation_id"] for r in body["results"]] == [mine[2].pk, mine[1].pk] and body["next"]
    rest = api.get(body["next"]).json()
    assert [r["operation_id"] for r in rest["results"]] == [mine[0].pk] and rest["next"] is None
    assert {r["error_class"] for r in body["results"]} == {"permission"}
    assert api.get("/api/v1/attempt-evidence", {"error_class": "transient"}).json()["results"] == []
    assert len(api.get("/api/v1/attempt-evidence", {"provider": "stripe"}).json()["results"]) == 3
    assert api.get("/api/v1/attempt-evidence", {"provider": "other"}).json()["results"] == []
    later = (timezone.now() + DAY).isoformat()
    assert api.get("/api/v1/attempt-evidence", {"finished_after": later}).json()["results"] == []
    assert api.get("/api/v1/attempt-evidence", {"error_class": "nonsense"}).status_code == 400


@pytest.mark.skipif(not on_postgres(), reason="declarative partitioning is PostgreSQL's")
@pytest.mark.django_db
def test_a_dropped_month_of_attempts_leaves_its_evidence(tenant, provider):
    now = sql.db_now()
    old = partitions.month_start(now, plus=-14)
    monthly_from(partitions.month_start(now, plus=-15))
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=30 * DAY)
    # The first attempt fails (evidence), the second succeeds; then all of it moves to `old`.
    op = fail(claim(tenant, provider, payload=PERSON), ErrorClass.TRANSIENT, message=ECHO)
    make_retry_due(op.pk)
    op = claim(tenant, provider, payload=PERSON)
    services.operation_complete(
        operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, provider_ref="r", response_body={}
    )
    at = old + timedelta(days=14)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_operation SET created_at = %s, updated_at = %s, done_at = %s, claimed_at = %s WHERE id = %s",
            [at, at, at, at, op.pk],
        )
        cursor.execute("UPDATE ledger_attempt SET started_at = %s WHERE operation_id = %s", [at, op.pk])
        cursor.execute("UPDATE ledger_operationevent SET at = %s WHERE operation_id = %s", [at, op.pk])
    AttemptEvidence.objects.update(started_at=at, finished_at=at)
    settle()

    retention_purge(now=now, trigger="test")

    assert partitions.partition_name("ledger_attempt", old) not in names("ledger_attempt")
    assert not Operation.objects.filter(pk=op.pk).exists()
    (row,) = AttemptEvidence.objects.all()
    assert (row.operation_id, row.attempt_number, row.error_class) == (op.pk, 1, "transient")
