"""The DLQ console. Entries, replays and alerts are changed only through services (each
change leaves its FailedEventChange / Replay row); payloads are shown as a masked skeleton.

Lists stay fast at a million rows: every filter is either a choices filter (no query), a
text input, or a date range, the tenant filter lists tenants (not distinct values of the big
table), counts are capped, and the default order (-failed_at, -id) is an index's order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dlq import services
from dlq.entries import selectors
from dlq.entries.payloads import is_redacted, open_payload
from dlq.models import (
    BulkReplay,
    FailedEvent,
    FailedEventChange,
    FailedEventStatus,
    KeySource,
    N8nConnection,
    Replay,
    ReplayAck,
    ReplayOutcome,
    ReplayTarget,
    RunResume,
)
from dlq.rules.conf import dlq_setting
from ledger.models import IdempotencyClass, Tenant
from ledger.platform.errors import DomainError
from ledger.platform.masking import mask_json
from ledger.platform.redaction import scrub
from ledger.providers.credentials import url_masked
from ledger.web import display
from ledger.web.console import (
    HTTPS_URL_FORMS,
    ReadOnlyInline,
    SelectorSearchMixin,
    TenantColumnMixin,
    TenantInlineFormSet,
    https_url_formfield,
)
from ledger.web.console_base import ConsoleJSONField, ConsoleReadOnlyAdmin, ServiceSaveAdmin
from ledger.web.failures import failure_html
from ledger.web.pagination import COUNT_CAP, CappedCountPaginator

MASK = "•••"


def mask_skeleton(value: Any, depth: int = 0) -> Any:
    """The payload's shape with every value replaced by •••: keys say what is there."""
    if depth > 8:
        return MASK
    if isinstance(value, dict):
        return {str(k): mask_skeleton(v, depth + 1) for k, v in list(value.items())[:100]}
    if isinstance(value, list):
        items = [mask_skeleton(v, depth + 1) for v in value[:20]]
        if len(value) > 20:
            items.append(f"{MASK} ({len(value) - 20} more)")
        return items
    return None if value is None else MASK


def masked_json(value: Any) -> str:
    if value is None:
        return "—"
    if is_redacted(value):
        return "(redacted by retention)"
    try:
        plain = open_payload(value)
    except Exception:  # a key that is not configured: say so, never break the page
        return "(sealed with a key that is not configured)"
    return json.dumps(mask_skeleton(plain), indent=2, ensure_ascii=False)


def needs_key(event: FailedEvent) -> bool:
    """A pending entry with no usable key, never replayed: the console sets its key before it
    offers the replay (an entry replayed before keeps its course)."""
    return (
        event.status == FailedEventStatus.PENDING and event.key_source == KeySource.MISSING and not event.replay_count
    )


def replay_failure(replay: Replay) -> SafeString | str:
    """A failed replay's error as a sentence with its next step, the raw text behind a
    disclosure (ledger.web.failures; the target's URL, if it still exists, names the destination)."""
    if not replay.error_message:
        return ""
    url = (
        ReplayTarget.objects.filter(tenant_id=replay.tenant_id, slug=replay.target_slug)
        .values_list("url", flat=True)
        .first()
    )
    return failure_html(replay.error_message, status=replay.response_status, url=url or "")


def last_replay_failure(event: FailedEvent) -> SafeString | str:
    last = event.replays.filter(tenant_id=event.tenant_id).order_by("-number").first()
    if last is None or last.outcome == ReplayOutcome.SUCCEEDED:
        return ""
    return replay_failure(last)


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


# --- Filters -----------------------------------------------------------------------------------


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
        # The console's admin site scopes every ModelAdmin to the user's tenants (review.tenancy,
        # a layer above): ask the admin, not the console's module.
        tenant_scope = getattr(model_admin, "tenant_scope", None)
        scope = tenant_scope(request) if tenant_scope is not None else None
        if scope is not None:
            tenants = tenants.filter(pk__in=scope)
        return [(str(t.pk), t.slug) for t in tenants[:200]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(tenant_id=self.value()) if self.value() else queryset


# --- Inlines -------------------------------------------------------------------------------------


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


# --- Forms -------------------------------------------------------------------------------------


class _TargetChoice(forms.ChoiceField):
    def __init__(self, tenant_id: int, **kwargs: Any):
        targets = ReplayTarget.objects.filter(tenant_id=tenant_id, active=True).order_by("slug")
        choices = [("", "the entry's target (or the tenant's default)")] + [
            (t.slug, f"{t.slug} → {t.url}{' (default)' if t.is_default else ''}") for t in targets
        ]
        super().__init__(choices=choices, required=False, **kwargs)


class ReplayForm(forms.Form):
    note = forms.CharField(required=False, max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))
    force = forms.BooleanField(required=False, help_text="Replay an entry that was replayed successfully already.")
    as_new = forms.BooleanField(
        required=False,
        label="Re-run as new",
        help_text="Send a derived key {key}~r{n} instead of the original one: the receiver will NOT dedup it "
        "against the first try. Only for receivers that cached the first failure.",
    )
    confirm = forms.BooleanField(required=False, label="I confirm the re-run as new")

    def __init__(self, *args: Any, tenant_id: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["target"] = _TargetChoice(tenant_id)


class NoteForm(forms.Form):
    note = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


class KeyForm(forms.Form):
    """The key an entry with no usable key is replayed under (services.failed_event_key_set
    checks it by the key rule; a refusal names the rule broken)."""

    key = forms.CharField(
        label="Idempotency key",
        max_length=255,
        strip=False,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "lead:call_7f3c2a9e:crm-contact:v1"}),
        help_text="1–255 printable ASCII characters, no blanks around it, no e-mail address or phone number: "
        "the record id the receiver deduplicates on.",
    )
    note = forms.CharField(
        max_length=500, required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}), label="Why (optional)"
    )


class CorrectForm(forms.Form):
    """A quarantined entry replayed with corrected fields as the next version."""

    fields_json = ConsoleJSONField(
        label="Corrected fields",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "placeholder": '{"body.amount": 1200}'}),
        help_text="JSON: dotted path → corrected value. Execute mode: paths into the stored request (body.…); "
        "guard mode: into the stored payload. The stored payload is not changed.",
    )
    note = forms.CharField(
        label="Why",
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required: recorded with your name and the fields you changed.",
    )

    def __init__(self, *args: Any, tenant_id: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["target"] = _TargetChoice(tenant_id, label="Replay target (guard mode)")

    def clean_fields_json(self) -> dict[str, Any]:
        value = self.cleaned_data["fields_json"]
        if not isinstance(value, dict) or not value:
            raise forms.ValidationError("An object of dotted paths and their corrected values.")
        return value


# --- FailedEvent -----------------------------------------------------------------------------------


@admin.register(FailedEvent)
class FailedEventAdmin(TenantColumnMixin, SelectorSearchMixin, ConsoleReadOnlyAdmin):
    """Read-only page: replay, resolve and discard below go through services."""

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

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dlq.replay_failedevent")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dlq.resolve_failedevent")

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

    # --- per-entry actions (change page buttons) ---

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path("<int:pk>/replay/", wrap(self.replay_view), name="dlq_failedevent_replay"),
            path("<int:pk>/correct/", wrap(self.correct_view), name="dlq_failedevent_correct"),
            path("<int:pk>/set-key/", wrap(self.set_key_view), name="dlq_failedevent_set_key"),
            path("<int:pk>/resend-decision/", wrap(self.resend_decision_view), name="dlq_failedevent_resend_decision"),
            path(
                "<int:pk>/resolve/",
                wrap(self.close_view),
                {"to": FailedEventStatus.RESOLVED},
                name="dlq_failedevent_resolve",
            ),
            path(
                "<int:pk>/discard/",
                wrap(self.close_view),
                {"to": FailedEventStatus.DISCARDED},
                name="dlq_failedevent_discard",
            ),
        ]
        return own + super().get_urls()

    def _entry(self, request: HttpRequest, pk: int) -> FailedEvent:
        # get_queryset is tenant-scoped by the console: another tenant's entry is a 404.
        return get_object_or_404(self.get_queryset(request), pk=pk)

    def _change_url(self, pk: int) -> str:
        return reverse("admin:dlq_failedevent_change", args=[pk])

    def _entry_action(
        self,
        request: HttpRequest,
        pk: int,
        *,
        allowed: bool,
        form: Callable[[FailedEvent], forms.Form],
        act: Callable[[FailedEvent, dict[str, Any]], tuple[int, str]],
        refused: str,
        title: str,
        button: str,
        preview: Callable[[FailedEvent], dict[str, Any]] | None = None,
    ) -> HttpResponse:
        """One entry's action page: its form; on a valid POST the service call (``act``: the
        message level and text it answers with), then back to the entry; a refusal (a domain
        error) is said as "``refused``: why" above the form again."""
        if not allowed:
            raise PermissionDenied
        event = self._entry(request, pk)
        bound = form(event)
        if request.method == "POST" and bound.is_valid():
            try:
                level, message = act(event, bound.cleaned_data)
            except DomainError as exc:
                messages.error(request, f"{refused}: {exc.detail}")
            else:
                messages.add_message(request, level, message)
                return HttpResponseRedirect(self._change_url(event.pk))
        return self._form_page(
            request, event, bound, title=title, button=button, preview=preview(event) if preview else None
        )

    def replay_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        def replay(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            replay = services.failed_event_replay(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                actor=actor_of(request),
                target_slug=data["target"],
                force=data["force"],
                note=data["note"],
                as_new=data["as_new"],
                confirm=data["confirm"],
            )
            if replay.outcome == ReplayOutcome.SUCCEEDED:
                answer = f"HTTP {replay.response_status}" if replay.response_status else "delivered"
                return messages.SUCCESS, f"Replay #{replay.number} to {replay.target_slug}: succeeded ({answer})."
            return messages.WARNING, format_html(
                "Replay #{} to {}: {} — {}",
                replay.number,
                replay.target_slug,
                replay.outcome,
                replay_failure(replay) or "no error recorded",
            )

        if self.has_replay_permission(request) and needs_key(self._entry(request, pk)):
            # Replayed under its own identity, no receiver could tell it from a new request:
            # the key is set first (set_key_view), then the replay is offered.
            messages.warning(request, f"Entry {pk} has no usable key: set the key it is replayed under first.")
            return HttpResponseRedirect(reverse("admin:dlq_failedevent_set_key", args=[pk]))
        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: ReplayForm(request.POST or None, tenant_id=event.tenant_id),
            act=replay,
            refused="Not replayed",
            title=f"Replay entry {pk}",
            button="Replay now",
            preview=lambda event: self._replay_preview(event, target_slug=request.POST.get("target", "")),
        )

    def _replay_preview(self, event: FailedEvent, *, target_slug: str) -> dict[str, Any]:
        """Where the replay goes, with which key, and what it sends (masked): shown before
        the button, from the same resolution the service uses."""
        preview: dict[str, Any] = {"key": event.original_key or event.event_id}
        try:
            target = selectors.replay_target_resolve(
                tenant_id=event.tenant_id, slug=target_slug or event.replay_target_slug
            )
        except DomainError as exc:
            preview["problem"] = exc.detail
        else:
            preview.update(
                url=url_masked(target.url),
                header=target.idempotency_header,
                target=target.slug,
                target_class=target.get_idempotency_class_display(),
                target_ack="delivered only on its Onceguard-Ack"
                if target.ack == ReplayAck.ECHO
                else "any 2xx counts as delivered",
                # Why it would wait for a person, in words, with the button to decide.
                waits=selectors.replay_wait_reason(event=event, target=target),
                decide_url=reverse("admin:dlq_failedevent_resend_decision", args=[event.pk]),
            )
        if is_redacted(event.payload):
            preview["body"] = "(redacted by retention: nothing to replay)"
        else:
            try:
                preview["body"] = json.dumps(mask_json(open_payload(event.payload)), indent=2, ensure_ascii=False)
            except Exception:  # a key that is not configured: say so, never break the page
                preview["body"] = "(sealed with a key that is not configured)"
        preview["as_new_key"] = services.derive_new_key(preview["key"], event.replay_count + 1)
        return preview

    def set_key_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Set the key of an entry that has no usable one (services.failed_event_key_set), then
        back to the entry, whose replay is offered from then on."""

        def set_key(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            changed = services.failed_event_key_set(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                key=data["key"],
                actor=actor_of(request),
                note=data["note"],
            )
            return messages.SUCCESS, f"Key of entry {event.pk} set to {changed.original_key}: it can be replayed now."

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: KeyForm(request.POST or None),
            act=set_key,
            refused="Key not set",
            title=f"Set the key of entry {pk} before its replay",
            button="Set the key",
        )

    def correct_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Replay with corrected fields as the next version of the key (services.failed_event_correct)."""

        def correct(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            result = services.failed_event_correct(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                actor=actor_of(request),
                fields=data["fields_json"],
                note=data["note"],
                target_slug=data["target"],
            )
            done = (
                f"submitted as operation {result.operation.pk}"
                if result.operation is not None
                else f"replay #{result.replay.number}: {result.replay.outcome}"  # type: ignore[union-attr]
            )
            return messages.SUCCESS, f"Corrected and sent again as {result.key} ({done})."

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: CorrectForm(request.POST or None, tenant_id=event.tenant_id),
            act=correct,
            refused="Not corrected",
            title=f"Correct entry {pk} and replay it as the next version",
            button="Correct and replay",
        )

    def resend_decision_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Record the decision "safe to resend" (a reason required) for an entry whose first
        try may have acted and whose target is key-advisory: the next replay is sent once."""

        def decide(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            services.failed_event_resend_decide(
                tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=data["note"]
            )
            return (
                messages.SUCCESS,
                f'Decision "safe to resend" recorded for entry {event.pk}: the next replay is sent.',
            )

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: NoteForm(request.POST or None),
            act=decide,
            refused="Not recorded",
            title=f'Entry {pk}: record the decision "safe to resend"',
            button="Safe to resend",
        )

    def close_view(self, request: HttpRequest, pk: int, to: str) -> HttpResponse:
        change = services.failed_event_resolve if to == FailedEventStatus.RESOLVED else services.failed_event_discard

        def close(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            change(tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=data["note"])
            return messages.SUCCESS, f"Entry {event.pk} marked {to}."

        verb = "Resolve" if to == FailedEventStatus.RESOLVED else "Discard"
        return self._entry_action(
            request,
            pk,
            allowed=self.has_resolve_permission(request),
            form=lambda event: NoteForm(request.POST or None),
            act=close,
            refused="Not changed",
            title=f"{verb} entry {pk}",
            button=verb,
        )

    def _form_page(
        self,
        request: HttpRequest,
        event: FailedEvent,
        form: forms.Form,
        *,
        title: str,
        button: str,
        preview: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {
            "preview": preview,
            "status_badge": display.badge(event.status, event.get_status_display()),
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "event": event,
            "form": form,
            "button": button,
            "back_url": self._change_url(event.pk),
        }
        return TemplateResponse(request, "admin/dlq/failedevent/action_form.html", context)

    # --- bulk actions (count shown before confirming) ---

    @admin.action(description="Replay selected entries…", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        tenant_ids = set(queryset.values_list("tenant_id", flat=True).distinct()[:2])
        if len(tenant_ids) != 1:
            messages.error(request, "A bulk replay works on one tenant's entries at a time.")
            return None
        tenant = Tenant.objects.get(pk=tenant_ids.pop())
        if request.POST.get("bulk_confirm"):
            try:
                bulk = services.bulk_replay_confirm(
                    tenant=tenant,
                    bulk_id=int(request.POST["bulk_id"]),
                    actor=actor_of(request),
                    count=int(request.POST["bulk_count"]),
                    target_slug=request.POST.get("target", ""),
                    note=request.POST.get("note", ""),
                )
            except (DomainError, ValueError, KeyError) as exc:
                messages.error(request, f"Not started: {getattr(exc, 'detail', 'bad request')}")
                return None
            messages.success(request, f"Bulk replay #{bulk.pk} of {bulk.count} entries started (paced).")
            return None
        try:
            bulk = services.bulk_replay_prepare(
                tenant=tenant,
                filters={},
                actor=actor_of(request),
                event_pks=list(queryset.values_list("pk", flat=True)[: COUNT_CAP + 1]),
            )
        except DomainError as exc:
            messages.error(request, f"Not prepared: {exc.detail}")
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Confirm bulk replay",
            "bulk": bulk,
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "ticked": queryset.count(),
            "target_field": _TargetChoice(tenant.pk).widget.render("target", ""),
            "action": "replay_selected",
            "rate": dlq_setting("BULK_REPLAY_PER_SECOND"),
            "waiting": selectors.replay_waiting(tenant_id=tenant.pk, event_ids=bulk.event_ids),
        }
        return TemplateResponse(request, "admin/dlq/failedevent/bulk_confirm.html", context)

    def _bulk_close(self, request: HttpRequest, queryset: QuerySet[FailedEvent], to: str) -> HttpResponse | None:
        note = request.POST.get("note", "").strip()
        if request.POST.get("bulk_confirm") and note:
            fn = services.failed_event_resolve if to == FailedEventStatus.RESOLVED else services.failed_event_discard
            done = skipped = 0
            for event in queryset.only("pk", "tenant_id")[:COUNT_CAP]:
                try:
                    fn(tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=note)
                    done += 1
                except DomainError:
                    skipped += 1
            messages.success(request, f"{done} entries marked {to}; {skipped} skipped (not pending or replayed).")
            return None
        if request.POST.get("bulk_confirm"):
            messages.error(request, "A note is required.")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Mark entries {to}",
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "ticked": queryset.count(),
            "action": f"{'resolve' if to == FailedEventStatus.RESOLVED else 'discard'}_selected",
            "to": to,
        }
        return TemplateResponse(request, "admin/dlq/failedevent/bulk_confirm.html", context)

    @admin.action(description="Resolve selected entries…", permissions=["resolve"])
    def resolve_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        return self._bulk_close(request, queryset, FailedEventStatus.RESOLVED)

    @admin.action(description="Discard selected entries…", permissions=["resolve"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        return self._bulk_close(request, queryset, FailedEventStatus.DISCARDED)


# --- Lineage, bulk replays, targets, alerts ------------------------------------------------------


@admin.register(RunResume)
class RunResumeAdmin(ConsoleReadOnlyAdmin):
    """The audit of run resumes (dlq.replays.runs): who resumed which run, why, what it planned to
    re-drive and what came of each step. Written only by run_resume; read-only here."""

    list_display = ["at", "run", "actor", "note", "summary"]
    search_fields = ["run__exact", "actor"]
    ordering = ["-at", "-id"]
    show_full_result_count = False
    fields = ["tenant", "run", "actor", "note", "at", "planned", "results"]
    readonly_fields = fields

    @admin.display(description="steps re-driven")
    def summary(self, obj: RunResume) -> str:
        return "; ".join(f"{r.get('key')}: {r.get('outcome') or r.get('error') or '—'}" for r in obj.results or [])


@admin.register(Replay)
class ReplayAdmin(ConsoleReadOnlyAdmin):
    list_display = ["event", "number", "trigger", "outcome", "target_slug", "actor", "started_at", "response_status"]
    list_filter = ["outcome", "trigger", "as_new", "forced"]
    search_fields = ["ledger_key__exact", "sent_key__exact"]
    list_select_related = ["event"]
    ordering = ["-id"]
    show_full_result_count = False
    exclude = ["response_body"]
    readonly_fields = ["response_masked"]

    @admin.display(description="target's answer")
    def response_masked(self, obj: Replay) -> str:
        return format_html("<pre>{}</pre>", masked_json(obj.response_body))


@admin.register(BulkReplay)
class BulkReplayAdmin(ConsoleReadOnlyAdmin):
    list_display = ["id", "tenant", "status", "count", "position", "succeeded", "failed", "skipped", "created_by"]
    list_filter = ["status"]
    ordering = ["-id"]
    exclude = ["event_ids"]


class ReplayTargetForm(forms.ModelForm):
    """A new target must declare its class (the blank choice is refused); saving a class
    confirms it. The credential's value is write-only: typed to set or replace it, never
    rendered back, blank keeps the stored one. ReplayTarget.clean checks the URLs (outbound
    policy, https unless on this machine)."""

    idempotency_class = forms.ChoiceField(
        choices=[("", "— choose —"), *IdempotencyClass.choices],
        label="Idempotency class",
        help_text=ReplayTarget._meta.get_field("idempotency_class").help_text,
    )
    # Not required, so a save that leaves it out keeps the target's (or, for a new one, gets
    # the service's undeclared default: echo on the tenant's n8n, else status — the same as
    # the command's, ADR 0006); declaring it confirms it (ADR 0007).
    ack = forms.ChoiceField(
        choices=[("", "— not declared (echo on this tenant's n8n, else status) —"), *ReplayAck.choices],
        required=False,
        label="Acknowledgement",
        help_text=ReplayTarget._meta.get_field("ack").help_text,
    )
    new_credential = forms.CharField(
        required=False,
        label="Credential value",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent in the credential header on every replay. Write-only: type a value to set or replace the"
        " stored one (stored encrypted, never shown again); leave blank to keep it.",
    )
    clear_credential = forms.BooleanField(required=False, label="Remove the stored credential")

    class Meta:
        model = ReplayTarget
        fields = [
            "tenant",
            "slug",
            "url",
            "idempotency_class",
            "ack",
            "idempotency_header",
            "lookup_url",
            "credential_header",
            "timeout_seconds",
            "is_default",
            "auto_replay",
            "active",
        ]
        formfield_callback = https_url_formfield

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and not self.instance.class_confirmed:
            # A migrated target: its key-advisory default is not a declaration; ask again.
            self.initial["idempotency_class"] = ""
        if self.instance.pk is None or not self.instance.ack_confirmed:
            # Migrated (or never declared): "status" is what it does, not a declaration; ask.
            self.initial["ack"] = ""

    def clean_ack(self) -> str:
        # Blank keeps what the target has: the model field is never set to "" (save_model
        # passes the declaration, or None, to the service).
        self.declared_ack = self.cleaned_data.get("ack") or None
        return self.declared_ack or self.instance.ack or ReplayAck.STATUS

    def clean_new_credential(self) -> str:
        value = self.cleaned_data.get("new_credential") or ""
        if value and not value.isprintable():
            raise forms.ValidationError("The credential must be printable text.")
        return value

    def credential_change(self) -> str | None:
        """The credential as ``services.replay_target_upsert`` takes it: a new value, "" to
        remove it, None to keep it (the service seals it)."""
        if self.cleaned_data.get("clear_credential"):
            return ""
        return self.cleaned_data.get("new_credential") or None


class AckFilter(admin.SimpleListFilter):
    title = "acknowledgement"
    parameter_name = "ack_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("unconfirmed", "not confirmed (migrated or not declared)"), *ReplayAck.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> QuerySet[ReplayTarget]:
        if self.value() == "unconfirmed":
            return queryset.filter(ack_confirmed=False)
        if self.value() in ReplayAck.values:
            return queryset.filter(ack=self.value())
        return queryset


class ClassConfirmedFilter(admin.SimpleListFilter):
    title = "class"
    parameter_name = "class_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("unconfirmed", "not confirmed (migrated as key-advisory)"), *IdempotencyClass.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> QuerySet[ReplayTarget]:
        if self.value() == "unconfirmed":
            return queryset.filter(class_confirmed=False)
        if self.value() in IdempotencyClass.values:
            return queryset.filter(idempotency_class=self.value())
        return queryset


@admin.register(ReplayTarget)
class ReplayTargetAdmin(ServiceSaveAdmin):
    """Where replays go. The URL is shown masked past its host (a webhook path can be a
    token) and is not searchable; the signing secret is shown once, when made or rotated;
    the credential is write-only."""

    form = ReplayTargetForm
    list_display = [
        "slug",
        "tenant",
        "url_shown",
        "class_shown",
        "ack_shown",
        "idempotency_header",
        "is_default",
        "auto_replay",
        "active",
    ]
    list_filter = [ClassConfirmedFilter, AckFilter, "is_default", "auto_replay", "active"]
    search_fields = ["slug"]
    formfield_overrides = HTTPS_URL_FORMS
    readonly_fields = ["signing_state", "credential_state"]
    service_keys = ("tenant", "slug")
    actions = ["rotate_signing_secret"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Said by the list page itself: the console's mixin in front of every page
        # (review.console.ConsoleAdminMixin) answers get_changelist with its own class and never
        # asks this page's. GET only, so an action's post and its redirect do not say it twice.
        if request.method == "GET":
            self._unconfirmed_warnings(request)
        return super().changelist_view(request, extra_context)

    def _unconfirmed_warnings(self, request: HttpRequest) -> None:
        unconfirmed = self.get_queryset(request).filter(class_confirmed=False).count()
        if unconfirmed:
            # The dashboard hint: migrated targets whose class nobody declared yet.
            messages.warning(
                request,
                f"{unconfirmed} replay target(s) were migrated as key-advisory and wait for their class to be"
                " confirmed: open each and choose key-enforced or key-advisory.",
                fail_silently=True,
            )
        unacknowledged = self.get_queryset(request).filter(ack_confirmed=False).count()
        if unacknowledged:
            # Migrated targets count a bare 2xx as delivered, as they did: for an n8n receiver
            # that is n8n's answer to a workflow that stopped half-way (ADR 0007).
            messages.warning(
                request,
                f"{unacknowledged} replay target(s) count any 2xx as delivered and nobody confirmed it: for an n8n"
                " receiver, update its workflow to answer Onceguard-Ack (the replay-receiver template) and choose"
                " echo; keep status only for an API that refuses a second effect of a key.",
                fail_silently=True,
            )

    @admin.display(description="acknowledgement")
    def ack_shown(self, obj: ReplayTarget) -> str:
        return obj.ack if obj.ack_confirmed else f"{obj.ack} (not confirmed)"

    @admin.display(description="URL")
    def url_shown(self, obj: ReplayTarget) -> str:
        return url_masked(obj.url)

    @admin.display(description="class")
    def class_shown(self, obj: ReplayTarget) -> str:
        shown = obj.get_idempotency_class_display()
        return shown if obj.class_confirmed else f"{shown} (not confirmed)"

    @admin.display(description="signing secret")
    def signing_state(self, obj: ReplayTarget) -> str:
        return services.replay_target_secret_summary(obj)

    @admin.display(description="credential")
    def credential_state(self, obj: ReplayTarget) -> str:
        if not obj.credential_secret:
            return "not set"
        return f"set, sent in {obj.credential_header or '(no header named)'} (stored encrypted; never shown)"

    def save_model(self, request: HttpRequest, obj: ReplayTarget, form: Any, change: bool) -> None:
        # One write path (ADR 0006): the command's service checks the URLs, seals the
        # credential, makes a new target's signing secret, moves the default and records
        # every target it changed.
        target = services.replay_target_upsert(
            tenant=obj.tenant,
            slug=obj.slug,
            url=obj.url,
            idempotency_class=obj.idempotency_class,
            ack=getattr(form, "declared_ack", None),
            idempotency_header=obj.idempotency_header,
            lookup_url=obj.lookup_url,
            credential_header=obj.credential_header,
            credential_value=form.credential_change(),
            timeout_seconds=obj.timeout_seconds,
            is_default=obj.is_default,
            auto_replay=obj.auto_replay,
            active=obj.active,
            actor=self.actor_of(request),
        )
        self._new_secret = target.new_signing_secret
        self.adopt(obj, target)

    def response_add(self, request: HttpRequest, obj: ReplayTarget, post_url_continue: str | None = None) -> Any:
        secret = getattr(self, "_new_secret", "")
        if secret:
            return self._secret_once(request, obj, secret, made="made")
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Rotate the signing secret (shown once)", permissions=["change"])
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> HttpResponse | None:
        if queryset.count() != 1:
            messages.error(request, "Rotate one target's secret at a time: each new secret is shown once.")
            return None
        target = queryset.get()
        secret, _made = services.replay_target_signing_secret(
            target_id=target.pk, rotate=True, actor=f"user:{request.user.get_username()}"
        )
        target.refresh_from_db()
        return self._secret_once(request, target, secret, made="rotated")

    def _secret_once(self, request: HttpRequest, target: ReplayTarget, secret: str, *, made: str) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"Signing secret of replay target {target.slug}",
            "opts": self.opts,
            "target": target,
            "secret": secret,
            "made": made,
            "summary": services.replay_target_secret_summary(target),
        }
        response = TemplateResponse(request, "admin/dlq/replaytarget/secret_once.html", context)
        # Shown once: never cached, never kept in the session or a message cookie.
        response["Cache-Control"] = "no-store"
        return response


class N8nConnectionForm(forms.ModelForm):
    """The n8n API key is write-only: typed to set or replace it, never rendered back (the
    page says when it was set). N8nConnection.clean checks the URL against the outbound
    policy and stores it canonical; the save is dlq.services.n8n_connection_save's, which
    records the change with the key masked (ADR 0006)."""

    new_api_key = forms.CharField(
        required=False,
        label="n8n API key",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Made in n8n under Settings → n8n API (it needs to read executions). Write-only: type a key to set"
        " or replace the stored one; it is stored encrypted and never shown again.",
    )

    class Meta:
        model = N8nConnection
        fields = ["tenant", "base_url", "timeout_seconds", "active"]
        formfield_callback = https_url_formfield

    def clean_new_api_key(self) -> str:
        key = self.cleaned_data.get("new_api_key") or ""
        if not key:
            return ""
        try:
            return services.n8n_api_key_check(key)
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.instance.pk is None and not data.get("new_api_key") and "new_api_key" not in self.errors:
            self.add_error("new_api_key", "A new connection needs the n8n API key.")
        return data


@admin.register(N8nConnection)
class N8nConnectionAdmin(ServiceSaveAdmin):
    """A tenant's n8n instance for lead capture (DESIGN §7): Error Trigger entries get the
    failed node's input items. Tenant admins set it; the key is never shown."""

    form = N8nConnectionForm
    formfield_overrides = HTTPS_URL_FORMS
    list_display = ["tenant", "base_url", "api_key_state", "active", "updated_at"]
    list_filter = ["active"]
    search_fields = ["base_url"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["tenant", "api_key_state"] if obj is not None else ["api_key_state"]

    @admin.display(description="API key")
    def api_key_state(self, obj: N8nConnection) -> str:
        if not obj.api_key_secret:
            return "not set"
        when = f", set {display.age(obj.api_key_set_at)}" if obj.api_key_set_at else ""
        return f"set (stored encrypted; never shown){when}"

    def save_model(self, request: HttpRequest, obj: N8nConnection, form: Any, change: bool) -> None:
        # One write path (ADR 0006): `manage.py n8n_connect`'s service checks the URL and the
        # key, seals the key and records the change with it masked.
        connection = services.n8n_connection_save(
            tenant=obj.tenant,
            base_url=obj.base_url,
            api_key=form.cleaned_data.get("new_api_key") or None,
            timeout_seconds=obj.timeout_seconds,
            active=obj.active,
            actor=self.actor_of(request),
        )
        self.adopt(obj, connection)
