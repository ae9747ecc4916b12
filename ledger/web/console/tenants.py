"""A tenant's settings (a superuser's), its API keys (revoked here, made by ``manage.py
apikey_create``) and the configuration trail (who changed which configuration, from what to
what; read-only, exported by auditors). Saves go through the tenant's configuration service
(ADR 0006); the callback signing secret is never shown, a rotation shows the new one once."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from ledger.models import ApiKey, ConfigChange, Tenant
from ledger.protocol import callbacks, services
from ledger.rules.provider_checks import secret_env_names
from ledger.web import display
from ledger.web.console_base import ConsoleAdmin, ConsoleReadOnlyAdmin, ServiceSaveAdmin


@admin.register(Tenant)
class TenantAdmin(ServiceSaveAdmin):
    """A tenant's settings. The callback signing secret is never displayed (whoever may view
    tenants — reviewers, auditors, operators — could otherwise sign callbacks as the service):
    the page says whether it is set and when it was made; the rotate action shows a new one
    once, to those who may rotate it (ledger.rotate_callback_secret), and the previous one
    keeps signing for CALLBACK_SECRET_OVERLAP_SECONDS."""

    list_display = ["slug", "name", "secret_namespace", "created_at"]
    search_fields = ["slug", "name"]
    exclude = ["callback_secret", "callback_secret_previous", "callback_secret_rotated_at"]
    readonly_fields = ["secret_namespace_state", "callback_secret_state"]
    actions = ["rotate_callback_secret"]

    # Every field of a tenant is the platform's — its slug, limits, budgets, allow-list,
    # eligibility URL (review.staff.roles: tenants are a superuser's). A tenant-scoped user sees
    # the page read-only, whatever permission a role or a person was granted, so a tampered
    # form changes nothing. The secret namespace is on no form at all (ADR 0001).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser and super().has_delete_permission(request, obj)

    def has_rotate_callback_secret_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.rotate_callback_secret")

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        # One write path (ADR 0006): `manage.py tenant_create`'s and the CLI's services check
        # (Tenant.clean: the allow-list and eligibility URL against the outbound policy),
        # assign the secret namespace once and record the change.
        actor = self.actor_of(request)
        names = [name for name in form.cleaned_data if name in {f.name for f in Tenant._meta.concrete_fields}]
        if change:
            saved = services.tenant_update(
                tenant_id=obj.pk,
                actor=actor,
                **{name: getattr(obj, name) for name in names if name in form.changed_data},
            )
        else:
            saved = services.tenant_create(
                slug=obj.slug,
                name=obj.name,
                actor=actor,
                **{name: getattr(obj, name) for name in names if name not in ("slug", "name")},
            )
        self.adopt(obj, saved)

    @admin.display(description="secret namespace")
    def secret_namespace_state(self, obj: Tenant) -> str:
        # Fixed when the tenant was made; a slug change keeps it (ADR 0001).
        if not obj.secret_namespace:
            return "assigned when the tenant is saved (from its slug where free); fixed from then on"
        return (
            f"{obj.secret_namespace} — its providers may read credentials only from"
            f" {secret_env_names(obj.secret_namespace)}; fixed when the tenant was made"
        )

    @admin.display(description="callback signing secret")
    def callback_secret_state(self, obj: Tenant) -> str:
        return callbacks.callback_secret_summary(obj)

    @admin.action(description="Rotate the callback signing secret (shown once)", permissions=["rotate_callback_secret"])
    def rotate_callback_secret(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> HttpResponse | None:
        if queryset.count() != 1:
            messages.error(request, "Rotate one tenant's secret at a time: each new secret is shown once.")
            return None
        tenant = queryset.get()
        secret = callbacks.tenant_callback_secret(
            tenant_id=tenant.pk, rotate=True, actor=f"user:{request.user.get_username()}"
        )
        tenant.refresh_from_db()
        context = {
            **self.admin_site.each_context(request),
            "title": f"New callback signing secret of {tenant.slug}",
            "opts": self.opts,
            "tenant": tenant,
            "secret": secret,
            "summary": callbacks.callback_secret_summary(tenant),
        }
        response = TemplateResponse(request, "admin/ledger/tenant/secret_once.html", context)
        # Shown once: never cached, never kept in the session or a message cookie.
        response["Cache-Control"] = "no-store"
        return response


@admin.register(ApiKey)
class ApiKeyAdmin(ConsoleAdmin):
    list_display = ["prefix", "tenant", "name", "scopes", "created_at", "expires_at", "revoked_at"]
    list_filter = ["tenant", "revoked_at"]
    search_fields = ["prefix", "name"]
    # The expiry is set when the key is made (`apikey_create --expires-in-days`), never moved.
    readonly_fields = [
        "tenant",
        "prefix",
        "hashed_key",
        "scopes",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The secret must be shown exactly once: keys are made with `manage.py apikey_create`.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # Only for those who may change keys: without `permissions` any viewer (an auditor) could run it.
    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset:
            services.apikey_revoke(api_key_id=api_key.pk, actor=f"user:{request.user.get_username()}")
        messages.success(request, f"Revoked {queryset.count()} key(s).")


def _json_value(values: dict[str, Any], name: str) -> str:
    """One side of a changed field, as JSON (absent: an em dash)."""
    if name not in values:
        return display.EMPTY
    return json.dumps(values[name], sort_keys=True, ensure_ascii=False)


@admin.register(ConfigChange)
class ConfigChangeAdmin(ConsoleReadOnlyAdmin):
    """Who changed which configuration, when, from what to what (secrets masked). Read-only
    for everyone; auditors filter it and export it as CSV (the console's export)."""

    # One line per change: the fields it touched, the values behind a disclosure (every diff
    # spelled out made the page 17,000 px tall); the export keeps before and after whole.
    list_display = ["at", "tenant", "actor", "action", "object_type", "object_repr", "changed"]
    list_per_page = 50
    list_filter = ["action", "object_type", "tenant", ("at", admin.DateFieldListFilter)]
    search_fields = ["actor", "=object_id", "object_repr"]
    date_hierarchy = "at"
    list_select_related = ["tenant"]
    show_full_result_count = False
    readonly_fields = [
        "at",
        "tenant",
        "actor",
        "action",
        "object_type",
        "object_id",
        "object_repr",
        "before",
        "after",
    ]

    def export_columns(self, request: HttpRequest) -> list[str]:
        return [
            "at",
            "tenant",
            "actor",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before_json",
            "after_json",
        ]

    @admin.display(description="what changed")
    def changed(self, obj: ConfigChange) -> str:
        before, after = obj.before or {}, obj.after or {}
        if not isinstance(before, dict) or not isinstance(after, dict):
            return display.EMPTY
        names = sorted(name for name in {*before, *after} if before.get(name) != after.get(name))
        if not names:
            return display.EMPTY
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        rows = format_html_join(
            "",
            "<tr><th>{}</th><td>{}</td><td>{}</td></tr>",
            ((name, _json_value(before, name), _json_value(after, name)) for name in names),
        )
        return format_html(
            '<details class="og-diff"><summary>{} field{}: {}</summary>'
            "<table><thead><tr><th>field</th><th>before</th><th>after</th></tr></thead><tbody>{}</tbody></table>"
            "</details>",
            len(names),
            "" if len(names) == 1 else "s",
            shown,
            rows,
        )

    @admin.display(description="before")
    def before_json(self, obj: ConfigChange) -> str:
        return "" if obj.before is None else json.dumps(obj.before, sort_keys=True, ensure_ascii=False)

    @admin.display(description="after")
    def after_json(self, obj: ConfigChange) -> str:
        return "" if obj.after is None else json.dumps(obj.after, sort_keys=True, ensure_ascii=False)
