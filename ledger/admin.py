"""Console pages for the ledger. Operations, attempts and events are read-only here for
everyone, superusers included: every change goes through a service and leaves its event."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ledger import services
from ledger.models import ApiKey, Attempt, ConfigChange, Operation, OperationEvent, Provider, Tenant


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


class ReadOnlyAdmin(ReadOnlyPermissions, admin.ModelAdmin):
    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


class ReadOnlyInline(ReadOnlyPermissions, admin.TabularInline):
    extra = 0
    can_delete = False


class AttemptInline(ReadOnlyInline):
    model = Attempt
    fields = [
        "number",
        "outcome",
        "started_at",
        "sent_at",
        "finished_at",
        "error_class",
        "message",
        "provider_ref",
        "response_status",
        "execution_id",
    ]
    readonly_fields = fields


class EventInline(ReadOnlyInline):
    model = OperationEvent
    fields = ["at", "from_status", "to_status", "actor", "reason", "attempt"]
    readonly_fields = fields
    ordering = ["at", "id"]


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["key", "tenant", "provider", "mode", "status", "attempts", "provider_ref", "updated_at"]
    list_filter = ["status", "mode", "tenant", "provider", "error_class"]
    search_fields = ["=key", "=reconciliation_handle", "=provider_ref", "=execution_id", "=correlation_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "provider"]
    show_full_result_count = False
    inlines = [AttemptInline, EventInline]
    exclude = ["payload", "request", "response_body"]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["operation", "number", "outcome", "started_at", "finished_at", "error_class", "provider_ref"]
    list_filter = ["outcome", "error_class"]
    search_fields = ["=operation__key", "=provider_ref", "=execution_id"]
    list_select_related = ["operation"]
    exclude = ["response_body"]
    show_full_result_count = False


@admin.register(OperationEvent)
class OperationEventAdmin(ReadOnlyAdmin):
    list_display = ["operation", "from_status", "to_status", "actor", "reason", "at"]
    list_filter = ["to_status", "from_status"]
    search_fields = ["=operation__key", "actor"]
    list_select_related = ["operation"]
    show_full_result_count = False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
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


@admin.register(ConfigChange)
class ConfigChangeAdmin(ReadOnlyAdmin):
    """Who changed which configuration, when, from what to what (secrets masked). Read-only
    for everyone; auditors filter it and export it as CSV (the console's export)."""

    list_display = ["at", "tenant", "actor", "action", "object_type", "object_repr", "before_json", "after_json"]
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

    @admin.display(description="before")
    def before_json(self, obj: ConfigChange) -> str:
        return "" if obj.before is None else json.dumps(obj.before, sort_keys=True, ensure_ascii=False)

    @admin.display(description="after")
    def after_json(self, obj: ConfigChange) -> str:
        return "" if obj.after is None else json.dumps(obj.after, sort_keys=True, ensure_ascii=False)


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ["slug", "tenant", "idempotency_class", "base_url", "max_attempts", "throttled_until", "paused_at"]
    list_filter = ["tenant", "idempotency_class"]
    search_fields = ["slug", "base_url"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Slugs are how operations, claims and caches name a provider: fixed once created.
        return ["tenant", "slug"] if obj is not None else []
