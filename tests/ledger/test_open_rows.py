"""The work queue's mirror, ``ledger_open_operation`` (ADR 0017): it holds exactly the open
operation rows, as they are, through every move; a completion is a HOT update of the
operation row; the lists that lost their index on the row read the mirror and the terminal
events; ``updated_after`` answers exactly as the row's column; the backfill fills and repairs
it in batches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import (
    TERMINAL_STATES,
    Attempt,
    IdempotencyClass,
    OpenOperation,
    Operation,
    OperationEvent,
    OperationStatus,
)
from ledger.platform.errors import DomainError
from ledger.protocol import selectors, services, transitions
from ledger.recovery import sweeper
from ledger.store import open_rows
from ledger.store.orphans import DRIFT, orphans_count
from tests.conftest import on_postgres
from tests.ledger.support import expire_lease, make_retry_due
from tests.support.plans import captured_statements, explain, sequential_scans

S = OperationStatus
MIRRORED = ("tenant_id", "status", "mode", "provider_id", "lease_expires_at", "next_attempt_at", "updated_at")


def open_rows_as_they_are() -> dict[int, tuple[Any, ...]]:
    return {
        row[0]: row[1:]
        for row in Operation.objects.exclude(status__in=sorted(TERMINAL_STATES)).values_list("id", *MIRRORED)
    }


def mirror() -> dict[int, tuple[Any, ...]]:
    return {row[0]: row[1:] for row in OpenOperation.objects.values_list("operation_id", *MIRRORED)}


def assert_mirrored() -> None:
    assert mirror() == open_rows_as_they_are()


def _execute_provider(tenant: Any) -> Any:
    return services.provider_upsert(
        tenant=tenant,
        slug="mailer",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        max_attempts=3,
        base_delay_seconds=1.0,
        max_delay_seconds=2.0,
    )


class Walk:
    """A few operations moved at random through the real transitions: every move a row can
    make between open states, into each terminal state, and the sweeper's."""

    def __init__(self, tenant: Any, provider: Any, mailer: Any) -> None:
        self.tenant, self.provider, self.mailer = tenant, provider, mailer
        self.held: dict[int, str] = {}  # op id → lease token, for rows claimed by a caller or worker

    def _op(self, pick: int, *states: str) -> Operation | None:
        rows = list(Operation.objects.filter(tenant=self.tenant, status__in=states).order_by("id"))
        return rows[pick % len(rows)] if rows else None

    def claim(self, pick: int) -> None:
        result = services.operation_claim(
            tenant=self.tenant, key=f"walk-{pick}", provider=self.provider, action="charge", lease_seconds=30
        )
        if result.acquired:
            self.held[result.operation.pk] = result.operation.lease_token

    def submit(self, pick: int) -> None:
        operation_submit(
            tenant=self.tenant,
            key=f"job-{pick}",
            provider=self.mailer.slug,
            action="send",
            request={"method": "POST", "path": "/send", "body": {"n": pick}},
        )

    def take(self, pick: int) -> None:
        for op in operations_take(limit=1 + pick % 2, actor="worker"):
            self.held[op.pk] = op.lease_token

    def _holder(self, pick: int) -> Operation | None:
        return self._op(pick, S.CLAIMED, S.UNCERTAIN, S.REVIEW)

    def complete(self, pick: int) -> None:
        op = self._holder(pick)
        if op is not None:
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"ref-{pick}"
            )

    def fail(self, pick: int) -> None:
        op = self._holder(pick)
        if op is not None:
            services.operation_fail(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                error_class=("transient", "permission", "ambiguous")[pick % 3],
                message="walk",
            )

    def heartbeat(self, pick: int) -> None:
        op = self._op(pick, S.CLAIMED)
        if op is not None:
            services.operation_heartbeat(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, lease_seconds=60
            )

    def reclaim(self, pick: int) -> None:
        op = self._op(pick, S.RETRY_WAIT)
        if op is not None:
            make_retry_due(op.pk)
            if op.mode == "guard":
                services.operation_claim(tenant=self.tenant, key=op.key, provider=self.provider, action="charge")

    def cancel(self, pick: int) -> None:
        op = self._op(pick, S.QUEUED, S.RETRY_WAIT)
        if op is not None:
            transitions.operation_cancel(operation_id=op.pk, actor="operator", reason="walk")

    def sweep(self, pick: int) -> None:
        op = self._op(pick, S.CLAIMED)
        if op is not None:
            expire_lease(op.pk)
        sweeper.sweep_expired_leases()


MOVES = ("claim", "submit", "take", "complete", "fail", "heartbeat", "reclaim", "cancel", "sweep")


@settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(st.tuples(st.sampled_from(MOVES), st.integers(0, 5)), min_size=1, max_size=14))
def test_the_mirror_holds_exactly_the_open_rows_through_random_moves(
    tenant: Any, provider: Any, steps: list[tuple[str, int]]
) -> None:
    mailer = _execute_provider(tenant)
    walk = Walk(tenant, provider, mailer)
    savepoint = transaction.savepoint()
    try:
        for move, pick in steps:
            try:
                with transaction.atomic():
                    getattr(walk, move)(pick)
            except DomainError:
                pass
            assert_mirrored()
    finally:
        transaction.savepoint_rollback(savepoint)


def test_a_terminal_move_deletes_the_mirror_and_a_finished_row_never_gets_one(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge").operation
    assert OpenOperation.objects.filter(operation_id=op.pk, status=S.CLAIMED).exists()
    services.operation_complete(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    assert not OpenOperation.objects.filter(operation_id=op.pk).exists()
    # Rows written around the transitions (fixtures, restores) are mirrored by the same triggers.
    Operation.objects.filter(pk=op.pk).update(updated_at=F("updated_at") - timedelta(seconds=5))
    assert not OpenOperation.objects.exists()
    Operation.objects.filter(pk=op.pk).delete()
    assert_mirrored()


def test_deleting_an_open_operation_deletes_its_mirror(tenant: Any, provider: Any) -> None:
    op = services.operation_claim(tenant=tenant, key="k-2", provider=provider, action="charge").operation
    Attempt.objects.filter(operation_id=op.pk).delete()
    OperationEvent.objects.filter(operation_id=op.pk).delete()
    Operation.objects.filter(pk=op.pk).delete()
    assert not OpenOperation.objects.exists()


# --- updated_after: the same rows as the row's own column ----------------------------------------


def _age(seconds: int) -> None:
    """Time passes: every stored time of the operations and their events moves into the past."""
    delta = timedelta(seconds=seconds)
    Operation.objects.update(
        **{
            c: F(c) - delta
            for c in ("claimed_at", "lease_expires_at", "next_attempt_at", "created_at", "updated_at", "done_at")
        }
    )
    OperationEvent.objects.update(at=F("at") - delta)


# Both plans of ``operations_updated_after`` (ADR 0027): the candidate union, and the walk
# newest first taken past UPDATED_AFTER_UNION_MAX candidates (1 here: any candidate).
@pytest.mark.parametrize("union_max", [selectors.UPDATED_AFTER_UNION_MAX, 1])
def test_updated_after_finds_exactly_the_rows_whose_updated_at_is_later(
    tenant: Any, other_tenant: Any, provider: Any, api: Any, union_max: int, monkeypatch: Any
) -> None:
    monkeypatch.setattr(selectors, "UPDATED_AFTER_UNION_MAX", union_max)
    theirs = services.provider_upsert(
        tenant=other_tenant,
        slug="stripe",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
    )

    def claim(key: str, who: Any = tenant) -> Operation:
        prov = provider if who == tenant else theirs
        return services.operation_claim(tenant=who, key=key, provider=prov, action="charge").operation

    def done(op: Operation, **kw: Any) -> None:
        services.operation_complete(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, **kw)

    def failed(op: Operation, error_class: str) -> None:
        services.operation_fail(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, error_class=error_class
        )

    # Rows that moved at different times: finished, failed, waiting to retry, heartbeaten,
    # claimed and never moved again, and one of another tenant.
    done(claim("a"))
    _age(100)
    retry = claim("b")
    failed(retry, "transient")
    _age(20)
    failed(claim("c"), "permission")
    beat = claim("d")
    _age(20)
    services.operation_heartbeat(
        operation_id=beat.pk, tenant_id=beat.tenant_id, lease_token=beat.lease_token, lease_seconds=60
    )
    claim("e")
    done(claim("x", other_tenant))
    _age(20)
    make_retry_due(retry.pk)
    services.operation_claim(tenant=tenant, key="b", provider=provider, action="charge")
    done(claim("f"))
    _age(5)
    cancelled = claim("g")
    failed(cancelled, "transient")
    transitions.operation_cancel(operation_id=cancelled.pk, actor="op", reason="not needed")

    times = sorted(set(Operation.objects.values_list("updated_at", flat=True)))
    assert len(times) >= 5, times
    probes = {times[0] - timedelta(seconds=1)}
    for at in times:
        probes |= {at - timedelta(microseconds=1), at, at + timedelta(microseconds=1)}
    mine = Operation.objects.filter(tenant=tenant)
    for after in sorted(probes):
        expected = set(mine.filter(updated_at__gt=after).values_list("id", flat=True))
        found = set(
            selectors.operations_updated_after(mine, after, tenant_ids=[tenant.pk]).values_list("id", flat=True)
        )
        assert found == expected, after
    # Through the API, as a client polls: the same ids.
    after = times[len(times) // 2]
    answer = api.get("/api/v1/operations", {"updated_after": after.isoformat(), "page_size": 100})
    assert answer.status_code == 200
    assert {row["id"] for row in answer.json()["results"]} == set(
        mine.filter(updated_at__gt=after).values_list("id", flat=True)
    )


# --- lists by state ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", [s for s in S.values])
def test_every_state_list_answers_the_rows_in_that_state(tenant: Any, provider: Any, state: str) -> None:
    ops = [
        services.operation_claim(tenant=tenant, key=f"s-{i}", provider=provider, action="c").operation for i in range(6)
    ]
    services.operation_complete(operation_id=ops[0].pk, tenant_id=tenant.pk, lease_token=ops[0].lease_token)
    for op, error_class in zip(ops[1:4], ("transient", "permission", "ambiguous"), strict=True):
        services.operation_fail(
            operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, error_class=error_class
        )
    transitions.operation_cancel(operation_id=ops[1].pk, actor="op", reason="no")
    rows = Operation.objects.filter(tenant=tenant)
    listed = set(selectors.operations_in_state(rows, state, tenant_ids=[tenant.pk]).values_list("id", flat=True))
    assert listed == set(rows.filter(status=state).values_list("id", flat=True))


def test_updated_after_reads_the_candidate_union_only_while_it_is_small(
    tenant: Any, provider: Any, monkeypatch: Any
) -> None:
    # Sorting and joining every candidate before the page is what cost 2 s at 10M rows a month
    # back (ADR 0027): past the bound the rows are walked newest first instead.
    for i in range(3):
        op = services.operation_claim(tenant=tenant, key=f"u-{i}", provider=provider, action="c").operation
        services.operation_complete(operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token)
    rows = Operation.objects.filter(tenant=tenant)
    after = timezone.now() - timedelta(hours=1)
    expected = list(rows.filter(updated_at__gt=after).order_by("-id").values_list("id", flat=True))
    assert len(expected) == 3
    small = selectors.operations_updated_after(rows, after, tenant_ids=[tenant.pk]).order_by("-id")
    assert "UNION" in str(small.query)
    monkeypatch.setattr(selectors, "UPDATED_AFTER_UNION_MAX", 3)
    many = selectors.operations_updated_after(rows, after, tenant_ids=[tenant.pk]).order_by("-id")
    assert "UNION" not in str(many.query)
    assert list(small.values_list("id", flat=True)) == list(many.values_list("id", flat=True)) == expected


@pytest.mark.skipif(not on_postgres(), reason="DISTINCT ON and the planner's ordered semi-join")
def test_a_terminal_state_list_reads_its_event_ids_newest_first_each_once(tenant: Any, provider: Any, api: Any) -> None:
    # The page joins the first ids of an ordered, distinct stream and stops at its LIMIT (ADR
    # 0027): a plain IN hashed every `failed` event and sorted all their rows (1.5 s at 10M).
    ops = [
        services.operation_claim(tenant=tenant, key=f"f-{i}", provider=provider, action="c").operation for i in range(4)
    ]
    for op in ops:
        services.operation_fail(
            operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, error_class="permission"
        )
    # A second event into `failed` for one row, as a supersede writes (failed → failed).
    OperationEvent.objects.create(
        tenant=tenant,
        operation=ops[1],
        from_status=S.FAILED,
        to_status=S.FAILED,
        actor="t",
        reason="superseded",
        at=timezone.now(),
    )
    rows = Operation.objects.filter(tenant=tenant)
    listed = selectors.operations_in_state(rows, S.FAILED, tenant_ids=[tenant.pk]).order_by("-id")
    sql = str(listed.query)
    assert "DISTINCT ON" in sql and ("ORDER BY 1 DESC)" in sql or 'ORDER BY U0."operation_id" DESC)' in sql), sql
    newest_first = sorted((op.pk for op in ops), reverse=True)
    assert list(listed.values_list("id", flat=True)) == newest_first
    answer = api.get("/api/v1/operations", {"status": "failed", "page_size": 3})
    assert [row["id"] for row in answer.json()["results"]] == newest_first[:3]
    with captured_statements() as seen:
        list(listed[:2])
    plan = explain(seen[-1].sql, seen[-1].params, plan="custom", enable_seqscan="off")
    # The events' ids come out of their (tenant, status, operation) index already in order.
    assert "term_status" in plan or "tenant_id_to_status_operation" in plan, plan
    assert "Unique" in plan and "HashAggregate" not in plan, plan


# --- the backfill -----------------------------------------------------------------------------


def test_the_backfill_fills_a_missing_mirror_in_batches_resumes_and_repairs(tenant: Any, provider: Any) -> None:
    ops = [
        services.operation_claim(tenant=tenant, key=f"b-{i}", provider=provider, action="c").operation for i in range(7)
    ]
    for op in ops[:3]:
        services.operation_complete(operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token)
    expected = open_rows_as_they_are()
    assert len(expected) == 4
    # Rows open before the triggers existed: no mirror. And one mirror that drifted.
    OpenOperation.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_open_operation (id, tenant_id, status, mode, provider_id, updated_at)"
            " SELECT id, tenant_id, 'review', mode, provider_id, updated_at FROM ledger_operation WHERE id = %s",
            [ops[0].pk],
        )
    # The nightly check sees it (the four open rows without a mirror, the finished one with one).
    assert orphans_count()[DRIFT] == 5
    watermarks: list[int] = []
    # Interrupted after the first batches, resumed from the last watermark it printed.
    first = ops[0].pk - 1
    open_rows.open_rows_backfill_batch(after=first, upto=first + 2)
    open_rows.open_rows_backfill(start_after=first + 2, span=2, progress=lambda upto, n: watermarks.append(upto))
    assert watermarks == sorted(watermarks) and watermarks[-1] == ops[-1].pk
    assert mirror() == expected
    # Idempotent: again, through the command.
    call_command("open_rows_backfill", "--span", "3", stdout=_Quiet())
    assert mirror() == expected
    assert orphans_count()[DRIFT] == 0 and orphans_count()["ledger_open_operation.id"] == 0
    # A mirror row whose operation is gone (no constraint: ADR 0017) is an orphan.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_open_operation (id, tenant_id, status, mode, provider_id, updated_at)"
            " SELECT id + 1000, tenant_id, status, mode, provider_id, updated_at FROM ledger_operation WHERE id = %s",
            [ops[-1].pk],
        )
    assert orphans_count()["ledger_open_operation.id"] == 1


class _Quiet:
    def write(self, text: str) -> None:
        pass


# --- PostgreSQL: HOT completions, and the plans of the reads that moved ---------------------------


@pytest.mark.postgres_only
@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's HOT updates and plans")
def test_the_completion_is_a_hot_update(tenant: Any, provider: Any) -> None:
    def counts() -> tuple[int, int]:
        with connection.cursor() as cursor:
            # This transaction's own counters (pg_stat_user_tables shows them after commit).
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'ledger_operation'"
            )
            return cursor.fetchone()

    before = counts()
    pairs = 20
    for i in range(pairs):
        op = services.operation_claim(tenant=tenant, key=f"hot-{i}", provider=provider, action="c").operation
        # No provider reference: op_ref_idx (provider_ref) is still on the row until it moves to
        # the search table (ADR 0011 row 9), and a new reference makes that completion non-HOT.
        services.operation_complete(operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token)
    after = counts()
    updates, hot = after[0] - before[0], after[1] - before[1]
    assert updates == pairs
    assert hot >= 0.9 * pairs, (updates, hot)


def _plan_of_captured(run: Any, *markers: str) -> str:
    with captured_statements() as statements:
        run()
    found = [s for s in statements if all(marker in s.sql for marker in markers)]
    assert found, f"no statement with {markers!r}"
    # Planned for its values as the app sent them, sequential scans priced out (the tests'
    # tables are tiny): an index that can serve the statement shows up.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {found[0].sql}", found[0].params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgres_only
@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's partial indexes and plans")
def test_the_work_queue_reads_use_the_mirror_indexes(tenant: Any, provider: Any, api: Any) -> None:
    mailer = _execute_provider(tenant)
    for i in range(3):
        operation_submit(
            tenant=tenant,
            key=f"q-{i}",
            provider=mailer.slug,
            action="send",
            request={"method": "POST", "path": "/send", "body": {"n": i}},
        )
    for i in range(4):
        op = services.operation_claim(tenant=tenant, key=f"p-{i}", provider=provider, action="c").operation
        services.operation_fail(
            operation_id=op.pk, tenant_id=tenant.pk, lease_token=op.lease_token, error_class="permission"
        )
    # The workers' take: its fair pick (ADR 0021) walks the mirror's tenant-due index, the
    # operation row locked.
    take = _plan_of_captured(lambda: operations_take(limit=2), "WITH RECURSIVE walk")
    assert "open_exec_tenant_due_idx" in take and "LockRows" in take, take
    assert not sequential_scans(take, ["ledger_operation", "ledger_open_operation"]), take
    # The sweeper's expired leases.
    expired = _plan_of_captured(sweeper.sweep_expired_leases, "ledger_open_operation")
    assert "open_claimed_lease_idx" in expired, expired
    # A terminal state's list: the events into it; updated_after: the mirror and the terminal events.
    # (The events' indexes are per monthly partition: `<partition>_term_status`, `_term_at`.)
    listing = ('FROM "ledger_operation"', "ORDER BY")
    failed = _plan_of_captured(lambda: api.get("/api/v1/operations?status=failed"), *listing)
    assert "_term_status" in failed, failed
    # An open state's list: a mirror's index over the state (on tiny tables (tenant, id) costs
    # the same; without it, as tests/ledger/test_growth.py does, the plan shows what serves it).
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX op_tenant_id_idx")
    queued = _plan_of_captured(lambda: api.get("/api/v1/operations?status=queued"), *listing)
    assert "open_tenant_status_idx" in queued or "open_due_idx" in queued, queued
    assert not sequential_scans(queued, ["ledger_operation", "ledger_open_operation"]), queued
    changed = _plan_of_captured(
        lambda: api.get("/api/v1/operations", {"updated_after": "2020-01-01T00:00:00Z"}), *listing
    )
    assert "open_tenant_updated_idx" in changed and "_term_at" in changed, changed


@pytest.mark.postgres_only
@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's catalogue")
def test_the_operation_table_keeps_twelve_indexes_and_none_names_a_completed_column(db: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'ledger_operation'")
        indexes = dict(cursor.fetchall())
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'ledger_open_operation'")
        (options,) = cursor.fetchone()
    # 25 before ADR 0017 (ten moved to the mirror) and ADR 0018 (two to the search rows); 13
    # before ADR 0023 (op_handle_idx: the handle filter reads the search rows). Each is named
    # with the query it serves in ADR 0023; a new one is a decision recorded there, not a drift.
    assert len(indexes) == 12, sorted(indexes)
    assert set(indexes) == {
        "ledger_operation_pkey",
        "operation_unique_key_per_tenant",
        "op_tenant_id_idx",
        "op_exec_created_idx",
        "op_execution_idx",
        "op_correlation_idx",
        "op_workflow_idx",
        "op_superseded_idx",
        "op_replaced_idx",
        "op_run_idx",
        "op_record_idx",
        "op_search_fields_gin",
    }, sorted(indexes)
    completed = ("status", "updated_at", "lease_expires_at", "next_attempt_at", "done_at", "error_class")
    for name, definition in indexes.items():
        assert not any(column in definition for column in completed), (name, definition)
    assert "fillfactor=70" in options and "autovacuum_vacuum_scale_factor=0" in options


@pytest.mark.postgres_only
@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's trigram index and plans")
def test_the_handle_filter_reads_the_search_rows_trigram_index(tenant: Any, provider: Any, api: Any) -> None:
    """ADR 0023: op_handle_idx is gone; the API's reconciliation_handle filter finds its
    candidates on the search rows' trigram index and stays exact on the row's own column."""
    for i, handle in enumerate(["pi_3NfX1001", "pi_3NfX10011", "other-77"]):
        services.operation_claim(tenant=tenant, key=f"h-{i}", provider=provider, reconciliation_handle=handle)
    late = services.operation_claim(tenant=tenant, key="h-late", provider=provider).operation
    services.operation_mark_sent(
        operation_id=late.pk, tenant_id=tenant.pk, lease_token=late.lease_token, reconciliation_handle="pi_late_9"
    )
    found = api.get("/api/v1/operations", {"reconciliation_handle": "pi_3NfX1001"}).json()["results"]
    assert [row["key"] for row in found] == ["h-0"]
    found = api.get("/api/v1/operations", {"reconciliation_handle": "pi_late_9"}).json()["results"]
    assert [row["key"] for row in found] == ["h-late"]
    # Filled (20,000 more rows with handles and their search rows, analysed), so the plan is
    # the one a real table gets: on tiny tables walking the tenant's rows costs the same.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(quote_ident(column_name), ', ') FROM information_schema.columns"
            " WHERE table_name = 'ledger_operation' AND column_name NOT IN ('id', 'key', 'reconciliation_handle')"
        )
        (columns,) = cursor.fetchone()
        cursor.execute(
            f"INSERT INTO ledger_operation (key, reconciliation_handle, {columns})"
            f" SELECT 'fill-' || g, 'pi_fill_' || g, {columns} FROM ledger_operation, generate_series(1, 20000) g"
            " WHERE id = %s",
            [late.pk],
        )
        cursor.execute(
            "INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)"
            " SELECT id, 0, tenant_id, FALSE, key || chr(1) || reconciliation_handle || chr(1) || chr(1)"
            " FROM ledger_operation WHERE key LIKE 'fill-%%'"
        )
        cursor.execute("ANALYZE ledger_operation")
        cursor.execute("ANALYZE ledger_operation_search")
    plan = _plan_of_captured(
        lambda: api.get("/api/v1/operations", {"reconciliation_handle": "pi_3NfX1001"}),
        'FROM "ledger_operation"',
        "ORDER BY",
    )
    assert "opsearch_text_trgm" in plan, plan
    assert not sequential_scans(plan, ["ledger_operation", "ledger_operation_search"]), plan


@pytest.mark.postgres_only
@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's table locks")
def test_installing_the_mirror_triggers_lets_reads_go_on_and_runs_again(db: Any) -> None:
    """Migration 0042's trigger install (and a repair that runs it again) takes SHARE ROW
    EXCLUSIVE on the operation table, which reads do not hold up: here a reader's open
    transaction holds its ACCESS SHARE lock while the install runs twice under a 1 s lock
    timeout. DROP TRIGGER would have waited for the reader (ACCESS EXCLUSIVE) and timed out."""
    import psycopg

    params = {k: v for k, v in connection.get_connection_params().items() if k in ("dbname", "user", "host", "port")}
    reader = psycopg.connect(**params)
    try:
        reader.execute("SELECT count(*) FROM ledger_operation").fetchone()  # its transaction stays open
        with connection.cursor() as cursor:

            class Editor:  # what triggers_install reads of a schema editor
                execute = staticmethod(cursor.execute)
                connection = connection

            cursor.execute("SET LOCAL lock_timeout = '1s'")
            open_rows.triggers_install(Editor())
            open_rows.triggers_install(Editor())
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'ledger_operation'::regclass"
                " AND tgname LIKE 'ledger_open_operation_on_%%' ORDER BY tgname"
            )
            names = [row[0] for row in cursor.fetchall()]
        assert names == [f"ledger_open_operation_on_{op}" for op in ("delete", "insert", "update")], names
        assert reader.execute("SELECT 1").fetchone() == (1,)
    finally:
        reader.close()
