"""Attempts and events in a real browser (review.console.history_pages): from an operation's page to
one of its attempts and back, the attempt list's filters and search, an event's page."""

from __future__ import annotations

import pytest

from ledger.models import Attempt, Operation, OperationEvent
from ledger.protocol.selectors import operation_history
from tests.browser.test_console_issue14 import assert_fits, signed_in
from tests.console.support import MARKERS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_from_an_operation_to_its_attempt_and_event_pages_and_back(console):
    tab, made = signed_in(console)
    op = Operation.objects.get(pk=made["review_item"])
    attempt = Attempt.objects.filter(operation=op).order_by("number").first()

    tab.go(f"/admin/ledger/operation/{op.pk}/change/")
    attempts = tab.page.locator("[data-testid=attempts]")
    events = tab.page.locator("[data-testid=events]")
    story, technical = tab.page.locator("[data-testid=story]"), tab.page.locator("[data-testid=technical]")
    assert story.bounding_box()["y"] < attempts.bounding_box()["y"] < events.bounding_box()["y"]
    assert events.bounding_box()["y"] < technical.bounding_box()["y"]
    assert attempts.locator("[data-testid=attempt-row]").count() == Attempt.objects.filter(operation=op).count()
    # Every move: the stored rows and, first, a guard claim kept on the operation row (ADR 0024).
    moves = operation_history(op, OperationEvent.objects.filter(operation=op))
    assert events.locator("[data-testid=event-row]").count() == len(moves)
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= 1280
    tab.shot("01-operation-attempts-and-events")

    attempts.locator("[data-testid=attempt-row] a").first.click()
    tab.page.wait_for_selector("[data-testid=history-facts]")
    assert tab.page.url.endswith(f"/admin/ledger/attempt/{attempt.id}/change/")
    facts = tab.page.inner_text("[data-testid=history-facts]")
    assert "Outcome" in facts and "Lease token" not in facts and attempt.lease_token not in tab.text()
    assert not any(m in tab.text() for m in MARKERS)
    tab.shot("02-attempt-page")

    tab.page.click("[data-testid=operation-link]")
    tab.page.wait_for_selector("[data-testid=events]")
    tab.page.locator("[data-testid=event-row] a").last.click()
    tab.page.wait_for_selector("[data-testid=history-facts]")
    assert "/admin/ledger/operationevent/" in tab.page.url and "To status" in tab.text()
    tab.shot("03-event-page")


def test_the_attempt_list_filters_by_outcome_and_finds_a_key(console):
    tab, made = signed_in(console)
    op = Operation.objects.get(pk=made["review_item"])

    tab.go("/admin/ledger/attempt/")
    assert_fits(tab, ["operation", "number", "outcome", "provider ref"])
    tab.page.locator("#changelist-filter details[data-filter-title=outcome] a", has_text="succeeded").click()
    tab.page.wait_for_selector("#result_list")
    assert "outcome__exact=succeeded" in tab.page.url
    outcomes = tab.page.locator("#result_list tbody tr td:nth-child(3)").all_inner_texts()
    assert outcomes and set(outcomes) == {"succeeded"}
    tab.shot("04-attempts-succeeded")

    tab.go("/admin/ledger/attempt/")
    tab.page.fill("#searchbar", op.key.upper())
    tab.page.press("#searchbar", "Enter")
    tab.page.wait_for_selector("#result_list")
    keys = tab.page.locator("#result_list tbody tr th").all_inner_texts()
    assert keys and set(keys) == {op.key}
    tab.shot("05-attempts-search")
