"""The console in a real (headless) browser: the paths operators, reviewers and auditors take."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlq.entries import services as dlq_entries
from dlq.models import BulkReplay, FailedEvent, FailedEventStatus
from dlq.replays import bulk as dlq_bulk
from dlq.targets import services as dlq_targets
from ledger.models import Operation, OperationStatus
from review.models import AccessLog
from review.privacy import payloads as privacy
from tests.console.support import (
    MARKERS,
    advisory_provider,
    enforced_provider,
    example,
    failed_op,
    op_in_review,
    staff,
)
from tests.ledger.support import Sink

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reviewer_finds_an_operation_by_reconciliation_handle_and_records_confirm_succeeded(console, tenant):
    mailer = advisory_provider(tenant)
    op = op_in_review(
        tenant, mailer, "welcome-mail:cust-88:v1", handle="msg-7781", payload=example("voice-call-analyzed.json")
    )
    op_in_review(tenant, mailer, "welcome-mail:cust-89:v1", handle="msg-7782")
    staff("rita", role="reviewer", tenants=[tenant])

    tab = console()
    tab.login("rita")
    tab.shot("01-dashboard")
    assert tab.page.inner_text("[data-testid=review-backlog]").strip() == "2"
    tab.page.click("[data-testid=review-backlog]")
    tab.page.fill("#searchbar", "msg-7781")
    tab.page.press("#searchbar", "Enter")
    tab.page.wait_for_selector("#result_list")
    tab.shot("02-review-queue-search")
    rows = tab.page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "welcome-mail:cust-88:v1" in rows.first.inner_text()
    rows.first.locator("a").first.click()
    tab.page.wait_for_selector("#decision-form")
    assert not any(m in tab.text() for m in MARKERS)
    tab.shot("03-decide-page")
    tab.page.check("input[name=decision][value=confirm_succeeded]")
    tab.page.fill("#id_provider_ref", "mailer-msg-7781")
    tab.page.fill("#id_note", "Delivered per the mail provider's log (message msg-7781, 10:42 UTC).")
    tab.shot("04-decision-filled")
    tab.page.click("#decision-form input[type=submit]")
    tab.page.wait_for_selector(".messagelist .success")
    tab.shot("05-decision-recorded")
    assert "Recorded confirm_succeeded" in tab.text()

    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED and op.provider_ref == "mailer-msg-7781"
    assert op.events.order_by("-at", "-id").first().actor == "user:rita"


def test_operator_bulk_replays_dlq_entries_after_seeing_the_count(console, tenant):
    sink = Sink()
    try:
        crm = enforced_provider(tenant)
        dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n-webhook", url=f"{sink.url}/hook", is_default=True)
        failed = [
            failed_op(tenant, crm, f"crm-contact:call_{n}:v1", payload=example("crm-create-contact-request.json"))
            for n in range(3)
        ]
        done = failed_op(tenant, crm, "crm-contact:call_9:v1", payload={"x": 1})
        done_event = FailedEvent.objects.get(operation=done)
        dlq_entries.failed_event_resolve(tenant_id=tenant.pk, event_pk=done_event.pk, actor="t", note="fixed in CRM")
        staff("otto", role="operator", tenants=[tenant])

        tab = console()
        tab.login("otto")
        assert tab.page.inner_text("[data-testid=dlq-pending] .og-n").strip() == "3"
        tab.page.click("[data-testid=dlq-pending]")
        tab.page.wait_for_selector("#result_list")
        tab.go("/admin/dlq/failedevent/")
        tab.shot("01-dlq-list")
        assert not any(m in tab.text() for m in MARKERS)
        tab.page.check("#action-toggle")
        tab.page.select_option("select[name=action]", "replay_selected")
        tab.page.click("button[name=index]")
        tab.page.wait_for_selector("input[name=bulk_confirm]", state="attached")
        tab.shot("02-bulk-confirm-shows-count")
        body = tab.text()
        assert "You ticked 4 entries" in body and "3 of them are pending" in body
        tab.page.fill("textarea[name=note]", "CRM rate limit lifted; replaying the backlog")
        tab.page.click("input[type=submit][value^='Confirm']")
        tab.page.wait_for_selector(".messagelist .success")
        tab.shot("03-bulk-started")
        assert "of 3 entries started" in tab.text()
        # What the django-q2 worker does with the confirmed selection.
        bulk = BulkReplay.objects.get()
        dlq_bulk.bulk_replay_run(bulk_id=bulk.pk)
        assert sink.count("/hook") == 3
        assert set(FailedEvent.objects.filter(operation__in=failed).values_list("status", flat=True)) == {
            FailedEventStatus.REPLAYED
        }
        tab.go("/admin/dlq/failedevent/")
        tab.shot("04-after-replay")
    finally:
        sink.close()


def test_a_reviewer_without_view_payload_cannot_reveal(console, tenant):
    op = failed_op(
        tenant, enforced_provider(tenant), "lead:call_7f3c2a9e:v1", payload=example("voice-call-analyzed.json")
    )
    staff("rita", role="reviewer", tenants=[tenant])
    tab = console()
    tab.login("rita")
    tab.go(f"/admin/ledger/operation/{op.pk}/change/")
    tab.page.wait_for_selector("[data-testid=payload-panel]")
    tab.page.locator("[data-testid=payload-panel]").scroll_into_view_if_needed()
    tab.shot("01-masked-operation")
    assert tab.page.locator("[data-testid=no-reveal]").is_visible()
    assert tab.page.locator("[data-testid=reveal-link]").count() == 0
    assert not any(m in tab.text() for m in MARKERS)
    response = tab.go(f"/admin/onceguard/reveal/ledger/operation/{op.pk}/")
    assert response.status == 403
    tab.shot("02-reveal-refused")
    assert "do not have permission" in tab.text() and not any(m in tab.text() for m in MARKERS)
    assert AccessLog.objects.count() == 0


def test_a_reveal_with_a_reason_is_seen_by_the_auditor_in_the_log_and_the_csv(console, tenant, tmp_path):
    op = failed_op(
        tenant, enforced_provider(tenant), "lead:call_7f3c2a9e:v1", payload=example("voice-call-analyzed.json")
    )
    staff("ada", role="admin", tenants=[tenant])
    staff("aud", role="auditor", tenants=[tenant])
    reason = "Ticket OPS-142: caller says the quote never arrived"

    tab = console()
    tab.login("ada")
    tab.go(f"/admin/ledger/operation/{op.pk}/change/")
    tab.page.click("[data-testid=reveal-link]")
    tab.page.wait_for_selector("#reveal-form")
    tab.shot("01-reveal-form")
    tab.page.fill("#id_reason", reason)
    tab.page.click("[data-testid=reveal-submit]")
    tab.page.wait_for_selector("[data-testid=revealed]")
    tab.shot("02-revealed")
    assert "Priya Raman" in tab.page.inner_text("[data-testid=revealed]")
    assert "This access was logged" in tab.page.inner_text("[data-testid=logged]")
    tab.logout()

    tab.login("aud")
    tab.go("/admin/review/accesslog/")
    tab.page.wait_for_selector("#result_list")
    tab.shot("03-auditor-access-log")
    row = tab.page.locator("#result_list tbody tr").first.inner_text()
    assert "user:ada" in row and reason in row and "reveal" in row
    with tab.page.expect_download() as download:
        tab.page.click("[data-testid=export-csv]")
    csv_path = Path(download.value.path())
    text = csv_path.read_text()
    (tmp_path / "access-log.csv").write_text(text)
    assert "user:ada" in text and reason in text and str(op.pk) in text
    assert not any(m in text for m in MARKERS)
    assert privacy.accesslog_verify()[1] == []


def test_staff_of_tenant_a_never_see_tenant_b(console, tenant, other_tenant):
    for t, tag in ((tenant, "acme"), (other_tenant, "globex")):
        mailer = advisory_provider(t)
        op_in_review(t, mailer, f"{tag}-review:1", handle=f"{tag}-handle", payload=example("voice-call-analyzed.json"))
        failed_op(t, enforced_provider(t), f"{tag}-failed:1", payload=example("crm-create-contact-request.json"))
        privacy.accesslog_append(
            tenant_id=t.pk,
            action="reveal",
            actor=f"user:{tag}-person",
            object_type="ledger.operation",
            reason=f"{tag} support ticket",
            ip="127.0.0.1",
        )
    theirs = Operation.objects.get(key="globex-review:1")
    staff("alice", role="auditor", tenants=[tenant])

    tab = console()
    tab.login("alice")
    assert "Tenants: acme" in tab.page.inner_text("[data-testid=scope]")
    assert tab.page.inner_text("[data-testid=review-backlog]").strip() == "1"
    tab.shot("01-dashboard-acme-only")
    for n, path in enumerate(
        [
            "/admin/ledger/operation/",
            "/admin/review/reviewitem/",
            "/admin/dlq/failedevent/",
            "/admin/review/accesslog/",
            "/admin/ledger/provider/",
            "/admin/ledger/tenant/",
            "/admin/ledger/operation/?q=globex-handle",
        ],
        start=2,
    ):
        tab.go(path)
        text = tab.text()
        assert "globex" not in text, path
        tab.shot(f"{n:02d}-{path.strip('/').replace('/', '-').replace('?', '-')}")
    assert "acme-review:1" in (tab.go("/admin/ledger/operation/") and tab.text())
    tab.go(f"/admin/ledger/operation/{theirs.pk}/change/")
    assert "globex" not in tab.text() and "doesn’t exist" in tab.text()
    tab.shot("09-other-tenant-direct-url")
    assert tab.go(f"/admin/onceguard/reveal/ledger/operation/{theirs.pk}/").status == 404
