"""Issue 14 in a real browser at 1,280 px: lists that answer "what needs me" (every named
column on screen, asserted by position), searches that find their rows, detail pages that
lead with the story, actions with a preview, alerts acknowledged, the dashboard. Screenshots
of every page go to test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest

from alerts.models import Alert
from ledger.models import ErrorClass, Operation, OperationStatus, Provider
from ledger.protocol import services
from review.demo import demo_seed
from tests.console.support import MARKERS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280


def signed_in(console: Any, username: str = "demo-admin") -> tuple[Any, dict[str, Any]]:
    made = demo_seed()
    tab = console()
    tab.page.set_viewport_size({"width": WIDTH, "height": 900})
    tab.login(username, made["users"][username])
    return tab, made


def assert_fits(tab: Any, columns: list[str]) -> None:
    """Every named column's header lies inside the 1,280 px viewport, and neither the page
    nor the list's own box scrolls sideways (no overflow hidden: positions are measured)."""
    page = tab.page
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    headers = page.locator("#result_list thead th")
    # (A sorted column's header also carries its sort priority: the name is the last line.)
    texts = [t.strip().split("\n")[-1].strip().lower() for t in headers.all_inner_texts()]
    for name in columns:
        index = next((i for i, t in enumerate(texts) if t == name), None)
        assert index is not None, (name, texts)
        box = headers.nth(index).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (name, box)
    results = page.evaluate(
        "(() => { const r = document.querySelector('#changelist .results');"
        " return r ? [r.scrollWidth, r.clientWidth] : [0, 0]; })()"
    )
    assert results[0] <= results[1], results
    last_cell = page.locator("#result_list tbody tr").first.locator("td").last
    if last_cell.count():
        box = last_cell.bounding_box()
        assert box is not None and box["x"] + box["width"] <= WIDTH, box
    assert not any(m in tab.text() for m in MARKERS)
    assert not words_broken_midway(tab), words_broken_midway(tab)


# Every word of a list cell outside links and identifiers (which may break anywhere so a long
# key never widens the list) whose letters lie on more than one line.
_BROKEN_WORDS = """(() => {
  const broken = [];
  for (const cell of document.querySelectorAll('#result_list tbody td, #result_list tbody th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      // (A closed disclosure's content is not shown: the configuration changes' values.)
      if (node.parentElement.closest('a, .og-id, .og-l, td[class*="url"], td[class*="json"], details:not([open]) > table')) continue;
      for (const m of node.data.matchAll(/[^\\s\\-]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
})()"""


def words_broken_midway(tab: Any) -> list[str]:
    return tab.page.evaluate(_BROKEN_WORDS)


def search(tab: Any, path: str, text: str) -> str:
    tab.go(path)
    tab.page.fill("#searchbar", text)
    tab.page.press("#searchbar", "Enter")
    tab.page.wait_for_selector("#changelist")
    return tab.page.inner_text("#changelist")


def test_every_list_fits_1280_px_with_its_named_columns_badges_and_ages(console):
    tab, made = signed_in(console)
    lists = [
        ("/admin/ledger/operation/", ["id", "key", "status", "provider", "workflow / execution", "attempts", "age"]),
        (
            "/admin/dlq/failedevent/",
            ["entry", "status", "error", "workflow", "failed node", "retries", "replays", "failed"],
        ),
        ("/admin/review/reviewitem/", ["key", "provider", "why it is here", "attempts", "handle", "waiting"]),
        ("/admin/alerts/alert/", ["id", "state", "kind", "about", "summary", "raised"]),
        ("/admin/review/pausedprovider/", ["slug", "state", "why", "since"]),
        ("/admin/dlq/replay/", []),
        ("/admin/review/accesslog/", []),
        ("/admin/ledger/configchange/", []),
        ("/admin/review/retentionpolicy/", []),
        ("/admin/review/retentionrun/", []),
        ("/admin/ledger/provider/", []),
        ("/admin/dlq/replaytarget/", []),
        # The history tables' own pages (review.console.history_pages).
        (
            "/admin/ledger/attempt/",
            ["operation", "number", "outcome", "started at", "finished at", "error class", "provider ref"],
        ),
        ("/admin/ledger/operationevent/", ["operation", "from status", "to status", "actor", "reason", "at"]),
    ]
    for n, (path, columns) in enumerate(lists, start=1):
        assert tab.go(path).status == 200, path
        assert_fits(tab, columns)
        tab.shot(f"{n:02d}-list-{path.strip('/').replace('/', '-')}")
    tab.go("/admin/ledger/operation/")
    badge = tab.page.locator("#result_list .og-badge[data-state=review]").first
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") not in ("rgba(0, 0, 0, 0)", "rgb(85, 85, 85)")
    age = tab.page.locator("#result_list time.og-age").first
    assert age.inner_text().endswith("ago") or age.inner_text() == "just now"
    assert age.get_attribute("title").endswith(" UTC")
    tab.go("/admin/dlq/failedevent/")
    assert "too many requests" in tab.page.inner_text("#result_list")
    assert "CRM: Create Contact" in tab.page.inner_text("#result_list")


def test_searches_find_lead_call_crm_429_a_call_id_and_a_local_phone_number(console, settings):
    settings.DEFAULT_PHONE_REGION = "AU"
    tab, made = signed_in(console)
    crm = Provider.objects.get(slug="demo-crm")
    services.operation_claim(
        tenant=crm.tenant, key="lead-call:call_55aa:crm-contact:v1", provider=crm, request={}, execution_id="4901"
    )

    found = search(tab, "/admin/ledger/operation/", "lead-call")
    assert "lead-call:call_55aa:crm-contact:v1" in found and "order-1001" not in found
    tab.shot("01-operations-search-lead-call")
    found = search(tab, "/admin/ledger/operation/", "call_7f3c2a9e41b04d6f")
    assert "demo:call_7f3c2a9e41b04d6f:analysed:v1" in found
    tab.shot("02-operations-search-call-id")
    found = search(tab, "/admin/dlq/failedevent/", "CRM")
    assert "demo:n8n:17:4812" in tab.page.inner_html("#result_list")
    tab.shot("03-dlq-search-crm")
    found = search(tab, "/admin/dlq/failedevent/", "429")
    assert tab.page.locator("#result_list tbody tr").count() == 2 and "[429]" in found
    tab.shot("04-dlq-search-429")

    tab.go("/admin/onceguard/subjects/")
    tab.page.fill("#id_phone", "0412 345 678")
    tab.page.fill("#id_reason", "[demo] APP 12 access request #2 (local number)")
    tab.page.click("#subject-form input[type=submit]")
    tab.page.wait_for_selector("[data-testid=subject-events]")
    assert "demo:n8n:17:4812" in tab.page.inner_text("[data-testid=subject-events]")
    tab.shot("05-person-search-local-number")


def test_detail_pages_lead_with_the_story_and_keep_fields_collapsed(console):
    tab, made = signed_in(console)
    tab.go(f"/admin/ledger/operation/{made['review_item']}/change/")
    story = tab.page.locator("[data-testid=story]")
    technical = tab.page.locator("[data-testid=technical]")
    assert story.bounding_box()["y"] < technical.bounding_box()["y"]
    assert technical.evaluate("e => e.open") is False
    assert "Waiting for a reviewer" in story.inner_text()
    assert "error of the last failed attempt" in story.inner_text().lower()
    tab.shot("01-operation-story")
    tab.go(f"/admin/dlq/failedevent/{made['dlq_stuck']}/change/")
    assert "CRM: Create Contact" in tab.page.inner_text("[data-testid=story]")
    tab.shot("02-dlq-entry-story")
    tab.go(f"/admin/dlq/failedevent/{made['dlq_replayed']}/change/")
    assert "HTTP 201" in tab.text() and "succeeded" in tab.text()
    tab.shot("03-dlq-entry-replayed")
    tab.go(f"/admin/review/reviewitem/{made['review_item']}/change/")
    assert "the caller" in tab.page.inner_text("[data-testid=guard-retry-note]")
    tab.shot("04-review-decide-guard")


def test_a_bulk_cancel_over_a_filter_previews_its_count_then_cancels(console):
    tab, made = signed_in(console)
    crm = Provider.objects.get(slug="demo-crm")
    for n in range(3):
        op = services.operation_claim(
            tenant=crm.tenant, key=f"lead-call:call_{n}:crm-contact:v1", provider=crm, request={}
        ).operation
        services.operation_fail(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            error_class=ErrorClass.TRANSIENT,
            message="503",
        )
    tab.go("/admin/ledger/operation/?needs=cancellable")
    assert tab.page.locator("#result_list tbody tr").count() == 3
    assert_fits(tab, ["status", "attempts"])
    tab.shot("01-cancellable-filter")
    tab.page.check("#action-toggle")
    tab.page.select_option("select[name=action]", "cancel_selected")
    tab.page.click("button[name=index]")
    tab.page.wait_for_selector("[data-testid=bulk-preview]")
    assert tab.page.inner_text("[data-testid=bulk-count]") == "3"
    tab.shot("02-bulk-cancel-preview")
    tab.page.fill("#id_reason", "[demo] duplicate leads from a webhook retry storm")
    tab.page.click("[data-testid=bulk-confirm]")
    tab.page.wait_for_selector(".messagelist .success")
    tab.shot("03-bulk-cancel-done")
    assert Operation.objects.filter(key__startswith="lead-call:", status=OperationStatus.ABANDONED).count() == 3


def test_the_replay_form_shows_its_destination_key_and_masked_body(console):
    tab, made = signed_in(console)
    tab.go(f"/admin/dlq/failedevent/{made['dlq_stuck']}/change/")
    tab.page.click("[data-testid=replay]")
    tab.page.wait_for_selector("[data-testid=replay-preview]")
    destination = tab.page.inner_text("[data-testid=replay-destination]")
    assert destination.startswith("POST http")
    assert tab.page.inner_text("[data-testid=replay-key]") == "demo:call_7f3c2a9e41b04d6f:crm-contact:v1"
    assert "firstName" in tab.page.inner_text("[data-testid=replay-preview]")
    assert not any(m in tab.text() for m in MARKERS)
    tab.shot("01-replay-preview")


def test_an_alert_is_acknowledged_then_resolved(console):
    tab, made = signed_in(console, "demo-operator")
    alert = Alert.objects.filter(kind="dlq_new").order_by("pk").first()
    tab.go("/admin/alerts/alert/?state=open")
    tab.shot("01-open-alerts")
    tab.go(f"/admin/alerts/alert/{alert.pk}/change/")
    tab.page.click("[data-testid=acknowledge]")
    tab.page.wait_for_selector(".messagelist .success")
    assert "acknowledged" in tab.page.inner_text("[data-testid=story]")
    tab.shot("02-alert-acknowledged")
    tab.page.fill("input[name=note]", "[demo] CRM limit lifted, replayed")
    tab.page.click("[data-testid=resolve]")
    tab.page.wait_for_selector(".messagelist .success")
    alert.refresh_from_db()
    assert alert.acknowledged_by == alert.resolved_by == "user:demo-operator"
    tab.shot("03-alert-resolved")


def test_the_dashboard_needs_attention_and_charts_and_the_403_page(console):
    tab, made = signed_in(console)
    tab.go("/admin/")
    attention = tab.page.inner_text("[data-testid=attention]")
    assert "demo:order-1001:charge:v1" in attention and "entry" in attention
    assert tab.page.locator("[data-testid=charts] svg rect").count() > 0
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    tab.shot("01-dashboard")
    tab.page.click("[data-testid=attention-review] a")
    tab.page.wait_for_selector("#decision-form")
    tab.logout()
    auditor = console()
    auditor.page.set_viewport_size({"width": WIDTH, "height": 900})
    auditor.login("demo-auditor", made["users"]["demo-auditor"])
    response = auditor.go(f"/admin/ledger/operation/{made['review_item']}/cancel/")
    assert response.status == 403 and "You may not open this page" in auditor.text()
    auditor.shot("02-forbidden")
    icon = auditor.page.locator("link[rel=icon]").get_attribute("href")
    assert auditor.go(icon).status == 200
