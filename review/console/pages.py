"""What every page of the console gets, whoever wrote it.

``ConsoleAdminMixin``, which the site (review.console.site) puts in front of every ModelAdmin:
payload columns never rendered (not in lists, forms, searches), flags and durations worded
(``worded_column``: yes/no, "30 days"), a masked payload panel with a reveal link on detail
pages (``payload_panel_context``), lists read before they are counted (review.console.listing),
and *Export CSV* of the filtered list (``export_csv_response``: an access-log row per tenant
first). The history pages (review.console.history_pages) and the object pages use the same
panel, export and permission checks.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import label_for_field, lookup_field
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.text import capfirst, slugify

from ledger.platform.errors import LookupNotOffered
from ledger.store import sql
from ledger.web import display
from ledger.web.console_base import lookup_refused_response
from ledger.web.pagination import CappedCountPaginator
from review.console.forms import DurationWordsField
from review.console.listing import ConsoleChangeList
from review.models import AccessAction
from review.privacy import payloads as privacy
from review.staff import security
from review.staff.tenancy import tenant_path

EXPORT_MAX_ROWS = 100_000


def _is_payloadish(name: Any, masked: tuple[str, ...]) -> bool:
    # Exact column names only: a ModelAdmin's own masked renderings (e.g. `payload_masked`)
    # stay; the raw columns never render.
    return isinstance(name, str) and name in masked


def _strip(names: Any, masked: tuple[str, ...]) -> list[Any]:
    return [n for n in (names or []) if not _is_payloadish(n, masked)]


def client_ip(request: HttpRequest) -> str | None:
    return security.client_ip(request)


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


class _Echo:
    def write(self, value: str) -> str:
        return value


class ConsoleAdminMixin:
    """Masking, payload panels and CSV export, for every ModelAdmin on the console site."""

    # No list counts a whole table (docs/explanation/scale.md): at most COUNT_CAP rows, "more than" past it.
    paginator = CappedCountPaginator

    def _masked(self) -> tuple[str, ...]:
        return privacy.payload_fields_of(self.model)  # type: ignore[attr-defined]

    # Payload columns are never rendered by the stock admin: not in lists, forms, searches.
    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return _strip(super().get_fields(request, obj), self._masked())  # type: ignore[misc]

    # Flags and durations shown read-only (declared read-only, or every field for a viewer
    # without the change permission) are rendered by their worded column, the one the lists
    # use (`worded_column`: yes/no, "30 days"), instead of the stock tick / cross and
    # "30 days, 0:00:00".
    def _readonly_worded(self, request: HttpRequest, obj: Any) -> set[str] | None:
        """Names of the worded fields this page shows read-only; None: every field is."""
        if obj is not None and not self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            return None
        declared = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        return {n for n in declared if wording_of(self.model, n) is not None}  # type: ignore[attr-defined]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        worded = self._readonly_worded(request, obj)

        def shown(name: Any) -> Any:
            if isinstance(name, str) and (worded is None or name in worded):
                return worded_column(self.model, name)  # type: ignore[attr-defined]
            return name

        out = []
        for name, opts in super().get_fieldsets(request, obj):  # type: ignore[misc]
            opts = dict(opts)
            opts["fields"] = [
                tuple(shown(n) for n in _strip(f, self._masked())) if isinstance(f, (list, tuple)) else shown(f)
                for f in opts.get("fields", [])
                if not _is_payloadish(f, self._masked())
            ]
            out.append((name, opts))
        return out

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        names = _strip(super().get_readonly_fields(request, obj), self._masked())  # type: ignore[misc]
        return [worded_column(self.model, n) for n in names]  # type: ignore[attr-defined]

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        base = list(super().get_exclude(request, obj) or [])  # type: ignore[misc]
        # A read-only worded field is shown by its column (above), never also as a form field.
        worded = sorted(self._readonly_worded(request, obj) or ())
        return base + [f for f in (*self._masked(), *worded) if f not in base]

    def formfield_for_dbfield(self, db_field: models.Field, request: HttpRequest, **kwargs: Any) -> Any:
        # Durations are typed as people say them ("30 days", "12 hours", "2 weeks").
        if isinstance(db_field, models.DurationField):
            kwargs.setdefault("form_class", DurationWordsField)
        return super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns = _strip(super().get_list_display(request), self._masked())  # type: ignore[misc]
        # Flags read a neutral "yes"/"no", durations "30 days" (see `worded_column`).
        return [worded_column(self.model, c) for c in columns]  # type: ignore[attr-defined]

    def get_search_fields(self, request: HttpRequest) -> list[Any]:
        return _strip(super().get_search_fields(request), self._masked())  # type: ignore[misc]

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        instances = super().get_inline_instances(request, obj)  # type: ignore[misc]
        for inline in instances:
            # Inlines here are read-only lists: their flags and durations read as everywhere.
            if any(wording_of(inline.model, n) for n in inline.readonly_fields):
                inline.readonly_fields = [worded_column(inline.model, n) for n in inline.readonly_fields]
                if inline.fields:
                    inline.fields = [worded_column(inline.model, n) for n in inline.fields]
            masked = privacy.payload_fields_of(inline.model)
            if masked:
                inline.exclude = list(inline.exclude or []) + list(masked)
                if inline.fields:
                    inline.fields = _strip(inline.fields, masked)
                inline.readonly_fields = _strip(inline.readonly_fields, masked)
        return instances

    # Detail pages: the masked payload panel, with a reveal link for those allowed.
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        if self._masked():
            obj = self.get_object(request, object_id)  # type: ignore[attr-defined]
            if obj is not None:
                panel = payload_panel_context(request, obj, self.admin_site)  # type: ignore[attr-defined]
                # An admin that renders its own masked view (e.g. the DLQ's `payload_masked`)
                # gets only the reveal row here, not a second copy of the shape.
                panel["compact"] = any("masked" in str(f) for f in self.get_readonly_fields(request, obj))
                extra_context["onceguard_payload"] = panel
        return super().change_view(request, object_id, form_url, extra_context)  # type: ignore[misc]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        # Page one read before it is counted; a list shorter than a page is not counted again.
        return ConsoleChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = dict(extra_context or {})
        extra_context["onceguard_can_export"] = can_export(request, self.model)  # type: ignore[attr-defined]
        if request.method != "GET":
            return super().changelist_view(request, extra_context)  # type: ignore[misc]
        # Every list query planned for its filter's values (ledger.store.sql.planned_per_call), the
        # template's too (it queries while rendering): rendered inside, not after the view.
        # Serial, as the front page: a list reads a page. At ten million rows the planner gave the
        # open-state lists (status=review, needs=stuck, needs=cancellable) parallel plans whose
        # workers took 36–51 ms to start for under 1 ms of work each (EXPLAIN ANALYZE,
        # bench/results/scale-10M.md, fill version 10): the row's own state beside the mirror's
        # makes it expect a handful of rows where a page's are there to be read.
        with sql.planned_per_call(serial=True):
            response = super().changelist_view(request, extra_context)  # type: ignore[misc]
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def get_urls(self) -> list[Any]:
        info = self.model._meta.app_label, self.model._meta.model_name  # type: ignore[attr-defined]
        extra = [
            path(
                "export.csv",
                self.admin_site.admin_view(self.export_csv_view),  # type: ignore[attr-defined]
                name="{}_{}_export".format(*info),
            )
        ]
        return extra + super().get_urls()  # type: ignore[misc]

    def export_columns(self, request: HttpRequest) -> list[str]:
        # This mixin sits in front of the page's own class (OnceguardAdminSite.register): a page
        # that declares its export's columns is asked first.
        declared = getattr(super(), "export_columns", None)
        if declared is not None:
            return declared(request)
        worded = set(_COLUMNS.values())
        return [
            c if isinstance(c, str) else c.__name__
            for c in self.get_list_display(request)
            if c != "action_checkbox" and (isinstance(c, str) or c in worded)
        ]

    def export_csv_view(self, request: HttpRequest) -> HttpResponse:
        """The current list — same filters, search and tenant scope — as CSV."""
        if not (self.has_view_permission(request) and can_export(request, self.model)):  # type: ignore[attr-defined]
            raise PermissionDenied
        columns = self.export_columns(request)

        def value(obj: Any, column: str) -> Any:
            try:
                return lookup_field(column, obj, self)[2]
            except Exception:  # a broken column must not stop the export
                return ""

        # Every row the filter and search match, whichever page of the list the link was on
        # (a page past the end would stop the change list before its rows are read).
        request.GET = request.GET.copy()
        request.GET.pop(PAGE_VAR, None)
        try:
            rows = self.get_changelist_instance(request).queryset  # type: ignore[attr-defined]
        except LookupNotOffered as exc:
            # The export refuses what its list refuses: never a file filtered by it.
            return lookup_refused_response(request, exc, self.admin_site)  # type: ignore[attr-defined]
        return export_csv_response(
            request,
            model=self.model,  # type: ignore[attr-defined]
            rows=rows,
            columns=columns,
            labels=[str(label_for(c, self.model, self)) for c in columns],  # type: ignore[attr-defined]
            value=value,
        )


def export_csv_response(
    request: HttpRequest,
    *,
    model: type[models.Model],
    rows: models.QuerySet[Any],
    columns: list[str],
    labels: list[str],
    value: Callable[[Any, str], Any],
    written: Callable[[Iterator[Any]], Iterator[Any]] | None = None,
) -> HttpResponse:
    """A console list as CSV, for every list of the console (ModelAdmins and the history
    pages): first one access-log row per tenant in it (action ``export``, the filters and the
    columns), then at most EXPORT_MAX_ROWS rows streamed, each cell ``value(row, column)``.
    ``written``: the rows to write given ``rows``' own, in order (the events list adds the
    claims kept on operation rows, ADR 0024); at most EXPORT_MAX_ROWS of them are written."""
    path_ = tenant_path(model)
    if path_ is not None:
        tenant_ids = sorted(set(rows.order_by().values_list(path_, flat=True).distinct()[:1000]))
        filters = {k: v for k, v in request.GET.items()}
        for tenant_id in tenant_ids:
            if tenant_id is None:
                continue
            privacy.accesslog_append(
                tenant_id=tenant_id,
                action=AccessAction.EXPORT,
                actor=actor_of(request),
                user_id=request.user.pk,
                object_type=model._meta.label_lower,
                object_id="",
                object_ref=json.dumps(filters, sort_keys=True)[:255],
                fields=columns,
                reason="CSV export of the filtered list",
                ip=client_ip(request),
            )

    def lines() -> Iterator[str]:
        writer = csv.writer(_Echo())
        yield writer.writerow(labels)
        stored = rows[:EXPORT_MAX_ROWS].iterator(chunk_size=2000)
        for obj in itertools.islice(stored if written is None else written(stored), EXPORT_MAX_ROWS):
            yield writer.writerow([display.csv_cell(value(obj, column)) for column in columns])

    name = slugify(str(model._meta.verbose_name_plural))
    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    response["Cache-Control"] = "no-store"
    return response


# Fields the console words itself instead of the stock admin rendering: a flag is a neutral
# yes/no (the stock green tick / red cross says "good" or "bad" of a flag like "legal hold" or
# "forced", which is neither), a duration reads "30 days" (not "30 days, 0:00:00").
_WORDINGS: tuple[tuple[type[models.Field], Callable[[Any], str]], ...] = (
    (models.BooleanField, display.yes_no),
    (models.DurationField, partial(display.duration_words, exact=True)),
)
_COLUMNS: dict[tuple[str, str], Any] = {}


def wording_of(model: type[models.Model], name: Any) -> Callable[[Any], str] | None:
    """How the console words the field ``name`` of ``model``; None: the stock way."""
    if not isinstance(name, str):
        return None
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    return next((words for kind, words in _WORDINGS if isinstance(field, kind)), None)


def worded_column(model: type[models.Model], name: Any) -> Any:
    """``name`` itself, or for a field the console words its own way (a flag, a duration) a
    column showing it so. The column keeps the field's name (``__name__``: the CSS class and
    the help text of a detail page's row), its label and its sort order."""
    words = wording_of(model, name)
    if words is None:
        return name
    field = model._meta.get_field(name)
    key = (model._meta.label_lower, name)
    if key not in _COLUMNS:

        def column(obj: Any) -> str:
            value = getattr(obj, name)
            return display.EMPTY if value is None else words(value)

        column.short_description = field.verbose_name  # type: ignore[attr-defined]
        column.admin_order_field = name  # type: ignore[attr-defined]
        column.__name__ = name
        _COLUMNS[key] = column
    return _COLUMNS[key]


def label_for(name: str, model: type[models.Model], model_admin: Any) -> str:
    try:
        return capfirst(str(label_for_field(name, model, model_admin)))
    except Exception:
        return name


def can_export(request: HttpRequest, model: type[models.Model]) -> bool:
    return request.user.has_perm("review.export_data")


def can_reveal(request: HttpRequest) -> bool:
    return request.user.has_perm("review.view_payload")


def payload_panel_context(request: HttpRequest, obj: models.Model, site: admin.AdminSite) -> dict[str, Any]:
    states = [privacy.payload_state(obj, f) for f in privacy.payload_fields_of(obj)]
    states = [s for s in states if s.state != "empty"]
    reveal_url = None
    if any(s.state in ("sealed", "plain") for s in states):
        opts = obj._meta
        reveal_url = reverse(
            f"{site.name}:onceguard_reveal", args=[opts.app_label, opts.model_name, privacy.object_id_of(obj)]
        )
    return {
        "states": states,
        "can_reveal": can_reveal(request),
        "reveal_url": reveal_url,
        "search_fields": getattr(obj, "search_fields", None)
        if isinstance(getattr(obj, "search_fields", None), dict)
        else None,
    }
