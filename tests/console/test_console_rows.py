"""Console lists render their rows with per-page work done once (review.console.listing; every list must stay fast at ten million rows):
the same HTML as Django's admin, byte for byte, and no per-row URL resolving or widget
rendering."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.contrib import admin
from django.contrib.admin.templatetags import admin_list, admin_urls
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.auth.models import User
from django.forms import CheckboxInput
from django.test import RequestFactory
from django.urls import reverse

from ledger.models import Operation
from review.console import listing
from tests.console.support import client_for
from tests.console.test_list_query_counts import seed

pytestmark = pytest.mark.django_db

_CSRF = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')
_AGE = re.compile(r"(in )?\d+ (s|min|h|days?)( ago)?|just now")


def _page(client, url: str, *, stock: bool) -> str:
    patch = (
        mock.patch.object(listing, "fast_results", admin_list.results)
        if stock
        else mock.patch.object(listing, "_PLACEHOLDER", listing._PLACEHOLDER)
    )
    with patch:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return _AGE.sub("AGE", _CSRF.sub("", response.content.decode()))


@pytest.fixture
def rows(tenant, other_tenant, provider):
    from ledger.protocol import services

    other = services.provider_upsert(
        tenant=other_tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    seed(tenant, provider, 0, 12)
    seed(other_tenant, other, 0, 6)
    return User.objects.create_superuser("root", "root@example.invalid", "x")


def _lists() -> list[str]:
    pages = [reverse(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist") for m in admin.site._registry]
    ops = reverse("admin:ledger_operation_changelist")
    pages += [
        f"{ops}?status__exact=review",
        f"{ops}?status__exact=failed&o=-1",
        f"{ops}?needs=cancellable",
        f"{ops}?q=k-1",
        f"{ops}?_popup=1&_to_field=id",
    ]
    return sorted(pages)


def test_every_console_list_renders_the_same_rows_as_djangos_admin(rows):
    client = client_for(rows)
    differ = []
    for url in _lists():
        if _page(client, url, stock=True) != _page(client, url, stock=False):
            differ.append(url)
    assert not differ, f"lists whose rows differ from Django's rendering: {differ}"


def test_a_page_resolves_its_row_links_and_renders_its_checkbox_once_not_per_row(rows):
    client = client_for(rows)
    url = reverse("admin:ledger_operation_changelist") + "?status__exact=failed"
    counts = {"preserved": 0, "checkbox": 0}
    real_render = CheckboxInput.render

    def preserved(*args, **kwargs):
        counts["preserved"] += 1
        return add_preserved_filters(*args, **kwargs)

    def checkbox(self, *args, **kwargs):
        counts["checkbox"] += 1
        return real_render(self, *args, **kwargs)

    with (
        mock.patch.object(listing, "add_preserved_filters", preserved),
        mock.patch.object(admin_list, "add_preserved_filters", preserved),
        mock.patch.object(admin_urls, "add_preserved_filters", preserved),
        mock.patch.object(CheckboxInput, "render", checkbox),
    ):
        body = client.get(url).content.decode()
    assert body.count('class="action-select"') == 6  # the failed rows of both tenants, each its checkbox
    assert body.count("?_changelist_filters=status__exact%3Dfailed") == 12  # two links a row
    assert counts == {"preserved": 1, "checkbox": 0}, counts


def test_a_key_a_url_would_escape_gets_djangos_own_link(rows):
    model_admin = admin.site._registry[Operation]
    request = RequestFactory().get("/admin/ledger/operation/?status__exact=failed")
    request.user = rows
    cl = model_admin.get_changelist_instance(request)
    link = listing._Link(cl)
    for pk in (7, "a b/c", "é?x", "ok_key-1.2~"):
        row = Operation(id=pk)
        expected = add_preserved_filters(
            {"preserved_filters": cl.preserved_filters, "opts": cl.opts}, cl.url_for_result(row)
        )
        assert link.url(row) == expected, pk


def _operation_reads(client, url: str) -> tuple[str, list[str]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    # The substring match reads the operation table, or its write-once search rows (ADR 0018).
    tables = ('FROM "ledger_operation"', 'FROM "ledger_operation_search"')
    # An EXPLAIN of the match (the search window's estimate, ADR 0026) plans it and reads no row.
    reads = [
        q["sql"]
        for q in ctx.captured_queries
        if any(t in q["sql"] for t in tables) and "LIKE" in q["sql"] and not q["sql"].startswith("EXPLAIN")
    ]
    return response.content.decode(), reads


def test_a_search_shorter_than_a_page_reads_the_table_once_not_again_to_count_it(rows):
    # Django counts a list, then reads its page: two trigram scans of a substring search.
    client = client_for(rows)
    body, reads = _operation_reads(client, reverse("admin:ledger_operation_changelist") + "?q=-1")
    assert len(reads) == 1, reads
    assert body.count('class="action-select"') == 4  # k-1, k-10, k-11 of the first tenant, k-1 of the other
    assert "4 operations" in body


@pytest.mark.parametrize("page", [None, "2"])
def test_pages_and_counts_are_djangos_when_the_list_is_longer_than_a_page(rows, page, monkeypatch):
    from ledger.web.console.operations import OperationAdmin

    monkeypatch.setattr(OperationAdmin, "list_per_page", 5)
    client = client_for(rows)
    url = reverse("admin:ledger_operation_changelist") + "?status__exact=failed" + (f"&p={page}" if page else "")
    stock = mock.patch.object(listing.ConsoleChangeList, "get_results", listing.ChangeList.get_results)
    with stock:
        expected = _AGE.sub("AGE", _CSRF.sub("", client.get(url).content.decode()))
    ours = _AGE.sub("AGE", _CSRF.sub("", client.get(url).content.decode()))
    assert ours == expected
    assert "6 operations" in ours


def test_a_hostile_key_is_escaped_in_the_list_as_djangos_admin_escapes_it(rows, tenant, provider):
    from ledger.protocol import services

    hostile = "<script>alert('x')</script>\"&amp;"
    services.operation_claim(tenant=tenant, key=hostile, provider=provider, action="charge")
    client = client_for(rows)
    url = reverse("admin:ledger_operation_changelist")
    ours = _page(client, url, stock=False)
    assert ours == _page(client, url, stock=True)
    assert "<script>alert" not in ours
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;&amp;amp;" in ours
