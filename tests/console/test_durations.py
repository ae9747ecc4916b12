"""Retention TTLs in the console: typed as people say them ("2 weeks", "90d", "30"), refused
with a message saying what to type, and shown as "30 days" in the form, the list, a viewer's
detail page and the configuration trail."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from ledger.models import ConfigChange, Tenant
from review.models import RetentionPolicy
from tests.console.support import client_for, page, staff, submit_form

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)
ADD = "/admin/review/retentionpolicy/add/"


@pytest.fixture
def ada(tenant: Tenant) -> Client:
    return client_for(staff("ada", role="admin", tenants=[tenant]))


def _add(client: Client, tenant: Tenant, **ttls: str):
    return client.post(ADD, {"tenant": tenant.pk, "record_type": "operations", "legal_hold_note": "", **ttls})


@pytest.mark.parametrize(
    ("payload_ttl", "record_ttl", "kept"),
    [
        ("2 weeks", "90d", (14 * DAY, 90 * DAY)),
        ("30", "365", (30 * DAY, 365 * DAY)),
        # (Above the platform's floors: a day of payload, 30 days of operations.)
        ("36 hours", "30 days 12 h", (timedelta(hours=36), timedelta(days=30, hours=12))),
        ("", "52 weeks", (None, 364 * DAY)),
    ],
)
def test_a_policy_saved_with_ttls_in_words_keeps_those_durations(tenant, ada, payload_ttl, record_ttl, kept):
    response = _add(ada, tenant, payload_ttl=payload_ttl, record_ttl=record_ttl)
    assert response.status_code == 302, response.content.decode()[:2000]
    policy = RetentionPolicy.objects.get(tenant=tenant, record_type="operations")
    assert (policy.payload_ttl, policy.record_ttl) == kept


@pytest.mark.parametrize(
    ("record_ttl", "says"),
    [
        ("6 months", "Months and years vary in length: give months or years as days or weeks"),
        ("5m", "Say &quot;min&quot; for minutes"),
        ("a month", "Enter a duration such as &quot;30 days&quot;, &quot;12 hours&quot;, &quot;90d&quot;"),
        ("-3 days", "A duration cannot be negative."),
        ("0", "The record TTL must be longer than zero."),
    ],
)
def test_a_ttl_that_is_not_a_duration_is_refused_on_the_form_with_what_to_type(tenant, ada, record_ttl, says):
    response = _add(ada, tenant, payload_ttl="", record_ttl=record_ttl)
    assert response.status_code == 200
    body = response.content.decode()
    assert 'class="errorlist' in body and says in body, re.findall(r'<ul class="errorlist[^>]*>.*?</ul>', body)
    assert not RetentionPolicy.objects.exists()


def test_ttls_show_as_words_in_the_form_the_list_the_trail_and_a_viewers_detail_page(tenant, ada):
    assert _add(ada, tenant, payload_ttl="30 days", record_ttl="P365D").status_code == 302
    policy = RetentionPolicy.objects.get()
    form_url = f"/admin/review/retentionpolicy/{policy.pk}/change/"

    _, form = page(ada, form_url)
    assert re.search(r'name="payload_ttl" value="30 days"', form) and re.search(r'value="365 days"', form)
    assert 'placeholder="e.g. 30 days"' in form and "0:00:00" not in form
    _, listing = page(ada, "/admin/review/retentionpolicy/")
    assert "30 days" in listing and "365 days" in listing and "0:00:00" not in listing
    [created] = ConfigChange.objects.filter(object_type="review.retentionpolicy")
    assert created.after["payload_ttl"] == "30 days" and created.after["record_ttl"] == "365 days"

    # Saved again as shown: nothing changed, nothing recorded.
    assert submit_form(ada, form_url).status_code == 302
    assert ConfigChange.objects.filter(object_type="review.retentionpolicy").count() == 1
    assert submit_form(ada, form_url, record_ttl="400 days").status_code == 302
    changed = ConfigChange.objects.filter(object_type="review.retentionpolicy").latest("id")
    assert changed.before == {"record_ttl": "365 days"} and changed.after == {"record_ttl": "400 days"}

    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    _, detail = page(auditor, form_url)
    readonly = dict(
        re.findall(r'field-(\w+)">.*?<div class="readonly">(.*?)</div>', detail.replace("\n", " "), flags=re.S)
    )
    assert readonly["payload_ttl"] == "30 days" and readonly["record_ttl"] == "400 days", readonly
    assert readonly["legal_hold"] == "no"
    # Labels in words, not column names ("Payload ttl").
    assert "Keep the payload for" in detail and "Keep the record for" in detail
