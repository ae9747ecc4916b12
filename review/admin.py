"""Console pages of the review app: the review queue and its decide page, the access log,
retention policies and runs, tombstones, staff memberships, provider pauses.

Every ModelAdmin here (and in every other app) is tenant-scoped and payload-masked by the
console's admin site (review.console), not by code in each class."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ledger.admin import ReadOnlyAdmin
from ledger.errors import DomainError
from ledger.models import Tombstone
from ledger.services import provider_resume
from review.models import (
    AccessLog,
    AccessLogCheckpoint,
    LoginFailure,
    PausedProvider,
    RetentionPolicy,
    RetentionRun,
    ReviewDecision,
    ReviewItem,
    StaffTenant,
)
from review.services import retention_policy_check, review_decision_record


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=ReviewDecision.choices, widget=forms.RadioSelect)
    provider_ref = forms.CharField(
        required=False, max_length=255, help_text="For confirm succeeded: the provider's reference, if you have it."
    )
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, help_text="Required: why.")


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@admin.register(ReviewItem)
class ReviewItemAdmin(ReadOnlyAdmin):
    list_display = ["key", "tenant", "provider", "attempts", "reconciliation_handle", "last_error", "updated_at"]
    list_filter = ["tenant", "provider", "mode"]
    search_fields = ["=key", "=reconciliation_handle", "=provider_ref", "=execution_id", "=correlation_id"]
    list_select_related = ["tenant", "provider"]
    ordering = ["updated_at"]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("review.view_reviewitem") or request.user.has_perm("review.decide_reviewitem")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        item = self.get_object(request, object_id)
        if item is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        can_decide = request.user.has_perm("review.decide_reviewitem")
        form = DecisionForm(request.POST or None)
        if request.method == "POST":
            if not can_decide:
                messages.error(request, "You may not record review decisions.")
            elif form.is_valid():
                try:
                    review_decision_record(
                        operation_id=item.pk,
                        decision=form.cleaned_data["decision"],
                        note=form.cleaned_data["note"],
                        provider_ref=form.cleaned_data["provider_ref"],
                        actor=actor_of(request),
                        tenant_ids=getattr(request, "onceguard_tenant_ids", None),
                    )
                except DomainError as exc:
                    messages.error(request, exc.detail)
                else:
                    messages.success(request, f"Recorded {form.cleaned_data['decision']} for {item.key}.")
                    return HttpResponseRedirect(reverse("admin:review_reviewitem_changelist"))
        context = {
            **(extra_context or {}),
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Review {item.key}",
            "item": item,
            "attempts": item.attempt_set.order_by("number"),
            "events": item.events.order_by("at", "id"),
            "form": form,
            "can_decide": can_decide,
        }
        return TemplateResponse(request, "admin/review/decide.html", context)


@admin.register(AccessLog)
class AccessLogAdmin(ReadOnlyAdmin):
    """Auditors list, filter and export (CSV) who looked at what, why, when, from where."""

    list_display = ["at", "tenant", "actor", "action", "object_label", "field_list", "reason", "ip"]
    list_filter = ["action", "tenant", "object_type", ("at", admin.DateFieldListFilter)]
    search_fields = ["actor", "=object_id", "=object_ref", "reason"]
    date_hierarchy = "at"
    list_select_related = ["tenant"]
    show_full_result_count = False
    readonly_fields = [
        "tenant",
        "seq",
        "at",
        "action",
        "actor",
        "user_id_at_time",
        "object_type",
        "object_id",
        "object_ref",
        "fields",
        "reason",
        "ip",
        "prev_hash",
        "hash",
        "chain_version",
        "key_id",
    ]

    @admin.display(description="fields")
    def field_list(self, obj: AccessLog) -> str:
        return ", ".join(obj.fields or [])

    def export_columns(self, request: HttpRequest) -> list[str]:
        # The export carries the whole row, chain fields included, so it can be verified offline.
        return [
            "at",
            "tenant",
            "actor",
            "action",
            "object_type",
            "object_id",
            "object_ref",
            "field_list",
            "reason",
            "ip",
            "seq",
            "prev_hash",
            "hash",
            "chain_version",
            "key_id",
        ]

    @admin.display(description="object", ordering="object_type")
    def object_label(self, obj: AccessLog) -> str:
        label = f"{obj.object_type} {obj.object_id}".strip()
        return f"{label} ({obj.object_ref})" if obj.object_ref else label


class RetentionPolicyForm(forms.ModelForm):
    """The service's rules (review.services.retention_policy_check) on the console form:
    among them the platform's floor under the access log's record TTL."""

    class Meta:
        model = RetentionPolicy
        fields = ["tenant", "record_type", "payload_ttl", "record_ttl", "legal_hold", "legal_hold_note"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        record_type = data.get("record_type") or getattr(self.instance, "record_type", "")
        try:
            retention_policy_check(
                record_type=record_type, payload_ttl=data.get("payload_ttl"), record_ttl=data.get("record_ttl")
            )
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from exc
        return data


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    form = RetentionPolicyForm
    list_display = ["tenant", "record_type", "payload_ttl", "record_ttl", "legal_hold", "updated_at"]
    list_filter = ["tenant", "record_type", "legal_hold"]
    fields = ["tenant", "record_type", "payload_ttl", "record_ttl", "legal_hold", "legal_hold_note"]


@admin.register(AccessLogCheckpoint)
class AccessLogCheckpointAdmin(ReadOnlyAdmin):
    """The signed anchors of the access log's chains (review.accesslog), for auditors."""

    list_display = ["at", "tenant", "n", "kind", "seq", "key_id"]
    list_filter = ["kind", "tenant"]
    list_select_related = ["tenant"]
    readonly_fields = ["tenant", "n", "kind", "seq", "hash", "at", "key_id", "signature"]


@admin.register(RetentionRun)
class RetentionRunAdmin(ReadOnlyAdmin):
    list_display = [
        "started_at",
        "tenant",
        "status",
        "trigger",
        "redacted",
        "deleted",
        "discarded",
        "tombstones_created",
        "tombstones_expired",
        "batches",
        "finished_at",
    ]
    list_filter = ["status", "tenant", "trigger"]
    date_hierarchy = "started_at"
    list_select_related = ["tenant"]
    readonly_fields = [
        "tenant",
        "pass_id",
        "trigger",
        "started_at",
        "finished_at",
        "status",
        "redacted",
        "deleted",
        "discarded",
        "tombstones_created",
        "tombstones_expired",
        "batches",
        "details",
        "accesslog_anchor_seq",
        "accesslog_anchor_hash",
        "error",
    ]


@admin.register(Tombstone)
class TombstoneAdmin(ReadOnlyAdmin):
    list_display = ["key", "tenant", "final_status", "provider_ref", "done_at", "deleted_at", "keep_until"]
    list_filter = ["tenant", "final_status"]
    search_fields = ["=key", "=provider_ref"]
    list_select_related = ["tenant"]


@admin.register(StaffTenant)
class StaffTenantAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["user__username"]
    autocomplete_fields: list[str] = []


class PausedFilter(admin.SimpleListFilter):
    title = "paused"
    parameter_name = "paused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "paused"), ("no", "running")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(paused_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(paused_at__isnull=True)
        return queryset


@admin.register(PausedProvider)
class PausedProviderAdmin(ReadOnlyAdmin):
    """Operators see why a provider is paused and resume it (a service call, logged)."""

    list_display = ["slug", "tenant", "paused_at", "paused_reason", "throttled_until", "idempotency_class"]
    list_filter = [PausedFilter, "tenant"]
    search_fields = ["slug"]
    list_select_related = ["tenant"]
    actions = ["resume"]
    fields = ["tenant", "slug", "idempotency_class", "base_url", "paused_at", "paused_reason", "throttled_until"]

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("review.resume_provider")

    @admin.action(description="Resume selected providers", permissions=["resume"])
    def resume(self, request: HttpRequest, queryset: QuerySet[PausedProvider]) -> None:
        done = 0
        for provider in queryset.filter(paused_at__isnull=False):
            if provider_resume(provider_id=provider.pk, actor=actor_of(request)):
                done += 1
        messages.success(request, f"Resumed {done} provider(s).")


@admin.register(LoginFailure)
class LoginFailureAdmin(ReadOnlyAdmin):
    list_display = ["at", "username", "ip"]
    search_fields = ["username", "ip"]
