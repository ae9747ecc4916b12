"""The console's admin site: every ModelAdmin registered on it is tenant-scoped and
payload-masked, whoever wrote it; plus the dashboard, reveal, data-subject search and CSV
exports.

``OnceguardAdminSite.register`` puts three mixins in front of every ModelAdmin class:
``TenantScopedAdminMixin`` (review.staff.tenancy: rows of the user's tenants only),
``ConfigChangeAdminMixin`` (review.audit.changes: saves of configuration leave a ConfigChange row)
and ``ConsoleAdminMixin`` (below: payload columns never rendered, a masked payload panel with
a reveal link on detail pages, CSV export of the filtered list).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.admin.utils import label_for_field, lookup_field
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, ValidationError
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from django.utils.text import capfirst, slugify

from dlq.models import FailedEvent
from ledger.models import Operation, Tenant
from ledger.platform.errors import DomainError, LookupNotOffered
from ledger.store import sql
from ledger.web import display
from ledger.web.console_base import ConsoleLookupsMixin, lookup_refused_response
from ledger.web.pagination import CappedCountPaginator
from review.audit.changes import ConfigChangeAdminMixin
from review.console.listing import ConsoleChangeList
from review.console.n8n_audit_pages import n8n_audit_page
from review.console.round import console_round
from review.console.run_pages import run_page
from review.console.selectors import CHART_SERIES, attention_now, dashboard_numbers, provider_activity
from review.console.subject_pages import subject_trail_page
from review.models import AccessAction
from review.privacy import payloads as privacy
from review.staff import security
from review.staff.tenancy import object_tenant_id, scope_of, scoped_admin_class, tenant_path

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
        with sql.planned_per_call():
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
) -> HttpResponse:
    """A console list as CSV, for every list of the console (ModelAdmins and the history
    pages): first one access-log row per tenant in it (action ``export``, the filters and the
    columns), then at most EXPORT_MAX_ROWS rows streamed, each cell ``value(row, column)``."""
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
        for obj in rows[:EXPORT_MAX_ROWS].iterator(chunk_size=2000):
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


# --- Forms -----------------------------------------------------------------------------------------


class DurationWordsField(forms.DurationField):
    """A duration typed as people say it ("30 days", "12 hours", "90d", "2 weeks", "1 day 12 h",
    a plain number of days; ledger.web.display.duration_parse) and shown back the same way, every
    unit kept ("30 days"), so that saving an unchanged form changes nothing."""

    default_error_messages = {"invalid": f"Enter a duration such as {display.DURATION_HELP}."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.widget.attrs.setdefault("placeholder", "e.g. 30 days")

    def prepare_value(self, value: Any) -> Any:
        return display.duration_words(value, exact=True) if isinstance(value, timedelta) else value

    def to_python(self, value: Any) -> timedelta | None:
        if value in self.empty_values:
            return None
        if isinstance(value, timedelta):
            return value
        try:
            return display.duration_parse(str(value))
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from None


class RevealForm(forms.Form):
    fields_wanted = forms.MultipleChoiceField(
        label="Fields", widget=forms.CheckboxSelectMultiple, required=True, choices=()
    )
    reason = forms.CharField(
        label="Reason",
        min_length=privacy.MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "e.g. Ticket OPS-142: customer asks why the lead was not created"}
        ),
        help_text="Required. Logged with your name, the time and your address; auditors read it.",
    )

    def __init__(self, *args: Any, choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["fields_wanted"].choices = choices
        self.fields["fields_wanted"].initial = [c for c, _ in choices]


class SubjectSearchForm(forms.Form):
    phone = forms.CharField(required=False, max_length=40, label="Phone number")
    email = forms.CharField(required=False, max_length=254, label="Email address")
    reason = forms.CharField(
        min_length=privacy.MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "e.g. Access request #2291 under APP 12"}),
        help_text="Required: a search about a person is logged like a reveal.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not data.get("phone") and not data.get("email"):
            raise ValidationError("Give a phone number or an email address.")
        return data


class ThrottledAuthenticationForm(AdminAuthenticationForm):
    """The admin login, refusing attempts while this username from this address, or this
    address, is locked out (review.staff.security: nobody locks an account out from elsewhere)."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        ip = security.client_ip(self.request)
        if security.login_locked(username=username, ip=ip):
            raise ValidationError(
                "Too many failed sign-in attempts. Wait 15 minutes or ask an administrator.", code="throttled"
            )
        try:
            data = super().clean()
        except ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                security.login_failed(username=username, ip=ip)
            raise
        security.login_succeeded(username=username, ip=ip)
        return data


# --- The site -----------------------------------------------------------------------------------------


_APPS_WHEN_READ = "_onceguard_app_list_when_read"
_APPS_BUILT = "_onceguard_app_list"


def demo_sign_in() -> tuple[str, str] | None:
    """The demo admin's username and password (``bootstrap_demo`` writes them to
    var/credentials.txt), only under the demo settings (settings.DEMO_SETTINGS) — never under
    production settings, whatever files lie under var/."""
    if not settings.DEMO_SETTINGS:
        return None
    try:
        text = (Path(settings.VAR_DIR) / "credentials.txt").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        label, _, value = line.partition(":")
        if label.strip() == "console login" and " / " in value:
            username, password = value.strip().split(" / ", 1)
            return username.strip(), password.strip()
    return None


class OnceguardAdminSite(admin.AdminSite):
    site_header = "Onceguard console"
    site_title = "Onceguard"
    index_title = "Overview"
    login_form = ThrottledAuthenticationForm
    login_template = "admin/onceguard/login.html"
    index_template = "admin/onceguard/index.html"
    # Lists need the width (ids, keys, reasons); the app index is one click away.
    enable_nav_sidebar = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The history tables' pages (review.console.history_pages), by model.
        self._history_pages: dict[type[models.Model], Any] = {}

    def register_history_page(self, page_class: Any) -> None:
        """A history table's console pages (review.console.history_pages): their own views at the
        addresses the admin would give the model, which the admin cannot register (a
        composite primary key)."""
        self._history_pages[page_class.model] = page_class(self)

    def history_page(self, model: type[models.Model]) -> Any:
        return self._history_pages.get(model)

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        if app_label is None and getattr(request, _APPS_WHEN_READ, False):
            # each_context's ``available_apps``: read only by the nav sidebar (off here).
            return SimpleLazyObject(lambda: self.get_app_list(request))  # type: ignore[return-value]
        if app_label is None and hasattr(request, _APPS_BUILT):
            # The index reads it twice (the round, then the admin's own context): built once.
            return getattr(request, _APPS_BUILT)
        # The history pages listed with their app's models, for those who may view them.
        apps = super().get_app_list(request, app_label)
        for model, page in self._history_pages.items():
            entry = page.app_list_entry(request)
            app = next((a for a in apps if a["app_label"] == model._meta.app_label), None)
            if entry is None or app is None:
                continue
            app["models"].append(entry)
            app["models"].sort(key=lambda m: m["name"])
        if app_label is None:
            setattr(request, _APPS_BUILT, apps)
        return apps

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        admin_class = admin_class or admin.ModelAdmin
        if not getattr(admin_class, "onceguard_console", False):
            # Pages of other packages (auth, django-q) answer only their lists' lookups too.
            lookups = () if issubclass(admin_class, ConsoleLookupsMixin) else (ConsoleLookupsMixin,)
            admin_class = type(
                admin_class.__name__,
                (ConfigChangeAdminMixin, ConsoleAdminMixin, *lookups, admin_class),
                {"__module__": admin_class.__module__, "onceguard_console": True},
            )
        super().register(model_or_iterable, scoped_admin_class(admin_class), **options)

    def each_context(self, request: HttpRequest) -> dict[str, Any]:
        # Every page's context carries the app list for the nav sidebar, which is off: built
        # only if read (it checks each model's permissions and reverses its URLs; the
        # dashboard builds its own for the page): ~10 % of a list's CPU.
        setattr(request, _APPS_WHEN_READ, True)
        try:
            context = super().each_context(request)
        finally:
            delattr(request, _APPS_WHEN_READ)
        scope = scope_of(request) if getattr(request, "user", None) and request.user.is_authenticated else []
        if scope is None:
            context["onceguard_scope"] = "all tenants"
        elif scope:
            context["onceguard_scope"] = ", ".join(Tenant.objects.filter(pk__in=scope).values_list("slug", flat=True))
        else:
            context["onceguard_scope"] = "no tenant assigned"
        if getattr(request, "user", None) and request.user.is_authenticated:
            context["onceguard_roles"] = ", ".join(sorted(request.user.groups.values_list("name", flat=True))) or (
                "superuser" if request.user.is_superuser else "no role"
            )
            context["onceguard_can_search_subjects"] = request.user.has_perm("review.search_subjects")
        return context

    def get_urls(self) -> list[Any]:
        extra = [
            path(
                "onceguard/reveal/<str:app_label>/<str:model_name>/<str:object_id>/",
                self.admin_view(self.reveal_view),
                name="onceguard_reveal",
            ),
            path("onceguard/subjects/", self.admin_view(self.subject_search_view), name="onceguard_subjects"),
            path("onceguard/runs/", self.admin_view(self.run_view), name="onceguard_run"),
            path("onceguard/n8n-audit/", self.admin_view(self.n8n_audit_view), name="onceguard_n8n_audit"),
            path("onceguard/subjects/trail/", self.admin_view(self.subject_trail_view), name="onceguard_subject_trail"),
        ]
        for page in self._history_pages.values():
            extra += page.get_urls()
        return extra + super().get_urls()

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # While the demo runs, its sign-in is on the page itself (make run's terminal scrolls).
        extra_context = {**(extra_context or {}), "onceguard_demo_sign_in": demo_sign_in()}
        return super().login(request, extra_context)

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = dict(extra_context or {})
        scope = scope_of(request)
        with sql.planned_per_call():
            extra_context["dash"] = dashboard_context(request, dashboard_numbers(tenant_ids=scope), self)
            extra_context["attention"] = attention_context(request, attention_now(tenant_ids=scope))
            if request.user.has_perm("ledger.view_operation"):
                extra_context["charts"] = charts_context(provider_activity(tenant_ids=scope))
            extra_context["round"] = console_round(request, self)
        return super().index(request, extra_context)

    # --- reveal ---------------------------------------------------------------------------

    def _scoped_object(self, request: HttpRequest, app_label: str, model_name: str, object_id: str) -> tuple[Any, Any]:
        page = next(
            (
                p
                for m, p in self._history_pages.items()
                if (m._meta.app_label, m._meta.model_name) == (app_label, model_name)
            ),
            None,
        )
        if page is not None and privacy.payload_fields_of(page.model):
            obj = page.get_object(request, object_id)  # scoped to the user's tenants
            if obj is None or not page.has_view_permission(request):
                raise Http404("No such record in your tenants.")
            return page, obj
        model_admin = next(
            (
                ma
                for m, ma in self._registry.items()
                if m._meta.app_label == app_label and m._meta.model_name == model_name
            ),
            None,
        )
        if model_admin is None or not privacy.payload_fields_of(model_admin.model):
            raise Http404("No such page.")
        obj = model_admin.get_object(request, object_id)  # scoped by TenantScopedAdminMixin
        if obj is None or not model_admin.has_view_permission(request, obj):
            raise Http404("No such record in your tenants.")
        return model_admin, obj

    def reveal_view(self, request: HttpRequest, app_label: str, model_name: str, object_id: str) -> HttpResponse:
        model_admin, obj = self._scoped_object(request, app_label, model_name, object_id)
        states = [s for s in (privacy.payload_state(obj, f) for f in privacy.payload_fields_of(obj))]
        choices = [(s.field, s.label) for s in states if s.state in ("sealed", "plain")]
        allowed = can_reveal(request)
        form = RevealForm(request.POST or None, choices=choices)
        revealed: dict[str, str] | None = None
        entry = None
        if request.method == "POST":
            if not allowed:
                raise PermissionDenied("You do not have the view_payload permission.")
            if form.is_valid():
                try:
                    values, entry = privacy.payload_reveal(
                        obj=obj,
                        tenant_id=object_tenant_id(obj),
                        fields=form.cleaned_data["fields_wanted"],
                        reason=form.cleaned_data["reason"],
                        actor=actor_of(request),
                        user_id=request.user.pk,
                        ip=client_ip(request),
                    )
                except DomainError as exc:
                    messages.error(request, exc.detail)
                else:
                    revealed = {
                        privacy.FIELD_LABELS.get(k, k): json.dumps(v, indent=2, ensure_ascii=False)
                        for k, v in values.items()
                    }
        opts = model_admin.model._meta
        try:
            back = reverse(f"{self.name}:{opts.app_label}_{opts.model_name}_change", args=[privacy.object_id_of(obj)])
        except NoReverseMatch:
            back = None
        context = {
            **self.each_context(request),
            "title": f"Reveal payload of {obj}",
            "opts": opts,
            "obj": obj,
            "states": states,
            "form": form,
            "allowed": allowed,
            "revealed": revealed,
            "entry": entry,
            "back_url": back,
        }
        response = TemplateResponse(request, "admin/onceguard/reveal.html", context, status=200 if allowed else 403)
        response["Cache-Control"] = "no-store"
        return response

    # --- runs (review.console.run_pages) ----------------------------------------------------------------

    def run_view(self, request: HttpRequest) -> HttpResponse:
        return run_page(self, request)

    # --- the n8n workflow audit (review.console.n8n_audit_pages) --------------------------------------------

    def n8n_audit_view(self, request: HttpRequest) -> HttpResponse:
        return n8n_audit_page(self, request)

    # --- a person's data trail (review.console.subject_pages) ----------------------------------------------

    def subject_trail_view(self, request: HttpRequest) -> HttpResponse:
        return subject_trail_page(self, request)

    # --- data-subject search -------------------------------------------------------------------

    def subject_search_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm("review.search_subjects"):
            raise PermissionDenied
        form = SubjectSearchForm(request.POST or None)
        hits = None
        if request.method == "POST" and form.is_valid():
            scope = scope_of(request)
            phone, email = form.cleaned_data["phone"], form.cleaned_data["email"]
            hits = privacy.subject_search(tenant_ids=scope, phone=phone, email=email)
            ops = list(Operation.objects.filter(pk__in=hits.operation_ids).select_related("tenant", "provider"))
            events = list(FailedEvent.objects.filter(pk__in=hits.failed_event_ids).select_related("tenant"))
            tenant_ids = scope if scope is not None else list(Tenant.objects.values_list("pk", flat=True))
            touched = {o.tenant_id for o in ops} | {e.tenant_id for e in events}
            # Logged for every tenant searched (the search itself is about a person), with
            # the kinds searched for and a digest prefix — never the phone number or address.
            kinds = [k for k, v in (("phone", phone), ("email", email)) if v]
            for tenant_id in sorted(touched or set(tenant_ids[:50])):
                privacy.accesslog_append(
                    tenant_id=tenant_id,
                    action=AccessAction.SUBJECT_SEARCH,
                    actor=actor_of(request),
                    user_id=request.user.pk,
                    object_type="subject",
                    object_ref=f"{len(hits.operation_ids)} operations, {len(hits.failed_event_ids)} DLQ entries",
                    fields=kinds,
                    reason=form.cleaned_data["reason"],
                    ip=client_ip(request),
                )
            hits = {"operations": ops, "events": events}
        context = {**self.each_context(request), "title": "Find records about a person", "form": form, "hits": hits}
        return TemplateResponse(request, "admin/onceguard/subjects.html", context)


def _changelist(site: admin.AdminSite, app: str, model: str, query: str = "") -> str | None:
    try:
        url = reverse(f"{site.name}:{app}_{model}_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{query}" if query else url


def dashboard_context(request: HttpRequest, numbers: dict[str, Any], site: admin.AdminSite) -> dict[str, Any]:
    """The dashboard's numbers, each with the link to the list it counts."""
    ops_url = lambda q="": _changelist(site, "ledger", "operation", q)  # noqa: E731
    dlq_url = lambda q="": _changelist(site, "dlq", "failedevent", q)  # noqa: E731
    user = request.user
    can_ops = user.has_perm("ledger.view_operation")
    can_dlq = user.has_perm("dlq.view_failedevent")
    return {
        **numbers,
        "operations": [
            {
                "state": s,
                "label": label,
                "n": n.n,
                "count": str(n),
                "url": ops_url(f"status__exact={s}") if can_ops else None,
            }
            for s, label, n in numbers["operations"]
        ],
        "operations_url": ops_url() if can_ops else None,
        "eligible_url": ops_url("needs=due") if can_ops else None,
        "caller_url": ops_url("needs=caller") if can_ops else None,
        "alerts_url": _changelist(site, "alerts", "alert", "state=open")
        if user.has_perm("alerts.view_alert")
        else None,
        "dlq": [
            {
                "state": s,
                "label": label,
                "n": n.n,
                "count": str(n),
                "url": dlq_url(f"status__exact={s}") if can_dlq else None,
            }
            for s, label, n in numbers["dlq"]
        ],
        "dlq_url": dlq_url() if can_dlq else None,
        "review_url": _changelist(site, "review", "reviewitem")
        if (user.has_perm("review.view_reviewitem") or user.has_perm("review.decide_reviewitem"))
        else None,
        "paused_url": _changelist(site, "review", "pausedprovider", "paused=yes")
        if user.has_perm("review.view_pausedprovider")
        else None,
        "purge_url": _changelist(site, "review", "retentionrun") if user.has_perm("review.view_retentionrun") else None,
        "sweep_url": _changelist(site, "django_q", "success", "q=ledger.schedules.sweep_task")
        if user.is_superuser
        else None,
        "subjects_url": reverse(f"{site.name}:onceguard_subjects") if user.has_perm("review.search_subjects") else None,
        "accesslog_url": _changelist(site, "review", "accesslog") if user.has_perm("review.view_accesslog") else None,
    }


def attention_context(request: HttpRequest, rows: dict[str, list[Any]]) -> dict[str, Any]:
    """The "needs attention now" list: only the kinds this user may open, each row one click
    from its page."""
    user = request.user
    out: dict[str, Any] = {}
    if user.has_perm("review.view_reviewitem") or user.has_perm("review.decide_reviewitem"):
        out["review"] = rows["review"]
    if user.has_perm("dlq.view_failedevent"):
        out["dlq"] = rows["dlq"]
    if user.has_perm("review.view_pausedprovider") or user.has_perm("ledger.view_provider"):
        out["paused"] = rows["paused"]
    if user.has_perm("ledger.view_operation"):
        out["stuck"] = rows["stuck"]
    out["empty"] = not any(out.values())
    return out


# Colours of the chart series (fill attributes of the SVG; the legend uses console.css).
CHART_COLOURS = {"succeeded": "#3a9a5e", "reviewed": "#7a4fc2", "dead_lettered": "#e08a1e", "failed": "#c0392b"}
CHART_LABELS = {"succeeded": "succeeded", "failed": "failed", "dead_lettered": "dead-lettered", "reviewed": "reviewed"}
CHART_W, CHART_H, BAR = 288, 56, 12


def charts_context(activity: dict[str, Any]) -> dict[str, Any]:
    """Small stacked bar charts, one per provider, one bar per hour: rectangles computed
    here and drawn as inline SVG by the template (no script, nothing from another origin)."""
    hours = activity["hours"]
    charts = []
    for provider, series in activity["providers"]:
        totals = [sum(series[name][h] for name in CHART_SERIES) for h in range(hours)]
        peak = max(totals) or 1
        rects = []
        for h in range(hours):
            y = CHART_H
            # Bottom to top: the good outcome first, then what needed a person, then failures.
            for name in ("succeeded", "reviewed", "dead_lettered", "failed"):
                n = series[name][h]
                if not n:
                    continue
                height = max(1.0, round(n / peak * (CHART_H - 2), 1))
                y -= height
                rects.append(
                    {
                        "x": h * BAR + 1,
                        "y": round(y, 1),
                        "w": BAR - 2,
                        "h": height,
                        "fill": CHART_COLOURS[name],
                        "title": f"{n} {CHART_LABELS[name]}, hour {h - hours + 1:+d} h",
                    }
                )
        charts.append(
            {
                "provider": provider,
                "rects": rects,
                "peak": peak,
                "totals": [
                    {"name": name, "label": CHART_LABELS[name], "n": sum(series[name])} for name in CHART_SERIES
                ],
            }
        )
    return {
        "charts": charts,
        "width": CHART_W,
        "height": CHART_H,
        "since": activity["since"],
        "until": activity["until"],
    }
