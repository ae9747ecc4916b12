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
ModelAdmins of other packages (auth, django-q) when it registers them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib import admin
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
from django.core.paginator import InvalidPage
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ledger.errors import LookupNotOffered
from ledger.storable import EARLIEST, LATEST

# Django's own parameters of a change list (never lookups on the model).
LIST_PARAMETERS = frozenset(
    {ALL_VAR, ORDER_VAR, SEARCH_VAR, PAGE_VAR, ERROR_FLAG, IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR}
)

# A drill-down year inside the window every stored time lies in (ledger.storable): its
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


class ConsoleAdmin(ConsoleLookupsMixin, admin.ModelAdmin):
    """The base of every console ModelAdmin (module docstring)."""


class ConsoleReadOnlyAdmin(ReadOnlyPermissions, ConsoleAdmin):
    """A console page over rows only services write: no add, change, delete or bulk delete."""

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


__all__ = [
    "ConsoleAdmin",
    "ConsoleLookupsMixin",
    "ConsoleReadOnlyAdmin",
    "LookupNotOffered",
    "OfferedLookupsChangeList",
    "ReadOnlyPermissions",
    "drill_down_problem",
    "lookup_refused_response",
    "unoffered_parameters",
]
