"""The console's front page as an operator's round: what needs attention, operations, the
dead-letter queue, runs, people, configuration, audit — in that order, each page with its count.

The admin's own index lists its apps' models in app and model order (35 links); an operator
walks the pages by the question they answer instead. Every count is bounded
(``review.console.selectors.shown_count``: exact up to a thousand rows read from an index, else the
planner's estimate), never a COUNT(*) over the operation table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse

from review.console.selectors import shown_counts

# (section title, what it answers, its pages as (app label, model name)). A page registered
# later and named nowhere here is listed under configuration, so no page goes missing.
ROUND: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Needs attention",
        "decisions waiting for a person, re-sends waiting for a second person, alerts, paused providers",
        [("review", "reviewitem"), ("ledger", "approvalrequest"), ("alerts", "alert"), ("review", "pausedprovider")],
    ),
    (
        "Operations",
        "every guarded call, its attempts, files in and out",
        [
            ("ledger", "operation"),
            ("ledger", "attempt"),
            ("ledger", "upload"),
            ("ledger", "operationoutput"),
            ("ledger", "tombstone"),
        ],
    ),
    (
        "Dead-letter queue",
        "failures no automatic retry will fix, and their replays",
        [("dlq", "failedevent"), ("dlq", "replay"), ("dlq", "bulkreplay")],
    ),
    ("Runs", "workflow runs step by step, and their resumptions", [("dlq", "runresume")]),
    (
        "People",
        "records about a person, erasures, who may sign in",
        [("review", "erasurerun"), ("auth", "user"), ("auth", "group"), ("review", "stafftenant")],
    ),
    (
        "Configuration",
        "tenants, providers, targets, keys, schedules",
        [
            ("ledger", "tenant"),
            ("ledger", "provider"),
            ("ledger", "prompttemplate"),
            ("dlq", "replaytarget"),
            ("dlq", "n8nconnection"),
            ("ledger", "apikey"),
            ("alerts", "alertchannel"),
            ("review", "retentionpolicy"),
            ("django_q", "schedule"),
        ],
    ),
    (
        "Audit",
        "who changed or looked at what, and what ran",
        [
            ("ledger", "configchange"),
            ("review", "accesslog"),
            ("review", "accesslogcheckpoint"),
            ("ledger", "operationevent"),
            ("alerts", "alertdelivery"),
            ("review", "retentionrun"),
            ("review", "loginfailure"),
            ("django_q", "success"),
            ("django_q", "failure"),
            ("django_q", "ormq"),
        ],
    ),
]
CONFIGURATION = "Configuration"

# Needs attention counts what needs it, and its link opens that filtered list: the pair names
# one of the page's own list filters (alerts.admin.AlertStateFilter,
# review.admin.PausedFilter) and its choice, and the count runs that filter's queryset — one
# definition of "open" for the count and the list.
ATTENTION: dict[tuple[str, str], tuple[str, str]] = {
    ("alerts", "alert"): ("state", "open"),
    # ledger.web.console.approvals.ApprovalStateFilter: re-sends waiting for a second person.
    ("ledger", "approvalrequest"): ("state", "pending"),
    ("review", "pausedprovider"): ("paused", "yes"),
}


def _filtered(request: HttpRequest, model_admin: Any, queryset: QuerySet, parameter: str, choice: str) -> QuerySet:
    """``queryset`` narrowed by the page's list filter named ``parameter`` set to ``choice``."""
    for spec in model_admin.list_filter:
        if isinstance(spec, type) and issubclass(spec, admin.SimpleListFilter) and spec.parameter_name == parameter:
            chosen = spec(request, {parameter: [choice]}, model_admin.model, model_admin)
            return chosen.queryset(request, queryset)
    raise LookupError(f"{type(model_admin).__name__} has no list filter {parameter!r}")


@dataclass
class RoundPage:
    name: str
    url: str
    count: str = ""


@dataclass
class RoundSection:
    title: str
    about: str
    slug: str
    pages: list[RoundPage] = field(default_factory=list)


def _extra_pages(request: HttpRequest, site: admin.AdminSite) -> dict[str, list[RoundPage]]:
    """Pages that are no model's list: the run page and the person search."""
    extra: dict[str, list[RoundPage]] = {"Runs": [], "People": []}
    user = request.user
    if user.has_perm("ledger.view_operation"):
        extra["Runs"].append(RoundPage("Open a run by its id", reverse(f"{site.name}:onceguard_run")))
    if user.has_perm("review.search_subjects"):
        extra["People"].append(RoundPage("Find records about a person", reverse(f"{site.name}:onceguard_subjects")))
    return extra


def console_round(request: HttpRequest, site: Any) -> list[RoundSection]:
    """The round's sections, each with the pages ``request.user`` may view, in order."""
    apps = site.get_app_list(request)
    entries = {(app["app_label"], m["object_name"].lower()): m for app in apps for m in app["models"]}
    named = {page for _, _, pages in ROUND for page in pages}
    sections: list[RoundSection] = []
    counted: list[tuple[RoundPage, QuerySet]] = []
    extra = _extra_pages(request, site)

    def add(section: RoundSection, entry: dict[str, Any], name: tuple[str, str]) -> None:
        narrowed = ATTENTION.get(name)
        query = f"?{narrowed[0]}={narrowed[1]}" if narrowed else ""
        page = RoundPage(str(entry["name"]), entry["admin_url"] + query)
        section.pages.append(page)
        model_admin = site.get_model_admin(entry["model"]) if site.is_registered(entry["model"]) else None
        # A history page (attempts, events) has no model admin: partitioned and scoped by its
        # own page, it is counted there, filtered.
        if model_admin is not None:
            queryset = model_admin.get_queryset(request)
            if narrowed:
                queryset = _filtered(request, model_admin, queryset, *narrowed)
            counted.append((page, queryset))

    for title, about, pages in ROUND:
        section = RoundSection(title, about, slug=title.lower().replace(" ", "-"))
        for name in pages:
            entry = entries.get(name)
            if entry is not None and entry.get("admin_url"):
                add(section, entry, name)
        if title == CONFIGURATION:
            for name, entry in sorted(entries.items()):
                if name not in named and entry.get("admin_url"):
                    add(section, entry, name)
        section.pages += extra.get(title, [])
        if section.pages:
            sections.append(section)
    for (page, _), count in zip(counted, shown_counts([qs for _, qs in counted]), strict=True):
        page.count = str(count)
    return sections
