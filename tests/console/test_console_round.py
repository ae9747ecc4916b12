"""The console's front page is the operator's round: needs attention, operations, dead-letter
queue, runs, people, configuration, audit — in that order, each page with its count, the counts
bounded and read in one statement."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.protocol import services
from tests.console.support import client_for, enforced_provider, staff

pytestmark = pytest.mark.django_db

ORDER = ["Needs attention", "Operations", "Dead-letter queue", "Runs", "People", "Configuration", "Audit"]


def _sections(html: str) -> list[str]:
    return re.findall(r'data-testid="round-[a-z-]+">\s*<h2><span>\d\. ([^<]+)</span>', html)


def test_the_front_page_walks_the_round_in_order_with_a_count_per_page(tenant):
    crm = enforced_provider(tenant)
    for n in range(3):
        services.operation_claim(tenant=tenant, key=f"order-{n}", provider=crm, request={})
    client = client_for(User.objects.create_superuser("root", password="correct horse battery"))
    with CaptureQueriesContext(connection) as ctx:
        page = client.get("/admin/").content.decode()
    assert _sections(page) == ORDER
    operations = re.search(
        r'<a href="/admin/ledger/operation/">Operations</a> <span class="og-count"[^>]*>([^<]+)<', page
    )
    assert operations and operations.group(1) == "3"
    # Every page of the round counted in one statement, each count bounded (LIMIT), none a
    # COUNT(*) over a whole table.
    counting = [q["sql"] for q in ctx.captured_queries if "counted_0" in q["sql"]]
    assert len(counting) == 1 and counting[0].count("LIMIT") >= 20, counting


def test_a_person_sees_only_the_pages_they_may_open(tenant):
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    page = auditor.get("/admin/").content.decode()
    sections = _sections(page)
    assert sections and sections[-1] == "Audit"
    assert "/admin/auth/user/" not in page and "/admin/ledger/apikey/add/" not in page


def test_needs_attention_counts_what_needs_it_and_links_to_that_list(tenant):
    from django.utils import timezone

    from alerts.models import Alert
    from ledger.models import Provider

    crm = enforced_provider(tenant)
    enforced_provider(tenant, slug="mailer")
    Provider.objects.filter(pk=crm.pk).update(paused_at=timezone.now(), paused_reason="401 from the provider")
    now = timezone.now()
    for ref, resolved in (("1", None), ("2", now)):
        Alert.objects.create(
            tenant=tenant,
            kind="dlq_new",
            ref=ref,
            summary="a new dead-letter entry",
            dedup_key=f"dlq_new:{ref}:1",
            created_at=now,
            last_raised_at=now,
            resolved_at=resolved,
        )
    client = client_for(User.objects.create_superuser("root", password="correct horse battery"))
    page = client.get("/admin/").content.decode()

    def count(path: str) -> str:
        found = re.search(rf'<a href="{re.escape(path)}">[^<]+</a> <span class="og-count"[^>]*>([^<]+)<', page)
        assert found, path
        return found.group(1)

    # Two providers, one paused; two alerts, one still open.
    assert count("/admin/review/pausedprovider/?paused=yes") == "1"
    assert count("/admin/alerts/alert/?state=open") == "1"
    assert client.get("/admin/review/pausedprovider/?paused=yes").status_code == 200
    assert client.get("/admin/alerts/alert/?state=open").status_code == 200
