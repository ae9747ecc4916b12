"""The console's admin site: every ModelAdmin registered on it is tenant-scoped and
payload-masked, whoever wrote it; plus its own views — the front page (the round and the
dashboard: review.console.round, review.console.dashboard), the reveal, the data-subject search,
and the addresses of the run, workflow-audit, subject-trail and history pages.

``OnceguardAdminSite.register`` puts three mixins in front of every ModelAdmin class:
``TenantScopedAdminMixin`` (review.staff.tenancy: rows of the user's tenants only),
``ConfigChangeAdminMixin`` (review.audit.changes: saves of configuration leave a ConfigChange row)
and ``ConsoleAdminMixin`` (review.console.pages: payload columns never rendered, a masked payload
panel with a reveal link on detail pages, CSV export of the filtered list).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.functional import SimpleLazyObject

from dlq.models import FailedEvent
from ledger.models import Operation, Tenant
from ledger.platform.errors import DomainError
from ledger.store import sql
from ledger.web.console_base import ConsoleLookupsMixin
from review.audit.changes import ConfigChangeAdminMixin
from review.console import sign_in_pages
from review.console.dashboard import attention_context, charts_context, dashboard_context
from review.console.forms import RevealForm, SubjectSearchForm, ThrottledAuthenticationForm
from review.console.n8n_audit_pages import n8n_audit_page
from review.console.pages import ConsoleAdminMixin, actor_of, can_reveal, client_ip
from review.console.round import console_round
from review.console.run_pages import run_page
from review.console.selectors import attention_now, dashboard_numbers, provider_activity
from review.console.subject_pages import subject_trail_page
from review.models import AccessAction
from review.privacy import payloads as privacy
from review.staff.oidc import oidc_enabled
from review.staff.tenancy import object_tenant_id, scope_of, scoped_admin_class

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
            # Sign-in (ADR 0014): to the identity provider and back, before anyone is signed in;
            # the second factor's pages, for a signed-in session that has not shown it yet.
            path("sign-in/sso/", sign_in_pages.oidc_start_view, name="onceguard_oidc_start"),
            path(
                "sign-in/sso/callback/",
                sign_in_pages.ConsoleOidcCallbackView.as_view(site=self),
                name="onceguard_oidc_callback",
            ),
            path("sign-in/second-factor/", self.admin_view(self.mfa_verify_view), name="onceguard_mfa_verify"),
            path("sign-in/second-factor/enrol/", self.admin_view(self.mfa_enrol_view), name="onceguard_mfa_enrol"),
        ]
        for page in self._history_pages.values():
            extra += page.get_urls()
        return extra + super().get_urls()

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # While the demo runs, its sign-in is on the page itself (make run's terminal scrolls).
        # With single sign-on configured the page offers it above the password form.
        extra_context = {
            **(extra_context or {}),
            "onceguard_demo_sign_in": demo_sign_in(),
            "onceguard_sso": oidc_enabled(),
        }
        return super().login(request, extra_context)

    def mfa_verify_view(self, request: HttpRequest) -> HttpResponse:
        return sign_in_pages.mfa_verify_view(self, request)

    def mfa_enrol_view(self, request: HttpRequest) -> HttpResponse:
        return sign_in_pages.mfa_enrol_view(self, request)

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = dict(extra_context or {})
        scope = scope_of(request)
        # Serial plans: the page's reads each stop after a few rows (sql.planned_per_call).
        with sql.planned_per_call(serial=True):
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
