"""A 429 lowers a provider's concurrency too (ADR 0008; DESIGN §5, rate and concurrency caps):
its effective in-flight limit halves, down to 1, for every provider — a declared cap or not —,
climbs back by 1 per quiet period up to its cap (or the deployment's default), and the take
never has more of its calls out at once than that limit.

The provider is a real loopback server that answers the scripted statuses and counts the
requests it holds at once. The clock is the database's: quiet periods pass by moving the
bucket's timestamps back, never by sleeping."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from ledger.execution.attempts import operations_take
from ledger.models import Operation, OperationStatus, ProviderRate
from ledger.protocol.services import provider_upsert
from ledger.providers import ratelimit
from ledger.store import sql
from tests.console.support import client_for, page, staff
from tests.execute.support import (
    CountingProvider,
    child_env,
    make_due,
    run_due,
    start_worker,
    statuses,
    stop_process,
    unthrottle,
    wait_until,
    worker_output,
)
from tests.execute.test_provider_caps import capped, finish, submit

S = OperationStatus


@pytest.fixture
def crm():
    server = CountingProvider()
    yield server
    server.stop()


@pytest.fixture
def small_default(settings):
    """A deployment whose default in-flight cap is 8 and whose quiet period is 30 s."""
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "PROVIDER_DEFAULT_MAX_IN_FLIGHT": 8,
        "PROVIDER_CONCURRENCY_RECOVERY_SECONDS": 30,
    }


def move_concurrency_clock(provider_id: int, seconds: float) -> None:
    """The limit's quiet clock and the last lowering `seconds` earlier (database clock): as if
    that much time had passed without a 429."""
    past, params = sql.now_plus(-seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_providerrate SET concurrency_quiet_since = {past}, lowered_at = {past},"
            " next_take_at = NULL WHERE provider_id = %s",
            [*params, *params, provider_id],
        )


def storm(provider_id: int, crm: CountingProvider, key: str, tenant: Any, answer: tuple[int, dict[str, str]]) -> None:
    """One new call, answered ``answer``; the provider unthrottled after."""
    op = submit(tenant, key)
    make_due(op.pk)
    crm.script = [answer]
    recorded = run_due(limit=1)
    assert [r.status for r in recorded] == [S.RETRY_WAIT]
    finish(recorded)
    unthrottle(provider_id)


def limit(provider_id: int) -> int | None:
    return ProviderRate.objects.get(provider_id=provider_id).concurrency


TOO_MANY = (429, {"Retry-After": "0"})


# --- Down and up again, one step at a time (both databases) --------------------------------------


# Its own transactions: PostgreSQL's now() is a transaction's start, and one storm is told from the
# next by the times of separate takes and answers.
@pytest.mark.django_db(transaction=True)
def test_a_429_halves_the_in_flight_limit_once_per_storm_down_to_1(tenant, crm, small_default):
    provider = capped(tenant, crm, max_in_flight=6)
    # Three calls of one take, all answered 429: one storm, one halving (6 → 3).
    for i in range(3):
        submit(tenant, f"s-{i}")
    crm.script = [TOO_MANY] * 3
    assert len(run_due()) == 3
    assert limit(provider.pk) == 3
    bucket = ProviderRate.objects.get(provider=provider)
    assert bucket.concurrency_reason == "halved after an HTTP 429 answer"
    assert bucket.concurrency_since is not None
    finish(list(Operation.objects.all()))
    unthrottle(provider.pk)

    # A call sent after the halving, answered 429 again: the next storm (3 → 1, never 0).
    move_concurrency_clock(provider.pk, 1)
    storm(provider.pk, crm, "t-1", tenant, TOO_MANY)
    assert limit(provider.pk) == 1
    move_concurrency_clock(provider.pk, 1)
    storm(provider.pk, crm, "t-2", tenant, (503, {"Retry-After": "0"}))
    assert limit(provider.pk) == 1  # the floor
    assert ProviderRate.objects.get(provider=provider).concurrency_reason == (
        "halved after an HTTP 503 with Retry-After answer"
    )
    # A bare 503 is an outage, not a rate limit: it throttles but lowers nothing.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_providerrate SET concurrency = 4")
    move_concurrency_clock(provider.pk, 1)
    storm(provider.pk, crm, "t-3", tenant, (503, {}))
    assert limit(provider.pk) == 4


@pytest.mark.django_db(transaction=True)
def test_a_provider_that_declared_no_caps_is_halved_from_the_deployments_default_and_released_at_it(
    tenant, crm, small_default
):
    provider = capped(tenant, crm)  # no max_in_flight, no rate
    assert not ProviderRate.objects.filter(provider=provider).exists()
    storm(provider.pk, crm, "u-1", tenant, TOO_MANY)
    bucket = ProviderRate.objects.get(provider=provider)
    assert (bucket.concurrency, bucket.rate) == (4, 0.0)  # 8 / 2; no rate to lower
    caps = ratelimit.provider_caps(provider)
    assert (caps.effective_in_flight, caps.in_flight_lowered, caps.rate_limit) == (4, True, None)

    # Quiet periods bring it back by 1 each (the take's refill), up to the default: then it is
    # released — the provider is uncapped again, as it declared.
    for i in range(8):
        submit(tenant, f"v-{i}")
    seen = []
    for _ in range(5):
        move_concurrency_clock(provider.pk, 31)
        finish(operations_take(limit=1, actor="t"))
        seen.append(limit(provider.pk))
    assert seen == [5, 6, 7, None, None]
    assert ratelimit.provider_caps(provider).effective_in_flight is None
    assert len(operations_take(limit=10, actor="t")) == 3  # the rest, at once: uncapped


@pytest.mark.django_db(transaction=True)
def test_the_limit_climbs_back_by_1_per_quiet_period_and_never_past_the_declared_cap(tenant, crm, small_default):
    provider = capped(tenant, crm, max_in_flight=4, concurrency_recovery_seconds=10)
    storm(provider.pk, crm, "w-0", tenant, TOO_MANY)
    assert limit(provider.pk) == 2
    for i in range(10):
        submit(tenant, f"w-{i + 1}")

    # Not quiet long enough (the provider's own period: 10 s, not the deployment's 30 s): no step.
    move_concurrency_clock(provider.pk, 5)
    finish(operations_take(limit=1, actor="t"))
    assert limit(provider.pk) == 2
    since = ProviderRate.objects.get(provider=provider).concurrency_since
    # A quiet period: +1, and the step restarts the quiet clock (one step per period, not per take).
    move_concurrency_clock(provider.pk, 11)
    finish(operations_take(limit=1, actor="t"))
    assert limit(provider.pk) == 3
    assert ProviderRate.objects.get(provider=provider).concurrency_since != since
    finish(operations_take(limit=1, actor="t"))
    assert limit(provider.pk) == 3
    # Back at the cap it is no longer lowered; the declared cap holds and is never exceeded.
    move_concurrency_clock(provider.pk, 11)
    finish(operations_take(limit=1, actor="t"))
    assert limit(provider.pk) is None
    move_concurrency_clock(provider.pk, 3600)
    assert len(operations_take(limit=10, actor="t")) == 4
    assert limit(provider.pk) is None

    # A 429 in between restarts the quiet clock: the next step waits a whole period after it.
    finish(list(Operation.objects.filter(status=S.CLAIMED)))
    move_concurrency_clock(provider.pk, 1)
    storm(provider.pk, crm, "w-storm", tenant, TOO_MANY)
    assert limit(provider.pk) == 2
    finish(operations_take(limit=1, actor="t"))
    assert limit(provider.pk) == 2


@pytest.mark.django_db(transaction=True)
def test_the_take_leaves_rows_beyond_the_lowered_limit_queued_and_passes_the_provider_over(tenant, crm, small_default):
    provider = capped(tenant, crm, concurrency_recovery_seconds=3600)
    capped(tenant, crm, slug="free")
    storm(provider.pk, crm, "x-0", tenant, TOO_MANY)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_providerrate SET concurrency = 2")
    mine = [submit(tenant, f"x-{i + 1}") for i in range(5)]
    others = [submit(tenant, f"f-{i}", provider="free") for i in range(2)]
    first = operations_take(limit=5, actor="t")
    assert [op.key for op in first] == ["x-1", "x-2"]  # the lowered limit, though five were selected
    assert set(Operation.objects.filter(pk__in=[op.pk for op in mine[2:]]).values_list("status", "attempts")) == {
        (S.QUEUED, 0)
    }
    # At its limit the provider is passed over: the other provider's rows behind it go.
    assert sorted(op.key for op in operations_take(limit=5, actor="t")) == sorted(op.key for op in others)
    assert operations_take(limit=5, actor="t") == []
    finish(first[:1])
    assert [op.key for op in operations_take(limit=5, actor="t")] == ["x-3"]
    # A change of the caps starts the provider again as declared.
    provider_upsert(tenant=tenant, slug="crm", max_in_flight=3)
    assert limit(provider.pk) is None


@pytest.mark.django_db(transaction=True)
def test_the_provider_api_and_console_page_say_the_limit_why_and_since_when(tenant, crm, make_client, small_default):
    provider = capped(tenant, crm, max_in_flight=6)
    body = make_client(tenant, ["read"]).get("/api/v1/providers/crm").json()
    assert (body["caps"]["effective_max_in_flight"], body["caps"]["in_flight_lowered"]) == (6, False)
    assert body["caps"]["in_flight_lowered_reason"] is None
    storm(provider.pk, crm, "y-0", tenant, TOO_MANY)
    caps = make_client(tenant, ["read"]).get("/api/v1/providers/crm").json()["caps"]
    assert caps["effective_max_in_flight"] == 3
    assert caps["in_flight_lowered"] is True
    assert caps["in_flight_lowered_reason"] == "halved after an HTTP 429 answer"
    assert caps["in_flight_limit_since"]
    assert caps["in_flight_recovery_seconds"] == 30.0
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    status, html = page(ada, f"/admin/ledger/provider/{provider.pk}/change/")
    assert status == 200
    assert "at most 3 in flight (now 0): halved after an HTTP 429 answer at " in html
    assert "climbing back by 1 per 30 s without a 429 up to 6" in html


@pytest.mark.django_db
def test_a_quiet_period_that_makes_no_sense_is_refused(tenant, crm):
    from ledger.platform.errors import ValidationFailed

    for seconds in (0, 86401):
        with pytest.raises(ValidationFailed):
            capped(tenant, crm, slug="bad", concurrency_recovery_seconds=seconds)


# --- A worker process against a provider that counts what it holds (both databases) ---------------


@pytest.fixture
def slow_crm():
    server = CountingProvider(hold=0.15)
    yield server
    server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_worker_never_holds_more_calls_at_once_than_the_lowered_limit(tenant, slow_crm, small_default):
    # A provider that declared no caps, a 429 that lowered its limit from the default 8 to 4, then
    # to 2 by hand (a second storm), held there (a quiet period of an hour): six threads of one
    # worker process may hold only 2 of its calls at once.
    provider = capped(tenant, slow_crm, concurrency_recovery_seconds=3600)
    storm(provider.pk, slow_crm, "storm-1", tenant, TOO_MANY)
    assert limit(provider.pk) == 4
    move_concurrency_clock(provider.pk, 1)
    storm(provider.pk, slow_crm, "storm-2", tenant, TOO_MANY)
    assert limit(provider.pk) == 2
    slow_crm.most = 0
    env = child_env(LOG_LEVEL="INFO", PROVIDER_DEFAULT_MAX_IN_FLIGHT="8")
    worker = start_worker(env=env, concurrency=6)
    try:
        assert wait_until(lambda: "worker_started" in worker_output(worker), timeout=60)
        for i in range(12):
            submit(tenant, f"z-{i}")
        lowered = wait_until(lambda: statuses(key__startswith="z-") == {S.SUCCEEDED: 12}, timeout=60, interval=0.1)
        lowered_most = slow_crm.most
        # The control: the limit lifted (a change of the caps), the same worker holds more at once.
        provider_upsert(tenant=tenant, slug=provider.slug, concurrency_recovery_seconds=60)
        slow_crm.most = 0
        for i in range(12, 24):
            submit(tenant, f"z-{i}")
        lifted = wait_until(lambda: statuses(key__startswith="z-") == {S.SUCCEEDED: 24}, timeout=60, interval=0.1)
    finally:
        output = stop_process(worker)
    assert lowered and lifted, (statuses(), output)
    assert lowered_most == 2, lowered_most
    assert slow_crm.most > 2, slow_crm.most
    assert len(slow_crm.arrivals) == 24 + 2  # the two storms' calls and every job's, once
