"""Provider rate and concurrency caps (DESIGN §5, rate and concurrency caps; ledger.providers.ratelimit):
the take leaves what the caps do not allow queued, across worker processes, counted in the
database; a 429 halves the effective rate and it climbs back while the provider stays quiet.

The provider is a real loopback server that counts the requests it holds at once and records
when each arrived. Nothing here asserts speed: windows of arrival times are counted with
margins, and the bucket's clock is moved in the database instead of sleeping."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, IdempotencyClass, Operation, OperationEvent, OperationStatus, ProviderRate
from ledger.protocol.services import provider_upsert
from ledger.store import sql
from tests.console.support import client_for, page, staff
from tests.execute.support import (
    CountingProvider,
    child_env,
    run_due,
    start_worker,
    statuses,
    stop_process,
    unthrottle,
    wait_until,
    worker_output,
)

S = OperationStatus


@pytest.fixture
def crm():
    server = CountingProvider()
    yield server
    server.stop()


def capped(tenant, server: CountingProvider, slug: str = "crm", **caps: Any):
    return provider_upsert(
        tenant=tenant,
        slug=slug,
        base_url=server.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=2.0,
        max_attempts=5,
        base_delay_seconds=0.05,
        max_delay_seconds=0.2,
        **caps,
    )


def submit(tenant, key: str, provider: str = "crm"):
    return operation_submit(
        tenant=tenant, key=key, provider=provider, request={"method": "POST", "path": "/contacts", "body": {"k": key}}
    ).operation


def move_bucket_clock(provider_id: int, seconds: float) -> None:
    """The bucket's last refill and quiet period `seconds` earlier (database clock), and no
    hold-back: as if that much time had passed."""
    past, params = sql.now_plus(-seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_providerrate SET refilled_at = {past}, quiet_since = {past}, next_take_at = NULL"
            " WHERE provider_id = %s",
            [*params, *params, provider_id],
        )


def finish(ops: list[Operation]) -> None:
    for op in ops:
        Operation.objects.filter(pk=op.pk).update(status=S.SUCCEEDED, done_at=sql.db_now(), lease_expires_at=None)


# --- The take, one step at a time (both databases) ---------------------------------------------


@pytest.mark.django_db
def test_the_take_leaves_a_capped_providers_rows_beyond_its_in_flight_cap_queued_without_an_attempt(tenant, crm):
    provider = capped(tenant, crm, max_in_flight=2)
    capped(tenant, crm, slug="free")
    mine = [submit(tenant, f"c-{i}") for i in range(5)]
    others = [submit(tenant, f"f-{i}", provider="free") for i in range(3)]

    first = operations_take(limit=5, actor="t")
    assert [op.key for op in first] == ["c-0", "c-1"]  # the cap, though five were selected
    queued = Operation.objects.filter(pk__in=[op.pk for op in mine[2:]])
    assert set(queued.values_list("status", "attempts")) == {(S.QUEUED, 0)}
    assert not Attempt.objects.filter(operation__in=queued).exists()

    # At its cap the provider is passed over: the uncapped provider's rows behind it go.
    second = operations_take(limit=5, actor="t")
    assert sorted(op.key for op in second) == sorted(op.key for op in others)
    assert operations_take(limit=5, actor="t") == []

    # One call ends: one slot, one row.
    finish(first[:1])
    third = operations_take(limit=5, actor="t")
    assert [op.key for op in third] == ["c-2"]
    assert Operation.objects.filter(provider=provider, status=S.CLAIMED).count() == 2


@pytest.mark.django_db
def test_the_bucket_allows_its_burst_then_one_call_per_interval_on_the_database_clock(tenant, crm):
    provider = capped(tenant, crm, rate_limit=2, rate_period_seconds=60, rate_burst=2)
    for i in range(5):
        submit(tenant, f"r-{i}")
    assert len(operations_take(limit=10, actor="t")) == 2  # the burst
    bucket = ProviderRate.objects.get(provider=provider)
    assert bucket.tokens == pytest.approx(0.0, abs=0.01)
    # One call per 30 s from now on: the take passes the provider over until then.
    wait = (sql.to_datetime(bucket.next_take_at) - sql.db_now()).total_seconds()
    assert 28 < wait <= 30
    assert operations_take(limit=10, actor="t") == []
    assert Operation.objects.filter(status=S.QUEUED).count() == 3

    move_bucket_clock(provider.pk, 15)  # half an interval: still nothing
    assert operations_take(limit=10, actor="t") == []
    move_bucket_clock(provider.pk, 31)
    assert len(operations_take(limit=10, actor="t")) == 1
    move_bucket_clock(provider.pk, 3600)  # a long quiet spell refills the burst, no more
    assert len(operations_take(limit=10, actor="t")) == 2
    assert ProviderRate.objects.get(provider=provider).tokens >= 0


# Its own transactions: PostgreSQL's now() is a transaction's start, and one storm is told from
# the next by the times of separate takes and answers.
@pytest.mark.django_db(transaction=True)
def test_a_429_halves_the_effective_rate_once_per_storm_and_it_climbs_back_while_quiet(tenant, crm, settings):
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "PROVIDER_RATE_RECOVERY_SECONDS": 30,
        "PROVIDER_RATE_STEP_FRACTION": 0.1,
    }
    provider = capped(tenant, crm, rate_limit=10, rate_burst=4)
    for i in range(3):
        submit(tenant, f"s-{i}")
    # Three calls of one take all answered 429: one storm, one halving.
    crm.script = [(429, {"Retry-After": "0"})] * 3
    assert len(run_due()) == 3
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(5.0)
    assert statuses() == {S.RETRY_WAIT: 3}

    # A call sent after the halving and answered 429 again: the next storm halves again.
    Operation.objects.update(next_attempt_at=sql.db_now())
    move_bucket_clock(provider.pk, 1)
    crm.script = [(429, {"Retry-After": "0"})]
    recorded = run_due(limit=1)
    assert [op.status for op in recorded] == [S.RETRY_WAIT]
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(2.5)
    # A 503 without Retry-After is an outage, not a rate limit: it throttles but lowers nothing.
    Operation.objects.update(next_attempt_at=sql.db_now())
    move_bucket_clock(provider.pk, 1)
    crm.script = [(503, {})]
    assert [op.status for op in run_due(limit=1)] == [S.RETRY_WAIT]
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(2.5)
    unthrottle(provider.pk)

    # Quiet: one step of a tenth of the declared rate per quiet period, up to it, never past it.
    # (The take refills the bucket of a provider it selected a row of: one due row per round.)
    finish(list(Operation.objects.all()))
    for i in range(11):
        submit(tenant, f"later-{i}")
    rates = []
    for _ in range(10):
        move_bucket_clock(provider.pk, 31)
        finish(operations_take(limit=1, actor="t"))
        rates.append(round(ProviderRate.objects.get(provider=provider).rate, 3))
    assert rates == [3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.0, 10.0, 10.0]
    # Without a quiet period it does not climb at all.
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_providerrate SET rate = 5.0, quiet_since = {sql.now()}, next_take_at = NULL", [])
    assert len(operations_take(limit=1, actor="t")) == 1
    assert ProviderRate.objects.get(provider=provider).rate == 5.0


@pytest.mark.django_db
def test_caps_are_refused_when_they_make_no_sense_and_a_change_resets_the_bucket(tenant, crm):
    from ledger.platform.errors import ValidationFailed

    for caps in (
        {"max_in_flight": 0},
        {"rate_limit": 0},
        {"rate_limit": 5, "rate_burst": 6},
        {"rate_period_seconds": 0},
    ):
        with pytest.raises(ValidationFailed):
            capped(tenant, crm, slug="bad", **caps)
    provider = capped(tenant, crm, rate_limit=10)
    submit(tenant, "x-1")
    operations_take(limit=1, actor="t")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_providerrate SET rate = 1.0, tokens = 0.0")
    provider = capped(tenant, crm, rate_limit=20)
    bucket = ProviderRate.objects.get(provider=provider)
    assert (bucket.rate, bucket.tokens, bucket.lowered_at) == (20.0, 1.0, None)


@pytest.mark.django_db
def test_the_provider_api_and_console_page_show_the_caps_and_the_effective_rate(tenant, crm, make_client):
    provider = capped(tenant, crm, max_in_flight=3, rate_limit=120, rate_period_seconds=60, rate_burst=5)
    submit(tenant, "a-1")
    operations_take(limit=1, actor="t")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_providerrate SET rate = 1.0, lowered_at = {sql.now()}", [])
    body = make_client(tenant, ["read"]).get("/api/v1/providers/crm").json()
    assert body["caps"] | {"rate_lowered_at": None} == {
        "max_in_flight": 3,
        "in_flight": 1,
        "rate_limit": 120,
        "rate_period_seconds": 60,
        "rate_burst": 5,
        "effective_rate": 60.0,
        "rate_lowered": True,
        "rate_lowered_at": None,
        # The in-flight limit, not lowered (tests/execute/test_provider_concurrency.py).
        "effective_max_in_flight": 3,
        "in_flight_lowered": False,
        "in_flight_lowered_reason": None,
        "in_flight_limit_since": None,
        "in_flight_recovery_seconds": 30.0,
    }
    assert body["caps"]["rate_lowered_at"]
    assert make_client(tenant, ["read"]).get("/api/v1/providers/nope").status_code == 404
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    status, html = page(ada, f"/admin/ledger/provider/{provider.pk}/change/")
    assert status == 200
    assert "at most 3 in flight (now 1)" in html and "lowered after a 429 to 60 per 60 s" in html


# --- Worker processes (PostgreSQL: real concurrency) ---------------------------------------------

pg_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="concurrent takers need PostgreSQL")


@pytest.fixture
def slow_crm():
    server = CountingProvider(hold=0.15)
    yield server
    server.stop()


@pg_only
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_never_exceed_the_providers_in_flight_cap(tenant, slow_crm):
    # Each process holds at most 2 calls, so the cap of 3 is reached only with both taking part,
    # and exceeded (4) if the cap is not kept across processes. (With 4 threads each, the
    # process whose call just finished re-polled first and could take every freed slot itself.)
    provider = capped(tenant, slow_crm, max_in_flight=3)
    env = child_env(LOG_LEVEL="INFO")
    workers = [start_worker(env=env, concurrency=2) for _ in range(2)]
    try:
        # Submitted once both are up, so both take part (one starting a second late under load
        # found the backlog drained and proved nothing: a fresh-clone run failed that way).
        assert wait_until(lambda: all("worker_started" in worker_output(w) for w in workers), timeout=60)
        for i in range(16):
            submit(tenant, f"m-{i}")
        done = wait_until(lambda: statuses() == {S.SUCCEEDED: 16}, timeout=60, interval=0.1)
        capped_most = slow_crm.most
        # The control: without the cap the same workers hold more at once (the test can fail).
        provider_upsert(tenant=tenant, slug=provider.slug, max_in_flight=None)
        for i in range(16, 32):
            submit(tenant, f"m-{i}")
        uncapped = wait_until(lambda: statuses() == {S.SUCCEEDED: 32}, timeout=60, interval=0.1)
    finally:
        outputs = [stop_process(w) for w in workers]
    assert done and uncapped, (statuses(), outputs)
    assert capped_most == 3, capped_most
    assert slow_crm.most > 3
    assert len(slow_crm.arrivals) == 32  # nothing held back was lost or sent twice
    # Both processes took part in the capped run.
    takers = OperationEvent.objects.filter(
        operation__key__in=[f"m-{i}" for i in range(16)], to_status=S.CLAIMED
    ).values_list("actor", flat=True)
    assert len(set(takers)) == 2, set(takers)


@pg_only
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_keep_to_the_providers_rate(tenant, crm):
    provider = capped(tenant, crm, rate_limit=10, rate_period_seconds=1, rate_burst=1)
    for i in range(20):
        submit(tenant, f"q-{i}")
    env = child_env(LOG_LEVEL="WARNING")
    workers = [start_worker(env=env, concurrency=4) for _ in range(2)]
    try:
        done = wait_until(lambda: statuses() == {S.SUCCEEDED: 20}, timeout=60, interval=0.1)
    finally:
        outputs = [stop_process(w) for w in workers]
    assert done, (statuses(), outputs)
    # The database's record: each take's time (the bucket's clock). Burst 1 + 10/s: at most
    # 1 + 10·T calls start in any window of T seconds.
    starts = sorted(
        sql.to_datetime(t).timestamp()
        for t in Attempt.objects.filter(operation__provider=provider).values_list("started_at", flat=True)
    )
    assert len(starts) == 20
    for window in (0.5, 1.0):
        most = max(sum(1 for t in starts if s <= t < s + window) for s in starts)
        # (+1: a take's time is its transaction's start, which may precede the lock it waited for.)
        assert most <= 1 + 10 * window + 1, (window, most)
    # The provider's record: arrivals per window, with room for scheduling jitter between a
    # take and its send (an uncapped run sends all twenty within a few tens of milliseconds).
    assert crm.most_in_window(0.5) <= 1 + 5 + 3, sorted(crm.arrivals)
    assert crm.most_in_window(1.0) <= 1 + 10 + 3
    assert ProviderRate.objects.get(provider=provider).tokens >= 0
