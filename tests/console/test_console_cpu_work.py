"""The work a console page does per view does not grow with what it shows (issue 16: the
dashboard, the review list and the operations lists were mostly Python CPU at ten million
rows). Pinned by counting, not timing: how often a row parses the date format, how many
queries a filter's choices take, how often the app list is built, how many statements the
dashboard's counts take, which columns a list page reads — and that the faster spellings
write what Django's write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin import AdminSite
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import dateformat, formats, html, timezone
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy

from dlq.models import FailedEventStatus
from ledger.models import OperationStatus, Provider, Tenant
from ledger.protocol import services
from ledger.web import display
from tests.console.support import client_for, staff
from tests.console.test_list_query_counts import seed

pytestmark = pytest.mark.django_db

OPERATIONS = "/admin/ledger/operation/"
REVIEW_ITEMS = "/admin/review/reviewitem/"


def _django_when(moment: datetime) -> str:
    return formats.date_format(timezone.localtime(moment), "DATETIME_FORMAT")


def _moments() -> list[datetime]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # Every hour of a year, seconds and microseconds varied; the DST changes fall inside.
    return [start + timedelta(hours=h, seconds=h % 61, microseconds=h * 7) for h in range(0, 24 * 366, 7)]


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
def test_when_writes_what_djangos_date_format_writes(zone: str) -> None:
    with timezone.override(ZoneInfo(zone)):
        moments = _moments()
        # The hour a clock is set back happens twice: its zone name is left out (ambiguous).
        if zone == "Europe/Berlin":
            moments += [datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 25, 1, 30, tzinfo=UTC)]
        different = [(m, display.when(m), _django_when(m)) for m in moments if display.when(m) != _django_when(m)]
    assert not different, different[:5]
    assert display.when(None) == display.EMPTY


def test_when_falls_back_to_django_for_a_format_it_does_not_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display.formats, "get_format", lambda name, *a, **k: r"D, jS \o\f F Y P e")
    moment = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert display.when(moment) == dateformat.format(timezone.localtime(moment), r"D, jS \o\f F Y P e")


@pytest.mark.parametrize(
    "args",
    [
        ("<b>", "a \"quoted\" & 'single'"),
        (mark_safe("<i>safe</i>"), 3),
        (gettext_lazy("Select all"), None),
        (display.badge("failed"), 1.5),
    ],
)
def test_format_html_writes_what_djangos_writes(args: tuple[Any, ...]) -> None:
    template = '<span title="{}">{}</span>'
    ours, theirs = display.format_html(template, *args), html.format_html(template, *args)
    assert ours == theirs and type(ours) is type(theirs)
    assert display.escape(args[0]) == html.conditional_escape(args[0])


def _superuser_client() -> Any:
    return client_for(User.objects.create_superuser("root", "root@example.invalid", "x"))


def _providers(tenants: list[Tenant], n: int) -> dict[str, Provider]:
    return {
        f"{t.slug}-{i}": services.provider_upsert(
            tenant=t, slug=f"p{i}", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
        )
        for t in tenants
        for i in range(n)
    }


def test_the_operations_list_parses_the_date_format_a_fixed_number_of_times(tenant, monkeypatch) -> None:
    # Each row shows two times (created, updated) with the exact time on hover: Django's
    # date_format parsed the format string for each (two thirds of a row's time).
    parses = []
    real = dateformat.Formatter.format

    def counted(self: Any, formatstr: str) -> str:
        parses.append(formatstr)
        return real(self, formatstr)

    monkeypatch.setattr(dateformat.Formatter, "format", counted)
    provider = _providers([tenant], 1)[f"{tenant.slug}-0"]
    client = _superuser_client()
    seed(tenant, provider, 0, 3)
    assert client.get(OPERATIONS).status_code == 200
    few = len(parses)
    seed(tenant, provider, 3, 30)
    parses.clear()
    body = client.get(OPERATIONS).content.decode()
    assert body.count('class="og-age"') >= 66  # the 33 rows' two times each are on the page
    assert len(parses) == few, (few, len(parses))


@pytest.mark.parametrize("url", [OPERATIONS, REVIEW_ITEMS])
def test_a_lists_filters_read_their_choices_in_a_fixed_number_of_queries(url, tenant, other_tenant) -> None:
    # The provider filter's choices print as "tenant/slug": one tenant query per provider.
    client = _superuser_client()
    providers = _providers([tenant, other_tenant], 1)
    seed(tenant, providers[f"{tenant.slug}-0"], 0, 3)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    _providers([tenant, other_tenant], 6)
    with CaptureQueriesContext(connection) as many:
        body = client.get(url).content.decode()
    assert "globex/p5" in body  # the filter lists every provider
    assert len(many.captured_queries) == len(few.captured_queries), [q["sql"][:120] for q in many.captured_queries]


def test_the_app_list_is_built_once_for_the_dashboard_and_not_for_a_list(tenant, monkeypatch) -> None:
    # Every page's context carries it for the nav sidebar, which is off: built only if read.
    built = []
    real = AdminSite._build_app_dict

    def counted(self: Any, request: Any, label: str | None = None) -> Any:
        built.append(label)
        return real(self, request, label)

    monkeypatch.setattr(AdminSite, "_build_app_dict", counted)
    client = _superuser_client()
    for url, times in ((OPERATIONS, 0), (REVIEW_ITEMS, 0), ("/admin/", 1)):
        built.clear()
        assert client.get(url).status_code == 200
        assert len(built) == times, (url, built)
    # The dashboard still lists the apps, the app index its own.
    assert "/admin/ledger/operation/" in client.get("/admin/").content.decode()
    assert client.get("/admin/ledger/").status_code == 200


@pytest.mark.parametrize("scoped", [False, True])
def test_the_dashboard_counts_every_state_in_one_statement_per_table(scoped, tenant, other_tenant) -> None:
    providers = _providers([tenant, other_tenant], 1)
    seed(tenant, providers[f"{tenant.slug}-0"], 0, 6)
    seed(other_tenant, providers[f"{other_tenant.slug}-0"], 0, 3)
    if scoped:
        client = client_for(staff("ops", role="operator", tenants=[tenant]))
    else:
        client = _superuser_client()
    with CaptureQueriesContext(connection) as ctx:
        body = client.get("/admin/").content.decode()
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(*)" in q["sql"]]
    # The operations' states are counted off the work queue's mirror and the terminal events
    # (ADR 0026, "the dashboard's counts"), succeeded off the row: any of these columns.
    columns = {
        "ledger_operation": (
            '"ledger_operation"."status"',
            '"ledger_open_operation"."status"',
            '"ledger_operationevent"."to_status"',
        ),
        "dlq_failedevent": ('"dlq_failedevent"."status"',),
    }
    for table, states in (("ledger_operation", OperationStatus.values), ("dlq_failedevent", FailedEventStatus.values)):
        # The one statement that counts any of the table's states counts all of them.
        # The column named with its table: another table's state may share the name ('pending').
        def names(sql: str, state: str, table: str = table) -> bool:
            return any(f"{column} = '{state}'" in sql for column in columns[table])

        by_state = [s for s in counts if names(s, states[0])]
        assert len(by_state) == 1, (table, by_state)
        assert all(names(by_state[0], state) for state in states), by_state[0]
    # The counts the page shows: acme's 2 succeeded, 2 failed, 2 in review (+ globex's 1 each).
    each = 2 if scoped else 3
    for state in ("succeeded", "failed"):
        assert f'data-testid="ops-{state}"><span class="og-n">{each}</span>' in body, state
    assert f'data-testid="review-backlog">{each}</a>' in body


def test_the_dashboard_of_a_platform_with_no_tenant_yet_shows_zero_counts() -> None:
    """No tenant at all (a fresh install before its first tenant): every count's queryset can
    match nothing (``tenant_id IN ()``), which Django compiles to no SQL — counted as 0, not a 500."""
    from ledger.store import sql

    assert not Tenant.objects.exists()
    body = _superuser_client().get("/admin/")
    assert body.status_code == 200
    assert 'data-testid="ops-failed"><span class="og-n">0</span>' in body.content.decode()
    none = Provider.objects.filter(pk__in=[])
    assert sql.capped_counts([none, Provider.objects.all(), none], 10) == [0, 0, 0]
    assert sql.capped_counts([none], 10) == [0]


def test_the_operations_list_reads_only_the_columns_it_shows(tenant) -> None:
    # An operation with its tenant and provider is ~120 columns, a dozen JSON decoded per row.
    provider = _providers([tenant], 1)[f"{tenant.slug}-0"]
    seed(tenant, provider, 0, 3)
    client = _superuser_client()
    for url in (OPERATIONS, f"{OPERATIONS}?status__exact=failed", REVIEW_ITEMS):
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        page = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith('SELECT "ledger_operation"."id"')]
        assert page, url
        for column in (
            '"ledger_operation"."payload"',
            '"ledger_operation"."request"',
            '"ledger_provider"."intent_schema"',
        ):
            assert column not in page[0], (url, column)
