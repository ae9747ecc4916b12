"""The sweeper's rules that need no provider call (DESIGN §3 "The sweeper")."""

from __future__ import annotations

from typing import Any

import pytest

from dlq.models import FailedEvent
from ledger.models import AttemptOutcome, IdempotencyClass, Operation, OperationMode, OperationStatus
from ledger.protocol import services
from ledger.recovery.sweeper import (
    alert_stuck,
    expire_abandoned_retries,
    reconcile_uncertain,
    sweep,
    sweep_expired_leases,
)
from ledger.store import sql
from tests.ledger.support import attempts_of, events_of, expire_lease

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


def _provider(tenant: Any, slug: str, cls: str, lookup_path: str = "") -> Any:
    return services.provider_upsert(
        tenant=tenant, slug=slug, base_url="http://127.0.0.1:9", idempotency_class=cls, lookup_path=lookup_path
    )


def _claim(tenant: Any, provider: Any, key: str, **kw: Any) -> Operation:
    return services.operation_claim(tenant=tenant, key=key, provider=provider, request={"k": key}, **kw).operation


def _set(op_id: int, **values: Any) -> None:
    Operation.objects.filter(pk=op_id).update(**values)


def test_expired_lease_without_marker_from_a_marker_honouring_sender_is_retried(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "a:1", uses_sent_marker=True)
    expire_lease(op.pk)
    report = sweep_expired_leases()
    op.refresh_from_db()
    assert op.status == S.RETRY_WAIT
    assert report.counts == {"claimed->retry_wait": 1}
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.EXPIRED
    # Due at once: the next claim of the same key takes a new attempt.
    again = services.operation_claim(tenant=tenant, key="a:1", provider=p, request={"k": "a:1"})
    assert again.acquired and again.operation.attempts == 2


def test_expired_lease_without_marker_from_a_sender_that_never_promised_is_treated_as_sent(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "a:2", uses_sent_marker=False)
    expire_lease(op.pk)
    sweep_expired_leases()
    op.refresh_from_db()
    assert op.status == S.UNCERTAIN
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.AMBIGUOUS


def test_expired_lease_after_the_sent_marker_becomes_uncertain(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "a:3", mark_sent=True)
    expire_lease(op.pk)
    sweep_expired_leases()
    op.refresh_from_db()
    assert op.status == S.UNCERTAIN


def test_live_lease_is_left_alone(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "a:4", mark_sent=True)
    assert sweep().counts.get("claimed->uncertain") is None
    op.refresh_from_db()
    assert op.status == S.CLAIMED


def test_two_overlapping_passes_move_each_row_once(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    ops = [_claim(tenant, p, f"b:{i}", mark_sent=True) for i in range(5)]
    for op in ops:
        expire_lease(op.pk)
    first = sweep_expired_leases()
    second = sweep_expired_leases()
    assert first.counts == {"claimed->uncertain": 5}
    assert second.counts == {}
    for op in ops:
        moves = [e for e in events_of(op.pk) if e[1] == S.UNCERTAIN]
        assert len(moves) == 1


def test_key_advisory_uncertain_goes_to_review_never_resent(tenant):
    p = _provider(tenant, "smtp", IdempotencyClass.KEY_ADVISORY, lookup_path="/x?k={key}")
    op = _claim(tenant, p, "c:1", mark_sent=True)
    expire_lease(op.pk)
    report = sweep()
    op.refresh_from_db()
    assert op.status == S.REVIEW
    assert report.counts["uncertain->review"] == 1
    assert op.attempts == 1  # nothing re-sent
    assert op.reconcile_until is None


def test_guard_mode_key_enforced_without_lookup_goes_to_review(tenant):
    p = _provider(tenant, "nolookup", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "c:2", mark_sent=True)
    expire_lease(op.pk)
    sweep()
    op.refresh_from_db()
    assert op.status == S.REVIEW


def test_execute_mode_key_enforced_without_lookup_is_reissued_with_the_same_key(tenant):
    p = _provider(tenant, "nolookup", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "c:3", mode=OperationMode.EXECUTE, via_claims=False)
    _set(op.pk, status=S.UNCERTAIN, attempts=1)
    reconcile_uncertain()
    op.refresh_from_db()
    assert op.status == S.RETRY_WAIT
    assert op.next_attempt_at is not None
    assert op.key == "c:3"


def test_uncertain_row_under_a_live_reconciliation_lease_is_skipped(tenant):
    p = _provider(tenant, "smtp", IdempotencyClass.KEY_ADVISORY)
    op = _claim(tenant, p, "c:4", mark_sent=True)
    expire_lease(op.pk)
    sweep_expired_leases()
    future, params = sql.now_plus(60)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET reconcile_until = {future} WHERE id = %s", [*params, op.pk])
    assert reconcile_uncertain().counts == {}
    op.refresh_from_db()
    assert op.status == S.UNCERTAIN


def test_guard_retry_wait_past_its_lifetime_fails_into_the_dlq(tenant):
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "d:1", mark_sent=True)
    services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class="transient", message="503"
    )
    past, params = sql.now_plus(-5)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET expires_at = {past} WHERE id = %s", [*params, op.pk])
    expire_abandoned_retries()
    op.refresh_from_db()
    assert op.status == S.FAILED
    assert FailedEvent.objects.filter(operation=op).exists()


def test_stuck_rows_raise_exactly_one_alert_each(tenant, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "STUCK_ALERT_SECONDS": 0}
    p = _provider(tenant, "enf", IdempotencyClass.KEY_ENFORCED)
    op = _claim(tenant, p, "e:1", mark_sent=True)
    past, params = sql.now_plus(-10)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET updated_at = {past} WHERE id = %s", [*params, op.pk])
    assert alert_stuck().counts == {"stuck_alerted": 1}
    assert alert_stuck().counts == {}
    op.refresh_from_db()
    assert op.alerted_at is not None
