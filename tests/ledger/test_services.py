"""ledger.protocol.services: failure classes, backoff, caps, DLQ, leases, events (DESIGN §3)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F

from dlq.models import FailedEvent
from ledger.models import (
    ALLOWED_TRANSITIONS,
    AttemptOutcome,
    ErrorClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    Provider,
    Tenant,
)
from ledger.platform import hooks
from ledger.platform.errors import (
    IllegalTransition,
    InvalidKey,
    LeaseExpired,
    LeaseLost,
    OperationAlreadyFinished,
    OperationInProgress,
    OperationNotFound,
    OperationRetryScheduled,
    ValidationFailed,
)
from ledger.protocol import services
from ledger.protocol.transitions import holder as transitions_holder
from ledger.protocol.transitions.claim import guarded_move
from ledger.recovery.sweeper import sweep_expired_leases
from tests.ledger.support import (
    attempts_of,
    events_of,
    expire_lease,
    ledger_counts,
    make_retry_due,
    plain,
    row,
)

S = OperationStatus
pytestmark = pytest.mark.django_db


def claim(tenant: Tenant, provider: Provider | None, key: str = "order-7:charge:v1", **kwargs: Any) -> Operation:
    kwargs.setdefault("action", "charge")
    kwargs.setdefault("request", {"amount": 1})
    result = services.operation_claim(tenant=tenant, key=key, provider=provider, **kwargs)
    assert result.acquired, result
    return result.operation


def fail(op: Operation, error_class: str, **kwargs: Any) -> Operation:
    return services.operation_fail(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=error_class, **kwargs
    )


def reclaim(tenant: Tenant, provider: Provider | None, op: Operation, **kwargs: Any) -> Operation:
    make_retry_due(op.pk)
    again = claim(tenant, provider, key=op.key, **kwargs)
    assert again.pk == op.pk
    return again


@pytest.fixture
def limited(tenant: Tenant) -> Provider:
    return services.provider_upsert(
        tenant=tenant,
        slug="limited",
        idempotency_class="key_enforced",
        max_attempts=2,
        base_delay_seconds=10.0,
        max_delay_seconds=300.0,
    )


# --- transient -----------------------------------------------------------------------------


def test_transient_failure_moves_to_retry_wait_with_next_attempt_at(tenant, limited):
    op = claim(tenant, limited)

    failed = fail(op, ErrorClass.TRANSIENT, message="503 before send")

    assert failed.status == S.RETRY_WAIT
    assert failed.next_attempt_at is not None
    assert failed.done_at is None
    assert failed.error_class == ErrorClass.TRANSIENT
    assert failed.last_error == "503 before send"
    assert failed.lease_expires_at is None
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.TRANSIENT
    assert not FailedEvent.objects.exists()


def test_backoff_delay_is_full_jitter_below_base_times_two_to_the_attempt(tenant, monkeypatch):
    provider = services.provider_upsert(
        tenant=tenant,
        slug="slow",
        idempotency_class="key_enforced",
        max_attempts=10,
        base_delay_seconds=10.0,
        max_delay_seconds=35.0,
    )
    real = services.backoff_seconds
    seen: list[tuple[int, float, float]] = []

    def top_of_range(*, attempt: int, base: float, cap: float, rng: Any = None) -> float:
        class Top:
            def uniform(self, low: float, high: float) -> float:
                return high

        value = real(attempt=attempt, base=base, cap=cap, rng=Top())
        seen.append((attempt, base, value))
        return value

    monkeypatch.setattr(transitions_holder, "backoff_seconds", top_of_range)
    op = claim(tenant, provider)
    delays = []
    for n in range(1, 5):
        failed = fail(op, ErrorClass.TRANSIENT)
        assert failed.status == S.RETRY_WAIT
        delays.append((failed.next_attempt_at - failed.updated_at).total_seconds())
        if n < 4:
            op = reclaim(tenant, provider, failed)
            assert op.attempts == n + 1

    # base·2^(n-1) = 10, 20, 40 → capped at 35, 80 → capped at 35.
    assert [attempt for attempt, _, _ in seen] == [1, 2, 3, 4]
    assert delays == pytest.approx([10.0, 20.0, 35.0, 35.0], abs=0.01)


def test_backoff_seconds_stays_within_zero_and_the_capped_ceiling():
    rng = random.Random(7)
    for attempt, base, cap in [(1, 1.0, 300.0), (3, 2.0, 300.0), (12, 1.0, 60.0)]:
        ceiling = min(cap, base * 2 ** (attempt - 1))
        samples = [services.backoff_seconds(attempt=attempt, base=base, cap=cap, rng=rng) for _ in range(300)]
        assert all(0 <= s <= ceiling for s in samples)
        # Full jitter: the whole range is used, not just its top or bottom.
        assert min(samples) < ceiling * 0.1
        assert max(samples) > ceiling * 0.9


def test_real_backoff_on_the_row_lies_within_the_first_attempts_ceiling(tenant, limited):
    for i in range(5):
        op = claim(tenant, limited, key=f"jitter-{i}")
        failed = fail(op, ErrorClass.TRANSIENT)
        delay = (failed.next_attempt_at - failed.updated_at).total_seconds()
        assert -0.001 <= delay <= 10.0 + 0.001


def test_retry_after_from_the_provider_delays_the_retry_at_least_that_long(tenant, limited):
    op = claim(tenant, limited)

    failed = fail(op, ErrorClass.TRANSIENT, retry_after=120)

    assert (failed.next_attempt_at - failed.updated_at).total_seconds() >= 119.99


def test_transient_failure_on_the_last_attempt_is_failed_with_a_dlq_entry(tenant, limited):
    op = claim(tenant, limited, payload={"order": 7})
    op = reclaim(tenant, limited, fail(op, ErrorClass.TRANSIENT))
    assert op.attempts == 2

    failed = fail(op, ErrorClass.TRANSIENT, message="still 503")

    assert failed.status == S.FAILED
    assert failed.done_at is not None
    assert failed.next_attempt_at is None
    entry = FailedEvent.objects.get(operation_id=op.pk)
    assert entry.original_key == op.key
    assert entry.error_class == ErrorClass.TRANSIENT
    assert plain(entry.payload) == {"order": 7}
    assert entry.status == "pending"
    assert "attempts exhausted" in events_of(op.pk)[-1][3]


def test_a_dlq_write_failure_rolls_back_the_failed_transition(tenant, limited):
    op = claim(tenant, limited)
    before = row(op.pk)
    counts = ledger_counts()

    def broken(*, operation: Operation) -> None:
        raise RuntimeError("dlq down")

    # The DLQ's receiver of operation_failed, replaced by one that fails.
    with hooks.operation_failed.replaced(broken), pytest.raises(RuntimeError):
        fail(op, ErrorClass.INVALID_INPUT)

    # Same transaction: no failed row without its DLQ entry.
    assert row(op.pk) == before
    assert ledger_counts() == counts


def test_throttled_failures_consume_no_attempt(tenant):
    provider = services.provider_upsert(
        tenant=tenant, slug="one-shot", idempotency_class="key_enforced", max_attempts=1
    )
    op = claim(tenant, provider)

    throttled = fail(op, ErrorClass.TRANSIENT, throttled=True, retry_after=5)

    assert throttled.status == S.RETRY_WAIT
    assert throttled.throttled_attempts == 1
    again = reclaim(tenant, provider, throttled)
    assert fail(again, ErrorClass.TRANSIENT).status == S.FAILED


def test_transient_failure_past_the_lifetime_is_failed(tenant, limited):
    op = claim(tenant, limited)
    Operation.objects.filter(pk=op.pk).update(expires_at=op.claimed_at - timedelta(seconds=1))

    failed = fail(op, ErrorClass.TRANSIENT)

    assert failed.status == S.FAILED
    assert "lifetime exhausted" in events_of(op.pk)[-1][3]
    assert FailedEvent.objects.filter(operation_id=op.pk).exists()


# --- definitive and ambiguous classes ---------------------------------------------------


@pytest.mark.parametrize("error_class", [ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION])
def test_definitive_failures_are_failed_with_a_dlq_entry_and_no_retry(tenant, provider, error_class):
    op = claim(tenant, provider)

    failed = fail(op, error_class, message="card declined", response_status=402)

    assert failed.status == S.FAILED
    assert failed.next_attempt_at is None
    assert failed.response_status == 402
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.FAILED
    assert FailedEvent.objects.get(operation_id=op.pk).error_class == error_class


def test_ambiguous_failure_is_uncertain_and_not_dead_lettered(tenant, provider):
    op = claim(tenant, provider)
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)

    failed = fail(op, ErrorClass.AMBIGUOUS, message="read timeout")

    assert failed.status == S.UNCERTAIN
    assert failed.done_at is None
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.AMBIGUOUS
    assert not FailedEvent.objects.exists()


def test_unknown_error_class_is_refused_and_changes_nothing(tenant, provider):
    op = claim(tenant, provider)
    before = row(op.pk)

    with pytest.raises(ValidationFailed):
        fail(op, "flaky")

    assert row(op.pk) == before


def _with_unresolved_first_attempt(tenant: Tenant, provider: Provider) -> Operation:
    """Attempt 1 was sent and its answer never seen; a reviewer allowed a retry anyway."""
    op = claim(tenant, provider)
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    uncertain = fail(op, ErrorClass.AMBIGUOUS, message="connection reset")
    guarded_move(
        operation=uncertain,
        to=S.RETRY_WAIT,
        actor="reviewer:ann",
        reason="re-issue with the same key",
        values={"next_attempt_at": F("created_at")},
    )
    second = claim(tenant, provider, key=op.key)
    assert second.attempts == 2
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.AMBIGUOUS
    return second


def test_attempt_cap_hit_with_an_unresolved_sent_attempt_goes_to_review_not_failed(tenant, limited):
    second = _with_unresolved_first_attempt(tenant, limited)

    result = fail(second, ErrorClass.TRANSIENT, message="503")

    assert result.status == S.REVIEW
    assert not FailedEvent.objects.exists()


def test_definitive_failure_with_an_unresolved_sent_attempt_goes_to_review(tenant, limited):
    second = _with_unresolved_first_attempt(tenant, limited)

    result = fail(second, ErrorClass.INVALID_INPUT, message="400")

    assert result.status == S.REVIEW
    assert not FailedEvent.objects.exists()


def test_without_the_unresolved_attempt_the_same_cap_hit_is_failed(tenant, limited):
    op = reclaim(tenant, limited, fail(claim(tenant, limited), ErrorClass.TRANSIENT))

    assert fail(op, ErrorClass.TRANSIENT).status == S.FAILED


def test_latest_holder_may_fail_definitively_from_uncertain(tenant, provider):
    op = claim(tenant, provider)
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    expire_lease(op.pk)
    sweep_expired_leases()
    assert Operation.objects.get(pk=op.pk).status == S.UNCERTAIN

    result = fail(op, ErrorClass.INVALID_INPUT, message="provider says: declined")

    assert result.status == S.FAILED
    assert FailedEvent.objects.filter(operation_id=op.pk).exists()


def test_an_ambiguous_report_on_an_uncertain_row_is_evidence_only(tenant, provider):
    op = claim(tenant, provider)
    uncertain = fail(op, ErrorClass.AMBIGUOUS)
    before = row(op.pk)
    events = len(events_of(op.pk))

    again = fail(uncertain, ErrorClass.AMBIGUOUS, message="second timeout")

    assert again.status == S.UNCERTAIN
    assert row(op.pk) == before
    assert len(events_of(op.pk)) == events


def test_fail_for_another_tenant_is_not_found_and_records_nothing(tenant, provider, other_tenant):
    op = claim(tenant, provider)
    before = row(op.pk)

    with pytest.raises(OperationNotFound):
        services.operation_fail(
            operation_id=op.pk, lease_token=op.lease_token, error_class="transient", tenant_id=other_tenant.pk
        )

    assert row(op.pk) == before
    assert attempts_of(op.pk)[0]["outcome"] == AttemptOutcome.PENDING


# --- leases --------------------------------------------------------------------------------


@pytest.mark.parametrize(("wish", "expected"), [(0.5, 5), (30, 30), (10**7, 900), (None, 60)])
def test_lease_wish_is_clamped_to_the_configured_range(tenant, provider, wish, expected):
    op = claim(tenant, provider, lease_seconds=wish)

    assert (op.lease_expires_at - op.claimed_at).total_seconds() == pytest.approx(expected, abs=0.01)


def test_heartbeat_extends_the_lease_for_the_holder_only(tenant, provider):
    op = claim(tenant, provider, lease_seconds=10)

    beat = services.operation_heartbeat(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, lease_seconds=600
    )

    # The new lease runs 600 s from the heartbeat (one statement, one reading of the database's
    # clock), which came after the claim (was: at least 590 s after the claim, as if read at
    # two moments).
    assert beat.lease_expires_at - beat.updated_at == timedelta(seconds=600)
    assert beat.updated_at >= op.claimed_at
    # The attempt mirrors the extension: the row's value itself, not a second clock reading
    # (was: within 1 s of it).
    assert attempts_of(op.pk)[0]["lease_expires_at"] == beat.lease_expires_at
    with pytest.raises(LeaseLost):
        services.operation_heartbeat(operation_id=op.pk, tenant_id=op.tenant_id, lease_token="f" * 32)


def test_heartbeat_after_the_sweeper_moved_the_row_is_lease_lost(tenant, provider):
    op = claim(tenant, provider)
    expire_lease(op.pk)
    sweep_expired_leases()
    before = row(op.pk)

    with pytest.raises(LeaseLost):
        services.operation_heartbeat(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)

    assert row(op.pk) == before


def test_sent_marker_is_refused_once_the_lease_expired(tenant, provider):
    op = claim(tenant, provider)
    expire_lease(op.pk)

    with pytest.raises(LeaseExpired):
        services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)

    assert row(op.pk)["sent_at"] is None


def test_sent_marker_sets_sent_at_on_the_row_and_its_attempt_once(tenant, provider):
    op = claim(tenant, provider)

    first = services.operation_mark_sent(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, reconciliation_handle="h1"
    )
    second = services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)

    assert first.sent_at is not None
    assert second.sent_at == first.sent_at
    assert second.reconciliation_handle == "h1"
    # The attempt's copy was written by the first marker, after the row's and before the
    # marker's event row (on SQLite each statement reads its own clock; on PostgreSQL all
    # three are the transaction's time) (was: within 1 s of the row's).
    marked = OperationEvent.objects.filter(operation_id=op.pk, reason="sent marker").order_by("at", "id").first()
    assert first.sent_at <= attempts_of(op.pk)[0]["sent_at"] <= marked.at


def test_each_attempt_gets_a_fresh_token(tenant, limited):
    op = claim(tenant, limited)
    second = reclaim(tenant, limited, fail(op, ErrorClass.TRANSIENT))

    tokens = [a["lease_token"] for a in attempts_of(op.pk)]

    assert len(set(tokens)) == 2
    assert tokens[1] == second.lease_token


# --- claims of existing rows ----------------------------------------------------------------


def test_a_queued_execute_row_claimed_in_process_is_retry_scheduled(tenant, provider):
    services.operation_claim(
        tenant=tenant,
        key="exec-1",
        provider=provider,
        action="charge",
        request={"amount": 1},
        mode=OperationMode.EXECUTE,
        via_claims=False,
    )

    with pytest.raises(OperationRetryScheduled):
        services.operation_claim(
            tenant=tenant,
            key="exec-1",
            provider=provider,
            action="charge",
            request={"amount": 1},
            mode=OperationMode.EXECUTE,
            via_claims=False,
        )


def test_claim_never_inserts_a_second_row_for_a_key(tenant, provider):
    claim(tenant, provider)
    for _ in range(3):
        with pytest.raises(OperationInProgress):
            services.operation_claim(
                tenant=tenant, key="order-7:charge:v1", provider=provider, action="charge", request={"amount": 1}
            )

    assert Operation.objects.filter(tenant=tenant, key="order-7:charge:v1").count() == 1


@pytest.mark.parametrize(
    "key", [None, 7, "", "x" * 256, "a\x00", "a\tb", " a", "a ", "\u200b\x85", "ключ:ü:漢字", "order-\uff43"]
)
def test_validate_key_refuses_what_is_not_1_to_255_printable_ascii_characters(key):
    with pytest.raises(InvalidKey):
        services.validate_key(key)


@pytest.mark.parametrize("key", ["a", "x" * 255, "order-1001:export:rev3", "a b", "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./"])
def test_validate_key_accepts_printable_keys(key):
    assert services.validate_key(key) == key


def test_fingerprint_is_canonical_and_covers_mode_provider_action_request():
    base = {"mode": "guard", "provider": "stripe", "action": "charge", "request": {"a": 1, "b": [1, 2]}}
    same = services.request_fingerprint(**{**base, "request": {"b": [1, 2], "a": 1}})

    assert services.request_fingerprint(**base) == same
    for change in ({"mode": "execute"}, {"provider": "adyen"}, {"action": "refund"}, {"request": {"a": 2}}):
        assert services.request_fingerprint(**{**base, **change}) != same


# --- transitions and their events --------------------------------------------------------


def test_every_transition_writes_an_event_with_old_new_actor_and_reason(tenant, limited):
    op = claim(tenant, limited, actor="apikey:abcd")
    services.operation_mark_sent(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, actor="apikey:abcd"
    )
    fail(op, ErrorClass.TRANSIENT, message="refused", actor="apikey:abcd")
    second = reclaim(tenant, limited, op, actor="worker:2")
    services.operation_complete(
        operation_id=second.pk,
        tenant_id=second.tenant_id,
        lease_token=second.lease_token,
        provider_ref="ch_1",
        actor="worker:2",
    )

    events = events_of(op.pk)

    assert [(old, new, actor) for old, new, actor, _ in events] == [
        ("", S.CLAIMED, "apikey:abcd"),
        (S.CLAIMED, S.CLAIMED, "apikey:abcd"),
        (S.CLAIMED, S.RETRY_WAIT, "apikey:abcd"),
        (S.RETRY_WAIT, S.CLAIMED, "worker:2"),
        (S.CLAIMED, S.SUCCEEDED, "worker:2"),
    ]
    reasons = [reason for *_, reason in events]
    assert reasons[0] == "claimed"
    assert reasons[1] == "sent marker"
    assert "transient" in reasons[2] and "refused" in reasons[2]
    assert reasons[3] == "retry claimed"
    assert reasons[4] == "completed"


def test_sweeper_and_reviewer_transitions_write_events_too(tenant, provider):
    op = claim(tenant, provider)
    expire_lease(op.pk)
    sweep_expired_leases()
    uncertain = Operation.objects.get(pk=op.pk)
    in_review = guarded_move(operation=uncertain, to=S.REVIEW, actor="sweeper", reason="no lookup")
    guarded_move(operation=in_review, to=S.ABANDONED, actor="reviewer:ann", reason="customer left")

    assert [(old, new, actor) for old, new, actor, _ in events_of(op.pk)][1:] == [
        (S.CLAIMED, S.UNCERTAIN, "sweeper"),
        (S.UNCERTAIN, S.REVIEW, "sweeper"),
        (S.REVIEW, S.ABANDONED, "reviewer:ann"),
    ]
    assert events_of(op.pk)[-1][3] == "customer left"


def test_a_failed_event_sequence_ends_with_claimed_to_failed(tenant, provider):
    op = claim(tenant, provider)

    fail(op, ErrorClass.PERMISSION, message="401 from provider")

    assert events_of(op.pk)[-1][:2] == (S.CLAIMED, S.FAILED)
    assert "permission" in events_of(op.pk)[-1][3]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (source, target)
        for source in ALLOWED_TRANSITIONS
        if source is not None
        for target in ALLOWED_TRANSITIONS
        if target is not None and target not in ALLOWED_TRANSITIONS[source]
    ],
)
def test_moves_outside_the_table_raise_illegal_transition_and_change_nothing(tenant, provider, source, target):
    op = claim(tenant, provider)
    # Put the row in `source` directly: this test is about the guard, not how it got there.
    done = op.claimed_at if source in (S.SUCCEEDED, S.FAILED, S.ABANDONED) else None
    # A waiting row has its job and no lease (operation_waiting_has_job).
    waiting = {"provider_ref": "job_1", "lease_expires_at": None, "next_attempt_at": op.claimed_at}
    Operation.objects.filter(pk=op.pk).update(status=source, done_at=done, **(waiting if source == S.WAITING else {}))
    op = Operation.objects.get(pk=op.pk)
    before = row(op.pk)
    events = len(events_of(op.pk))

    with pytest.raises(IllegalTransition):
        guarded_move(operation=op, to=target, actor="test", reason="illegal")

    assert row(op.pk) == before
    assert len(events_of(op.pk)) == events


def test_a_transition_from_a_stale_read_raises_and_never_overwrites(tenant, provider):
    op = claim(tenant, provider)
    stale = Operation.objects.get(pk=op.pk)
    services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
    )
    before = row(op.pk)

    with pytest.raises(LeaseLost):
        guarded_move(operation=stale, to=S.UNCERTAIN, actor="sweeper", reason="late")

    assert row(op.pk) == before


def test_complete_from_a_terminal_state_raises_already_finished(tenant, provider):
    op = claim(tenant, provider)
    fail(op, ErrorClass.INVALID_INPUT)

    with pytest.raises(OperationAlreadyFinished):
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="late"
        )
