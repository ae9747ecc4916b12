"""The dead-letter entries' pages: the list (fast at a million rows: choices filters, text
inputs or a date range, tenants from the tenant table, capped counts, an index's order) and an
entry's read-only page with its story, its replays and its status history. What a person does
to an entry is ``dlq.web.console.entry_actions``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dlq.entries import selectors
from dlq.models import FailedEvent, FailedEventChange, Replay, ReplayOutcome
from dlq.web.console.common import masked_json, replay_failure
from dlq.web.console.entry_actions import FailedEventActions, needs_key
from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.platform.redaction import scrub
from ledger.web import display
from ledger.web.console_base import (
    ConsoleReadOnlyAdmin,
    ReadOnlyInline,
    SelectorSearchMixin,
    TenantColumnMixin,
    TenantInlineFormSet,
)
from ledger.web.pagination import CappedCountPaginator


def last_replay_failure(event: FailedEvent) -> SafeString | str:
    last = event.replays.filter(tenant_id=event.tenant_id).order_by("-number").first()
    if last is None or last.outcome == ReplayOutcome.SUCCEEDED:
        return ""
    return replay_failure(last)


class InputFilter(admin.SimpleListFilter):
    """A free-text filter rendered as an input box (no query over the table to build it)."""

    template = "admin/dlq/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Must be non-empty for Django to render the filter at all.
        return [("", "")]

    def choices(self, changelist: Any) -> Any:
        # The other filters in force, kept as hidden inputs of this filter's little form.
        pairs = [
            (name, value)
            for name, values in changelist.get_filters_params().items()
            if name != self.parameter_name
            for value in (values if isinstance(values, list) else [values])
        ]
        yield {"query_pairs": pairs, "parameter_name": self.parameter_name, "value": self.value() or ""}


class WorkflowFilter(InputFilter):
    title = "source workflow id"
    parameter_name = "workflow"

    def queryset(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> QuerySet[FailedEvent]:
        return queryset.filter(source_workflow_id=self.value()) if self.value() else queryset


class MatchFilter(InputFilter):
    title = "payload field (path:value)"
    parameter_name = "match"

    def queryset(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> QuerySet[FailedEvent]:
        if not self.value():
            return queryset
        try:
            match = selectors.parse_match([self.value()])
        except DomainError as exc:
            messages.warning(request, exc.detail)
            return queryset.none()
        return selectors._filter_match(queryset, match)


class TenantFilter(admin.SimpleListFilter):
    """Tenants from the tenant table (a distinct over the entries would scan them all)."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tenants = Tenant.objects.order_by("slug")
        # The console's admin site scopes every ModelAdmin to the user's tenants
        # (review.staff.tenancy, a layer above): ask the admin, not the console's module.
        tenant_scope = getattr(model_admin, "tenant_scope", None)
        scope = tenant_scope(request) if tenant_scope is not None else None
        if scope is not None:
            tenants = tenants.filter(pk__in=scope)
        return [(str(t.pk), t.slug) for t in tenants[:200]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tenant_id=self.value()) if self.value() else queryset


class ReplayInline(ReadOnlyInline):
    model = Replay
    fields = [
        "number",
        "trigger",
        "started_at",
        "actor",
        "note",
        "target_slug",
        "sent_key",
        "flags",
        "result",
        "operation",
        "finished_at",
    ]
    readonly_fields = fields
    ordering = ["number"]
    verbose_name_plural = "replay history (lineage)"

    @admin.display(description="as new / forced")
    def flags(self, obj: Replay) -> str:
        return f"{display.yes_no(obj.as_new)} / {display.yes_no(obj.forced)}"

    @admin.display(description="result")
    def result(self, obj: Replay) -> str:
        # A success's answer is not an error: the HTTP status is the target's answer.
        answer = f"HTTP {obj.response_status}" if obj.response_status else ""
        problem = "" if obj.outcome == ReplayOutcome.SUCCEEDED else replay_failure(obj)
        return format_html(
            "{} {}{}",
            display.badge(obj.outcome),
            answer,
            format_html('<div class="og-muted">{}</div>', problem) if problem else "",
        )


class ChangeInline(ReadOnlyInline):
    model = FailedEventChange
    formset = TenantInlineFormSet
    fields = ["at", "from_status", "to_status", "actor", "note"]
    readonly_fields = fields
    ordering = ["at", "id"]
    verbose_name_plural = "status history"


@admin.register(FailedEvent)
class FailedEventAdmin(FailedEventActions, TenantColumnMixin, SelectorSearchMixin, ConsoleReadOnlyAdmin):
    """Read-only page: replay, resolve and discard (``FailedEventActions``) go through services."""

    list_display = ["entry", "status_badge", "error", "workflow", "node", "retries", "replays", "failed"]
    list_display_links = ["entry"]
    list_filter = [
        "status",
        "error_class",
        "shape",
        "weak_identity",
        ("failed_at", admin.DateFieldListFilter),
        TenantFilter,
        WorkflowFilter,
        MatchFilter,
    ]
    # The console's own search (dlq.entries.selectors.failed_event_search); this only shows the box.
    search_fields = ["event_id"]
    list_search = staticmethod(selectors.failed_event_search)
    search_help_text = (
        "Any part of the error message, workflow name, failed node, identity, original key or execution id "
        "(any case); an entry id."
    )
    ordering = ["-failed_at", "-id"]
    list_select_related = ["tenant"]
    show_full_result_count = False
    paginator = CappedCountPaginator
    list_per_page = 50
    inlines = [ReplayInline, ChangeInline]
    actions = ["replay_selected", "resolve_selected", "discard_selected"]
    change_form_template = "admin/dlq/failedevent/change_form.html"
    fieldsets = [
        (None, {"fields": ["event_id", "tenant", "status", "status_note", "weak_identity_shown", "shape"]}),
        (
            "Source",
            {
                "fields": [
                    "source_workflow_id",
                    "source_workflow_name",
                    "source_execution_id",
                    "execution_link",
                    "source_node",
                    "source_mode",
                    "operation",
                ]
            },
        ),
        (
            "Failure",
            {
                "fields": [
                    "error_class",
                    "error_message",
                    "quarantine_reason",
                    "failed_at",
                    "last_seen_at",
                    "retry_count",
                    "seen_count",
                ]
            },
        ),
        (
            "Replay",
            {
                "fields": [
                    "original_key",
                    "key_origin",
                    "occurrences_shown",
                    "same_key_entries",
                    "replay_target_slug",
                    "replay_count",
                    "auto_replay_count",
                    "corrected_operation",
                ]
            },
        ),
        (
            "Payload (masked)",
            {
                "fields": [
                    "payload_origin",
                    "payload_source",
                    "payload_source_ref",
                    "payload_fetch",
                    "payload_fetch_note",
                    "payload_fetched_at",
                    "payload_masked",
                    "search_fields",
                ]
            },
        ),
    ]
    readonly_fields = [
        "event_id",
        "tenant",
        "status",
        "status_note",
        "weak_identity_shown",
        "shape",
        "source_workflow_id",
        "source_workflow_name",
        "source_execution_id",
        "execution_link",
        "source_node",
        "source_mode",
        "operation",
        "error_class",
        "error_message",
        "failed_at",
        "last_seen_at",
        "retry_count",
        "seen_count",
        "original_key",
        "key_origin",
        "occurrences_shown",
        "same_key_entries",
        "replay_target_slug",
        "replay_count",
        "auto_replay_count",
        "payload_masked",
        "search_fields",
        "quarantine_reason",
        "corrected_operation",
        "payload_origin",
        "payload_source",
        "payload_source_ref",
        "payload_fetch",
        "payload_fetch_note",
        "payload_fetched_at",
    ]

    def export_columns(self, request: HttpRequest) -> list[str]:
        # The stored values, in full (the list's cells are HTML); the message scrubbed as listed.
        return [
            "id",
            "event_id",
            "tenant",
            "status",
            "error_class",
            "error_text",
            "source_workflow_id",
            "source_workflow_name",
            "source_execution_id",
            "source_node",
            "retry_count",
            "replay_count",
            "failed_at",
        ]

    @admin.display(description="error message")
    def error_text(self, obj: FailedEvent) -> str:
        return scrub(obj.error_message)

    @admin.display(description="entry", ordering="id")
    def entry(self, obj: FailedEvent) -> str:
        return format_html('{}<div class="og-muted">{}</div>', obj.pk, display.short_id(obj.event_id, keep=16))

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: FailedEvent) -> str:
        return display.badge(obj.status, obj.get_status_display())

    @admin.display(description="error")
    def error(self, obj: FailedEvent) -> str:
        message = display.truncate(scrub(obj.error_message), 110) or display.EMPTY
        kind = obj.get_error_class_display() if obj.error_class else "unclassified"
        return format_html('<div class="og-error">{}</div><div class="og-muted">{}</div>', message, kind)

    @admin.display(description="workflow", ordering="source_workflow_name")
    def workflow(self, obj: FailedEvent) -> str:
        if not (obj.source_workflow_name or obj.source_workflow_id):
            return display.EMPTY

        # The ids shortened (full value on hover, copied on click): an id of 255 characters
        # would otherwise widen the list past the screen.
        def shown(value: str) -> str:
            return display.short_id(value) if len(value) > 20 else value

        execution = format_html(" · exec {}", shown(obj.source_execution_id)) if obj.source_execution_id else ""
        return format_html(
            '<span title="{}">{}</span><div class="og-muted">wf {}{}</div>',
            obj.source_workflow_name,
            display.truncate(obj.source_workflow_name, 60) or display.EMPTY,
            shown(obj.source_workflow_id),
            execution,
        )

    @admin.display(description="failed node", ordering="source_node")
    def node(self, obj: FailedEvent) -> str:
        return display.truncate(obj.source_node, 40) or display.EMPTY

    @admin.display(description="retries", ordering="retry_count")
    def retries(self, obj: FailedEvent) -> int:
        return obj.retry_count

    @admin.display(description="replays", ordering="replay_count")
    def replays(self, obj: FailedEvent) -> int:
        return obj.replay_count

    @admin.display(description="failed", ordering="failed_at")
    def failed(self, obj: FailedEvent) -> str:
        return display.age(obj.failed_at)

    @admin.display(description="weak identity (a digest of the body)")
    def weak_identity_shown(self, obj: FailedEvent) -> str:
        return display.yes_no(obj.weak_identity)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        event = self.get_object(request, object_id)
        if event is not None:
            extra_context["story"] = selectors.failed_event_story(event)
            extra_context["status_badge"] = display.badge(event.status, event.get_status_display())
            extra_context["can_replay"] = self.has_replay_permission(request)
            extra_context["can_resolve"] = self.has_resolve_permission(request)
            extra_context["last_replay_failure"] = last_replay_failure(event)
            extra_context["needs_key"] = needs_key(event)
            extra_context["key_origin"] = selectors.key_origin(event)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="where the key came from")
    def key_origin(self, obj: FailedEvent) -> str:
        return selectors.key_origin(obj)

    @admin.display(description="occurrences")
    def occurrences_shown(self, obj: FailedEvent) -> str:
        rows = selectors.failed_event_occurrences(obj)
        if not rows:
            return str(obj.occurrence_count)
        return format_html(
            "{}<ul>{}</ul>",
            obj.occurrence_count,
            format_html_join(
                "",
                "<li>#{} · {} · execution {} · {}</li>",
                (
                    (
                        o.number,
                        display.when(o.at),
                        o.source_execution_id or "—",
                        display.truncate(scrub(o.error_message), 120),
                    )
                    for o in rows
                ),
            ),
        )

    @admin.display(description="other entries of this key")
    def same_key_entries(self, obj: FailedEvent) -> str:
        others = selectors.failed_events_sharing_key(obj)
        if not others:
            return "—"
        return format_html_join(
            ", ",
            '<a href="{}">entry {}</a> ({})',
            ((reverse("admin:dlq_failedevent_change", args=[o.pk]), o.pk, o.status) for o in others),
        )

    @admin.display(description="where the payload came from")
    def payload_origin(self, obj: FailedEvent) -> str:
        return selectors.payload_origin(obj)

    @admin.display(description="payload")
    def payload_masked(self, obj: FailedEvent) -> str:
        return format_html(
            '<pre style="max-height:30em;overflow:auto">{}</pre><p class="help">Values are masked. '
            "Revealing them needs the reveal permission and a reason (logged).</p>",
            masked_json(obj.payload),
        )

    @admin.display(description="execution URL")
    def execution_link(self, obj: FailedEvent) -> str:
        url = obj.source_execution_url
        if url.startswith(("https://", "http://")):
            return format_html('<a href="{}" rel="noreferrer noopener" target="_blank">{}</a>', url, url)
        return url or "—"
