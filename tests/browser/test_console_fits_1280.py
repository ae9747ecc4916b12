"""Every list and every detail page of the console fits a 1,280 px screen, with rows at the
longest values the API accepts: a 255-character key, a long error, a long workflow name, long
provider and target names. Neither the page nor any scrolling box in it scrolls sideways, and
no word of prose or a heading breaks in the middle. Every list the console's index links to
has a row (made through the service or task that makes such rows), so every detail page is
opened: a list left empty fails the test rather than leaving its detail page unmeasured.
Screenshots of every page are kept under test-artifacts/browser/ (the path is printed)."""

from __future__ import annotations

import json
from datetime import timedelta
from multiprocessing import Value
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from django_q.humanhash import uuid
from django_q.monitor import monitor
from django_q.queues import Queue
from django_q.worker import worker

from alerts.models import AlertChannelKind
from alerts.services import alert_channel_upsert, alert_raise
from dlq.ingest import services as dlq_ingest
from dlq.n8n import connections as dlq_connections
from dlq.replays import bulk as dlq_bulk
from dlq.replays.runs import run_resume
from dlq.targets import services as dlq_targets
from ledger.models import ApprovalRequest, ErrorClass, FenceHold, IdempotencyClass, Tenant, Tombstone
from ledger.protocol import services
from ledger.providers import prompts
from ledger.tenants.workflows import workflow_name_note
from review.demo import demo_seed
from review.privacy import erasure
from review.privacy.subjects import subject_resolve
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
LONG_RUN = ("run:lead-intake:" + "2026-12-07T09:41:07Z:" * 12 + "f" * 255)[:255]
# An actor as the console writes it: "user:" and a username at its 150 characters (letters,
# digits and @.+-_, no blank).
LONG_ACTOR = ("user:" + "operations.lead.for.the.regional.sales.team@example.invalid." * 3)[:150]
LONG_NOTE = (
    "Customer support ticket CS-48213: the CRM outage of 07:00-09:30 UTC is over (status page confirms), "
    "so the leads that failed during it are sent again; duplicates are refused by the CRM's own rule. "
) * 3
LONG_NOTE = LONG_NOTE[:500].strip()
LONG_PROMPT_NAME = "regional-sales-lead-qualification-summary-for-the-crm-notes-v12"[:63]
PROMPT_SLOTS = [f"field_{n:02}_of_the_lead_form" for n in range(1, 21)]
LONG_PROMPT = (
    "Summarise the lead for the regional sales team in a neutral tone, without personal data. "
    + " ".join(f"{{{{ {name} }}}}" for name in PROMPT_SLOTS)
    + " Unbrokenwordsthatgoonandonwithoutanyspaceatall" * 40
)
LONG_EMAIL = ("procurement.department.contact." * 6)[:150] + "@regional-sales.example.invalid"
# A mistyped sign-in at the username field's 150 characters (a failure of another name than
# the one that signs in next, which clears only its own).
LONG_USERNAME = ("operations.lead.for.the.regional.sales.team." * 4)[:150]

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
      // Its table's widest columns, by the class Django gives a list's cells (field-<name>).
      const wide = [...el.querySelectorAll('thead th')].filter(th => th.offsetWidth > 120)
        .map(th => `${(th.className.match(/column-\\S+/) || [th.textContent.trim()])[0]} ${th.offsetWidth}`);
      out.push(`${name} ${el.scrollWidth} > ${el.clientWidth}` + (wide.length ? ` (widest: ${wide.join(', ')})` : ''));
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


_HREFS = "links => links.map(a => a.getAttribute('href'))"


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
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug=LONG_TARGET, url="http://127.0.0.1:9/webhook/" + "rerun-lead-capture/" * 40
    )
    _seed_runs_and_records(tenant, provider)
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
    dlq_ingest.failed_event_ingest(
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
    dlq_connections.n8n_connection_save(
        tenant=tenant, base_url="http://127.0.0.1:9/" + "n8n-regional/" * 10, api_key="k" * 64, actor="t"
    )
    _seed_alert_deliveries(tenant)
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
    # A restore hold (ADR 0012) with the longest key.
    FenceHold.objects.create(
        tenant=tenant, key=LONG_KEY[:-1] + "h", provider_id=None, journaled_state="succeeded", epoch=1, found_at=now
    )
    # A four-eyes request (ADR 0013) with a long reason.
    ApprovalRequest.objects.create(
        tenant=tenant,
        kind="replay",
        target_ids=[1],
        requested_by="user:" + "r" * 60,
        request_reason="re-send the charge after the provider's outage " * 4,
        requested_at=now,
        expires_at=now + timedelta(days=1),
    )


def _task(func: str, *args: Any) -> None:
    """Run a django-q2 task through its worker and monitor, in this process, as the cluster
    runs what it takes from the broker: the monitor saves it as a success or a failure (the
    ``sync`` option would raise a failure instead of saving it). Named as
    ``ledger.platform.tasks.enqueue`` names it."""
    name = f"{func.rsplit('.', 1)[-1]}:{':'.join(map(str, args))}"
    task = {"id": uuid()[1], "name": name, "func": func, "args": args, "kwargs": {}, "started": timezone.now()}
    taken, done = Queue(), Queue()
    taken.put(task)
    taken.put("STOP")
    worker(taken, done, Value("f", -1))
    done.put("STOP")
    monitor(done)
    for queue in (taken, done):
        queue.close()
        queue.join_thread()


def _seed_runs_and_records(tenant: Tenant, provider: Any) -> None:
    """A resumed run, a bulk replay that ran, a finished erasure, a prompt template and a
    failed task, each through the service (or the task) that makes it, at its limits. Made
    before the long operation, so that one stays each operation list's newest."""
    # A run (its id at the column's 255) whose failed step a resume re-drives: the step fails
    # for good (no retry, not quarantined), so its dead-letter entry is replayable.
    step = services.operation_claim(
        tenant=tenant,
        key=LONG_KEY[:-1] + "r",
        provider=provider,
        request={"contact": {"email_hash": "h" * 64}},
        correlation_id=LONG_RUN,
        step=1,
    ).operation
    services.operation_fail(
        operation_id=step.pk,
        tenant_id=step.tenant_id,
        lease_token=step.lease_token,
        error_class=ErrorClass.PERMISSION,
        message=LONG_ERROR,
        response_status=403,
    )
    run_resume(tenant_id=tenant.pk, run=LONG_RUN, actor=LONG_ACTOR, note=LONG_NOTE, target_slug=LONG_TARGET)
    # A bulk replay of the pending entries, confirmed and run by its task (the sends are
    # refused: nothing listens on the target's port).
    bulk = dlq_bulk.bulk_replay_prepare(
        tenant=tenant, filters={}, actor=LONG_ACTOR, target_slug=LONG_TARGET, note=LONG_NOTE
    )
    dlq_bulk.bulk_replay_confirm(tenant=tenant, bulk_id=bulk.pk, actor=LONG_ACTOR, count=bulk.count)
    _task("dlq.tasks.bulk_replay_run_task", bulk.pk)
    prompts.prompt_template_create(
        tenant=tenant,
        name=LONG_PROMPT_NAME,
        text=LONG_PROMPT,
        slots={name: {"max_length": 20_000} for name in PROMPT_SLOTS},
        actor=LONG_ACTOR,
        reason=LONG_NOTE,
    )
    # An erasure of someone the tenant holds nothing about, run to its end by its task.
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": LONG_EMAIL, "phone": "+44 20 7946 0958"}),
        actor=LONG_ACTOR,
        reason=LONG_NOTE,
        enqueue=False,
    )
    _task("review.tasks.erasure_run_task", run.pk)
    # A task that fails: an erasure pass for a run that is no longer there.
    _task("review.tasks.erasure_run_task", 10**12)


def _seed_alert_deliveries(tenant: Tenant) -> None:
    """An alert with the longest ref and summary, handed to the long-named webhook channel by
    the dispatch task (its delivery fails: nothing listens there) — a delivery row."""
    alert_raise(tenant_id=tenant.pk, kind="dlq_new", ref=LONG_KEY, summary=LONG_ERROR)
    _task("alerts.tasks.alert_dispatch_task", tenant.pk)


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
    # The service's schedules, as `make run` installs them: another browser test may have emptied
    # the schedule table, and every list linked from the index must have a row to open.
    call_command("schedules_install")
    tenant = Tenant.objects.get(slug=made["tenant"])
    _seed_longest(tenant)
    User.objects.create_superuser("root", password=PASSWORD)
    tab = console()
    tab.page.set_viewport_size({"width": WIDTH, "height": 900})
    # A mistyped password first: the login-failure list gets its row.
    tab.go("/admin/login/")
    tab.page.fill("#id_username", LONG_USERNAME)
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
    # The lists the index links to (its round's pages, some with a filter in the query).
    linked = {href.split("?")[0] for href in tab.page.eval_on_selector_all("a[href]", _HREFS)}
    pages = _pages()
    for name, listed, detail in pages:
        check(f"{name}-list", listed)
        if detail is None:
            no_rows.append(name)
        else:
            check(f"{name}-detail", detail)
    print(f"\nscreenshots of {len(visited)} pages: {ARTIFACTS}; no rows to open: {', '.join(no_rows) or 'none'}")
    assert not problems, json.dumps(problems, indent=1)
    # Every list the index links to had a row whose detail page was opened: a list seeded with
    # nothing would leave its detail page unmeasured without anyone noticing.
    assert reverse("admin:ledger_operation_changelist") in linked, sorted(linked)
    unopened = [name for name, listed, detail in pages if listed in linked and detail is None]
    assert not unopened, f"lists linked from the index with no row to open: {unopened}"
