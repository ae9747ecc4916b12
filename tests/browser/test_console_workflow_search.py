"""The operations search finds operations by any part of their workflow's name, in any case,
in a real browser at 1,280 px, and the list shows the name. Screenshots go to
test-artifacts/browser/."""

from __future__ import annotations

import pytest

from ledger.models import Operation, WorkflowName
from review.demo import demo_seed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280


def test_an_operation_is_found_by_part_of_its_workflow_name_in_any_case(console):
    made = demo_seed()
    # The demo's n8n failure named workflow 17 ("[demo] Voice call analyzed -> CRM lead").
    assert WorkflowName.objects.filter(workflow_id="17", name="[demo] Voice call analyzed -> CRM lead").exists()
    in_workflow = set(Operation.objects.filter(workflow_id="17").values_list("key", flat=True))
    assert in_workflow
    tab = console()
    tab.page.set_viewport_size({"width": WIDTH, "height": 900})
    tab.login("demo-admin", made["users"]["demo-admin"])

    tab.go("/admin/ledger/operation/")
    tab.page.fill("#searchbar", "cALL ANALYZED -> crm")
    tab.page.press("#searchbar", "Enter")
    tab.page.wait_for_selector("#changelist")
    rows = tab.page.locator("#result_list tbody tr")
    listed = tab.page.inner_text("#result_list")
    shown = {
        rows.nth(i).locator(".field-key_short [data-copy]").get_attribute("data-copy") for i in range(rows.count())
    }
    assert shown == in_workflow, (shown, in_workflow)
    # The column shows the name (shortened; in full on hover).
    named = tab.page.locator('#result_list span[title="[demo] Voice call analyzed -> CRM lead"]')
    assert named.count() == rows.count() and "[demo] Voice call analyzed" in listed
    assert "demo:order-1001:charge:v1" not in listed
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    tab.shot("01-search-by-workflow-name")

    tab.page.fill("#searchbar", "no workflow is called this")
    tab.page.press("#searchbar", "Enter")
    tab.page.wait_for_selector("#changelist")
    assert tab.page.locator("#result_list tbody tr").count() == 0
