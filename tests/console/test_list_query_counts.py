"""Every console list and the dashboard run a number of queries that does not grow with the
rows on the page (issue 16: the operations list once ran 111 queries for 100 rows, one
tenant lookup per row; the review list two per row). Each page is counted with a few rows,
then must take no more queries with ten times as many."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Operation, OperationEvent, OperationOutput, OperationStatus, Provider, Tenant, Upload
from ledger.protocol import services
from ledger.web.console.operations import NeedsFilter
from review.console import selectors as review_selectors
from review.console.selectors import attention_now, provider_activity
from tests.conftest import on_postgres
from tests.console.support import client_for, drop_indexes_until_rollback, generic_plan, seq_scan_free_plan

pytestmark = pytest.mark.django_db

# Enough for session, user, permissions, scope, the list's filters and its one query per
# related set; what matters is that it does not grow with the rows.
MAX_QUERIES = 40


def seed(tenant: Tenant, provider: Provider, start: int, count: int) -> None:
    """``count`` operations: succeeded, failed (a DLQ entry) and in review, in turn."""
    for i in range(start, start + count):
        op = services.operation_claim(tenant=tenant, key=f"k-{i}", provider=provider, action="charge").operation
        if i % 3 == 0:
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"ch_{i}"
            )
            # Its published output and an upload (rows only: the lists never read the bytes).
            digest = f"{tenant.pk:032d}{i:032d}"  # 64 hex digits whatever the ids
            OperationOutput.objects.create(
                tenant=tenant,
                operation=op,
                key=f"out_{digest}",
                sha256=digest,
                size=1000 + i,
                media_type="image/png",
                width=64,
                height=48,
                storage_name=f"outputs/{digest}",
            )
            Upload.objects.create(
                tenant=tenant,
                key=f"up_{digest}",
                sha256=digest,
                size=2000 + i,
                media_type="image/jpeg",
                width=640,
                height=480,
                storage_name=f"uploads/{digest}",
            )
        elif i % 3 == 1:
            services.operation_fail(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                error_class="invalid_input",
                message="declined",
            )
        else:
            # As the sweeper leaves it: in review, with the event that says why.
            Operation.objects.filter(pk=op.pk).update(status=OperationStatus.REVIEW, lease_expires_at=None)
            OperationEvent.objects.create(
                tenant_id=op.tenant_id,
                operation=op,
                from_status=OperationStatus.CLAIMED,
                to_status=OperationStatus.REVIEW,
                actor="sweeper",
                reason="lease expired after the sent marker",
                at=timezone.now(),
            )


def console_pages() -> list[str]:
    pages = ["/admin/"]
    # ModelAdmins and the history tables' pages (review.console.history_pages).
    for model in [*admin.site._registry, *admin.site._history_pages]:
        pages.append(reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"))
    ops = reverse("admin:ledger_operation_changelist")
    pages += [f"{ops}?status__exact=review", f"{ops}?q=k-1", f"{ops}?needs=stuck"]
    return sorted(pages)


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(ctx.captured_queries)


@pytest.fixture
def two_tenants(tenant: Tenant, other_tenant: Tenant) -> dict[str, Any]:
    made = {}
    for t in (tenant, other_tenant):
        made[t.slug] = services.provider_upsert(
            tenant=t, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
        )
    return made


def test_no_console_list_or_the_dashboard_runs_more_queries_for_more_rows(tenant, other_tenant, two_tenants):
    admin_user = User.objects.create_superuser("root", "root@example.invalid", "x")
    client = client_for(admin_user)
    seed(tenant, two_tenants["acme"], 0, 3)
    seed(other_tenant, two_tenants["globex"], 0, 3)
    few = {url: queries(client, url) for url in console_pages()}

    seed(tenant, two_tenants["acme"], 3, 30)
    seed(other_tenant, two_tenants["globex"], 3, 30)
    grown = {}
    for url in few:
        n = queries(client, url)
        # One more at most, once: a list longer than a page is counted; a shorter one is read
        # without a count (review.console.listing.ConsoleChangeList). A query per row adds dozens.
        if n > few[url] + 1 or n > MAX_QUERIES:
            grown[url] = (few[url], n)
    assert not grown, f"pages whose queries grew with the rows (few rows, 10× rows): {grown}"


def test_the_api_lists_run_a_fixed_number_of_queries(tenant, two_tenants, make_client, django_assert_max_num_queries):
    api = make_client(tenant, ["read"])
    seed(tenant, two_tenants["acme"], 0, 3)
    counts = {}
    urls = ["/api/v1/operations", "/api/v1/review/items", "/api/v1/dlq/events"]
    for url in urls:
        with CaptureQueriesContext(connection) as ctx:
            assert api.get(url).status_code == 200
        counts[url] = len(ctx.captured_queries)
    seed(tenant, two_tenants["acme"], 3, 30)
    for url in urls:
        with django_assert_max_num_queries(counts[url]):
            assert api.get(url).status_code == 200


def test_the_operations_list_sorts_by_id_only_whatever_the_o_parameter_asks(tenant, two_tenants):
    # Any other order sorts every matching row (a key sort over ten million rows took 31 s).
    client = client_for(User.objects.create_superuser("root", "root@example.invalid", "x"))
    seed(tenant, two_tenants["acme"], 0, 3)
    for o in ("1", "2", "3", "-2", "2.1"):
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(f"/admin/ledger/operation/?o={o}").status_code == 200
        orders = [q["sql"].split("ORDER BY", 1)[1] for q in ctx.captured_queries if "ORDER BY" in q["sql"]]
        listing = [order for order in orders if '"ledger_operation"."' in order]
        assert listing and all('"ledger_operation"."key"' not in order for order in listing), listing
        assert all('"ledger_operation"."created_at"' not in order for order in listing), listing


def test_dashboard_counts_are_exact_up_to_the_bound_and_estimates_past_it(tenant, two_tenants, monkeypatch):
    # Counting reads every row it counts: past the bound the page shows PostgreSQL's estimate
    # (from statistics) and marks it as one; SQLite has no estimate and shows the bound.
    monkeypatch.setattr(review_selectors, "DASHBOARD_EXACT_UP_TO", 4)
    client = client_for(User.objects.create_superuser("root", "root@example.invalid", "x"))
    seed(tenant, two_tenants["acme"], 0, 12)  # 4 succeeded, 4 failed, 4 in review
    seed(tenant, two_tenants["acme"], 12, 1)  # one more succeeded: 5, past the bound
    body = client.get("/admin/").content.decode()
    assert 'data-testid="ops-failed"><span class="og-n">4</span>' in body
    assert 'data-testid="review-backlog">4</a>' in body
    succeeded = body.split('data-testid="ops-succeeded"><span class="og-n">', 1)[1].split("<", 1)[0]
    if connection.vendor == "postgresql":
        assert succeeded.startswith("≈ "), succeeded
    else:
        assert succeeded == "4+", succeeded


def _finished_hours_ago(tenant: Tenant, hours: int) -> None:
    """Move the tenant's finished rows, their review exits and DLQ entries ``hours`` back."""
    from dlq.models import FailedEvent

    back = timezone.now() - timedelta(hours=hours)
    Operation.objects.filter(tenant=tenant, done_at__isnull=False).update(done_at=back, updated_at=back)
    OperationEvent.objects.filter(operation__tenant=tenant, from_status=OperationStatus.REVIEW).update(at=back)
    FailedEvent.objects.filter(tenant=tenant).update(failed_at=back)


def _ledger_reads(ctx: CaptureQueriesContext) -> list[str]:
    tables = ('FROM "ledger_operation"', 'FROM "ledger_operationevent"', 'FROM "dlq_failedevent"')
    return [q["sql"] for q in ctx.captured_queries if any(t in q["sql"] for t in tables)]


def test_dashboard_activity_of_a_finished_hour_is_read_from_the_ledger_once_whatever_the_process(tenant, two_tenants):
    seed(tenant, two_tenants["acme"], 0, 6)
    _finished_hours_ago(tenant, 3)
    seed(tenant, two_tenants["acme"], 6, 3)  # this hour's: read live each time
    from django.core.cache import cache

    with CaptureQueriesContext(connection) as first:
        before = provider_activity(tenant_ids=[tenant.pk])
    # The next view in this process reads only the current hour; in another process (its
    # cache empty) the finished hours come from the rollup, not the ledger.
    with CaptureQueriesContext(connection) as second:
        after = provider_activity(tenant_ids=[tenant.pk])
    cache.clear()
    with CaptureQueriesContext(connection) as elsewhere:
        assert provider_activity(tenant_ids=[tenant.pk]) == before
    assert after == before
    assert len(_ledger_reads(first)) == 6 and len(_ledger_reads(second)) == 3 and len(_ledger_reads(elsewhere)) == 3
    assert len(second.captured_queries) == 3
    assert all('"done_at" <' not in sql for sql in _ledger_reads(elsewhere))
    assert any("review_activityhour" in q["sql"] for q in elsewhere.captured_queries)
    totals = dict(after["providers"])["crm"]
    # Three hours ago: 2 succeeded, 2 failed; this hour 1 and 1 (k-6 succeeded, k-7 failed).
    assert sum(totals["succeeded"]) == 3 and sum(totals["failed"]) == 3, totals
    assert totals["succeeded"][-4] == 2 and totals["failed"][-4] == 2, totals


@pytest.mark.parametrize(
    ("minutes", "settled"),
    # The chart's 24 hours are the current one and the 23 before; the hour just over settles
    # two minutes after it ends (review.console.selectors.ACTIVITY_SETTLE) and is read live until then.
    [(30, 23), (1, 22)],
)
def test_the_rollup_schedule_reads_the_finished_hours_so_no_view_does(
    tenant, other_tenant, two_tenants, monkeypatch, minutes, settled
):
    from review.models import ActivityHour
    from review.schedules import activity_rollup_task

    seed(tenant, two_tenants["acme"], 0, 6)
    seed(other_tenant, two_tenants["globex"], 0, 3)
    _finished_hours_ago(tenant, 5)
    _finished_hours_ago(other_tenant, 2)
    # The clock pinned to a minute of this hour: the count of settled hours depends on it.
    moment = timezone.now().replace(minute=minutes, second=0, microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: moment)
    assert activity_rollup_task() == {"tenants": 2}
    assert ActivityHour.objects.filter(series="").count() == 2 * settled  # every settled hour of both, read once
    with CaptureQueriesContext(connection) as ctx:
        chart = provider_activity(tenant_ids=[tenant.pk, other_tenant.pk])
    assert all('"done_at" <' not in sql for sql in _ledger_reads(ctx))
    totals = dict(chart["providers"])["crm"]
    assert totals["succeeded"][-6] == 2 and totals["succeeded"][-3] == 1, totals
    assert totals["failed"][-6] == 2 and totals["failed"][-3] == 1, totals
    # Rows older than two days go; a second pass reads nothing it has.
    ActivityHour.objects.create(tenant=tenant, hour=timezone.now() - timedelta(days=3))
    with CaptureQueriesContext(connection) as again:
        activity_rollup_task()
    assert not ActivityHour.objects.filter(hour__lt=timezone.now() - timedelta(days=2)).exists()
    assert all('"done_at" <' not in sql for sql in _ledger_reads(again))


def _without_the_operations_primary_key() -> None:
    """The open rows live on the work queue's mirror (ADR 0017), joined to the operation by id:
    on the tests' tiny tables, walking the operation table's primary key and probing the mirror
    costs the same as walking the mirror's index, which at ten million rows it does not. Without
    that key (dropped for the test's transaction, rolled back with it; its foreign keys too),
    the plan shows which of the mirror's indexes serves the page. The mirror's own primary key
    goes too: walked backwards with the time as a filter, it costs the same as the (id,
    updated_at) index on a few rows (which of the two a plan took followed the statistics other
    tests left), while at scale only the second reads the time in the index."""
    with connection.cursor() as cursor:
        # The deferred foreign-key checks of the seeded rows run first (ALTER TABLE waits for none).
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE ledger_operation DROP CONSTRAINT ledger_operation_pkey CASCADE")
        cursor.execute("ALTER TABLE ledger_open_operation DROP CONSTRAINT ledger_open_operation_pkey CASCADE")


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's partial indexes and plans")
def test_stuck_rows_and_review_decisions_are_read_from_their_partial_indexes(tenant, two_tenants):
    # The tests' tables are tiny, so sequential scans are priced out to see which index can
    # serve each read: the open rows' (id, updated_at) index for the dashboard's stuck rows and
    # the needs=stuck page and count, the review exits' index for the activity chart. A filter spelled
    # so the planner cannot see the index's predicate applies would show a full scan instead.
    seed(tenant, two_tenants["acme"], 0, 3)
    _without_the_operations_primary_key()
    with CaptureQueriesContext(connection) as ctx:
        attention_now(tenant_ids=None)
    stuck_sql = next(q["sql"] for q in ctx.captured_queries if '"ledger_operation"."updated_at" <' in q["sql"])
    # In id order the primary key serves every row; the open rows' index is taken only if the
    # planner sees that the filter implies its predicate.
    assert "open_id_updated_idx" in plan_of(stuck_sql, in_index_order=True)

    stuck = NeedsFilter(None, {"needs": ["stuck"]}, Operation, None).queryset(None, Operation.objects.all())
    assert "open_id_updated_idx" in seq_scan_free_plan(stuck.order_by("-id")[:100], in_index_order=True)
    # Unordered (the capped count), the join may run either way on tiny tables: an index of the
    # mirror holding "not moved since" serves it. Which side drives follows the two tables'
    # statistics, which otherwise are whatever autovacuum last took while other tests filled and
    # rolled back rows (a mirror counted larger than the operation table is probed by its primary
    # key); taken now, they count this test's rows, and the small mirror drives, as at scale.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation, ledger_open_operation")
    count_plan = seq_scan_free_plan(stuck.order_by().values("pk")[:10001])
    assert "open_id_updated_idx" in count_plan or "open_tenant_updated_idx" in count_plan, count_plan

    # The chart's finished rows: found by their events into a terminal state, by time (the
    # operation row has no index on updated_at or done_at since ADR 0017), then by primary key.
    with CaptureQueriesContext(connection) as charted:
        review_selectors._activity_rows(tenant_ids=[tenant.pk], since=timezone.now(), until=None, cap=10)
    finished_sql = next(q["sql"] for q in charted.captured_queries if '"ledger_operation"."done_at" >=' in q["sql"])
    assert "opevent_terminal_at_idx" in plan_of(finished_sql) or "_term_at" in plan_of(finished_sql)

    reviewed = OperationEvent.objects.filter(from_status=OperationStatus.REVIEW, at__gte=timezone.now()).exclude(
        to_status=OperationStatus.REVIEW
    )
    assert "opevent_review_exit_idx" in seq_scan_free_plan(reviewed)

    # Cancellable rows: their own index in list order (the due index on their states gives
    # every such row, to be sorted; the open rows' index several open rows for each shown).
    # The open rows' index is in the same order and costs the same on tiny tables: without it.
    drop_indexes_until_rollback("open_id_updated_idx")
    cancellable = NeedsFilter(None, {"needs": ["cancellable"]}, Operation, None).queryset(None, Operation.objects.all())
    plan = seq_scan_free_plan(cancellable.order_by("-id")[:100], in_index_order=True)
    assert "open_cancellable_id_idx" in plan, plan
    # Unordered, either index over exactly these states serves it (op_due_idx has the same
    # predicate; which one wins is a planner tie on a tiny table).
    unordered = seq_scan_free_plan(cancellable.order_by().values("pk")[:10001])
    assert "open_cancellable_id_idx" in unordered or "open_due_idx" in unordered, unordered


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's partial indexes and generic plans")
@pytest.mark.parametrize("needs", ["stuck", "cancellable"])
def test_needs_pages_read_their_partial_index_in_a_generic_plan_too(tenant, two_tenants, needs):
    # A prepared statement's generic plan cannot see parameter values: a partial index over
    # states serves it only when the states are written into the SQL (LiteralIn).
    seed(tenant, two_tenants["acme"], 0, 3)
    _without_the_operations_primary_key()
    rows = NeedsFilter(None, {"needs": [needs]}, Operation, None).queryset(None, Operation.objects.all())
    index = {"stuck": "open_id_updated_idx", "cancellable": "open_cancellable_id_idx"}[needs]
    if needs == "cancellable":
        drop_indexes_until_rollback("open_id_updated_idx")  # same order, same cost on tiny tables
    plan = generic_plan(rows.order_by("-id")[:100], in_index_order=True)
    assert index in plan, plan


def test_literal_in_takes_state_names_only(tenant):
    assert list(Operation.objects.filter(status__in_literal=["queued", "review"])) == []
    with pytest.raises(ValueError):
        list(Operation.objects.filter(status__in_literal=["queued'); DROP TABLE x; --"]))


def plan_of(sql: str, *, in_index_order: bool = False) -> str:
    """The plan of ``sql`` with sequential scans priced out; ``in_index_order`` prices out
    sorts and bitmap scans too, so the only plans left read an index in the query's order.
    Which of those the planner takes on the tests' tiny tables otherwise follows whatever
    statistics autovacuum last took (the suite's other tests fill and roll back thousands of
    rows), not the query's shape."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        if in_index_order:
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(r[0] for r in cursor.fetchall())


def test_the_rollup_stores_every_count_of_an_hour_however_many_providers_and_hours_it_reads(tenant):
    # The rollup keeps what it reads for good (an hour read is never read again), so a read
    # cut at a row cap would lose counts for ever: here 46 providers x 2 states x 22 settled
    # hours x 11 tenants = 22,264 (tenant, provider, state, hour) counts, past the live
    # chart's cap of 20,000, one operation each.
    from review.console.selectors import activity_rollup
    from review.models import ActivityHour

    tenants = [tenant] + Tenant.objects.bulk_create([Tenant(slug=f"t-{i}") for i in range(10)])
    providers = Provider.objects.bulk_create(
        [
            Provider(tenant=t, slug=f"p-{i}", base_url="http://127.0.0.1:9", idempotency_class="key_enforced")
            for t in tenants
            for i in range(46)
        ]
    )
    top = timezone.now().replace(minute=0, second=0, microsecond=0)
    if timezone.now() - top < timedelta(minutes=3):
        top -= timedelta(hours=1)  # the hour just over settles 2 minutes after it ends
    rows = []
    for p in providers:
        for h in range(1, 23):
            at = top - timedelta(hours=h) + timedelta(minutes=30)
            for status in (OperationStatus.SUCCEEDED, OperationStatus.FAILED):
                rows.append(
                    Operation(
                        tenant_id=p.tenant_id,
                        provider=p,
                        key=f"{p.pk}-{h}-{status}",
                        mode="guard",
                        status=status,
                        fingerprint="ab" * 32,
                        created_at=at,
                        updated_at=at,
                        done_at=at,
                    )
                )
    Operation.objects.bulk_create(rows, batch_size=2000)
    # Each with its event into the terminal state, as every move into one writes (the rollup
    # finds the finished rows by those events: opevent_terminal_at_idx, ADR 0017).
    OperationEvent.objects.bulk_create(
        [
            OperationEvent(
                tenant_id=op.tenant_id,
                operation_id=op.pk,
                from_status=OperationStatus.CLAIMED,
                to_status=op.status,
                actor="worker",
                at=op.done_at,
            )
            for op in Operation.objects.filter(tenant__in=tenants).only("id", "tenant_id", "status", "done_at")
        ],
        batch_size=2000,
    )
    settled = top - timedelta(hours=22)
    expected = Operation.objects.filter(done_at__gte=settled).count()
    assert expected > 20000

    activity_rollup()

    stored = ActivityHour.objects.filter(hour__gte=settled).exclude(series="")
    assert sum(stored.values_list("n", flat=True)) == expected


@pytest.mark.parametrize(
    "query", ["status__exact=review", "needs=cancellable", "needs=stuck", "status__exact=review&q=k-"]
)
def test_an_open_rows_filter_alone_is_counted_on_the_work_queue_mirror(tenant, query, monkeypatch):
    # Counting 10,001 mirror rows joined to their operations probed as many operation rows
    # (~150 ms at 10M); the filter alone names the mirror's rows one for one (ADR 0027). With
    # another filter (a search) the list's own rows are counted.
    from ledger.web.console.operations import OperationAdmin

    provider = Provider.objects.filter(tenant=tenant).first()
    ops = [
        services.operation_claim(tenant=tenant, key=f"k-{i}", provider=provider, action="charge").operation
        for i in range(3)
    ]
    Operation.objects.filter(pk__in=[op.pk for op in ops]).update(status=OperationStatus.REVIEW)
    if "review" not in query:
        Operation.objects.filter(pk__in=[op.pk for op in ops]).update(
            status=OperationStatus.RETRY_WAIT, updated_at=timezone.now() - timedelta(days=2)
        )
    monkeypatch.setattr(OperationAdmin, "list_per_page", 2)
    root = client_for(User.objects.create_superuser("root-count", "root@example.invalid", "x"))
    with CaptureQueriesContext(connection) as ctx:
        response = root.get(reverse("admin:ledger_operation_changelist") + "?" + query)
    assert response.status_code == 200
    assert response.context["cl"].result_count == 3
    counts = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT COUNT(*) FROM (SELECT")]
    assert len(counts) == 1, counts
    on_mirror = '"ledger_operation"' not in counts[0] and '"ledger_open_operation"' in counts[0]
    assert on_mirror == ("&" not in query), counts[0]


@pytest.mark.parametrize("query", ["status__exact=failed", "status__exact=failed&q=term-"])
def test_a_terminal_state_filter_alone_is_counted_on_the_events_into_it(
    tenant, other_tenant, two_tenants, query, monkeypatch
):
    # Counting the failed rows probed an operation row for each of up to 10,001 event ids (33–170
    # ms at 10M, seconds on a cold cache); the filter alone names them as the distinct
    # operations of the events into `failed` (ADR 0027 item 3). A supersede's second event into
    # `failed` is counted once; a tenant's staff count only their tenants' rows; with another
    # filter (a search) the list's own rows are counted.
    from ledger.web.console.operations import OperationAdmin
    from tests.console.support import failed_op, staff

    mine = [failed_op(tenant, two_tenants["acme"], f"term-{i}") for i in range(3)]
    failed_op(other_tenant, two_tenants["globex"], "term-other")
    OperationEvent.objects.create(
        tenant_id=tenant.pk,
        operation_id=mine[0].pk,
        from_status=OperationStatus.FAILED,
        to_status=OperationStatus.FAILED,
        actor="supersede",
        at=timezone.now(),
    )
    monkeypatch.setattr(OperationAdmin, "list_per_page", 2)  # a page short of the rows: counted
    for user, expected in (
        (User.objects.create_superuser("root-failed", "root@example.invalid", "x"), 4),
        (staff("ada-failed", role="admin", tenants=[tenant]), 3),
    ):
        with CaptureQueriesContext(connection) as ctx:
            response = client_for(user).get(reverse("admin:ledger_operation_changelist") + "?" + query)
        assert response.status_code == 200
        if "&" not in query:  # a search counts the ids it read (SelectorSearchMixin), not these
            assert response.context["cl"].result_count == expected, user.username
        counts = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT COUNT(*) FROM (SELECT")]
        assert len(counts) == 1, counts
        on_events = '"ledger_operation"' not in counts[0] and '"ledger_operationevent"' in counts[0]
        assert on_events == ("&" not in query), counts[0]


def test_a_search_that_stops_at_its_page_says_more_than_the_rows_up_to_it(tenant, two_tenants, monkeypatch):
    # A console search reads its matches up to the page shown and one more row (ADR 0018), so
    # its count is of those: four matches at two a page count 3 on the first page. The page says
    # "more than 2" there, and the exact number once a page reads past the last match.
    from ledger.web.console.operations import OperationAdmin
    from tests.console.support import failed_op

    for i in range(4):
        failed_op(tenant, two_tenants["acme"], f"more-{i}")
    monkeypatch.setattr(OperationAdmin, "list_per_page", 2)
    root = client_for(User.objects.create_superuser("root-more", "root@example.invalid", "x"))
    url = reverse("admin:ledger_operation_changelist")
    first = root.get(url, {"q": "more-"}).content.decode()
    assert "more than 2 operations" in first, first[-3000:]
    last = root.get(url, {"q": "more-", "p": "2"}).content.decode()
    assert "4 operations" in last and "more than" not in last.split('class="paginator"')[1], last[-3000:]
    few = root.get(url, {"q": "more-3"}).content.decode()
    assert "more than" not in few.split('class="paginator"')[1], few[-3000:]
    # Without a search the list is counted as every list is.
    unsearched = root.get(url).content.decode()
    assert "4 operations" in unsearched.split('class="paginator"')[1], unsearched[-3000:]
