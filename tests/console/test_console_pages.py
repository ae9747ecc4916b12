"""Issue 14's console pages through the test client (the browser tests show them at 1,280 px):
lists that answer "what needs me", detail pages that lead with the story, actions with a
preview, alerts acknowledged and resolved, the dashboard, the 403 page and the favicon."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from alerts.models import Alert
from dlq.models import FailedEvent, ReplayTarget
from ledger.models import Operation, OperationStatus
from ledger.providers.credentials import url_masked
from review.demo import demo_seed
from tests.console.support import MARKERS, client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo():
    made = demo_seed()
    made["client"] = client_for(User.objects.get(username="demo-admin"))
    return made


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    text = response.content.decode()
    assert not any(m in text for m in MARKERS), url
    return text


def test_the_operations_list_shows_badges_ages_and_searches_by_substring(demo):
    text = page(demo["client"], "/admin/ledger/operation/?q=order-1001")
    assert "demo:order-1001:charge:v1" in text and 'class="og-badge og-tone-warn" data-state="review"' in text
    assert '<time class="og-age"' in text and " UTC" in text
    assert "demo:call_7f3c2a9e41b04d6f:analysed:v1" not in text
    assert "analysed" in page(demo["client"], "/admin/ledger/operation/?q=7F3C2A")


def test_the_dlq_list_shows_error_workflow_node_and_counts_and_finds_429(demo):
    text = page(demo["client"], "/admin/dlq/failedevent/?q=429")
    assert "too many requests" in text and "Voice call analyzed" in text and "CRM: Create Contact" in text
    assert page(demo["client"], "/admin/dlq/failedevent/?q=nothing-like-this").count('class="og-badge') == 0


def test_an_operation_detail_page_leads_with_its_story_and_hides_fields_in_a_collapsed_section(demo):
    text = page(demo["client"], f"/admin/ledger/operation/{demo['review_item']}/change/")
    story, technical = text.index('data-testid="story"'), text.index('data-testid="technical"')
    assert story < text.index("Attempts") < technical
    assert "Waiting for a reviewer" in text and "Decide this review item" in text
    assert "Error of the last failed attempt" in text and "connection reset" in text


def test_a_succeeded_operation_shows_no_error_as_its_outcome(demo):
    op = Operation.objects.get(key__endswith=":analysed:v1")
    text = page(demo["client"], f"/admin/ledger/operation/{op.pk}/change/")
    assert "Succeeded" in text and 'data-testid="last-attempt-error"' not in text


def test_cancel_previews_and_needs_a_reason_then_abandons(demo, tenant):
    op = Operation.objects.get(pk=demo["review_item"])
    Operation.objects.filter(pk=op.pk).update(status=OperationStatus.RETRY_WAIT)
    client = demo["client"]
    preview = page(client, f"/admin/ledger/operation/{op.pk}/cancel/")
    assert "retry_wait → abandoned" in preview
    assert client.post(f"/admin/ledger/operation/{op.pk}/cancel/", {"reason": ""}).status_code == 200
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.RETRY_WAIT
    client.post(f"/admin/ledger/operation/{op.pk}/cancel/", {"reason": "customer cancelled the order"})
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.ABANDONED


def test_a_bulk_cancel_over_a_filter_shows_the_count_then_refuses_a_stale_one(demo):
    Operation.objects.filter(pk=demo["review_item"]).update(status=OperationStatus.RETRY_WAIT)
    client = demo["client"]
    url = "/admin/ledger/operation/?status__exact=retry_wait"
    form = {"action": "cancel_selected", "select_across": "1", "index": "0", "_selected_action": [demo["review_item"]]}
    preview = client.post(url, form)
    assert preview.status_code == 200 and 'data-testid="bulk-count">1<' in preview.content.decode()
    stale = client.post(url, {**form, "bulk_confirm": "1", "bulk_count": "2", "reason": "duplicate"}, follow=True)
    assert "selection changed" in stale.content.decode()
    client.post(url, {**form, "bulk_confirm": "1", "bulk_count": "1", "reason": "duplicate"})
    assert Operation.objects.get(pk=demo["review_item"]).status == OperationStatus.ABANDONED


def test_the_replay_form_shows_destination_key_and_masked_preview(demo):
    text = page(demo["client"], f"/admin/dlq/failedevent/{demo['dlq_stuck']}/replay/")
    target = ReplayTarget.objects.get(slug="demo-crm-webhook")
    # The destination, its path masked past the host: a webhook path can be a bearer secret.
    assert f'data-testid="replay-destination">POST {url_masked(target.url)}<' in text
    assert "demo:call_7f3c2a9e41b04d6f:crm-contact:v1" in text
    assert 'data-testid="replay-preview"' in text and "firstName" in text


def test_an_alert_is_acknowledged_then_resolved_with_who_and_when(demo):
    alert = Alert.objects.filter(kind="dlq_new").first()
    client = demo["client"]
    client.post(f"/admin/alerts/alert/{alert.pk}/acknowledge/")
    alert.refresh_from_db()
    assert alert.acknowledged_by == "user:demo-admin" and alert.resolved_at is None
    client.post(f"/admin/alerts/alert/{alert.pk}/resolve/", {"note": "replayed"})
    alert.refresh_from_db()
    assert alert.resolved_by == "user:demo-admin" and alert.state == "resolved"


def test_the_dashboard_lists_what_needs_attention_and_draws_charts_without_scripts(demo):
    text = page(demo["client"], "/admin/")
    assert 'data-testid="attention"' in text and "demo:order-1001:charge:v1" in text
    assert "<svg" in text and 'data-testid="chart-' in text and "<script>" not in text


def test_a_forbidden_page_is_the_styled_403_and_the_favicon_answers(demo):
    auditor = client_for(User.objects.get(username="demo-auditor"))
    response = auditor.get(f"/admin/ledger/operation/{demo['review_item']}/cancel/")
    assert response.status_code == 403 and b'data-testid="forbidden"' in response.content
    assert b"console.css" in response.content
    assert Client().get("/favicon.ico").status_code == 301
    assert FailedEvent.objects.exists()
