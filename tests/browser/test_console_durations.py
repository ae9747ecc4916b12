"""A retention policy saved in a real browser with TTLs typed as people say them: a month is
refused with a message saying what to type instead, "2 weeks" and "90d" are kept, and every
page shows them as "14 days" and "90 days". Screenshots go to test-artifacts/browser/."""

from __future__ import annotations

from datetime import timedelta

import pytest

from review.demo import demo_seed
from review.models import RetentionPolicy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280


def test_a_retention_policy_is_saved_with_ttls_in_words(console):
    made = demo_seed()
    RetentionPolicy.objects.filter(tenant__slug="demo", record_type="failed_events").delete()
    tab = console()
    tab.page.set_viewport_size({"width": WIDTH, "height": 900})
    tab.login("demo-admin", made["users"]["demo-admin"])

    tab.go("/admin/review/retentionpolicy/add/")
    tab.page.select_option("#id_tenant", label="demo")
    tab.page.select_option("#id_record_type", "failed_events")
    assert tab.page.get_attribute("#id_payload_ttl", "placeholder") == "e.g. 30 days"
    tab.page.fill("#id_payload_ttl", "2 weeks")
    tab.page.fill("#id_record_ttl", "6 months")
    tab.page.click("input[name=_save]")
    error = tab.page.inner_text(".form-row.field-record_ttl .errorlist")
    assert "Months and years vary in length" in error and '"180 days"' in error
    # What was typed stays in the box to be corrected.
    assert tab.page.input_value("#id_payload_ttl") == "2 weeks"
    tab.shot("01-a-month-is-refused")

    tab.page.fill("#id_record_ttl", "90d")
    tab.page.click("input[name=_save]")
    tab.page.wait_for_selector(".messagelist .success")
    policy = RetentionPolicy.objects.get(tenant__slug="demo", record_type="failed_events")
    assert (policy.payload_ttl, policy.record_ttl) == (timedelta(days=14), timedelta(days=90))
    row = tab.page.locator("#result_list tbody tr", has_text="DLQ entries")
    assert "14 days" in row.inner_text() and "90 days" in row.inner_text()
    assert "0:00:00" not in tab.text()
    tab.shot("02-saved-policy-in-the-list")

    tab.go(f"/admin/review/retentionpolicy/{policy.pk}/change/")
    assert tab.page.input_value("#id_payload_ttl") == "14 days"
    assert tab.page.input_value("#id_record_ttl") == "90 days"
    tab.shot("03-the-form-shows-words")
