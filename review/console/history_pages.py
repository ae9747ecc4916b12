"""Console pages for the ledger's history: attempts and events (DESIGN §12, *Partitions*).

Both tables are partitioned by month and keyed ``(id, <time>)`` — a ``CompositePrimaryKey``,
which Django 5.2's admin refuses to register — so they are pages of the console's site, like
the run and subject pages, with what their ModelAdmins gave: at the same addresses and URL
names, a list newest first with the same filters and search, a read-only detail page (an
attempt's recorded response masked, with the reveal for those allowed), the CSV export with
its access-log rows; behind the same view permissions, scoped to the user's tenants
(review.staff.tenancy), counted with the console's capped paginator and planned per call. There is
no add, change or delete page: the rows are the services' to write (DESIGN §6).

A row is named by its id alone in addresses and in the access log: one sequence per table
numbers them, so an id is one row (the time is only what the partitioning needs in the key).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.utils import display_for_field
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.utils.text import capfirst, smart_split, unescape_string_literal
from django.views.decorators.http import require_safe

from ledger.models import Attempt, AttemptOutcome, ErrorClass, Operation, OperationEvent, OperationStatus
from ledger.platform.errors import LookupNotOffered
from ledger.protocol.selectors import claim_event
from ledger.providers import prompts, revisions
from ledger.store import sql
from ledger.web import display
from ledger.web.console_base import lookup_refused_response, may_view, unoffered_parameters
from ledger.web.pagination import CappedCountPaginator
from review.console.pages import can_export, export_csv_response, payload_panel_context
from review.privacy import payloads as privacy
from review.staff.tenancy import scope_of, scope_queryset

PAGE_VAR, SEARCH_VAR = "p", "q"


@dataclass(frozen=True)
class ChoiceFilter:
    """A list filter over a column's declared values (never ``SELECT DISTINCT`` over tens of
    millions of rows), under the query parameter the admin's filter used."""

    parameter: str
    field: str
    title: str
    choices: list[tuple[str, str]]


class HistoryPage:
    """A history table's list, detail and export pages on the console's site."""

    model: type[models.Model]
    # Field names, in order; the first links to the row's page.
    list_columns: tuple[str, ...]
    detail_fields: tuple[str, ...]
    filters: tuple[ChoiceFilter, ...]
    search_help: str
    # What the list does not hold that a reader would look for in it, said above the rows.
    list_note = ""
    list_per_page = 100

    def __init__(self, site: admin.AdminSite) -> None:
        self.site = site
        self.opts = self.model._meta

    # --- who sees what ---

    def has_view_permission(self, request: HttpRequest) -> bool:
        user = request.user
        return user.is_active and user.is_staff and may_view(request, self.model)

    def queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The user's tenants' rows (review.staff.tenancy): every page and the export start here."""
        return scope_queryset(self.model._default_manager.select_related("operation"), scope_of(request))

    def get_object(self, request: HttpRequest, object_id: Any) -> Any:
        try:
            row_id = int(object_id)
        except (TypeError, ValueError):
            return None
        return self.queryset(request).filter(id=row_id).first()

    def search(self, rows: QuerySet[Any], text: str) -> QuerySet[Any]:
        """Every word matches one of the page's columns (the admin's search: words AND'ed,
        columns OR'ed; quoted phrases kept whole)."""
        for word in smart_split(text):
            if word[:1] in "\"'" and word[-1:] == word[:1]:
                word = unescape_string_literal(word)
            rows = rows.filter(self.word_matches(word))
        return rows

    def word_matches(self, word: str) -> Q:
        raise NotImplementedError

    def filtered(self, request: HttpRequest) -> QuerySet[Any]:
        """The list as the request's filters and search narrow it, newest first. Raises
        LookupNotOffered for a parameter the page does not offer (ledger.web.console_base)."""
        unoffered = unoffered_parameters(request.GET.keys(), (spec.parameter for spec in self.filters))
        if unoffered:
            raise LookupNotOffered(f"This list does not filter by {', '.join(unoffered)[:200]}.")
        rows = self.queryset(request)
        for spec in self.filters:
            value = request.GET.get(spec.parameter)
            if value:
                rows = rows.filter(**{spec.field: value})
        text = request.GET.get(SEARCH_VAR, "").strip()
        if text:
            rows = self.search(rows, text)
        # Newest first by id only: any other order sorts every matching row.
        return rows.order_by("-id")

    # --- addresses (the admin's, so links and bookmarks keep working) ---

    def url_name(self, page: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{page}"

    def detail_url(self, obj: Any) -> str:
        return reverse(f"{self.site.name}:{self.url_name('change')}", args=[obj.id])

    def get_urls(self) -> list[URLPattern]:
        # Reading only: a POST (an edit, a bulk action) to any of them is refused (405).
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            return self.site.admin_view(require_safe(view))

        base = f"{self.opts.app_label}/{self.opts.model_name}"
        return [
            path(f"{base}/", wrap(self.list_view), name=self.url_name("changelist")),
            path(f"{base}/export.csv", wrap(self.export_view), name=self.url_name("export")),
            path(f"{base}/<int:object_id>/change/", wrap(self.detail_view), name=self.url_name("change")),
        ]

    def app_list_entry(self, request: HttpRequest) -> dict[str, Any] | None:
        """The page's line in the console's app index (the admin's shape), for those who may view it."""
        if not self.has_view_permission(request):
            return None
        return {
            "model": self.model,
            "name": capfirst(self.opts.verbose_name_plural),
            "object_name": self.opts.object_name,
            "perms": {"add": False, "change": False, "delete": False, "view": True},
            "admin_url": reverse(f"{self.site.name}:{self.url_name('changelist')}"),
            "add_url": None,
            "view_only": True,
        }

    # --- cells ---

    def label(self, name: str) -> str:
        return capfirst(str(self.opts.get_field(name).verbose_name))

    def cell(self, obj: Any, name: str) -> Any:
        """A column as the admin showed it (choices by their label, times localised)."""
        field = self.opts.get_field(name)
        if field.is_relation:
            value = getattr(obj, name)
            return display.EMPTY if value is None else str(value)
        return display_for_field(getattr(obj, field.attname), field, display.EMPTY)

    def export_value(self, obj: Any, name: str) -> Any:
        """A column as the export wrote it (the stored value; a related row by its name)."""
        field = self.opts.get_field(name)
        return getattr(obj, name) if field.is_relation else getattr(obj, field.attname)

    def detail_facts(self, obj: Any) -> list[tuple[str, Any]]:
        return [(self.label(name), self.cell(obj, name)) for name in self.detail_fields]

    # --- views ---

    def _query_string(self, request: HttpRequest, **changes: str | None) -> str:
        params = {k: v for k, v in request.GET.items() if k != PAGE_VAR}
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = value
        return "?" + urlencode(sorted(params.items())) if params else "?"

    def list_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        filters = [
            {
                "title": spec.title,
                "choices": [
                    {
                        "label": "All",
                        "url": self._query_string(request, **{spec.parameter: None}),
                        "selected": not request.GET.get(spec.parameter),
                    }
                ]
                + [
                    {
                        "label": label,
                        "url": self._query_string(request, **{spec.parameter: value}),
                        "selected": request.GET.get(spec.parameter) == value,
                    }
                    for value, label in spec.choices
                ],
            }
            for spec in self.filters
        ]
        try:
            rows = self.filtered(request)
        except LookupNotOffered as exc:
            return lookup_refused_response(request, exc, self.site)
        # Every list query planned for its filter's values, the template's too (it renders here).
        with sql.planned_per_call():
            paginator = CappedCountPaginator(rows, self.list_per_page)
            page = paginator.get_page(request.GET.get(PAGE_VAR))
            rows = [
                # Each cell with its column's name: the template classes it field-<name>, as
                # the admin's lists do, so the console's column rules (what may break where) apply.
                {"url": self.detail_url(obj), "cells": [(name, self.cell(obj, name)) for name in self.list_columns]}
                for obj in page.object_list
            ]
            context = {
                **self.site.each_context(request),
                "title": f"Select {self.opts.verbose_name} to view",
                "subtitle": None,
                "opts": self.opts,
                "columns": [self.label(name) for name in self.list_columns],
                "rows": rows,
                "page": page,
                "count": paginator.count,
                "capped": getattr(paginator, "capped", False),
                "previous_url": self._query_string(request, **{PAGE_VAR: str(page.number - 1)})
                if page.has_previous()
                else None,
                "next_url": self._query_string(request, **{PAGE_VAR: str(page.number + 1)})
                if page.has_next()
                else None,
                "filters": filters,
                "query": request.GET.get(SEARCH_VAR, ""),
                "hidden": [(k, v) for k, v in request.GET.items() if k not in (PAGE_VAR, SEARCH_VAR)],
                "search_help": self.search_help,
                "list_note": self.list_note,
                "can_export": can_export(request, self.model),
                "export_url": reverse(f"{self.site.name}:{self.url_name('export')}") + self._query_string(request),
            }
            response = TemplateResponse(request, "admin/onceguard/history_list.html", context)
            response.render()
        return response

    def detail_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"No {self.opts.verbose_name} with id {object_id} in your tenants.")
        context = {
            **self.site.each_context(request),
            "title": f"{capfirst(self.opts.verbose_name)} {obj}",
            "opts": self.opts,
            "obj": obj,
            "facts": self.detail_facts(obj),
            "operation_url": reverse(f"{self.site.name}:ledger_operation_change", args=[obj.operation_id]),
            "onceguard_payload": payload_panel_context(request, obj, self.site)
            if privacy.payload_fields_of(obj)
            else None,
        }
        return TemplateResponse(request, "admin/onceguard/history_detail.html", context)

    def export_view(self, request: HttpRequest) -> HttpResponse:
        """The current list — same filters, search and tenant scope — as CSV, logged."""
        if not (self.has_view_permission(request) and can_export(request, self.model)):
            raise PermissionDenied
        try:
            rows = self.filtered(request)
        except LookupNotOffered as exc:
            return lookup_refused_response(request, exc, self.site)
        return export_csv_response(
            request,
            model=self.model,
            rows=rows,
            columns=list(self.list_columns),
            labels=[self.label(name) for name in self.list_columns],
            value=self.export_value,
            written=self.export_written(request),
        )

    def export_written(self, request: HttpRequest) -> Callable[[Iterator[Any]], Iterator[Any]] | None:
        """What the export writes given the list's rows (None: those rows)."""
        return None


def _exact(*fields: str) -> Callable[[str], Q]:
    def matches(word: str) -> Q:
        q = Q()
        for field in fields:
            q |= Q(**{f"{field}__iexact": word})
        return q

    return matches


class AttemptPage(HistoryPage):
    model = Attempt
    list_columns = ("operation", "number", "outcome", "started_at", "finished_at", "error_class", "provider_ref")
    # Every field but the recorded response (masked: the payload panel) and the lease token
    # (the holder's credential for the attempt: nobody reads it here).
    detail_fields = (
        "operation",
        "number",
        "outcome",
        "started_at",
        "lease_expires_at",
        "sent_at",
        "finished_at",
        "error_class",
        "message",
        "provider_ref",
        "response_status",
        "execution_id",
        "duration_ms",
        "adapter_revision",
        "prompt_template",
    )
    filters = (
        ChoiceFilter("outcome__exact", "outcome", "outcome", AttemptOutcome.choices),
        ChoiceFilter("error_class", "error_class", "error class", ErrorClass.choices),
    )
    search_help = "A whole operation key, provider ref or execution id (any case)."
    word_matches = staticmethod(_exact("operation__key", "provider_ref", "execution_id"))

    def cell(self, obj: Any, name: str) -> Any:
        # Immutable configuration rows, named from the per-process caches (no query per row).
        if name == "adapter_revision":
            number = revisions.revision_number(obj.adapter_revision_id)
            return display.EMPTY if number is None else str(number)
        if name == "prompt_template":
            return prompts.prompt_template_label(obj.prompt_template_id) or display.EMPTY
        if name == "provider_ref":
            # A provider's reference is an id of any length: shortened, the full value on hover
            # and copied on click, as every console page shows a long id.
            return display.short_id(obj.provider_ref)
        return super().cell(obj, name)


class EventPage(HistoryPage):
    model = OperationEvent
    list_columns = ("operation", "from_status", "to_status", "actor", "reason", "at")
    detail_fields = ("operation", "from_status", "to_status", "actor", "reason", "attempt", "at")
    filters = (
        ChoiceFilter("to_status", "to_status", "to status", OperationStatus.choices),
        ChoiceFilter("from_status", "from_status", "from status", OperationStatus.choices),
    )
    search_help = "A whole operation key (any case), or part of an actor."
    # ADR 0024: a guard claim of a new key is kept on its operation row, not stored here.
    list_note = (
        "The claim that opened an operation through the guard or the claims API is kept on the operation"
        " itself: its page and this list's export show it; this list shows the moves after it."
    )

    def word_matches(self, word: str) -> Q:
        return Q(operation__key__iexact=word) | Q(actor__icontains=word)

    def export_written(self, request: HttpRequest) -> Callable[[Iterator[Any]], Iterator[Any]] | None:
        """The event rows and, among them by time (newest first, as the list), the guard
        claims kept on operation rows instead of an event row of their own (ADR 0024): the
        export lists every move the filters match, as it did when each claim was a row."""
        claims = self.claims_on_rows(request)
        if claims is None:
            return None

        def merged(stored: Iterator[Any]) -> Iterator[Any]:
            kept = (_claim_row(op) for op in claims.iterator(chunk_size=2000))
            return heapq.merge(stored, kept, key=lambda e: e.at, reverse=True)

        return merged

    def claims_on_rows(self, request: HttpRequest) -> QuerySet[Operation] | None:
        """The operations whose claim (kept on the row) the list's filters and search match,
        newest first; None when the filters exclude every claim ('' → claimed)."""
        to_status, from_status = request.GET.get("to_status"), request.GET.get("from_status")
        if from_status or (to_status and to_status != OperationStatus.CLAIMED):
            return None
        ops = scope_queryset(Operation.objects.filter(claim_actor__isnull=False), scope_of(request))
        for word in smart_split(request.GET.get(SEARCH_VAR, "").strip()):
            if word[:1] in "\"'" and word[-1:] == word[:1]:
                word = unescape_string_literal(word)
            ops = ops.filter(Q(key__iexact=word) | Q(claim_actor__icontains=word))
        return ops.defer("payload", "request", "response_body", "search_fields").order_by("-id")


def _claim_row(op: Operation) -> OperationEvent:
    # claims_on_rows reads rows that keep their claim: claim_event is never None for them.
    event = cast(OperationEvent, claim_event(op))
    event.operation = op
    return event


for page_class in (AttemptPage, EventPage):
    admin.site.register_history_page(page_class)
