"""A common text's identifier matches are searched in the newest operations, window by window
(ADR 0026): the page says so and links the next, older window. The tests' tables are tiny, so
"common" and the window's size are made small here; on SQLite (no estimate) every match is read."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from ledger.models import Operation
from ledger.protocol import selectors, services
from ledger.protocol.selectors import SearchWindow, operation_search, operation_search_window
from ledger.web.console.operations import OperationAdmin
from tests.conftest import on_postgres
from tests.console.support import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def six(tenant) -> list[Operation]:
    # One search row each (claimed: the identifiers' row, no provider reference yet).
    return [
        services.operation_claim(tenant=tenant, key=f"win-{i}", provider=None, request={}).operation for i in range(6)
    ]


def found(text: str, window: SearchWindow | None, tenant_ids: list[int] | None = None) -> set[str]:
    rows = operation_search(Operation.objects.all(), text, tenant_ids=tenant_ids, window=window)
    return set(rows.values_list("key", flat=True))


def test_a_rare_text_has_no_window_and_finds_every_match(six, tenant, monkeypatch):
    assert operation_search_window("win-", tenant_ids=[tenant.pk]) is None
    # A user of no tenant has nothing to search: no window (nor an estimate of nothing).
    monkeypatch.setattr(selectors, "COMMON_TEXT_ROWS", 0)
    assert operation_search_window("win-", tenant_ids=[]) is None
    assert found("win-", None) == {f"win-{i}" for i in range(6)}


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's estimate says a text is common")
def test_a_common_text_is_searched_window_by_window_newest_first_down_to_the_oldest(six, tenant, monkeypatch):
    monkeypatch.setattr(selectors, "COMMON_TEXT_ROWS", 0)
    monkeypatch.setattr(selectors, "SEARCH_WINDOW_ROWS", 2)
    seen = []
    below = None
    for _ in range(4):
        window = operation_search_window("win-", tenant_ids=[tenant.pk], below=below)
        assert window is not None and window.below == below
        seen.append(found("win-", window, [tenant.pk]))
        if window.floor is None:
            break
        below = window.floor
    assert seen == [{"win-5", "win-4"}, {"win-3", "win-2"}, {"win-1", "win-0"}, set()]
    # The superuser's window (no tenant bound) is the newest rows of all.
    everyone = operation_search_window("win-", tenant_ids=None)
    assert everyone is not None and everyone.floor == six[4].pk
    assert found("win-", everyone) == {"win-5", "win-4"}


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's estimate says a text is common")
def test_the_console_says_a_common_text_was_searched_in_the_newest_operations_and_links_older_ones(six, monkeypatch):
    monkeypatch.setattr(selectors, "COMMON_TEXT_ROWS", 0)
    monkeypatch.setattr(selectors, "SEARCH_WINDOW_ROWS", 2)
    client = client_for(User.objects.create_superuser("root", password="correct horse battery"))
    url = reverse("admin:ledger_operation_changelist")
    page = client.get(url, {"q": "win-"})
    assert page.status_code == 200
    text = page.content.decode()
    assert "win-5" in text and "win-4" in text and "win-3" not in text
    assert "is a common text" in text and f"older_than={six[4].pk}" in text
    older = client.get(url, {"q": "win-", "older_than": six[4].pk})
    assert older.status_code == 200, older.status_code
    text = older.content.decode()
    assert "win-3" in text and "win-2" in text and "win-5" not in text
    assert f"older_than={six[2].pk}" in text
    # A value that is not an id is ignored (the newest window), never a refused lookup.
    assert client.get(url, {"q": "win-", "older_than": "x"}).status_code == 200


def test_without_a_window_the_console_search_reads_every_match(six):
    client = client_for(User.objects.create_superuser("root", password="correct horse battery"))
    text = client.get(reverse("admin:ledger_operation_changelist"), {"q": "win-"}).content.decode()
    assert all(f"win-{i}" in text for i in range(6)) and "is a common text" not in text


@pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's estimate says a text is common")
def test_the_page_links_of_an_older_window_stay_in_that_window(six, monkeypatch):
    monkeypatch.setattr(selectors, "COMMON_TEXT_ROWS", 0)
    monkeypatch.setattr(selectors, "SEARCH_WINDOW_ROWS", 2)
    monkeypatch.setattr(OperationAdmin, "list_per_page", 1)
    client = client_for(User.objects.create_superuser("root", password="correct horse battery"))
    url = reverse("admin:ledger_operation_changelist")
    text = client.get(url, {"q": "win-", "older_than": six[4].pk}).content.decode()
    assert "win-3" in text and "win-2" not in text
    # Page 2 of the older window is its second row, not the newest window's.
    assert f"older_than={six[4].pk}&amp;p=2" in text or f"p=2&amp;older_than={six[4].pk}" in text
    second = client.get(url, {"q": "win-", "older_than": six[4].pk, "p": 2}).content.decode()
    assert "win-2" in second and "win-4" not in second
