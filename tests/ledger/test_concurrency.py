"""Races on real, separate database connections (one per thread), with the side effect
counted by a real HTTP receiver on loopback. The claim must be atomic: exactly one winner
per key, and exactly one effect, however the losers are answered."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db import connection, transaction

from ledger.models import Attempt, Operation, OperationEvent, OperationStatus
from ledger.platform.errors import OperationAlreadyFinished, OperationInProgress, OperationRetryScheduled
from ledger.protocol import services
from ledger.protocol.guard import run_once
from ledger.protocol.selectors import operation_history
from ledger.recovery.sweeper import sweep
from tests.conftest import on_postgres
from tests.ledger.support import Sink, expire_lease, make_retry_due

S = OperationStatus
THREADS = 32


def rounds() -> int:
    # Real concurrency is PostgreSQL's job; SQLite serialises writers, a few rounds prove it.
    return 20 if on_postgres() else 4


def race(n: int, work: Callable[[int], str]) -> Counter[str]:
    """Run ``work`` in ``n`` threads released together; each closes its own connection."""
    barrier = threading.Barrier(n)
    answers: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            answer = work(i)
            with lock:
                answers.append(answer)
        except BaseException as exc:  # surfaced below, with the thread's traceback
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    if errors:
        raise errors[0]
    return Counter(answers)


def assert_one_finished_operation(key: str) -> Operation:
    op = Operation.objects.get(key=key)
    assert (op.status, op.attempts) == (S.SUCCEEDED, 1)
    assert Attempt.objects.filter(operation=op).count() == 1
    # Every move (the claim kept on the row, ADR 0024, then the event rows).
    assert [e.to_status for e in operation_history(op, OperationEvent.objects.filter(operation=op))] == [
        S.CLAIMED,
        S.CLAIMED,
        S.SUCCEEDED,
    ]
    return op


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_identical_claims_give_one_201_and_one_side_effect_per_round(tenant, provider, sink: Sink):
    for r in range(rounds()):
        key = f"order-{r}:charge:v1"

        def claim_and_send(i: int, key: str = key) -> str:
            try:
                result = services.operation_claim(
                    tenant=tenant, key=key, provider=provider, action="charge", request={"amount": 100}
                )
            except OperationInProgress:
                return "409"
            if result.replayed:
                assert result.operation.status == S.SUCCEEDED
                return "200"
            op = result.operation
            services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
            ref = sink.send(f"effects/{key}")
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=ref
            )
            return "201"

        answers = race(THREADS, claim_and_send)

        assert answers["201"] == 1, (r, answers)
        assert answers["409"] + answers["200"] == THREADS - 1, (r, answers)
        assert sink.count(f"effects/{key}") == 1
        op = assert_one_finished_operation(key)
        assert op.provider_ref.startswith("ch_")
    assert sink.count() == rounds()


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_identical_claims_over_http_give_one_201_and_one_side_effect(
    tenant, provider, http_server, sink: Sink
):
    _, secret = services.apikey_create(tenant=tenant)
    headers = {"Authorization": f"Bearer {secret}"}
    base = f"{http_server}/api/v1"
    http_rounds = 5 if on_postgres() else 2

    for r in range(http_rounds):
        key = f"http-order-{r}:charge:v1"
        body = {"key": key, "provider": "stripe", "action": "charge", "request": {"amount": 100}}

        def claim_and_send(i: int, key: str = key, body: dict[str, Any] = body) -> str:
            with httpx.Client(headers=headers, timeout=60) as http:
                answer = http.post(f"{base}/claims", json=body)
                if answer.status_code == 409:
                    assert answer.headers["Content-Type"] == "application/problem+json"
                    assert answer.json()["code"] == "operation_in_progress"
                    assert int(answer.headers["Retry-After"]) >= 1
                    return "409"
                if answer.status_code == 200:
                    assert answer.headers["Idempotent-Replayed"] == "true"
                    return "200"
                assert answer.status_code == 201, answer.text
                assert "Idempotent-Replayed" not in answer.headers
                claim = answer.json()
                token = {"lease_token": claim["lease_token"]}
                assert http.post(f"{base}/operations/{claim['id']}/sent", json=token).status_code == 200
                ref = sink.send(f"effects/{key}")
                done = http.post(f"{base}/operations/{claim['id']}/complete", json={**token, "provider_ref": ref})
                assert done.status_code == 200, done.text
                return "201"

        answers = race(THREADS, claim_and_send)

        assert answers["201"] == 1, (r, answers)
        assert answers["409"] + answers["200"] == THREADS - 1, (r, answers)
        assert sink.count(f"effects/{key}") == 1
        assert_one_finished_operation(key)

    # Afterwards every claim is the replay, byte for byte.
    with httpx.Client(headers=headers, timeout=30) as http:
        body = {"key": "http-order-0:charge:v1", "provider": "stripe", "action": "charge", "request": {"amount": 100}}
        replays = [http.post(f"{base}/claims", json=body) for _ in range(3)]
    assert {(a.status_code, a.headers["Idempotent-Replayed"]) for a in replays} == {(200, "true")}
    assert len({a.content for a in replays}) == 1
    assert sink.count() == http_rounds


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_guarded_calls_run_the_function_once(tenant, provider, sink: Sink):
    for r in range(max(2, rounds() // 4)):
        key = f"guard-{r}:export:v1"

        def call(i: int, key: str = key) -> str:
            try:
                value = run_once(
                    tenant=tenant,
                    key=key,
                    fn=sink.send,
                    args=(f"effects/{key}",),
                    provider="stripe",
                    action="export",
                    ref_from=str,
                )
            except OperationInProgress:
                return "in_progress"
            return f"value:{value}"

        answers = race(THREADS, call)

        assert sink.count(f"effects/{key}") == 1
        values = {a for a in answers if a.startswith("value:")}
        # The one call and every replay carry the same recorded result.
        assert len(values) == 1, answers
        assert sum(answers.values()) == THREADS
        op = Operation.objects.get(key=key)
        assert (op.status, op.attempts) == (S.SUCCEEDED, 1)
        assert values == {f"value:{op.provider_ref}"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_of_a_due_retry_give_exactly_one_new_attempt(tenant, provider):
    for r in range(rounds()):
        key = f"retry-{r}"
        first = services.operation_claim(tenant=tenant, key=key, provider=provider).operation
        services.operation_fail(
            operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, error_class="transient"
        )
        make_retry_due(first.pk)

        def reclaim(i: int, key: str = key) -> str:
            try:
                result = services.operation_claim(tenant=tenant, key=key, provider=provider)
            except (OperationInProgress, OperationRetryScheduled) as exc:
                return exc.code
            assert result.acquired
            return f"201:{result.operation.lease_token}"

        answers = race(16, reclaim)

        winners = [a for a in answers if a.startswith("201:")]
        assert len(winners) == 1, answers
        assert answers["operation_in_progress"] + answers["operation_retry_scheduled"] == 15
        op = Operation.objects.get(pk=first.pk)
        assert (op.status, op.attempts) == (S.CLAIMED, 2)
        assert op.lease_token == winners[0].removeprefix("201:")
        assert Attempt.objects.filter(operation=op).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_holder_completing_while_the_sweeper_runs_always_ends_succeeded(tenant, provider):
    for r in range(rounds()):
        op = services.operation_claim(tenant=tenant, key=f"late-{r}", provider=provider).operation
        services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
        expire_lease(op.pk)

        def act(i: int, op: Operation = op) -> str:
            if i == 0:
                sweep()
                return "swept"
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_late"
            )
            return "completed"

        assert race(2, act) == Counter({"swept": 1, "completed": 1})
        final = Operation.objects.get(pk=op.pk)
        assert (final.status, final.provider_ref) == (S.SUCCEEDED, "ch_late")


@pytest.mark.django_db(transaction=True)
def test_concurrent_complete_and_fail_by_one_holder_record_exactly_one_outcome(tenant, provider):
    for r in range(rounds()):
        op = services.operation_claim(tenant=tenant, key=f"dup-{r}", provider=provider).operation

        def report(i: int, op: Operation = op) -> str:
            try:
                if i % 2:
                    services.operation_complete(
                        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"r{i}"
                    )
                else:
                    services.operation_fail(
                        operation_id=op.pk,
                        tenant_id=op.tenant_id,
                        lease_token=op.lease_token,
                        error_class="invalid_input",
                    )
            except OperationAlreadyFinished:
                return "refused"
            return "recorded"

        answers = race(8, report)

        assert answers["recorded"] == 1, answers
        final = Operation.objects.get(pk=op.pk)
        assert final.status in (S.SUCCEEDED, S.FAILED)
        terminal_events = OperationEvent.objects.filter(operation=final, to_status__in=[S.SUCCEEDED, S.FAILED])
        assert terminal_events.count() == 1


@pytest.mark.postgres_only
@pytest.mark.skipif(
    not on_postgres(), reason="PostgreSQL's re-check of a guarded UPDATE on the row as a concurrent move left it"
)
@pytest.mark.django_db(transaction=True)
def test_a_completion_waiting_on_the_sweepers_move_records_the_state_it_moved_the_row_from(tenant, provider):
    """ADR 0023: the completion's lock-free UPDATE from claimed meets a row the sweeper is moving
    to uncertain; it waits, finds the guard false on the row as that move left it, and the
    locking path moves the row from uncertain. The event says uncertain → succeeded."""
    op = services.operation_claim(tenant=tenant, key="epq-1", provider=provider, mark_sent=True).operation
    moved, release = threading.Event(), threading.Event()

    def sweeper_move() -> None:
        # The sweeper's claimed → uncertain, its transaction held open until the completion waits.
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE ledger_operation SET status = %s, lease_expires_at = NULL, updated_at = now()"
                    " WHERE id = %s AND status = %s",
                    [S.UNCERTAIN, op.pk, S.CLAIMED],
                )
                moved.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    finished: list[Any] = []

    def complete() -> None:
        try:
            finished.append(
                services.operation_complete(
                    operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="late-1"
                )
            )
        except BaseException as exc:  # surfaced below
            finished.append(exc)
        finally:
            connection.close()

    mover = threading.Thread(target=sweeper_move)
    mover.start()
    assert moved.wait(timeout=30)
    holder = threading.Thread(target=complete)
    holder.start()
    # The completion is waiting for the sweeper's row lock.
    for _ in range(300):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%fast AS%%'"
            )
            if cursor.fetchone()[0]:
                break
        threading.Event().wait(0.05)
    else:
        release.set()
        pytest.fail("the completion never waited for the sweeper's move")
    release.set()
    mover.join(timeout=30)
    holder.join(timeout=30)
    assert not isinstance(finished[0], BaseException), finished[0]
    final = Operation.objects.get(pk=op.pk)
    assert (final.status, final.provider_ref) == (S.SUCCEEDED, "late-1")
    last = OperationEvent.objects.filter(operation=final).order_by("-id").first()
    assert (last.from_status, last.to_status) == (S.UNCERTAIN, S.SUCCEEDED)
