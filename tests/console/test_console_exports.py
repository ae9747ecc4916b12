"""Console CSV exports are fit for auditors: plain values (never the list's HTML), times in
ISO 8601 UTC, every cell a spreadsheet could run as a formula neutralised (OWASP), and the rows
of the list's current filter — read back with Python's csv module."""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime

import pytest
from django.contrib.auth.models import User

from ledger.models import Operation
from ledger.web import display
from tests.console.support import client_for, enforced_provider, failed_op, page, succeeded_op

pytestmark = pytest.mark.django_db

MARKUP = re.compile(r"<\s*/?\s*(span|div|a|time|strong|br)\b", re.I)
NUMBER = re.compile(r"-?\d+(\.\d+)?")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _rows(client, url: str) -> list[dict[str, str]]:
    status, body = page(client, url)
    assert status == 200, (url, status)
    return list(csv.DictReader(io.StringIO(body)))


def _assert_plain_and_safe(rows: list[dict[str, str]]) -> None:
    for row in rows:
        for column, cell in row.items():
            assert not MARKUP.search(cell), (column, cell)
            # A number is a number (-1 is not a formula); anything else is neutralised.
            assert not cell.startswith(FORMULA_START) or NUMBER.fullmatch(cell), (column, cell)


def _iso_utc(cell: str) -> bool:
    return cell.endswith("+00:00") and datetime.fromisoformat(cell).utcoffset().total_seconds() == 0


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", password="correct horse battery")


def test_the_operations_export_holds_plain_values_iso_times_and_neutralised_cells(tenant, root):
    crm = enforced_provider(tenant)
    succeeded_op(tenant, crm, '=HYPERLINK("http://127.0.0.1/x")')
    succeeded_op(tenant, crm, "@sum")
    failed_op(tenant, crm, "-plain")
    rows = _rows(client_for(root), "/admin/ledger/operation/export.csv")
    assert len(rows) == 3
    _assert_plain_and_safe(rows)
    assert {r["Key"] for r in rows} == {'\'=HYPERLINK("http://127.0.0.1/x")', "'@sum", "'-plain"}
    assert {r["Status"] for r in rows} == {"succeeded", "failed"}
    assert all(_iso_utc(r["Created at"]) and _iso_utc(r["Updated at"]) for r in rows)


def test_the_export_holds_the_rows_of_the_lists_current_filter_and_search(tenant, other_tenant, root):
    crm = enforced_provider(tenant)
    succeeded_op(tenant, crm, "done-1")
    failed_op(tenant, crm, "broken-1")
    failed_op(tenant, crm, "broken-2")
    failed_op(other_tenant, enforced_provider(other_tenant), "broken-3")
    client = client_for(root)
    listed = Operation.objects.filter(status="failed", tenant=tenant)
    rows = _rows(client, f"/admin/ledger/operation/export.csv?status__exact=failed&tenant__id__exact={tenant.pk}")
    assert sorted(r["Key"] for r in rows) == sorted(listed.values_list("key", flat=True)) == ["broken-1", "broken-2"]
    assert [r["Key"] for r in _rows(client, "/admin/ledger/operation/export.csv?q=broken-2")] == ["broken-2"]


def test_the_dlq_export_holds_no_markup(tenant, root):
    crm = enforced_provider(tenant)
    failed_op(tenant, crm, "=broken")
    rows = _rows(client_for(root), "/admin/dlq/failedevent/export.csv")
    assert len(rows) == 1
    _assert_plain_and_safe(rows)
    assert _iso_utc(rows[0]["Failed at"])


def test_every_export_of_the_console_is_plain_and_formula_safe(tenant, root):
    """Every list's export, the history pages' too: no cell with markup or a formula start,
    every time ISO 8601 in UTC."""
    crm = enforced_provider(tenant)
    succeeded_op(tenant, crm, "+1 555")
    failed_op(tenant, crm, "=1+1")
    client = client_for(root)
    from django.contrib import admin
    from django.urls import NoReverseMatch, reverse

    urls = []
    for model in [*admin.site._registry, *admin.site._history_pages]:
        try:
            urls.append(reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_export"))
        except NoReverseMatch:
            continue
    assert "/admin/ledger/attempt/export.csv" in urls
    seen = 0
    for url in urls:
        rows = _rows(client, url)
        _assert_plain_and_safe(rows)
        for row in rows:
            for cell in row.values():
                if re.fullmatch(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d.*", cell):
                    assert _iso_utc(cell), (url, cell)
        seen += len(rows)
    assert seen > 0


def test_a_csv_cell_is_neutralised_as_owasp_recommends():
    for start in FORMULA_START:
        assert display.csv_cell(f"{start}cmd") == f"'{start}cmd"
    assert display.csv_cell(-5) == "-5"
    assert display.csv_cell(display.badge("failed")) == "failed"
