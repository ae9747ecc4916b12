"""The console lists' rows, rendered as Django's admin renders them, with the work that is the
same for every row done once per page (docs/explanation/scale.md).

Django's ``items_for_result`` works per cell: for each row it reverses the change page's URL
and merges the list's filters into it (``add_preserved_filters`` parses the query string and
resolves the URL again), renders the selection checkbox through the form renderer's templates,
and hands the template one value per cell. At 100 rows a page that was ~150 ms of a list's
~250 ms at ten million rows, the same on small tables. Here the link is built once, with a
placeholder for the row's key, the checkbox is written as the widget writes it, and each row
reaches the template as one piece of HTML. The output is byte for byte Django's
(``tests/console/test_list_rendering.py`` renders both); anything this does not handle the same
way — an editable list, a custom checkbox or change list, a key that needs escaping in a URL —
goes through Django's own ``results``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any

from django.contrib.admin import ModelAdmin, helpers
from django.contrib.admin.templatetags.admin_list import (
    ResultList,
    result_headers,
    result_hidden_fields,
    results,
)
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import display_for_field, display_for_value, lookup_field, quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.urls import NoReverseMatch
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _

from ledger.web.console_base import OfferedLookupsChangeList
from ledger.web.display import escape, format_html
from ledger.web.pagination import CappedCountPaginator

# A key whose admin-quoted form reverse() would not escape further: its link is the template's.
_URL_SAFE = re.compile(r"^[A-Za-z0-9_.~-]+$")
_PLACEHOLDER = "0onceguardpk0"


def _stock_checkbox(model_admin: Any) -> bool:
    return getattr(type(model_admin), "action_checkbox", None) is ModelAdmin.action_checkbox


def _checkbox(obj: Any, label_format: str) -> str:
    # What CheckboxInput(attrs).render(ACTION_CHECKBOX_NAME, str(pk)) writes (Django's
    # input.html and attrs.html): type, name, value, then the attributes in their order.
    # ``label_format``: _("Select this object for an action - {}"), translated once a page.
    label = format_html(label_format, str(obj))
    return format_html(
        '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
        helpers.ACTION_CHECKBOX_NAME,
        str(obj.pk),
        label,
    )


class _Link:
    """The change page's URL of a row, the list's filters preserved: built once per page."""

    def __init__(self, cl: ChangeList) -> None:
        self.cl = cl
        self.template: str | None = None
        try:
            probe = cl.url_for_result(_Probe(cl))
        except NoReverseMatch:
            return
        url = add_preserved_filters({"preserved_filters": cl.preserved_filters, "opts": cl.opts}, probe)
        if url.count(_PLACEHOLDER) == 1:
            self.template = url

    def url(self, result: Any) -> str:
        """Raises NoReverseMatch as ``cl.url_for_result`` does."""
        pk = getattr(result, self.cl.pk_attname)
        quoted = str(quote(pk))  # reverse() writes each argument as str()
        if self.template is not None and _URL_SAFE.match(quoted):
            return self.template.replace(_PLACEHOLDER, quoted)
        url = self.cl.url_for_result(result)
        return add_preserved_filters({"preserved_filters": self.cl.preserved_filters, "opts": self.cl.opts}, url)


class _Probe:
    """Stands for a row when the URL is built once: its key is the placeholder."""

    def __init__(self, cl: ChangeList) -> None:
        setattr(self, cl.pk_attname, _PLACEHOLDER)


def _row(
    cl: ChangeList, result: Any, link: _Link, columns: list[tuple[Any, str, bool]], checkbox: str | None, empty: str
) -> str:
    """Django's ``items_for_result`` for a list without a form, as one string (its
    ``format_html`` calls written out: each argument escaped unless safe)."""
    out: list[str] = []
    first = True
    pk = cl.lookup_opts.pk.attname
    for field_name, field_class, link_to_changelist in columns:
        empty_value_display = empty
        row_classes = [field_class]
        if field_name == "action_checkbox" and checkbox is not None and not link_to_changelist:
            out.append(f'<td class="action-checkbox">{_checkbox(result, checkbox)}</td>')
            continue
        try:
            f, attr, value = lookup_field(field_name, result, cl.model_admin)
        except ObjectDoesNotExist:
            result_repr = empty_value_display
        else:
            empty_value_display = getattr(attr, "empty_value_display", empty_value_display)
            if isinstance(value, str) and value.strip() == "":
                value = ""
            if f is None or f.auto_created:
                if field_name == "action_checkbox":
                    row_classes = ["action-checkbox"]
                boolean = getattr(attr, "boolean", False)
                if isinstance(attr, property) and hasattr(attr, "fget"):
                    boolean = getattr(attr.fget, "boolean", False)
                result_repr = display_for_value(value, empty_value_display, boolean)
                if isinstance(value, (datetime.date, datetime.time)):
                    row_classes.append("nowrap")
            else:
                if isinstance(f.remote_field, models.ManyToOneRel):
                    field_val = getattr(result, f.name)
                    result_repr = empty_value_display if field_val is None else field_val
                else:
                    result_repr = display_for_field(value, f, empty_value_display, avoid_link=link_to_changelist)
                if isinstance(f, (models.DateField, models.TimeField, models.ForeignKey)):
                    row_classes.append("nowrap")
        row_class = ' class="{}"'.format(" ".join(row_classes))
        if link_to_changelist:
            table_tag = "th" if first else "td"
            first = False
            try:
                url = link.url(result)
            except NoReverseMatch:
                link_or_text = result_repr
            else:
                value = result.serializable_value(str(cl.to_field) if cl.to_field else pk)
                link_or_text = format_html(
                    '<a href="{}"{}>{}</a>',
                    url,
                    format_html(' data-popup-opener="{}"', value) if cl.is_popup else "",
                    result_repr,
                )
            out.append(f"<{table_tag}{row_class}>{escape(link_or_text)}</{table_tag}>")
        else:
            out.append(f"<td{row_class}>{escape(result_repr)}</td>")
    return mark_safe("".join(out))


def _columns(cl: ChangeList) -> list[tuple[Any, str, bool]]:
    def link_in_col(is_first: bool, field_name: Any) -> bool:
        if cl.list_display_links is None:
            return False
        if is_first and not cl.list_display_links:
            return True
        return field_name in cl.list_display_links

    columns = []
    first = True
    for index, name in enumerate(cl.list_display):
        linked = link_in_col(first, name)
        if linked:
            first = False
        columns.append((name, f"field-{_column_name(name, index)}", linked))
    return columns


def _column_name(name: Any, index: int) -> str:
    # The cell's class name as Django's admin_list writes it (a callable column by its
    # function's name, a lambda by its position); ours, not its private helper
    # (docs/adr/0004-private-framework-apis.md). test_list_rendering holds the HTML equal.
    if callable(name):
        return f"lambda{index}" if name.__name__ == "<lambda>" else name.__name__
    return str(name)


def fast_results(cl: ChangeList) -> Iterator[ResultList]:
    """Django's ``results(cl)``: each row one ResultList of one cell, the row's HTML."""
    if cl.formset:
        yield from results(cl)
        return
    link = _Link(cl)
    columns = _columns(cl)
    # The stock checkbox's label, translated once for the page (None: the admin's own checkbox).
    checkbox = _("Select this object for an action - {}") if _stock_checkbox(cl.model_admin) else None
    empty = cl.model_admin.get_empty_value_display()
    for result in cl.result_list:
        yield ResultList(None, [_row(cl, result, link, columns, checkbox, empty)])


def result_list(cl: ChangeList) -> dict[str, Any]:
    """Django's ``result_list`` context, its rows from ``fast_results``."""
    headers = list(result_headers(cl))
    return {
        "cl": cl,
        "result_hidden_fields": list(result_hidden_fields(cl)),
        "result_headers": headers,
        "num_sorted_fields": sum(1 for h in headers if h["sortable"] and h["sorted"]),
        "results": list(fast_results(cl)),
    }


class ConsoleChangeList(OfferedLookupsChangeList):
    """Django's ChangeList, whose first page is read before it is counted, answering only the
    lookups its list offers (ledger.web.console_base).

    Django counts a list, then reads the page: two scans of whatever the filter or the search
    reads (a substring search's trigram scan at ten million rows, ~0.1 s each). Here page one
    is read with one row more than a page: when that extra row is not there, the rows read
    are the count and the list is not counted again; when it is, the page is those rows and
    the count is the paginator's (capped, ``CappedCountPaginator``) as before. Other pages,
    "show all" and editable lists are Django's own."""

    def listed(self) -> Any:
        """The page's rows: ``self.queryset``, reading only the fields its columns show when the
        admin names them (``list_reads``). An operation's row with its tenant and provider is
        some 120 columns, a dozen of them JSON decoded per row; its list shows 15."""
        reads = getattr(self.model_admin, "list_reads", None)
        return self.queryset.only(*reads) if reads else self.queryset

    def get_results(self, request: Any) -> None:
        if self.show_all or self.list_editable or self.page_num != 1:
            # Django's own, over the rows as listed (a count ignores which fields are read).
            whole, self.queryset = self.queryset, self.listed()
            try:
                super().get_results(request)
            finally:
                self.queryset = whole
            return
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        if not isinstance(paginator, CappedCountPaginator):
            # Only ours can be told its count (docs/adr/0004-private-framework-apis.md).
            super().get_results(request)
            return
        head = list(self.listed()[: self.list_per_page + 1])
        if len(head) <= self.list_per_page:
            # What the paginator would have counted.
            paginator.known_count = len(head)
            paginator.capped = False
            result_count = len(head)
        else:
            result_count = paginator.count
            head = head[: self.list_per_page]
        full_result_count = self.root_queryset.count() if self.model_admin.show_full_result_count else None
        self.result_count = result_count
        self.show_full_result_count = self.model_admin.show_full_result_count
        self.show_admin_actions = not self.show_full_result_count or bool(full_result_count)
        self.full_result_count = full_result_count
        self.result_list = head
        self.can_show_all = result_count <= self.list_max_show_all
        self.multi_page = result_count > self.list_per_page
        self.paginator = paginator
