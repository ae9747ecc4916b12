"""Yes/no reads neutrally on every console page of the demo: no page, list or detail, shows
Django admin's stock green tick / red cross for a flag ("legal hold: no" is not an error, a
weak identity is not a success). Crawled in a real browser at 1,280 px as the auditor (who
sees editable pages read-only) and a superuser (who also sees the auth and
queue pages); screenshots of the flag-bearing pages go to test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import NoReverseMatch, reverse

from dlq.models import Replay, ReplayTarget
from review.demo import demo_seed
from review.models import RetentionPolicy
from tests.browser.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280
STOCK_ICONS = 'img[src*="icon-yes"], img[src*="icon-no"], img[src*="icon-unknown"]'
# Detail pages per model: the demo has a handful of each; this keeps the crawl bounded.
OBJECTS_PER_MODEL = 4


def console_pages() -> list[str]:
    """Every list of the console site and the detail pages of (up to a few of) its rows."""
    pages: list[str] = []
    for model in admin.site._registry:
        info = f"{admin.site.name}:{model._meta.app_label}_{model._meta.model_name}"
        try:
            pages.append(reverse(f"{info}_changelist"))
        except NoReverseMatch:
            continue
        for pk in model._default_manager.order_by("pk").values_list("pk", flat=True)[:OBJECTS_PER_MODEL]:
            pages.append(reverse(f"{info}_change", args=[pk]))
    return pages


def readonly_value(tab: Any, field: str) -> str:
    return tab.page.inner_text(f".form-row.field-{field} .readonly").strip()


def test_no_page_of_the_demo_shows_a_stock_tick_or_cross(console):
    made = demo_seed()
    User.objects.create_superuser("root", password=PASSWORD)
    # The auditor sees every page read-only; the superuser sees every page, editable ones too.
    users = {"demo-auditor": made["users"]["demo-auditor"], "root": PASSWORD}
    pages = console_pages()
    seen: dict[str, int] = {}
    for username, password in users.items():
        tab = console()
        tab.page.set_viewport_size({"width": WIDTH, "height": 900})
        tab.login(username, password)
        for path in pages:
            response = tab.go(path)
            if response.status == 403:
                continue
            assert response.status == 200, (username, path, response.status)
            icons = tab.page.locator(STOCK_ICONS)
            assert icons.count() == 0, (username, path, icons.first.evaluate("e => e.closest('div,td').outerHTML"))
            seen[username] = seen.get(username, 0) + 1
        tab.close()
    # Not vacuous: each of them saw lists and detail pages (the auditor's are all read-only).
    assert min(seen.values()) >= 30, seen


def test_flags_read_yes_or_no_on_detail_pages_and_stay_editable_for_an_editor(console):
    made = demo_seed()
    policy = RetentionPolicy.objects.order_by("pk").first()
    replay = Replay.objects.order_by("pk").first()
    target = ReplayTarget.objects.order_by("pk").first()

    auditor = console()
    auditor.page.set_viewport_size({"width": WIDTH, "height": 900})
    auditor.login("demo-auditor", made["users"]["demo-auditor"])
    auditor.go(f"/admin/review/retentionpolicy/{policy.pk}/change/")
    assert readonly_value(auditor, "legal_hold") == "no"
    # The field's own label and help text stay with it.
    assert "Legal hold" in auditor.page.inner_text(".form-row.field-legal_hold label")
    assert "nothing of this kind is purged" in auditor.page.inner_text(".form-row.field-legal_hold")
    auditor.shot("01-auditor-retention-policy")
    auditor.go(f"/admin/dlq/replay/{replay.pk}/change/")
    assert readonly_value(auditor, "as_new") == "no" and readonly_value(auditor, "forced") == "no"
    auditor.shot("02-auditor-replay")
    auditor.go(f"/admin/dlq/replaytarget/{target.pk}/change/")
    assert readonly_value(auditor, "is_default") == "yes" and readonly_value(auditor, "auto_replay") == "no"
    auditor.shot("03-auditor-replay-target")
    auditor.go("/admin/review/retentionpolicy/")
    cells = auditor.page.locator("#result_list td.field-held").all_inner_texts()
    assert cells and set(cells) <= {"yes", "no"}, cells
    auditor.shot("04-auditor-retention-policies")

    editor = console()
    editor.page.set_viewport_size({"width": WIDTH, "height": 900})
    editor.login("demo-admin", made["users"]["demo-admin"])
    editor.go(f"/admin/review/retentionpolicy/{policy.pk}/change/")
    editor.page.check("#id_legal_hold")
    editor.page.fill("#id_legal_hold_note", "[demo] litigation hold, matter 42")
    editor.shot("05-editor-retention-policy")
    editor.page.click("input[name=_continue]")
    editor.page.wait_for_selector(".messagelist .success")
    policy.refresh_from_db()
    assert policy.legal_hold is True
    auditor.go(f"/admin/review/retentionpolicy/{policy.pk}/change/")
    assert readonly_value(auditor, "legal_hold") == "yes"
