"""Every list and every detail page of the console fits a 1,280 px screen, with rows at the
longest values the API accepts: a 255-character key, a long error, a long workflow name, long
provider and target names. Neither the page nor any scrolling box in it scrolls sideways, and
no word of prose or a heading breaks in the middle. Screenshots of every page are kept under
test-artifacts/browser/ (the path is printed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from alerts.models import AlertChannelKind
from alerts.services import alert_channel_upsert
from dlq import services as dlq_services
from ledger.models import ErrorClass, IdempotencyClass, Tenant, Tombstone
from ledger.protocol import services
from ledger.tenants.workflows import workflow_name_note
from review.demo import demo_seed
from tests.browser.conftest import ARTIFACTS, PASSWORD
from tests.browser.test_console_objects import _files

pytestmark = [pytest.mark.heavy, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280
# The longest values the API takes, shaped as they come: a key without a blank in it, prose
# with a long unbroken token, names at their columns' limits.
LONG_KEY = "lead:" + "call_7f3c2a9e41b04d6f:" * 11 + "crm-contact-v1-" + "0123456789abcdef" * 1
LONG_KEY = (LONG_KEY + "x" * 255)[:255]
LONG_WORKFLOW = ("Voice call analysed then enriched and routed to the regional sales CRM as a qualified lead " * 3)[
    :255
].strip()
LONG_ERROR = (
    "The CRM refused the contact: DUPLICATE_VALUE on field Email__c (record 0035g00000XyZaBAAV already holds it); "
    "see https://crm.example.invalid/lightning/r/Contact/0035g00000XyZaBAAV/view?context=duplicate-rule-enforcement"
    "&ruleId=0Bm5g000000XyZaCAK for the matching rule, then retry with the merged record's identifier. "
) * 3
LONG_PROVIDER = "acme-enterprise-salesforce-production-eu-west-contacts-sync-v2"[:63]
LONG_TARGET = "n8n-regional-sales-lead-rerun-webhook-for-the-eu-west-tenant-v2"[:63]
LONG_NODE = "HTTP Request: create or update the contact in the regional CRM with duplicate handling " * 2

# Elements that scroll sideways (the page itself, and every box whose overflow-x scrolls).
_OVERFLOWING = """(() => {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth) out.push(`document ${doc.scrollWidth} > ${doc.clientWidth}`);
  for (const el of document.querySelectorAll('body *')) {
    const ox = getComputedStyle(el).overflowX;
    if ((ox === 'auto' || ox === 'scroll') && el.scrollWidth > el.clientWidth + 1) {
      const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
        + (typeof el.className === 'string' && el.className.trim() ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
      out.push(`${name} ${el.scrollWidth} > ${el.clientWidth}`);
    }
  }
  return out;
})()"""

# Words of prose and headings whose letters lie on more than one line. Identifiers (tokens with
# digits, colons, slashes, dots, hyphens or underscores, or longer than 30 characters), links,
# code and form fields may break anywhere: a 255-character key must, or it widens the page.
_BROKEN_WORDS = """(() => {
  const broken = [];
  const skip = 'a, code, pre, kbd, input, textarea, select, option, script, style, .og-id, .og-l, '
    + 'td[class*="url"], td[class*="json"], td[class*="key"], .readonly .og-mono, svg';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    // Not shown: hidden, or inside a closed disclosure (its summary aside).
    if (!parent || parent.closest(skip) || !parent.offsetParent) continue;
    if (parent.closest('details:not([open])') && !parent.closest('summary')) continue;
    for (const m of node.data.matchAll(/\\S+/g)) {
      const word = m[0].replace(/^[("“‘'\\[]+|[)"”’'\\].,;:!?…]+$/g, '');
      if (word.length < 2 || word.length > 30 || /[0-9:/._@=&?#\\-]/.test(word)) continue;
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(`${word} (in ${parent.tagName.toLowerCase()}${parent.className ? '.' + parent.className : ''})`);
    }
  }
  return broken;
})()"""


def _seed_longest(tenant: Tenant) -> None:
    """Rows at the limits, made after the demo's so they are the newest (each list's first
    rows, each detail page's object)."""
    _files(tenant)  # an upload and a published output (made first: the long operation stays the newest)
    provider = services.provider_upsert(
        tenant=tenant,
        slug=LONG_PROVIDER,
        base_url="http://127.0.0.1:9/" + "v2/regional/contacts/" * 10,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
    )
    dlq_services.replay_target_upsert(
        tenant=tenant, slug=LONG_TARGET, url="http://127.0.0.1:9/webhook/" + "rerun-lead-capture/" * 40
    )
    op = services.operation_claim(
        tenant=tenant,
        key=LONG_KEY,
        provider=provider,
        request={"contact": {"email_hash": "h" * 64, "note": "x" * 400}},
        workflow_id="wf-" + "9" * 60,
        execution_id="e" * 255,
        correlation_id="c" * 255,
        reconciliation_handle="r" * 255,
    ).operation
    workflow_name_note(tenant_id=tenant.pk, workflow_id=op.workflow_id, name=LONG_WORKFLOW)
    services.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=ErrorClass.INVALID_INPUT,
        message=LONG_ERROR,
        response_status=422,
        response_body={"errors": [{"message": LONG_ERROR, "fields": ["Email__c"] * 20}]},
    )
    envelope = {
        "event_id": "n8n:" + "7" * 120 + ":" + "4" * 120,
        "idempotency_key": LONG_KEY[:-1] + "z",
        "payload": {"contact": {"name": "x" * 300, "company": "y" * 300}},
        "error": {"message": LONG_ERROR * 2, "class": "invalid_input"},
        "source": {
            "workflow_id": "wf-" + "9" * 60,
            "workflow_name": LONG_WORKFLOW,
            "node": LONG_NODE[:255],
            "execution_id": "8" * 255,
        },
    }
    dlq_services.failed_event_ingest(
        tenant=tenant, raw=json.dumps(envelope).encode(), actor="t", replay_target=LONG_TARGET
    )
    # Configuration and files at their limits, so their detail pages are visited too.
    services.apikey_create(tenant=tenant, name=("n8n production workflows for the regional sales team " * 2)[:100])
    alert_channel_upsert(
        tenant=tenant,
        name="regional-sales-on-call-webhook-for-dead-letters-and-paused-crm-v2"[:63],
        kind=AlertChannelKind.WEBHOOK,
        url="http://127.0.0.1:9/hooks/" + "on-call-escalation/" * 20,
    )
    dlq_services.n8n_connection_save(
        tenant=tenant, base_url="http://127.0.0.1:9/" + "n8n-regional/" * 10, api_key="k" * 64, actor="t"
    )
    now = timezone.now()
    Tombstone.objects.create(
        tenant=tenant,
        key=LONG_KEY[:-1] + "t",
        operation_id=10**12,
        mode="guard",
        action="crm.contact.create-or-update-with-duplicate-handling",
        provider_slug=LONG_PROVIDER,
        fingerprint="ab" * 32,
        final_status="succeeded",
        provider_ref="0035g00000XyZaBAAV" * 10,
        created_at=now,
        done_at=now,
        deleted_at=now,
        keep_until=now,
    )


def _pages() -> list[tuple[str, str, Any]]:
    """(name, list URL, the newest object's detail URL or None) of every console page."""
    site = admin.site
    pages: list[tuple[str, str, Any]] = []
    for model in site._registry:
        opts = model._meta
        listed = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        newest = model._default_manager.order_by("-pk").first()
        detail = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[newest.pk]) if newest else None
        pages.append((f"{opts.app_label}.{opts.model_name}", listed, detail))
    for model, page in site._history_pages.items():
        opts = model._meta
        listed = reverse(f"admin:{page.url_name('changelist')}")
        newest = model._default_manager.order_by("-id").first()
        detail = reverse(f"admin:{page.url_name('change')}", args=[newest.id]) if newest else None
        pages.append((f"{opts.app_label}.{opts.model_name}", listed, detail))
    return sorted(pages)


def test_every_list_and_detail_page_fits_1280_px_with_the_longest_values(console):
    made = demo_seed()
    tenant = Tenant.objects.get(slug=made["tenant"])
    _seed_longest(tenant)
    User.objects.create_superuser("root", password=PASSWORD)
    tab = console()
    tab.page.set_viewport_size({"width": WIDTH, "height": 900})
    # A mistyped password first: the login-failure list gets its row.
    tab.go("/admin/login/")
    tab.page.fill("#id_username", "root")
    tab.page.fill("#id_password", "not the password")
    tab.page.click("input[type=submit]")
    tab.login("root")

    problems: dict[str, list[str]] = {}
    visited: list[str] = []
    no_rows: list[str] = []

    def check(name: str, url: str) -> None:
        answer = tab.go(url)
        assert answer is not None and answer.status < 500, (url, answer and answer.status)
        visited.append(url)
        found = tab.page.evaluate(_OVERFLOWING)
        broken = tab.page.evaluate(_BROKEN_WORDS)
        if broken:
            found.append("words broken mid-way: " + ", ".join(sorted(set(broken))[:12]))
        if found:
            problems[f"{name} {url}"] = found
        tab.shot(name)

    check("index", "/admin/")
    for name, listed, detail in _pages():
        check(f"{name}-list", listed)
        if detail is None:
            no_rows.append(name)
        else:
            check(f"{name}-detail", detail)
    print(f"\nscreenshots of {len(visited)} pages: {ARTIFACTS}; no rows to open: {', '.join(no_rows) or 'none'}")
    assert not problems, json.dumps(problems, indent=1)
