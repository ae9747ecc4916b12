"""The console's review list: longest waiting first, read from the work queue's mirror's index
of review rows (open_unresolved_idx) in that order, and counted on the mirror when unfiltered
(review.admin.ReviewItemAdmin; ADR 0017)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import Operation, OperationStatus, Tenant
from ledger.protocol import services
from ledger.store.sql import SERIAL_PLANS
from tests.conftest import on_postgres
from tests.console.support import client_for, enforced_provider

pytestmark = pytest.mark.django_db

REVIEW_ITEMS = "/admin/review/reviewitem/"


def in_review(tenant: Tenant, key: str, *, waiting_minutes: int) -> Operation:
    """An operation moved to review ``waiting_minutes`` ago (its last move's time)."""
    provider = enforced_provider(tenant)
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, action="charge").operation
    Operation.objects.filter(pk=op.pk).update(
        status=OperationStatus.REVIEW,
        lease_expires_at=None,
        updated_at=timezone.now() - timedelta(minutes=waiting_minutes),
    )
    return op


def page_queries(client, url: str = REVIEW_ITEMS, **params: str) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, params)
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in ctx.captured_queries]


def test_the_longest_waiting_item_is_listed_first(tenant, other_tenant):
    in_review(tenant, "k-new", waiting_minutes=1)
    in_review(other_tenant, "k-old", waiting_minutes=90)
    in_review(tenant, "k-mid", waiting_minutes=30)
    body, _ = page_queries(client_for(User.objects.create_superuser("root", "root@example.invalid", "x")))
    assert body.index("k-old") < body.index("k-mid") < body.index("k-new")


def test_the_unfiltered_list_is_counted_on_the_mirror_and_a_filtered_one_on_its_rows(tenant, other_tenant):
    for i in range(3):
        in_review(tenant, f"k-{i}", waiting_minutes=i)
    in_review(other_tenant, "k-theirs", waiting_minutes=5)
    client = client_for(User.objects.create_superuser("root", "root@example.invalid", "x"))
    # More items than a page: the page is read, then counted (capped).
    from review.admin import ReviewItemAdmin

    ReviewItemAdmin.list_per_page, per_page = 2, ReviewItemAdmin.list_per_page
    try:
        body, sql = page_queries(client)
        counts = [q for q in sql if "COUNT(" in q and "ledger_open_operation" in q]
        # One count, of the mirror's review rows alone: no operation row probed per item, and
        # no second count of the whole list beside it.
        assert len(counts) == 1, counts
        assert '"ledger_operation"' not in counts[0], counts[0]
        assert "4 review items" in body
        # Filtered by tenant, the list's own rows are counted (the filter reads the row).
        body, sql = page_queries(client, tenant__id__exact=str(tenant.pk))
        counts = [q for q in sql if "COUNT(" in q and "ledger_open_operation" in q]
        assert len(counts) == 1 and '"ledger_operation"' in counts[0], counts
        assert "3 review items" in body
    finally:
        ReviewItemAdmin.list_per_page = per_page


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's partial indexes and plans")
def test_the_page_walks_the_mirrors_review_index_in_list_order(tenant):
    for i in range(3):
        in_review(tenant, f"k-{i}", waiting_minutes=i)
    _, sql = page_queries(client_for(User.objects.create_superuser("root", "root@example.invalid", "x")))
    listed = next(q for q in sql if "ORDER BY" in q and "LIMIT 101" in q and "ledger_open_operation" in q)
    # The mirror's state alone: the row's own beside it made the planner take the two for
    # independent and expect a handful of items, which it then sorted rather than walk.
    assert '"ledger_operation"."status"' not in listed, listed
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation, ledger_open_operation")
        # Sorts, bitmap and sequential scans priced out: what is left reads an index in the
        # list's order (tests.console.support's in_index_order), which only the mirror's index
        # of review rows by time can.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN {listed}")
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "open_unresolved_idx" in plan, plan


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's parallel plans")
@pytest.mark.parametrize("url", [REVIEW_ITEMS, "/admin/ledger/operation/?needs=stuck", "/admin/ledger/operation/"])
def test_a_console_list_is_planned_without_parallel_workers_or_jit(tenant, url):
    # A page read: workers that take tens of milliseconds to start on a busy machine, or a JIT
    # compilation as long, for a millisecond of work (review.console.pages, as the front page).
    in_review(tenant, "k-0", waiting_minutes=1)
    _, sql = page_queries(client_for(User.objects.create_superuser("root", "root@example.invalid", "x")), url)
    serial = [n for n, q in enumerate(sql) if q == SERIAL_PLANS]
    listed = [n for n, q in enumerate(sql) if "LIMIT 101" in q]
    assert serial and listed and serial[0] < listed[0], sql
