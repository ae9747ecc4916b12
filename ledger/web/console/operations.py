"""The operations pages: the list that answers "what needs me", the detail page that leads
with the story, and the operator's cancel and retry now — one row after a preview, or a
filtered selection after a count preview, each through ``ledger.protocol.transitions``.

Operations are read-only here for everyone, superusers included: every change goes through a
transition and leaves its event. Attempts and events, keyed (id, <time>), have pages of their
own (review.console.history_pages): the admin does not register a model with a composite primary key;
the operation page shows them to those who may read their tables. ``NeedsFilter`` is the
list's "needs" filter, ``LiteralIn`` the ``status__in_literal`` lookup its partial indexes need."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import F, OuterRef, Q, QuerySet, Subquery
from django.db.models.lookups import In
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from ledger.execution import manifests
from ledger.models import (
    OPEN_STATES,
    RECALLED_OUTPUT_STATES,
    TERMINAL_STATES,
    Attempt,
    OpenOperation,
    Operation,
    OperationEvent,
    OperationMode,
    OperationOutput,
    OperationStatus,
    WorkflowName,
)
from ledger.platform import tracing
from ledger.platform.errors import DomainError
from ledger.protocol import transitions
from ledger.protocol.selectors import (
    LISTED_BY_EVENT,
    operation_history,
    operation_ids_in_terminal_state,
    operation_search,
    operation_search_window,
    operations_in_state,
    run_of,
)
from ledger.providers import prompts, revisions
from ledger.store.open_rows import open_rows_where
from ledger.web import display
from ledger.web.console_base import (
    ConsoleReadOnlyAdmin,
    SelectorSearchMixin,
    TenantColumnMixin,
    attempts_with_labels,
    may_view,
)
from ledger.web.failures import failure_html
from ledger.web.pagination import CappedCountPaginator
from ledger.web.story import operation_story

S = OperationStatus


class LiteralIn(In):
    """``status__in_literal=[…]``: ``IN`` with the states written into the SQL instead of sent
    as parameters. A partial index over states (``op_open_id_idx``, ``op_cancellable_id_idx``)
    is usable only by a plan that can prove its predicate from the query, which a generic plan
    of ``status IN ($1, $2)`` cannot: written as constants, the page's plan is the same
    whether PostgreSQL plans it per call or once for a prepared statement. Only state names
    (lower-case words) are accepted."""

    lookup_name = "in_literal"

    def process_rhs(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        values = sorted({str(v) for v in self.rhs})
        if not values or not all(isinstance(v, str) and _STATE_NAME.fullmatch(v) for v in values):
            raise ValueError(f"in_literal takes state names, not {self.rhs!r}")
        return "(" + ", ".join(f"'{v}'" for v in values) + ")", ()


_STATE_NAME = re.compile(r"[a-z_]{1,32}")
Operation._meta.get_field("status").register_lookup(LiteralIn)
OpenOperation._meta.get_field("status").register_lookup(LiteralIn)


class NeedsFilter(admin.SimpleListFilter):
    """What needs whom: due work, rows only their caller can move, rows stuck for too long."""

    title = "needs"
    parameter_name = "needs"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("due", "due now (execute mode)"),
            ("caller", "waiting for the caller (guard mode)"),
            ("stuck", "open for too long"),
            ("cancellable", "can be cancelled"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Operation]) -> QuerySet[Operation]:
        # Each reads the work queue's mirror, whose partial indexes hold the open rows (ADR 0017);
        # the row's own columns are checked too (open_rows_where).
        now = timezone.now()
        due = Q(status__in=[S.QUEUED, S.RETRY_WAIT], next_attempt_at__lte=now)
        if self.value() == "due":
            return queryset.filter(
                open_rows_where(status__in=[S.QUEUED, S.RETRY_WAIT], mode=OperationMode.EXECUTE)
            ).filter(due)
        if self.value() == "caller":
            return queryset.filter(open_rows_where(status=S.RETRY_WAIT, mode=OperationMode.GUARD)).filter(due)
        if self.value() == "stuck":
            cutoff = now - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
            _count_instead(request, OpenOperation.objects.filter(updated_at__lt=cutoff).values("pk"))
            # Every mirrored row is open: "not moved since" is checked on the entries of its
            # (id, updated_at) index; the page and its count read that index.
            return queryset.filter(
                open_row__tenant_id=F("tenant_id"), open_row__updated_at__lt=cutoff, updated_at__lt=cutoff
            ).exclude(status__in_literal=sorted(TERMINAL_STATES))
        if self.value() == "cancellable":
            # The predicate of open_cancellable_id_idx (those rows in list order), in constants:
            # the page reads its 100 entries, its count a range of them.
            cancellable = list(transitions.CANCELLABLE_STATES)
            _count_instead(request, OpenOperation.objects.filter(status__in_literal=cancellable).values("pk"))
            return queryset.filter(
                open_row__tenant_id=F("tenant_id"),
                open_row__status__in_literal=cancellable,
                status__in_literal=cancellable,
            )
        return queryset


class StateFilter(admin.ChoicesFieldListFilter):
    """The stock state filter (``status__exact``), each state read through an index that does
    not live on the operation row (ADR 0017: ``ledger.protocol.selectors.operations_in_state``)."""

    def __init__(self, field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any, field_path: str):
        super().__init__(field, request, params, model, model_admin, field_path)
        scope_of = getattr(model_admin, "tenant_scope", None)
        self.tenant_ids = scope_of(request) if scope_of is not None else None

    def queryset(self, request: HttpRequest, queryset: QuerySet[Operation]) -> QuerySet[Operation]:
        states = self.used_parameters.get(self.lookup_kwarg)
        if isinstance(states, list | tuple) and len(states) == 1:
            states = states[0]
        if not isinstance(states, str) or states not in S.values or self.lookup_kwarg_isnull in self.used_parameters:
            return super().queryset(request, queryset)
        if states in OPEN_STATES:
            _count_instead(request, OpenOperation.objects.filter(status=states).values("pk"))
        elif states in LISTED_BY_EVENT:
            # The events into the state (an index-only read) instead of an operation row probed
            # for each of up to 10,001 ids: 3–16 ms at 10M against 33–170 ms, and seconds on a
            # cold cache (ADR 0027 item 3).
            _count_instead(request, operation_ids_in_terminal_state(states))
        return operations_in_state(queryset, states, tenant_ids=self.tenant_ids)


# The console's list parameters that do not narrow its rows (page, ordering).
_NOT_FILTERS = frozenset({"p", "o"})


def _count_instead(request: HttpRequest | None, ids: QuerySet[Any]) -> None:
    """Let the list's capped count read ``ids`` — the ids of the list's rows, one per row, from
    a cheaper source — when that filter is the list's only one (ADR 0027): the page joins each
    candidate to its operation (to check the row's own columns, ``open_rows_where``), but
    counting 10,001 of them that way probed as many operation rows (~150 ms at 10M under
    load). The sources: the work-queue mirror, written by the row's own statements (ADR 0017
    triggers), so in one snapshot its rows are exactly the open rows with the same state and
    ``updated_at``; the events into a terminal state, which is final."""
    if request is not None:  # None: the filter applied outside a request (the dashboard's links)
        request.list_counted = ids  # type: ignore[attr-defined]


class OperatorActionForm(forms.Form):
    reason = forms.CharField(
        max_length=400,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required: kept in the operation's history with your name.",
    )


BULK_LIMIT = 5000


@admin.register(Operation)
class OperationAdmin(TenantColumnMixin, SelectorSearchMixin, ConsoleReadOnlyAdmin):
    """The operations list answers "what needs me" (state, provider, workflow, attempts,
    age on one line at 1,280 px); the detail page leads with the story (ledger.web.story); cancel
    and retry now go through services, one row or a filtered selection after a count preview."""

    list_display = ["row_id", "key_short", "status_badge", "provider_slug", "workflow", "attempts_used", "age"]
    list_display_links = ["row_id", "key_short"]
    # No date hierarchy: it runs DISTINCT date_trunc(created_at) over every matching row on each
    # view (4 s at ten million rows); the date filter is links, no query.
    list_filter = [
        NeedsFilter,
        ("status", StateFilter),
        "mode",
        "tenant",
        "provider",
        "error_class",
        ("created_at", admin.DateFieldListFilter),
    ]
    # The console's own search (ledger.protocol.selectors.operation_search); this list only shows the box.
    search_fields = ["key"]
    list_search = staticmethod(operation_search)
    # A common text is searched in the newest operations, window by window (ADR 0026).
    list_search_window = staticmethod(operation_search_window)
    list_search_scoped = True
    list_search_paged = True
    tenant_column_at = 2
    search_help_text = (
        "A whole key; any part of a key, reconciliation handle, execution or correlation id, workflow name"
        " or error text (any case); a provider ref from its start; an operation id."
    )
    list_select_related = ["tenant", "provider"]
    # What the columns read (review.console.listing.ConsoleChangeList.listed): the row's id, key and
    # state, its tenant's and provider's slugs, its workflow, attempts and times. A field
    # missing here is read with a query per row (tests/console/test_list_query_counts.py).
    list_reads = (
        "id",
        "tenant_id",
        "key",
        "mode",
        "status",
        "next_attempt_at",
        "provider_id",
        "workflow_id",
        "workflow_version",
        "execution_id",
        "attempts",
        "max_attempts",
        "created_at",
        "updated_at",
        "tenant__slug",
        "provider__slug",
    )
    # Sorted newest first by id only: any other order sorts every matching row (a key sort
    # over ten million rows took 31 s). The other columns declare no ordering, so a crafted
    # `o=` parameter cannot ask for one either (sortable_by alone only hides the links).
    sortable_by = ["row_id"]
    show_full_result_count = False
    change_form_template = "admin/ledger/operation/change_form.html"
    actions = ["cancel_selected", "retry_now_selected"]
    readonly_fields = [
        "last_attempt_error",
        "sent_marker_uses",
        "superseded_by",
        "run_page",
        "replaced_by",
        "prompt_pins",
        "trace",
        "output_state",
        "evaluation_manifest",
        "extraction_score",
    ]
    fieldsets = [
        (
            "Identity",
            {
                "fields": [
                    "key",
                    "tenant",
                    "provider",
                    "mode",
                    "action",
                    "fingerprint",
                    "workflow_id",
                    "workflow_version",
                    "execution_id",
                    "correlation_id",
                    "trace",
                    "reconciliation_handle",
                    "callback_url",
                ]
            },
        ),
        (
            "State and timing",
            {
                "fields": [
                    "status",
                    "attempts",
                    "throttled_attempts",
                    "max_attempts",
                    "created_at",
                    "claimed_at",
                    "sent_at",
                    "sent_marker_uses",
                    "lease_expires_at",
                    "next_attempt_at",
                    "deadline",
                    "expires_at",
                    "updated_at",
                    "done_at",
                    "superseded_by",
                ]
            },
        ),
        # The run it is a step of (its page shows every step), its versioned key's parts.
        (
            "Run and version",
            {
                "fields": [
                    "run_page",
                    "step",
                    "record",
                    "version",
                    "replaced_by",
                    "eligibility_confirmed_at",
                    "prompt_pins",
                ]
            },
        ),
        (
            "Outcome",
            {
                "fields": [
                    "provider_ref",
                    "response_status",
                    "last_attempt_error",
                    "output_state",
                    "evaluation_manifest",
                    "extraction_score",
                ]
            },
        ),
        ("Sweeper", {"fields": ["reconcile_until", "lookup_failures", "alerted_at"]}),
    ]

    def export_columns(self, request: HttpRequest) -> list[str]:
        # The stored values, in full (the list's cells are HTML: a shortened key, a badge, ages).
        return [
            "id",
            "tenant",
            "key",
            "status",
            "mode",
            "provider",
            "workflow_id",
            "workflow_version",
            "execution_id",
            "attempts",
            "max_attempts",
            "error_class",
            "created_at",
            "updated_at",
        ]

    # --- columns ---

    @admin.display(description="id", ordering="id")
    def row_id(self, obj: Operation) -> str:
        return str(obj.pk)

    @admin.display(description="key")
    def key_short(self, obj: Operation) -> str:
        return display.short_id(obj.key, keep=44)

    @admin.display(description="status")
    def status_badge(self, obj: Operation) -> str:
        mode = "guard" if obj.mode == OperationMode.GUARD else "execute"
        return display.format_html('{}<div class="og-muted">{}</div>', display.operation_badge(obj), mode)

    @admin.display(description="provider")
    def provider_slug(self, obj: Operation) -> str:
        return obj.provider.slug if obj.provider_id and obj.provider else display.EMPTY

    def get_paginator(self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any) -> Any:
        paginator = super().get_paginator(request, queryset, per_page, *args, **kwargs)
        ids = getattr(request, "list_counted", None)
        narrowing = set(request.GET) - _NOT_FILTERS
        if ids is not None and len(narrowing) == 1 and isinstance(paginator, CappedCountPaginator):
            scope = self._tenants(request)
            paginator.counted = ids if scope is None else ids.filter(tenant_id__in=scope)
        return paginator

    def get_queryset(self, request: HttpRequest) -> QuerySet[Operation]:
        # The newest name each row's workflow was seen with (WorkflowName's unique index),
        # computed for the rows of the page only.
        newest_name = (
            WorkflowName.objects.filter(tenant_id=OuterRef("tenant_id"), workflow_id=OuterRef("workflow_id"))
            .order_by("-first_seen_at", "-id")
            .values("name")[:1]
        )
        return super().get_queryset(request).annotate(workflow_name=Subquery(newest_name))

    @admin.display(description="workflow / execution")
    def workflow(self, obj: Operation) -> str:
        if not (obj.workflow_id or obj.execution_id):
            return display.EMPTY
        version = f" v{obj.workflow_version}" if obj.workflow_version else ""
        # Shortened like the execution (full value on hover): a workflow id may be 255 characters.
        workflow_id = display.short_id(obj.workflow_id) if len(obj.workflow_id) > 20 else obj.workflow_id
        workflow = display.format_html("wf {}{}", workflow_id, version) if obj.workflow_id else ""
        execution = display.short_id(f"exec {obj.execution_id}", keep=22) if obj.execution_id else ""
        name = getattr(obj, "workflow_name", None)
        if not name:
            return display.format_html('{}<div class="og-muted">{}</div>', workflow, execution)
        # The name first (shortened, in full on hover), then the workflow's id and the execution.
        return display.format_html(
            '<span title="{}">{}</span><div class="og-muted">{}{}{}</div>',
            name,
            display.truncate(name, 28),
            workflow,
            " · " if workflow and execution else "",
            execution,
        )

    @admin.display(description="attempts")
    def attempts_used(self, obj: Operation) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="age")
    def age(self, obj: Operation) -> str:
        return display.format_html(
            '{}<div class="og-muted og-nowrap">updated {}</div>',
            display.age(obj.created_at),
            display.age(obj.updated_at),
        )

    @admin.display(description="error of the last failed attempt")
    def last_attempt_error(self, obj: Operation) -> str:
        if not (obj.error_class or obj.last_error):
            return display.EMPTY
        text = f"{obj.get_error_class_display() or 'error'}: {obj.last_error or '(no message)'}"
        if obj.status == S.SUCCEEDED:
            text += " — an earlier attempt's; the operation succeeded"
        return text

    @admin.display(description="sender writes the sent marker")
    def sent_marker_uses(self, obj: Operation) -> str:
        return display.yes_no(obj.uses_sent_marker or obj.mode == OperationMode.EXECUTE)

    @admin.display(description="run")
    def run_page(self, obj: Operation) -> str:
        run = run_of(run=obj.run, correlation_id=obj.correlation_id)
        if not run:
            return display.EMPTY
        # The console site's run page (review.console.run_pages), by URL name: the ledger imports nothing above it.
        url = reverse(f"{self.admin_site.name}:onceguard_run") + "?" + urlencode({"run": run, "tenant": obj.tenant_id})
        source = "" if obj.run else " (its correlation id)"
        return format_html('<a href="{}">{}</a>{}', url, run, source)

    @admin.display(description="trace")
    def trace(self, obj: Operation) -> str:
        # The caller's trace this operation continued (ADR 0015), linked to the trace backend
        # when TRACE_LINK_TEMPLATE says where; only an http(s) template becomes a link.
        trace_id = tracing.trace_id_of(obj.trace_context)
        if not trace_id:
            return display.EMPTY
        url = tracing.trace_link(trace_id=trace_id, template=settings.TRACE_LINK_TEMPLATE)
        if not url.startswith(("https://", "http://")):
            return format_html("<code>{}</code>", trace_id)
        return format_html('<a href="{}" rel="noopener noreferrer"><code>{}</code></a>', url, trace_id)

    @admin.display(description="output")
    def output_state(self, obj: Operation) -> str:
        # The published output's standing (ADR 0020): recalled with a rolled-back revision or not.
        output = OperationOutput.objects.filter(tenant_id=obj.tenant_id, operation_id=obj.pk).first()
        if output is None:
            return display.EMPTY
        url = reverse("admin:ledger_operationoutput_change", args=[output.pk])
        if output.state not in RECALLED_OUTPUT_STATES:
            return format_html('<a href="{}">{}</a> · {}', url, display.short_id(output.key, keep=22), output.state)
        return format_html(
            '<a href="{}">{}</a> · <strong data-testid="output-recalled">{}</strong> (revision {}, {}): {}'
            '<div class="og-muted">consumed: {}</div>',
            url,
            display.short_id(output.key, keep=22),
            output.get_state_display(),
            revisions.revision_number(output.adapter_revision_id) or "—",
            output.recalled_at,
            output.recall_reason,
            output.consumed_at or "never",
        )

    @admin.display(description="prompt templates pinned at acceptance")
    def prompt_pins(self, obj: Operation) -> str:
        # Every attempt of the job renders these versions (ADR 0009); each attempt's row below
        # says the version it rendered.
        pinned = prompts.prompt_templates_pinned(tenant_id=obj.tenant_id, request=obj.request)
        if not pinned:
            return display.EMPTY
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            ((reverse("admin:ledger_prompttemplate_change", args=[p.pk]), str(p)) for p in pinned),
        )

    @admin.display(description="evaluation manifest")
    def evaluation_manifest(self, obj: Operation) -> str:
        # Its digest and preset only: the manifest itself can name a person (ADR 0022).
        manifest = manifests.manifest_of(tenant_id=obj.tenant_id, operation_id=obj.pk)
        if manifest is None:
            return display.EMPTY
        return format_html(
            "<code>sha256 {}</code> · preset {} · written by {}",
            manifest.sha256[:16] + "…",
            str(manifest.preset) if manifest.preset_id else "none",
            manifest.created_by,
        )

    @admin.display(description="manifest score")
    def extraction_score(self, obj: Operation) -> str:
        # An extraction's score against its document's manifest, and the fields that missed.
        score = manifests.manifest_score_of(tenant_id=obj.tenant_id, operation_id=obj.pk)
        if score is None:
            return display.EMPTY
        if score.score is None:
            return format_html(
                "{} · {}", score.get_status_display(), score.reason or f"of operation {score.evaluates_id}"
            )
        missed = [d["field"] for d in score.details if d["result"] != "match"]
        return format_html(
            "<strong>{}</strong> against the manifest of operation {} · {} of {} fields matched{}",
            f"{score.score:.3f}",
            score.evaluates_id or "(deleted)",
            len(score.details) - len(missed),
            len(score.details),
            f" · missed: {', '.join(missed[:12])}" if missed else "",
        )

    # --- detail: the story first ---

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        op = self.get_object(request, object_id)
        if op is not None:
            # By the operation's tenant too: Citus routes a statement by tenant_id (DESIGN §12).
            attempts = list(op.attempt_set.filter(tenant_id=op.tenant_id).order_by("number"))
            # Its claim from the row where it is kept there (ADR 0024), then its event rows.
            events = operation_history(op, op.events.filter(tenant_id=op.tenant_id))
            extra_context["story"] = operation_story(op, attempts, events)
            # The evidence sections, each for those who may read its table (as its inline was);
            # every attempt and event links to its own page (review.console.history_pages).
            extra_context["attempts"] = attempts_with_labels(attempts) if may_view(request, Attempt) else None
            extra_context["events"] = events if may_view(request, OperationEvent) else None
            extra_context["status_badge"] = display.operation_badge(op)
            extra_context["can_act"] = self.has_cancel_permission(request)
            extra_context["cancellable"] = op.status in transitions.CANCELLABLE_STATES
            extra_context["retryable"] = op.status == S.RETRY_WAIT and op.mode == OperationMode.EXECUTE
            extra_context["failed_event_id"] = (
                getattr(getattr(op, "failed_event", None), "pk", None) if op.status == S.FAILED else None
            )
            extra_context["in_review"] = op.status == S.REVIEW
            extra_context.update(self._failure_context(op, attempts))
            extra_context.update(self._replay_context(op))
        return super().change_view(request, object_id, form_url, extra_context)

    def _failure_context(self, op: Operation, attempts: list[Attempt]) -> dict[str, Any]:
        """The last failure as a sentence with its next step, the raw text behind a
        disclosure (ledger.web.failures: the same words on the DLQ entry and the replay result)."""
        failed = next((a for a in reversed(attempts) if a.error_class or a.message), None)
        message = op.last_error or (failed.message if failed else "")
        status = op.response_status if op.last_error else (failed.response_status if failed else None)
        return {"failure": failure_html(message, status=status) if message else ""}

    def _replay_context(self, op: Operation) -> dict[str, Any]:
        """A DLQ replay's own operation (action ``dlq.replay``, correlation id ``dlq:<entry>``)
        leads back to its entry and on to what can be done next: replay again, edit the
        target, open the run. The console's DLQ pages by URL name: the ledger imports nothing
        above it."""
        if op.action != "dlq.replay" or not op.correlation_id.startswith("dlq:"):
            return {}
        entry = op.correlation_id.removeprefix("dlq:")
        if not entry.isdigit():
            return {}
        site = self.admin_site.name
        try:
            links = {
                "entry_url": reverse(f"{site}:dlq_failedevent_change", args=[int(entry)]),
                "replay_url": reverse(f"{site}:dlq_failedevent_replay", args=[int(entry)]),
                # The claim keeps only the request's hash, so the list of targets, not one.
                "targets_url": reverse(f"{site}:dlq_replaytarget_changelist"),
            }
        except NoReverseMatch:
            return {}
        run = run_of(run=op.run, correlation_id=op.correlation_id)
        links["run_url"] = (
            reverse(f"{site}:onceguard_run") + "?" + urlencode({"run": run, "tenant": op.tenant_id}) if run else ""
        )
        return {"replay_of": {"entry": int(entry), **links}}

    # --- actions: one row (a page with a preview) ---

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.cancel_operation")

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path("<int:pk>/cancel/", wrap(self.cancel_view), name="ledger_operation_cancel"),
            path("<int:pk>/retry-now/", wrap(self.retry_now_view), name="ledger_operation_retry_now"),
        ]
        return own + super().get_urls()

    def _act_on_one(self, request: HttpRequest, pk: int, *, verb: str) -> HttpResponse:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        op = get_object_or_404(self.get_queryset(request).select_related("provider", "tenant"), pk=pk)
        form = OperatorActionForm(request.POST or None)
        back = reverse("admin:ledger_operation_change", args=[op.pk])
        if request.method == "POST" and form.is_valid():
            actor = f"user:{request.user.get_username()}"
            try:
                if verb == "cancel":
                    transitions.operation_cancel(
                        operation_id=op.pk,
                        actor=actor,
                        reason=form.cleaned_data["reason"],
                        tenant_ids=self._tenants(request),
                    )
                else:
                    transitions.operation_retry_now(
                        operation_id=op.pk,
                        actor=actor,
                        reason=form.cleaned_data["reason"],
                        tenant_ids=self._tenants(request),
                    )
            except DomainError as exc:
                messages.error(request, f"Nothing changed: {exc.detail}")
            else:
                done = "cancelled (abandoned)" if verb == "cancel" else "due now"
                messages.success(request, f"Operation {op.pk} {done}.")
                return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{'Cancel' if verb == 'cancel' else 'Retry now'}: operation {op.pk}",
            "op": op,
            "verb": verb,
            "form": form,
            "status_badge": display.operation_badge(op),
            "back_url": back,
            "allowed": op.status in transitions.CANCELLABLE_STATES
            if verb == "cancel"
            else (op.status == S.RETRY_WAIT and op.mode == OperationMode.EXECUTE),
        }
        return TemplateResponse(request, "admin/ledger/operation/action_confirm.html", context)

    def cancel_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._act_on_one(request, pk, verb="cancel")

    def retry_now_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._act_on_one(request, pk, verb="retry_now")

    def _tenants(self, request: HttpRequest) -> list[int] | None:
        scope_of = getattr(self, "tenant_scope", None)
        return scope_of(request) if scope_of is not None else None

    # --- actions: a selection or everything the filter matches (count preview, then confirm) ---

    def _bulk(self, request: HttpRequest, queryset: QuerySet[Operation], *, verb: str) -> HttpResponse | None:
        eligible = queryset.filter(status__in=list(transitions.CANCELLABLE_STATES))
        if verb == "retry_now":
            eligible = queryset.filter(status=S.RETRY_WAIT, mode=OperationMode.EXECUTE)
        eligible = eligible.order_by("id")
        count = eligible[: BULK_LIMIT + 1].count()
        reason = " ".join(request.POST.get("reason", "").split())
        if request.POST.get("bulk_confirm"):
            try:
                previewed = int(request.POST.get("bulk_count", "-1"))
            except ValueError:
                previewed = -1
            if not reason and verb == "cancel":
                messages.error(request, "A reason is required.")
            elif previewed != count:
                messages.warning(
                    request, f"The selection changed since the preview ({previewed} then, {count} now): check again."
                )
            elif count > BULK_LIMIT:
                messages.error(request, f"At most {BULK_LIMIT} operations at a time: narrow the filter.")
            else:
                actor = f"user:{request.user.get_username()}"
                done = skipped = 0
                for pk in list(eligible.values_list("pk", flat=True)[:BULK_LIMIT]):
                    try:
                        if verb == "cancel":
                            transitions.operation_cancel(
                                operation_id=pk, actor=actor, reason=reason, tenant_ids=self._tenants(request)
                            )
                        else:
                            transitions.operation_retry_now(
                                operation_id=pk, actor=actor, reason=reason, tenant_ids=self._tenants(request)
                            )
                        done += 1
                    except DomainError:
                        skipped += 1
                what = "cancelled" if verb == "cancel" else "made due now"
                messages.success(request, f"{done} operations {what}; {skipped} skipped (moved meanwhile).")
                return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Cancel operations" if verb == "cancel" else "Retry operations now",
            "verb": verb,
            "action": "cancel_selected" if verb == "cancel" else "retry_now_selected",
            "matched": queryset.order_by()[: BULK_LIMIT + 1].count(),
            "count": count,
            "limit": BULK_LIMIT,
            "sample": list(eligible.select_related("provider")[:10]),
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "reason": reason,
        }
        return TemplateResponse(request, "admin/ledger/operation/bulk_confirm.html", context)

    @admin.action(description="Cancel selected operations…", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Operation]) -> HttpResponse | None:
        return self._bulk(request, queryset, verb="cancel")

    @admin.action(description="Retry selected operations now…", permissions=["cancel"])
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet[Operation]) -> HttpResponse | None:
        return self._bulk(request, queryset, verb="retry_now")
