"""The base of every console page: a list answers only the lookups it offers (DESIGN §8, *Console lists*).

Django's admin applies any query-string lookup on any field of a model to its list unless told
otherwise (``?callback_secret__startswith=a`` narrowed the tenants list to those whose secret
starts with ``a``, one character at a time), and it hands the values of lookups it does not
understand to the database (``__year=99999``, ``__regex=(``), which answers 500. Here a list
offers exactly:

- the parameters of its list filters (what each filter itself takes: ``status__exact``,
  ``tenant__id__exact``, ``created_at__gte``, a SimpleListFilter's ``parameter_name`` …);
- its date drill-down (``<date_hierarchy>__year``/``__month``/``__day``), years in range;
- Django's own list parameters: search ``q``, ordering ``o``, page ``p``, ``all``, the
  popup's ``_popup``/``_to_field``, ``_facets`` and the error flag ``e``.

Anything else is refused with a 400 page before the list is read, and so are values an
offered lookup cannot take (a page of the list is never filtered by what it did not offer).
CSV exports read the same change list, so they refuse the same way. Pages that are not
ModelAdmins (the history pages) call :func:`unoffered_parameters` with their own filters.

``ConsoleAdmin`` and ``ConsoleReadOnlyAdmin`` are the classes every console ModelAdmin
derives from; the console's site (review.console) mixes ``ConsoleLookupsMixin`` into the
ModelAdmins of other packages (auth, django-q) when it registers them. ``ServiceSaveAdmin``
is the page whose saves call the object's configuration service (ADR 0006), and
``ConsoleJSONField`` the JSON box that refuses what could not be stored.

Below them, what the pages of every app (the ledger's ``ledger.web.console``, dlq, review,
alerts) share: ``ReadOnlyPermissions`` and ``ReadOnlyInline`` for rows only services write,
``TenantInlineFormSet``, the https default of URL forms (``HTTPS_URL_FORMS``,
``https_url_formfield``), the tenant column (``TenantColumnMixin``), a search box answered by
a selector (``SelectorSearchMixin``), ``may_view``, ``attempts_with_labels`` and ``pending_message``
(what an action says when its re-send waits for four-eyes approval, ADR 0013).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import (
    ALL_VAR,
    ERROR_FLAG,
    IS_FACETS_VAR,
    IS_POPUP_VAR,
    ORDER_VAR,
    PAGE_VAR,
    SEARCH_VAR,
    TO_FIELD_VAR,
    ChangeList,
)
from django.core.exceptions import ValidationError
from django.core.paginator import InvalidPage
from django.db import models
from django.db.models import QuerySet, URLField
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledger.models import Attempt, Tenant
from ledger.platform.errors import DomainError, LookupNotOffered
from ledger.platform.storable import EARLIEST, LATEST, json_problem, nul_problem
from ledger.protocol import approvals
from ledger.providers import prompts, revisions
from ledger.web.pagination import CappedCountPaginator

# Django's own parameters of a change list (never lookups on the model).
LIST_PARAMETERS = frozenset(
    {ALL_VAR, ORDER_VAR, SEARCH_VAR, PAGE_VAR, ERROR_FLAG, IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR}
)

# A drill-down year inside the window every stored time lies in (ledger.platform.storable): its
# bounds, a year later, stay a datetime in every time zone.
FIRST_YEAR, LAST_YEAR = EARLIEST.year, LATEST.year


class ReadOnlyPermissions:
    """No add, no change, no delete — not even for a superuser: rows only services write
    (each write leaves its event). The one declaration of it, for every app's console pages,
    ModelAdmins and inlines alike; viewing stays with the user's view permission."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def drill_down_problem(params: dict[str, list[str]], field: str) -> str | None:
    """Why the date drill-down's ``<field>__year/__month/__day`` cannot be answered, or None.
    Django turns them into a range with ``datetime(year + 1, …)``: year 9999 overflows."""
    year, month, day = (params.get(f"{field}__{part}") for part in ("year", "month", "day"))
    if year is None:
        return None
    try:
        y = int(year[-1])
        m = int(month[-1]) if month is not None else 1
        d = int(day[-1]) if day is not None else 1
        datetime(y, m, d)
    except (ValueError, OverflowError):
        return "The date drill-down takes a year, month and day that exist."
    if not FIRST_YEAR <= y <= LAST_YEAR:
        return f"The date drill-down takes years from {FIRST_YEAR} to {LAST_YEAR}."
    return None


def unoffered_parameters(params: Iterable[str], offered: Iterable[str]) -> list[str]:
    """The names in ``params`` that are neither one of ``offered`` nor Django's own list
    parameters, sorted (for the history pages, whose filters are their own)."""
    allowed = LIST_PARAMETERS | set(offered)
    return sorted(set(params) - allowed)


class OfferedLookupsChangeList(ChangeList):
    """Django's ChangeList, refusing every query-string lookup its filters did not take."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        # An older search window (ADR 0026) is taken off the query before the list reads it
        # (SelectorSearchMixin.changelist_view); its page links carry it again, so page 2 of
        # an older window is that window's, not the newest one's. A new search, a filter or a
        # sort starts from the newest window.
        self.search_older_than = getattr(request, "search_older_than", None)
        super().__init__(request, *args, **kwargs)

    def get_query_string(self, new_params: dict[str, Any] | None = None, remove: list[str] | None = None) -> str:
        if new_params and PAGE_VAR in new_params and self.search_older_than is not None:
            new_params = {**new_params, SEARCH_OLDER_VAR: str(self.search_older_than)}
        return super().get_query_string(new_params, remove)

    def get_filters(self, request: HttpRequest) -> Any:
        raw = self.get_filters_params()
        if self.date_hierarchy:
            problem = drill_down_problem(raw, self.date_hierarchy)
            if problem is not None:
                raise LookupNotOffered(problem)
        result = super().get_filters(request)
        # What no filter took is left (Django would filter the list by it). The drill-down's
        # own range (datetimes, not text from the address) is the one thing added there.
        remaining = result[2]
        generated = {f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"} if self.date_hierarchy else set()
        unoffered = sorted(
            name
            for name, values in remaining.items()
            if not (name in generated and all(isinstance(v, datetime) for v in values))
        )
        if unoffered:
            raise LookupNotOffered(f"This list does not filter by {', '.join(unoffered)[:200]}.")
        return result


class ConsoleLookupsMixin:
    """A list that answers only the lookups it offers; refusals are a 400 page."""

    onceguard_lookups = True

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return OfferedLookupsChangeList

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        try:
            return super().get_changelist_instance(request)  # type: ignore[misc]
        except LookupNotOffered:
            raise
        except DisallowedModelAdminLookup as exc:
            raise LookupNotOffered(f"This list does not offer that lookup: {exc}"[:300]) from exc
        except IncorrectLookupParameters as exc:
            # A page past the end: Django's own answer (back to page one), as for any list.
            if isinstance(exc.__context__, InvalidPage):
                raise
            raise LookupNotOffered("A filter of this list was given a value it cannot take.") from exc

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        try:
            return super().changelist_view(request, extra_context)  # type: ignore[misc]
        except LookupNotOffered as exc:
            return lookup_refused_response(request, exc, self.admin_site)  # type: ignore[attr-defined]


def lookup_refused_response(request: HttpRequest, exc: LookupNotOffered, site: Any = None) -> HttpResponse:
    """The console's 400 page for a refused lookup, in the console's look (templates/400.html)."""
    context: dict[str, Any] = {"title": exc.title, "reason": exc.detail, "code": exc.code}
    user = getattr(request, "user", None)
    if site is not None and user is not None and user.is_authenticated and user.is_staff:
        context.update(site.each_context(request))
    response = TemplateResponse(request, "400.html", context, status=exc.status)
    response["Cache-Control"] = "no-store"
    return response


# Deeper than any configuration a person types (headers, pointers, slots, filters); far below
# the API's MAX_JSON_DEPTH, so a form and its error page never walk further.
MAX_FORM_JSON_DEPTH = 32
# What every reader of a stored number holds (PostgreSQL bigint, n8n's and JavaScript's
# readers at most lose precision, never overflow).
MAX_FORM_JSON_INT = 2**63 - 1


class _NotJson(str):
    """Text typed into a JSON box that is not a value the service can store: shown back as typed."""


def _number_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def form_json_problem(value: Any) -> str | None:
    """Why a JSON value typed into a console form cannot be stored, or None: non-finite numbers
    (``NaN``, ``Infinity``, ``1e309``), integers past 64 bits, NUL, lone surrogates, nesting
    deeper than MAX_FORM_JSON_DEPTH. Walked without recursion."""
    problem = json_problem(value) or nul_problem(value)
    if problem is not None:
        return problem
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_FORM_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_FORM_JSON_DEPTH} levels."
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_FORM_JSON_INT:
            return "JSON integers must fit in 64 bits."
    return None


class ConsoleJSONField(forms.JSONField):
    """Django's JSON form field, refusing as form errors what it would pass on to fail later
    (a 500): ``NaN``/``Infinity`` and ``1e309`` (which ``json.loads`` accepts), integers too
    long to parse or store, nesting deep enough to exhaust the parser (form_json_problem)."""

    @staticmethod
    def _loads(text: str) -> Any:
        try:
            value = json.loads(text, parse_constant=_number_constant)
        except (ValueError, RecursionError):
            # JSONDecodeError, a constant above, the interpreter's 4,300-digit cap on integers.
            return _NotJson(text)
        return _NotJson(text) if form_json_problem(value) is not None else value

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            value = json.loads(value, parse_constant=_number_constant)
        except RecursionError:
            raise ValidationError(f"JSON nested deeper than {MAX_FORM_JSON_DEPTH} levels.", code="invalid") from None
        except ValueError as exc:
            message = "Enter a valid JSON (numbers finite, integers of at most 64 bits)."
            raise ValidationError(message, code="invalid", params={"value": str(exc)[:80]}) from None
        problem = form_json_problem(value)
        if problem is not None:
            raise ValidationError(problem, code="invalid")
        return value

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Django re-parses what was typed to render it back; a value it cannot hold is shown as typed.
        if self.disabled:
            return initial
        if data is None:
            return None
        loaded = self._loads(data)
        return forms.fields.InvalidJSONInput(data) if isinstance(loaded, _NotJson) else loaded


class ConsoleAdmin(ConsoleLookupsMixin, admin.ModelAdmin):
    """The base of every console ModelAdmin (module docstring)."""

    def formfield_for_dbfield(self, db_field: models.Field, request: HttpRequest, **kwargs: Any) -> Any:
        # JSON typed into a console form is checked for what storing and showing it needs.
        if isinstance(db_field, models.JSONField):
            kwargs.setdefault("form_class", ConsoleJSONField)
        return super().formfield_for_dbfield(db_field, request, **kwargs)


class ConsoleReadOnlyAdmin(ReadOnlyPermissions, ConsoleAdmin):
    """A console page over rows only services write: no add, change, delete or bulk delete."""

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


class ServiceSaveAdmin(ConsoleAdmin):
    """A console page whose saves go through the object's configuration service (ADR 0006):
    ``save_model`` calls the same function the management command and the API call, which
    checks, seals, writes and records the ConfigChange row in one transaction. The console's
    own trail mixin (review.audit.changes) therefore records nothing for these saves; deletes it
    still records.

    The form shows the service's refusals as field errors before anything is written (its
    ``clean`` runs the same checks); a refusal the service raises only at save time (a row
    changed between the form's check and the save) rolls the whole save back and is shown as
    the page's message — never a 500."""

    config_change_by_service = True
    # The fields the service finds a row by (tenant and slug or name): read-only once the row
    # exists, since a rename through the service would make a second object.
    service_keys: tuple[str, ...] = ()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if obj is None:
            return fields
        return [*(key for key in self.service_keys if key not in fields), *fields]

    @staticmethod
    def actor_of(request: HttpRequest) -> str:
        return f"user:{request.user.get_username()}"

    @staticmethod
    def adopt(obj: models.Model, saved: models.Model) -> None:
        """After ``save_model`` called the service: the admin's log entry, message and
        redirect name the row the service wrote."""
        obj.pk = saved.pk
        obj.refresh_from_db()

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except DomainError as exc:
            # The admin's own atomic block has rolled the save back by now.
            messages.error(request, f"Nothing changed: {exc.detail}")
            return HttpResponseRedirect(request.get_full_path())


# --- Shared by every app's console pages (dlq, review, alerts use these too) ---


# Forms of models with a URL: an address typed without a scheme is https (Django 6's default;
# 5.2 assumes http and warns), for the provider, replay target, n8n connection and alert channel.
HTTPS_URL_FORMS: dict[Any, dict[str, Any]] = {URLField: {"assume_scheme": "https"}}


def https_url_formfield(db_field: Any, **kwargs: Any) -> forms.Field | None:
    """A ModelForm's ``Meta.formfield_callback`` for the same rule (the form's own fields are
    built when its class is, before the admin's ``formfield_overrides`` apply)."""
    if isinstance(db_field, URLField):
        kwargs.setdefault("assume_scheme", "https")
    return db_field.formfield(**kwargs)


class ReadOnlyInline(ReadOnlyPermissions, admin.TabularInline):
    extra = 0
    can_delete = False


class TenantInlineFormSet(BaseInlineFormSet):
    """A parent's rows read by its tenant as well as its id: Citus routes a statement to one
    node by tenant_id (DESIGN §12)."""

    def __init__(self, *args: Any, instance: Any = None, queryset: Any = None, **kwargs: Any) -> None:
        if instance is not None and instance.pk is not None and queryset is not None:
            queryset = queryset.filter(tenant_id=instance.tenant_id)
        super().__init__(*args, instance=instance, queryset=queryset, **kwargs)


def attempts_with_labels(rows: Iterable[Attempt]) -> list[Attempt]:
    """Attempts for a console table, each with ``revision_label`` (its adapter revision's
    number) and ``prompt_label`` (``name@version`` of its prompt template): read from the
    per-process caches of those immutable rows, no query per attempt."""
    attempts = list(rows)
    for attempt in attempts:
        attempt.revision_label = revisions.revision_number(attempt.adapter_revision_id)  # type: ignore[attr-defined]
        attempt.prompt_label = prompts.prompt_template_label(attempt.prompt_template_id)  # type: ignore[attr-defined]
    return attempts


def may_view(request: HttpRequest, model: type[Any]) -> bool:
    """Whether the user may read ``model``'s rows in the console: its view (or change)
    permission, as the admin decides for a model's pages and inlines. The history tables'
    pages (review.console.history_pages) and the operation page's attempts and events sections ask it."""
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or request.user.has_perm(
        f"{opts.app_label}.change_{opts.model_name}"
    )


def shows_tenant(model_admin: Any, request: HttpRequest) -> bool:
    """A tenant column only for someone who sees more than one tenant."""
    scope_of = getattr(model_admin, "tenant_scope", None)
    scope = scope_of(request) if scope_of is not None else None
    if scope is None:
        # Counted once a request: a list asks for its columns more than once.
        if not hasattr(request, "_onceguard_tenants_counted"):
            request._onceguard_tenants_counted = Tenant.objects.count()  # type: ignore[attr-defined]
        return request._onceguard_tenants_counted > 1  # type: ignore[attr-defined]
    return len(scope) > 1


class TenantColumnMixin:
    """A tenant column, at ``tenant_column_at`` in the list, only for someone who sees more than
    one tenant (shows_tenant): the one declaration of it for every app's lists."""

    tenant_column_at = 1

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns = list(super().get_list_display(request))  # type: ignore[misc]
        if shows_tenant(self, request):
            columns.insert(self.tenant_column_at, "tenant")
        return columns


class SelectorSearchMixin:
    """The list's search box answered by a selector, ``list_search(rows, text)`` (substring
    search over the columns written once: ledger and dlq selectors), not the stock search."""

    list_search: Callable[[QuerySet[Any], str], QuerySet[Any]]

    # Whether list_search takes the user's tenants (a whole key is looked up among them).
    list_search_scoped = False
    # Whether list_search takes ``enough``: the rows up to the page shown (and one more, which
    # says there is a next page), so that it can stop reading matches there (ADR 0018).
    list_search_paged = False
    # The search window of a common text (ADR 0026): ``list_search_window(text, tenant_ids=,
    # below=)`` gives list_search its ``window``; None: every match is read.
    list_search_window: Callable[..., Any] | None = None

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # "Search older" (ADR 0026) is not a lookup of the list: taken off the query before
        # the change list reads it as one.
        if SEARCH_OLDER_VAR in request.GET:
            request.GET = request.GET.copy()
            older = request.GET.pop(SEARCH_OLDER_VAR)[-1]
            request.search_older_than = int(older) if older.isdigit() and len(older) <= 18 else None  # type: ignore[attr-defined]
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        options: dict[str, Any] = {}
        if self.list_search_scoped:
            scope_of = getattr(self, "tenant_scope", None)
            options["tenant_ids"] = scope_of(request) if scope_of is not None else None
        if self.list_search_paged:
            try:
                page = max(1, int(request.GET.get(PAGE_VAR, 1)))
            except ValueError:
                page = 1
            options["enough"] = page * getattr(self, "list_per_page", 100) + 1
            if search_term.strip():
                # The count of a search is of the matches read (the pages up to this one and
                # one more row): the paginator says "more than" when it reached them.
                request.search_read_up_to = options["enough"]  # type: ignore[attr-defined]
        window_of = type(self).list_search_window
        if window_of is not None and search_term.strip():
            window = window_of(
                search_term,
                tenant_ids=options.get("tenant_ids"),
                below=getattr(request, "search_older_than", None),
            )
            if window is not None:
                options["window"] = window
                _say_search_window(request, search_term, window)
        return type(self).list_search(queryset, search_term, **options), False

    def get_paginator(self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any) -> Any:
        paginator = super().get_paginator(request, queryset, per_page, *args, **kwargs)  # type: ignore[misc]
        read_up_to = getattr(request, "search_read_up_to", None)
        if read_up_to is not None and isinstance(paginator, CappedCountPaginator):
            paginator.read_up_to = read_up_to
        return paginator


# The query parameter of a common text's next, older search window (ADR 0026).
SEARCH_OLDER_VAR = "older_than"


def _say_search_window(request: HttpRequest, text: str, window: Any) -> None:
    """Tells the reader that a common text was searched in the newest operations only, and
    links the next, older window (the same query, ``older_than`` its floor)."""
    where = f"operations below #{window.below:,}" if window.below is not None else "the newest operations"
    if window.floor is None:
        messages.info(request, f"“{text}” is a common text: searched {where}, down to the oldest.")
        return
    query = request.GET.copy()
    query[SEARCH_OLDER_VAR] = str(window.floor)
    query.pop(PAGE_VAR, None)
    messages.info(
        request,
        format_html(
            "“{}” is a common text: its identifier matches were searched in {} from #{} on only"
            " (error texts and workflow names were searched in every operation). For older matches narrow the"
            ' text, or <a href="?{}">search older operations</a>.',
            text,
            where,
            f"{window.floor:,}",
            query.urlencode(),
        ),
    )


__all__ = [
    "HTTPS_URL_FORMS",
    "ConsoleAdmin",
    "ConsoleJSONField",
    "ConsoleLookupsMixin",
    "ConsoleReadOnlyAdmin",
    "LookupNotOffered",
    "OfferedLookupsChangeList",
    "ReadOnlyInline",
    "ReadOnlyPermissions",
    "SEARCH_OLDER_VAR",
    "SelectorSearchMixin",
    "ServiceSaveAdmin",
    "TenantColumnMixin",
    "TenantInlineFormSet",
    "attempts_with_labels",
    "drill_down_problem",
    "https_url_formfield",
    "lookup_refused_response",
    "may_view",
    "shows_tenant",
    "unoffered_parameters",
]


def pending_message(pending: approvals.ApprovalPending) -> SafeString:
    """What a console action says when its re-send waits for a second person."""
    request = pending.request
    return format_html(
        'Not sent: this re-send needs a second person\'s approval. <a href="{}">Request #{}</a> waits for someone'
        " with the right to approve it (until {}).",
        reverse("admin:ledger_approvalrequest_decide", args=[request.pk]),
        request.pk,
        request.expires_at.strftime("%Y-%m-%d %H:%M UTC"),
    )
