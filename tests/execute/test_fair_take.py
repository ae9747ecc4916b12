"""Fair admission at the workers' take (ADR 0021, ledger.execution.fairness): round-robin over
the tenants with due work (a share of rows per round each, a rotating start), first attempts
and retries interleaved within a tenant, a system-wide and a per-tenant in-flight cap, and a
tenant's own take settings held within the deployment's bound.

Only the take is exercised (nothing is sent): each take's rows are read back by key."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from ledger.execution import fairness
from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.platform.errors import TakeInFlightAboveDeployment, TakeShareAboveDeployment
from ledger.protocol import services
from ledger.store import sql
from tests.execute.support import CountingProvider

S = OperationStatus


@pytest.fixture(autouse=True)
def fresh_rotation():
    # Each test starts its rotation at the first tenant (the cursor is the process's).
    fairness.ROTATION.reset()
    yield
    fairness.ROTATION.reset()


@pytest.fixture
def crm():
    server = CountingProvider()
    yield server
    server.stop()


@pytest.fixture
def uncapped(settings):
    """No in-flight cap at all: the order alone is under test."""
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_MAX_IN_FLIGHT": 0, "EXECUTE_TENANT_MAX_IN_FLIGHT": None}


def tenant_with_provider(slug: str, server: CountingProvider, **settings: Any):
    tenant = services.tenant_create(slug=slug, **settings)
    services.provider_upsert(
        tenant=tenant,
        slug="crm",
        base_url=server.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=2.0,
    )
    return tenant


def submit(tenant, key: str) -> Operation:
    return operation_submit(
        tenant=tenant, key=key, provider="crm", request={"method": "POST", "path": "/contacts", "body": {"k": key}}
    ).operation


def backlog(tenant, prefix: str, n: int) -> list[Operation]:
    return [submit(tenant, f"{prefix}-{i:03d}") for i in range(n)]


def as_retries(ops: list[Operation]) -> None:
    """Rows that failed once and wait to retry, due a minute ago (before any queued row)."""
    Operation.objects.filter(pk__in=[op.pk for op in ops]).update(
        status=S.RETRY_WAIT, attempts=1, next_attempt_at=sql.db_now() - timedelta(seconds=60)
    )


def keys(ops: list[Operation]) -> list[str]:
    return [op.key for op in ops]


def finish(ops: list[Operation]) -> None:
    for op in ops:
        Operation.objects.filter(pk=op.pk).update(status=S.SUCCEEDED, done_at=sql.db_now(), lease_expires_at=None)


# --- Order (both databases) -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_small_tenants_first_job_is_taken_in_the_first_round_behind_a_big_backlog(crm, uncapped):
    big = tenant_with_provider("big", crm)
    small = tenant_with_provider("small", crm)
    backlog(big, "a", 40)
    submit(small, "b-000")  # submitted last: the global order would take it 41st

    first = operations_take(limit=4, actor="w")

    # Each tenant's reads are an even split of the take: the small tenant has no more, so this
    # take is one short (the worker takes again at once) and the big tenant's next rows follow.
    assert keys(first) == ["a-000", "b-000", "a-001"]
    assert keys(operations_take(limit=2, actor="w")) == ["a-002", "a-003"]


@pytest.mark.django_db
def test_takes_of_one_row_serve_the_tenants_in_turn_from_a_rotating_start(crm, uncapped):
    tenants = [tenant_with_provider(slug, crm) for slug in ("t1", "t2", "t3")]
    for n, tenant in enumerate(tenants, start=1):
        backlog(tenant, f"t{n}", 3)

    served = [keys(operations_take(limit=1, actor="w"))[0] for _ in range(7)]

    assert served == ["t1-000", "t2-000", "t3-000", "t1-001", "t2-001", "t3-001", "t1-002"]


@pytest.mark.django_db
def test_a_tenants_share_is_its_rows_per_round(crm, uncapped):
    heavy = tenant_with_provider("heavy", crm, take_share=2)
    light = tenant_with_provider("light", crm)
    backlog(heavy, "h", 10)
    backlog(light, "l", 10)

    assert keys(operations_take(limit=6, actor="w")) == ["h-000", "h-001", "l-000", "h-002", "h-003", "l-001"]


@pytest.mark.django_db
def test_retries_and_first_attempts_alternate_so_neither_starves_the_other(crm, uncapped):
    tenant = tenant_with_provider("acme", crm)
    retries = backlog(tenant, "r", 6)
    as_retries(retries)  # older than every first attempt below
    backlog(tenant, "q", 6)

    taken = keys(operations_take(limit=4, actor="w"))
    # Alternating, the older head first: two of each, not the four oldest retries.
    assert taken == ["r-000", "q-000", "r-001", "q-001"]
    # And the other way round: new work queued long before a burst of retries does not hold them.
    assert keys(operations_take(limit=2, actor="w")) == ["r-002", "q-002"]


@pytest.mark.django_db
def test_a_held_back_provider_does_not_hold_its_tenants_other_work_nor_its_turn(crm, uncapped):
    tenant = tenant_with_provider("acme", crm)
    other = tenant_with_provider("globex", crm)
    backlog(tenant, "paused", 5)
    services.provider_pause(provider_id=Operation.objects.get(key="paused-000").provider_id, reason="t", actor="t")
    services.provider_upsert(
        tenant=tenant,
        slug="free",
        base_url=crm.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=2.0,
    )
    operation_submit(
        tenant=tenant, key="free-000", provider="free", request={"method": "POST", "path": "/x", "body": {}}
    )
    submit(other, "g-000")

    assert keys(operations_take(limit=4, actor="w")) == ["free-000", "g-000"]


def test_fair_order_is_round_by_round_then_turn_then_place():
    from datetime import UTC, datetime

    at = datetime(2026, 1, 1, tzinfo=UTC)

    def c(i: int, tenant: int, turn: int, nth: int, share: int = 1) -> fairness.Candidate:
        return fairness.Candidate(id=i, tenant_id=tenant, turn=turn, share=share, nth=nth, next_attempt_at=at)

    rows = [c(1, 7, 2, 1), c(2, 7, 2, 2), c(3, 7, 2, 3), c(4, 9, 1, 1, share=2), c(5, 9, 1, 2, share=2)]
    room = fairness.Room(total=None, per_tenant={7: 2}, default=None)

    assert [x.id for x in fairness.fair_order(rows, limit=10, room=room)] == [4, 5, 1, 2]
    assert fairness.turn_order([3, 1, 5, 2], after=2) == [3, 5, 1, 2]


# --- Caps (both databases) --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_system_wide_cap_stops_the_take_and_a_finished_call_frees_one_slot(crm, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_MAX_IN_FLIGHT": 3, "EXECUTE_TENANT_MAX_IN_FLIGHT": None}
    a = tenant_with_provider("a", crm)
    b = tenant_with_provider("b", crm)
    backlog(a, "a", 5)
    backlog(b, "b", 5)

    first = operations_take(limit=10, actor="w")
    assert len(first) == 3
    assert operations_take(limit=10, actor="w") == []
    finish(first[:1])
    assert len(operations_take(limit=10, actor="w")) == 1
    assert Operation.objects.filter(status=S.CLAIMED).count() == 3


@pytest.mark.django_db
def test_a_tenant_at_its_cap_is_passed_over_and_its_own_cap_only_lowers_the_default(crm, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_MAX_IN_FLIGHT": 0, "EXECUTE_TENANT_MAX_IN_FLIGHT": 3}
    a = tenant_with_provider("a", crm, take_max_in_flight=1)
    b = tenant_with_provider("b", crm)
    backlog(a, "a", 5)
    backlog(b, "b", 5)

    assert keys(operations_take(limit=10, actor="w")) == ["a-000", "b-000", "b-001", "b-002"]
    assert operations_take(limit=10, actor="w") == []

    # Above the deployment's default (or its share bound) is refused by name; lowering is fine.
    with pytest.raises(TakeInFlightAboveDeployment) as refused:
        services.tenant_update(tenant_id=b.pk, actor="t", take_max_in_flight=4)
    assert refused.value.code == "take_in_flight_above_deployment"
    with pytest.raises(TakeShareAboveDeployment) as refused_share:
        services.tenant_create(slug="c", take_share=99)
    assert refused_share.value.code == "take_share_above_deployment"
    services.tenant_update(tenant_id=b.pk, actor="t", take_max_in_flight=2, take_share=2)
    # A default lowered since a tenant's value was stored: the lower one holds at the take.
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_TENANT_MAX_IN_FLIGHT": 1}
    finish(list(Operation.objects.filter(status=S.CLAIMED)))
    assert keys(operations_take(limit=10, actor="w")) == ["a-001", "b-003"]


# --- Concurrent takes (PostgreSQL) ------------------------------------------------------------


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_takes_never_pass_the_system_or_a_tenants_cap_nor_take_a_row_twice(crm, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_MAX_IN_FLIGHT": 7, "EXECUTE_TENANT_MAX_IN_FLIGHT": 4}
    a = tenant_with_provider("a", crm)
    b = tenant_with_provider("b", crm, take_max_in_flight=2)
    c = tenant_with_provider("c", crm)
    for tenant, prefix in ((a, "a"), (b, "b"), (c, "c")):
        backlog(tenant, prefix, 8)
    taken: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def taker() -> None:
        try:
            start.wait(timeout=10)
            for _ in range(3):
                got = operations_take(limit=3, actor="w")
                with lock:
                    taken.extend(keys(got))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=taker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)

    assert len(taken) == len(set(taken)) == 7  # the system cap, each row once
    claimed = Operation.objects.filter(status=S.CLAIMED)
    per_tenant = {slug: claimed.filter(tenant__slug=slug).count() for slug in ("a", "b", "c")}
    assert per_tenant["b"] == 2  # its own cap
    assert per_tenant["a"] <= 4 and per_tenant["c"] <= 4  # the deployment's per-tenant cap
    assert sum(per_tenant.values()) == 7


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_take_locks_rows_of_only_as_many_tenants_as_it_can_serve(crm, uncapped):
    """With more tenants than rows to take, the pick reads and locks the first `limit` tenants'
    rows in turn, not a row of every tenant: the others stay free for another taker."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("row locks (SKIP LOCKED) are PostgreSQL's")
    for n in range(6):
        backlog(tenant_with_provider(f"t{n}", crm), f"t{n}", 2)
    picked: list[int] = []
    locked = threading.Event()
    release = threading.Event()

    def taker() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                picked.extend(fairness.operations_due_fair(limit=2, held_back=[]))
                locked.set()
                release.wait(timeout=30)
        finally:
            locked.set()
            connections.close_all()

    thread = threading.Thread(target=taker)
    thread.start()
    try:
        assert locked.wait(timeout=30)
        with connections["default"].cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT count(*) FROM (SELECT id FROM ledger_operation WHERE status = 'queued'"
                " FOR UPDATE SKIP LOCKED) AS free"
            )
            (free,) = cursor.fetchone()
            cursor.execute("ROLLBACK")
    finally:
        release.set()
        thread.join(timeout=30)

    assert len(picked) == 2
    # Two tenants' first rows locked (one each: an even split of the take), ten left free — not
    # one row of each of the six tenants.
    assert free == 12 - 2
