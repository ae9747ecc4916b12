"""The crash window, on purpose, in execute mode (issue 4's table): the service's own
workers send through a real fault relay to real mock providers on loopback, and the
sweeper reconciles. Plus the seed's production-readiness test with a worker process
SIGKILLed after the provider answered."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.e2e.support import ADVISORY, ENFORCED, EXPECTED, TIMEOUT, Stack, effects, settle
from tests.execute.support import child_env, make_due, run_due, start_worker, stop_process, wait_until

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=[ENFORCED, ADVISORY])
def stack(request: Any, tenant: Any) -> Iterator[Stack]:
    s = Stack(tenant, request.param, base_delay_seconds=0.05, max_delay_seconds=0.1)
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _forget_caches() -> Iterator[None]:
    from ledger.platform import caching
    from ledger.protocol import selectors

    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()
    yield


def submit(api: Any, key: str) -> dict[str, Any]:
    r = api.post(
        "/api/v1/operations",
        {
            "key": key,
            "provider": "pay",
            "action": "charge",
            "request": {"method": "POST", "path": "/charges", "body": {"amount": 4200}},
        },
        format="json",
    )
    assert r.status_code == 202, r.content
    return r.json()


@pytest.mark.parametrize("relay_mode", list(EXPECTED))
def test_each_relay_mode_ends_as_the_provider_class_allows(stack, api, relay_mode):
    want_status, want_effects = EXPECTED[relay_mode][stack.cls]
    op = submit(api, f"order-1001:charge:{relay_mode}")
    stack.relay.set_mode(relay_mode, delay=TIMEOUT * 3)
    run_due()
    # The fault was one request's: the sweeper's lookup goes through a healthy relay.
    stack.relay.set_mode("forward-and-respond")
    row = Operation.objects.get(pk=op["id"])
    if relay_mode == "forward-and-respond":
        assert row.status == S.SUCCEEDED
        before = row.updated_at
        sweep()
        row.refresh_from_db()
        assert row.updated_at == before, "the sweeper must not touch a finished row"
    else:
        assert row.status == S.UNCERTAIN, (relay_mode, row.status, row.last_error)
        settle(row.pk)
        sweep()
        row.refresh_from_db()
        if row.status == S.RETRY_WAIT:
            # Looked up: not found. The worker re-issues with the SAME key.
            assert relay_mode == "fail-before-forward" and stack.cls == IdempotencyClass.KEY_ENFORCED
            make_due(row.pk)
            run_due()
            row.refresh_from_db()
            assert row.attempts == 2
            keys = {e.get("idempotency_key") for e in stack.relay.journal() if e["forwarded"]}
            assert keys == {row.key}
    assert (row.status, effects(stack.provider)) == (want_status, want_effects), row.last_error
    if want_status == S.SUCCEEDED:
        stored = stack.provider.effects()
        assert row.provider_ref.startswith("ch_") and stored["by_key"] == {row.key: 1}
    if stack.cls == IdempotencyClass.KEY_ADVISORY:
        assert sum(1 for e in stack.relay.journal() if e["forwarded"]) == want_effects, "never re-sent"


def test_worker_killed_after_the_provider_answered_is_reconciled_not_resent(stack, api, tenant):
    """Production-readiness test 2, with a real process: the provider commits, the answer is
    held by the relay, and the worker is SIGKILLed while waiting for it."""
    from ledger.models import Provider

    Provider.objects.filter(slug="pay").update(timeout_seconds=10.0)  # the worker waits, then dies
    stack.relay.set_mode("delay-then-respond", delay=8.0)
    op = submit(api, "order-4004:charge:v1")
    worker = start_worker(env=child_env(), concurrency=1)
    try:
        assert wait_until(lambda: effects(stack.provider) == 1, timeout=20), "the provider never saw the effect"
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        stop_process(worker)
    row = Operation.objects.get(pk=op["id"])
    assert row.status == S.CLAIMED and row.sent_at is not None
    # Lease expiry on the database clock, then the sweeper's pass.
    past, params = sql.now_plus(-1)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET lease_expires_at = {past} WHERE id = %s", [*params, row.pk])
    settle(row.pk)
    sweep()
    row.refresh_from_db()
    stack.relay.set_mode("forward-and-respond")
    run_due()  # nothing is due: a reconciled or reviewed row is never re-sent
    row.refresh_from_db()
    if stack.cls == IdempotencyClass.KEY_ENFORCED:
        stored = stack.provider._call("GET", f"/charges?idempotency_key={row.key}")
        assert (row.status, row.provider_ref) == (S.SUCCEEDED, stored["id"])
    else:
        assert row.status == S.REVIEW
    assert effects(stack.provider) == 1


def test_two_identical_submissions_at_once_make_one_row_and_one_effect(stack, tenant, make_client):
    import threading

    clients = [make_client(tenant) for _ in range(2)]
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def fire(client: Any) -> None:
        barrier.wait()
        body = {
            "key": "order-5005:charge:v1",
            "provider": "pay",
            "request": {"method": "POST", "path": "/charges", "body": {"amount": 1}},
        }
        codes.append(client.post("/api/v1/operations", body, format="json").status_code)
        connection.close()

    threads = [threading.Thread(target=fire, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(codes) in ([202, 409], [200, 202], [202, 202]), codes
    assert Operation.objects.filter(key="order-5005:charge:v1").count() == 1
    run_due()
    run_due()
    assert effects(stack.provider) == 1
