"""First run: the demo scenario gives every console page something real to show."""

from __future__ import annotations

import pytest

from review.demo import demo_seed
from tests.console.support import MARKERS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MASKED_PAGES = [
    "/admin/",
    "/admin/ledger/operation/",
    "/admin/dlq/failedevent/",
    "/admin/review/reviewitem/",
    "/admin/dlq/replay/",
    "/admin/review/retentionrun/",
    "/admin/review/retentionpolicy/",
]


def test_every_console_page_of_the_demo_renders_masked_and_labelled(console):
    made = demo_seed()
    tab = console()
    tab.login("demo-admin", made["users"]["demo-admin"])
    for n, path in enumerate(MASKED_PAGES, start=1):
        response = tab.go(path)
        assert response.status == 200, path
        text = tab.text()
        assert not any(m in text for m in MARKERS), path
        tab.shot(f"{n:02d}-{path.strip('/').replace('/', '-') or 'index'}")
    tab.go(f"/admin/dlq/failedevent/{made['dlq_stuck']}/change/")
    assert "CRM: Create Contact" in tab.text() and not any(m in tab.text() for m in MARKERS)
    tab.shot("10-dlq-entry-masked")
    tab.go(f"/admin/dlq/failedevent/{made['dlq_replayed']}/change/")
    assert "replayed" in tab.text()
    tab.shot("11-dlq-entry-with-lineage")
    tab.go(f"/admin/review/reviewitem/{made['review_item']}/change/")
    assert "pi_demo_3NfX1001" in tab.text()
    tab.shot("12-review-decide")
    tab.go("/admin/review/accesslog/")
    assert "Ticket DEMO-1" in tab.text()
    tab.shot("13-access-log")
    tab.go("/admin/onceguard/subjects/")
    tab.page.fill("#id_phone", "+61 (412) 345-678")
    tab.page.fill("#id_email", "")
    tab.page.fill("#id_reason", "[demo] APP 12 access request #1")
    tab.page.click("#subject-form input[type=submit]")
    tab.page.wait_for_selector("[data-testid=subject-events]")
    tab.shot("14-subject-search")
    assert "demo:n8n:17:4812" in tab.page.inner_text("[data-testid=subject-events]")
