"""A person's data trail in a real browser at 1,280 px (issue 13 item 5): the demo's caller
looked up by e-mail, her records and the events on them in order, nothing of her in clear on
the page but what was typed, the table inside the viewport; then erased, and the trail says
so. Screenshots go to test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest

from review.models import ErasureRun
from review.tasks import erasure_run_task
from tests.browser.test_console_issue14 import WIDTH, signed_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EMAIL = "priya.raman@example.invalid"
# Her values from the demo's payloads: none may be on the page (the e-mail only in its field).
VALUES = ("Priya", "Raman", "+61412345678", "412 345 678")


def _look_up(tab: Any, reason: str) -> None:
    tab.go("/admin/onceguard/subjects/trail/")
    tab.page.fill("#id_email", EMAIL)
    tab.page.fill("#id_reason", reason)
    tab.page.click("[data-testid=show-trail]")
    tab.page.wait_for_selector("[data-testid=trail-events]")


def test_the_trail_page_lists_records_and_events_in_order_within_1280_px_then_shows_the_erasure(console):
    tab, _ = signed_in(console, "demo-admin")
    tab.go("/admin/onceguard/subjects/")
    tab.page.click("[data-testid=trail-link]")
    _look_up(tab, "Access request AR-2291 (APP 12)")
    page = tab.page
    records = page.locator("[data-testid=trail-records] tbody tr")
    assert records.count() >= 2
    kinds = page.locator("[data-testid=trail-events] tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.event, r.cells[0].innerText])"
    )
    names = [k for k, _ in kinds]
    assert "ingested" in names and "revealed" in names and names[-1] == "looked up"
    assert [when for _, when in kinds] == sorted(when for _, when in kinds)
    # The demo's reveal, with who and why.
    reveal = page.locator("[data-testid=trail-events] tr[data-event=revealed]").first.inner_text()
    assert "demo-admin" in reveal and "DEMO-1" in reveal
    # Fits: no sideways scroll, every column of both tables inside the viewport.
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    for table in ("trail-records", "trail-events"):
        for box in [h.bounding_box() for h in page.locator(f"[data-testid={table}] thead th").all()]:
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (table, box)
    body = tab.text()
    assert not any(v in body for v in VALUES)
    assert page.input_value("#id_email") == EMAIL and EMAIL not in page.url
    tab.shot("trail-1280")

    # Erase on request: confirmation ticked, the run recorded; the worker's task runs it.
    page.fill("#id_reason", "Erasure request ER-17, verified by phone")
    page.check("#id_confirm_erase")
    page.click("[data-testid=erase]")
    page.wait_for_selector("[data-testid=trail-erasures]")
    run = ErasureRun.objects.get()
    assert erasure_run_task(run.pk)["state"] == "done"
    _look_up(tab, "Check the erasure ER-17 went through")
    assert "erased" in page.inner_text("[data-testid=trail-summary]")
    events = page.locator("[data-testid=trail-events] tbody tr").evaluate_all("rows => rows.map(r => r.dataset.event)")
    assert "erasure requested" in events and "erased" in events
    assert page.locator("[data-testid=trail-records] tbody tr").first.inner_text().startswith("No record")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    tab.shot("trail-after-erasure")
