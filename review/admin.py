"""Console pages of the review app: the review queue and its decide page, the access log,
retention policies and runs, tombstones, staff memberships, provider pauses.

Every ModelAdmin here (and in every other app) is tenant-scoped and payload-masked by the
console's admin site (review.console.site), not by code in each class."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import F, Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django_otp_webauthn import admin as webauthn_admin  # noqa: F401  (registers its page first: removed below)
from django_otp_webauthn.models import WebAuthnCredential
from django_q import admin as django_q_admin  # noqa: F401  (registers its pages first: replaced below)
from django_q.models import Schedule

from ledger.models import ConfigChangeAction, OpenOperation, OperationEvent, OperationMode, OperationStatus, Tombstone
from ledger.platform.errors import DomainError
from ledger.protocol import approvals
from ledger.protocol.selectors import operation_history, operation_search, operation_search_window
from ledger.protocol.services import provider_pause, provider_resume
from ledger.tenants.config_changes import config_change_of, config_snapshot
from ledger.web import display
from ledger.web.console_base import (
    ConsoleAdmin,
    ConsoleReadOnlyAdmin,
    SelectorSearchMixin,
    ServiceSaveAdmin,
    TenantColumnMixin,
    attempts_with_labels,
    pending_message,
)
from ledger.web.pagination import CappedCountPaginator
from ledger.web.story import operation_story
from review.decisions.services import review_decision_record
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
from review.retention.policies import retention_policy_check, retention_policy_save


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=ReviewDecision.choices, widget=forms.RadioSelect)
    provider_ref = forms.CharField(
        required=False, max_length=255, help_text="For confirm succeeded: the provider's reference, if you have it."
    )
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, help_text="Required: why.")


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


# The moves into uncertain and review, newest first: the review list's "why" column.
REVIEW_MOVES = Prefetch(
    "events",
    queryset=OperationEvent.objects.filter(to_status__in=[OperationStatus.UNCERTAIN, OperationStatus.REVIEW]).order_by(
        "operation_id", "-at", "-id"
    ),
    to_attr="review_moves",
)


@admin.register(ReviewItem)
class ReviewItemAdmin(TenantColumnMixin, SelectorSearchMixin, ConsoleReadOnlyAdmin):
    list_display = ["key_short", "provider_slug", "why", "attempts_used", "handle", "waiting"]
    list_display_links = ["key_short"]
    list_filter = ["tenant", "provider", "mode"]
    search_fields = ["key"]
    list_search = staticmethod(operation_search)
    # A common text is searched in the newest operations, window by window (ADR 0026).
    list_search_window = staticmethod(operation_search_window)
    list_search_scoped = True
    list_search_paged = True
    search_help_text = (
        "A whole key; any part of a key, reconciliation handle, execution or correlation id or workflow name"
        " (any case); a provider ref."
    )
    list_select_related = ["tenant", "provider"]
    # What the columns read (review.console.listing.ConsoleChangeList.listed); the "why" column's
    # events are prefetched.
    list_reads = (
        "id",
        "tenant_id",
        "key",
        "provider_id",
        "attempts",
        "max_attempts",
        "reconciliation_handle",
        "updated_at",
        "tenant__slug",
        "provider__slug",
        "provider__idempotency_class",
    )
    # Longest waiting first, by the time of the last move as the work queue's mirror holds it
    # (the row's own, ADR 0017 triggers): the page walks the mirror's index of review rows by
    # that time (open_unresolved_idx) and stops after a page. The row's updated_at has no index
    # since ADR 0017: ordered by it, every item was read and sorted for each page (20,000 at
    # ten million operations, ~190 ms; bench/results/scale-10M.md, fill version 10).
    ordering = ["open_row__updated_at"]
    # Django's count of the whole unfiltered list beside the page's capped count: every item
    # joined to its operation again. The capped count says how many, up to its cap.
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReviewItem]:
        # The items as the mirror names them, without ReviewItem.objects' check of the row's
        # own state (open_rows_where: what FOR UPDATE checks again after a wait; nothing here
        # locks, and in one snapshot the mirror's review rows are exactly the rows in review,
        # ADR 0027). With that check the planner multiplies two selectivities that are one
        # (an estimate of 10 items for 20,000 at ten million operations), so it joined and
        # sorted every item rather than walk the index for a page: 180 ms against 1 ms.
        rows = ReviewItem._base_manager.filter(
            open_row__status=OperationStatus.REVIEW, open_row__tenant_id=F("tenant_id")
        )
        ordering = self.get_ordering(request)  # as ModelAdmin.get_queryset orders its rows
        # The "why" column's events in one query for the page, not one per row.
        return (rows.order_by(*ordering) if ordering else rows).prefetch_related(REVIEW_MOVES)

    def get_paginator(self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any) -> Any:
        paginator = super().get_paginator(request, queryset, per_page, *args, **kwargs)
        # Unfiltered, the list's rows are the mirror's review rows one for one (ADR 0017: the
        # row's own statements write both), so those are counted, without probing an operation
        # row for each of up to 10,001 items (as the operations list does, ADR 0027).
        if not set(request.GET) - {"p", "o"} and isinstance(paginator, CappedCountPaginator):
            scope_of = getattr(self, "tenant_scope", None)
            scope = scope_of(request) if scope_of is not None else None
            mirrored = OpenOperation.objects.filter(status=OperationStatus.REVIEW).values("pk")
            paginator.counted = mirrored if scope is None else mirrored.filter(tenant_id__in=scope)
        return paginator

    @admin.display(description="key", ordering="key")
    def key_short(self, obj: ReviewItem) -> str:
        return display.short_id(obj.key, keep=44)

    @admin.display(description="provider", ordering="provider__slug")
    def provider_slug(self, obj: ReviewItem) -> str:
        if not obj.provider_id:
            return display.EMPTY
        return display.format_html(
            '{}<div class="og-muted">{}</div>', obj.provider.slug, obj.provider.get_idempotency_class_display()
        )

    @admin.display(description="why it is here")
    def why(self, obj: ReviewItem) -> str:
        # The recorded reasons of the moves into uncertain and review (the sweeper's words).
        reasons = [e.reason for e in obj.review_moves[:2] if e.reason]
        return display.truncate("; ".join(reversed(reasons)), 140) or display.EMPTY

    @admin.display(description="attempts", ordering="attempts")
    def attempts_used(self, obj: ReviewItem) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="handle", ordering="reconciliation_handle")
    def handle(self, obj: ReviewItem) -> str:
        return display.short_id(obj.reconciliation_handle, keep=20)

    @admin.display(description="waiting", ordering="open_row__updated_at")
    def waiting(self, obj: ReviewItem) -> str:
        return display.age(obj.updated_at)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("review.view_reviewitem") or request.user.has_perm("review.decide_reviewitem")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        item = self.get_object(request, object_id)
        if item is None:
            # The admin's own answer to a missing object, through its public API rather than
            # its private helper (docs/adr/0004-private-framework-apis.md).
            missing = gettext("%(name)s with ID “%(key)s” doesn’t exist. Perhaps it was deleted?") % {
                "name": self.opts.verbose_name,
                "key": unquote(object_id),
            }
            self.message_user(request, missing, messages.WARNING)
            return HttpResponseRedirect(reverse("admin:index", current_app=self.admin_site.name))
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
                except approvals.ApprovalPending as pending:
                    # Four-eyes (ADR 0013): the item stays in review until a second person decides.
                    messages.info(request, pending_message(pending))
                    return HttpResponseRedirect(reverse("admin:review_reviewitem_changelist"))
                except DomainError as exc:
                    messages.error(request, exc.detail)
                else:
                    message = f"Recorded {form.cleaned_data['decision']} for {item.key}."
                    if (
                        form.cleaned_data["decision"] == ReviewDecision.SAFE_TO_RETRY
                        and item.mode == OperationMode.GUARD
                    ):
                        message += (
                            " Guard mode: the caller must claim the key again (Onceguard does not send it);"
                            " until then it shows as waiting for the caller."
                        )
                    messages.success(request, message)
                    return HttpResponseRedirect(reverse("admin:review_reviewitem_changelist"))
        # Its claim from the row where it is kept there (ADR 0024), then its event rows.
        history = operation_history(item, item.events.filter(tenant_id=item.tenant_id))
        context = {
            **(extra_context or {}),
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Review {item.key}",
            "item": item,
            "attempts": attempts_with_labels(item.attempt_set.order_by("number")),
            "events": history,
            "story": operation_story(item, list(item.attempt_set.order_by("number")), history),
            "status_badge": display.operation_badge(item),
            "guard_mode": item.mode == OperationMode.GUARD,
            "form": form,
            "can_decide": can_decide,
        }
        return TemplateResponse(request, "admin/review/decide.html", context)


@admin.register(AccessLog)
class AccessLogAdmin(ConsoleReadOnlyAdmin):
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
        # The ref is a key of any length: shortened as every console page shows a long id (the
        # full value on hover, copied on click, and in the CSV export).
        return display.format_html("{} ({})", label, display.short_id(obj.object_ref)) if obj.object_ref else label


class RetentionPolicyForm(forms.ModelForm):
    """The service's rules (review.retention.policies.retention_policy_check) on the console form:
    among them the platform's floor under the access log's record TTL."""

    class Meta:
        model = RetentionPolicy
        fields = ["tenant", "record_type", "payload_ttl", "record_ttl", "legal_hold", "legal_hold_note"]
        # (The fields are the console's DurationWordsField: typed and shown as "30 days".)
        help_texts = {
            "payload_ttl": 'Then the payload is redacted: "30 days", "12 hours", "2 weeks", "90d" or a number of'
            " days. Empty: never redacted.",
            "record_ttl": 'Then the record is deleted (a tombstone stays): "365 days", "52 weeks" or a number of'
            " days. Empty: never deleted.",
        }

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
class RetentionPolicyAdmin(ServiceSaveAdmin):
    form = RetentionPolicyForm
    list_display = ["tenant", "record_type", "payload_kept", "record_kept", "held", "updated_at"]
    list_filter = ["tenant", "record_type", "legal_hold"]
    fields = ["tenant", "record_type", "payload_ttl", "record_ttl", "legal_hold", "legal_hold_note"]
    service_keys = ("tenant", "record_type")

    def save_model(self, request: HttpRequest, obj: RetentionPolicy, form: Any, change: bool) -> None:
        # One write path (ADR 0006): review.retention.policies.retention_policy_save checks the floors
        # and records the change, for the console as for every other caller.
        saved = retention_policy_save(
            tenant_id=obj.tenant_id,
            record_type=obj.record_type,
            payload_ttl=obj.payload_ttl,
            record_ttl=obj.record_ttl,
            legal_hold=obj.legal_hold,
            legal_hold_note=obj.legal_hold_note,
            actor=self.actor_of(request),
        )
        self.adopt(obj, saved)

    @admin.display(description="payload kept", ordering="payload_ttl")
    def payload_kept(self, obj: RetentionPolicy) -> str:
        return display.duration_words(obj.payload_ttl, exact=True) if obj.payload_ttl else "forever"

    @admin.display(description="record kept", ordering="record_ttl")
    def record_kept(self, obj: RetentionPolicy) -> str:
        return display.duration_words(obj.record_ttl, exact=True) if obj.record_ttl else "forever"

    @admin.display(description="legal hold", ordering="legal_hold")
    def held(self, obj: RetentionPolicy) -> str:
        return display.yes_no(obj.legal_hold)


@admin.register(AccessLogCheckpoint)
class AccessLogCheckpointAdmin(ConsoleReadOnlyAdmin):
    """The signed anchors of the access log's chains (review.audit.accesslog), for auditors."""

    list_display = ["at", "tenant", "n", "kind", "seq", "key_id"]
    list_filter = ["kind", "tenant"]
    list_select_related = ["tenant"]
    readonly_fields = ["tenant", "n", "kind", "seq", "hash", "at", "key_id", "signature"]


@admin.register(RetentionRun)
class RetentionRunAdmin(ConsoleReadOnlyAdmin):
    list_display = ["started", "tenant", "status_badge", "trigger", "removed", "tombstones", "batches", "took"]
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

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: RetentionRun) -> str:
        return display.age(obj.started_at)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: RetentionRun) -> str:
        tone = {"done": "good", "failed": "bad", "partial": "warn"}.get(obj.status, "busy")
        return display.badge(obj.status, obj.get_status_display(), tone=tone)

    @admin.display(description="redacted / deleted / discarded")
    def removed(self, obj: RetentionRun) -> str:
        return f"{obj.redacted} / {obj.deleted} / {obj.discarded}"

    @admin.display(description="tombstones made / expired")
    def tombstones(self, obj: RetentionRun) -> str:
        return f"{obj.tombstones_created} / {obj.tombstones_expired}"

    @admin.display(description="took")
    def took(self, obj: RetentionRun) -> str:
        if obj.finished_at is None:
            return "running"
        return display.duration_words(obj.finished_at - obj.started_at)


@admin.register(Tombstone)
class TombstoneAdmin(ConsoleReadOnlyAdmin):
    list_display = ["key", "tenant", "final_status", "provider_ref", "done_at", "deleted_at", "keep_until"]
    list_filter = ["tenant", "final_status"]
    search_fields = ["=key", "=provider_ref"]
    list_select_related = ["tenant"]


@admin.register(StaffTenant)
class StaffTenantAdmin(ConsoleAdmin):
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
class PausedProviderAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    """Operators see why a provider is paused, pause one by hand (a reason required) and
    resume it — service calls, each recorded as a configuration change with its actor."""

    list_display = ["slug", "state", "why", "since", "idempotency_class"]
    list_filter = [PausedFilter, "tenant"]
    search_fields = ["slug"]
    list_select_related = ["tenant"]
    actions = ["pause", "resume"]
    fields = ["tenant", "slug", "idempotency_class", "base_url", "paused_at", "paused_reason", "throttled_until"]

    @admin.display(description="state", ordering="paused_at")
    def state(self, obj: PausedProvider) -> str:
        if obj.paused_at:
            return display.badge("paused")
        if obj.throttled_until and obj.throttled_until > timezone.now():
            return display.badge("throttled", title=f"until {display.when(obj.throttled_until)}")
        return display.badge("running")

    @admin.display(description="why")
    def why(self, obj: PausedProvider) -> str:
        if obj.paused_at:
            return obj.paused_reason or "no reason given"
        if obj.throttled_until and obj.throttled_until > timezone.now():
            return format_html("the provider asked to slow down (429/503) — until {}", display.age(obj.throttled_until))
        return display.EMPTY

    @admin.display(description="since", ordering="paused_at")
    def since(self, obj: PausedProvider) -> str:
        return display.age(obj.paused_at) if obj.paused_at else display.EMPTY

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("review.resume_provider")

    # Pausing by hand is the other half of the same decision (the operator role has both).
    has_pause_permission = has_resume_permission

    def _recorded(self, request: HttpRequest, provider: PausedProvider, change: Any) -> bool:
        before = config_snapshot(provider)
        done = change()
        if done:
            provider.refresh_from_db()
            config_change_of(provider, actor=actor_of(request), action=ConfigChangeAction.UPDATE, before=before)
        return bool(done)

    @admin.action(description="Pause selected providers…", permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[PausedProvider]) -> HttpResponse | None:
        running = list(queryset.filter(paused_at__isnull=True).select_related("tenant")[:200])
        reason = " ".join(request.POST.get("pause_reason", "").split())
        if request.POST.get("pause_confirm") and reason:
            done = sum(
                self._recorded(
                    request,
                    p,
                    lambda p=p: provider_pause(
                        provider_id=p.pk, reason=f"paused by hand: {reason}", actor=actor_of(request)
                    ),
                )
                for p in running
            )
            messages.success(request, f"Paused {done} provider(s). Workers send nothing to them until resumed.")
            return None
        if request.POST.get("pause_confirm"):
            messages.error(request, "A reason is required.")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Pause providers",
            "providers": running,
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
        }
        return TemplateResponse(request, "admin/review/pausedprovider/pause_confirm.html", context)

    @admin.action(description="Resume selected providers", permissions=["resume"])
    def resume(self, request: HttpRequest, queryset: QuerySet[PausedProvider]) -> None:
        # The service records each resume in the trail, as for `manage.py provider_resume`.
        done = sum(
            provider_resume(provider_id=p.pk, actor=actor_of(request))
            for p in queryset.filter(paused_at__isnull=False)[:200]
        )
        messages.success(request, f"Resumed {done} provider(s).")


@admin.register(LoginFailure)
class LoginFailureAdmin(ConsoleReadOnlyAdmin):
    list_display = ["at", "username", "ip"]
    search_fields = ["username", "ip"]


class ScheduleReadOnlyAdmin(ConsoleReadOnlyAdmin):
    """django-q2's schedules, read-only: its own page lets whoever can add a Schedule name any
    importable function (``os.system`` with arguments) for the cluster to run. Schedules are
    installed by ``manage.py schedules_install`` from each app's schedules module; the console
    shows them and their last run, and changes nothing."""

    list_display = ["id", "name", "func", "schedule_type", "minutes", "repeats", "next_run"]
    list_filter = ["schedule_type"]
    search_fields = ["name", "func"]
    readonly_fields = [
        "name",
        "func",
        "hook",
        "args",
        "kwargs",
        "schedule_type",
        "minutes",
        "repeats",
        "next_run",
        "cron",
        "task",
        "cluster",
        "intended_date_kwarg",
    ]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


# django-q2 registers its own ScheduleAdmin (imported above, so it is there to replace, whatever
# the order apps' admin modules are loaded in).
if admin.site.is_registered(Schedule):
    admin.site.unregister(Schedule)
admin.site.register(Schedule, ScheduleReadOnlyAdmin)

# django-otp-webauthn's page of security keys shows raw public keys and lets a key be edited by
# hand; a person's second factors are reset with `manage.py mfa_reset` instead, which leaves its
# trace (review.staff.mfa, ADR 0014).
if admin.site.is_registered(WebAuthnCredential):
    admin.site.unregister(WebAuthnCredential)


# Attempts and events: their lists, pages and export (review.console.history_pages). Uploads and
# published outputs: their facts, and a logged download (review.console.object_pages).
from review.console import history_pages, object_pages  # noqa: E402, F401
