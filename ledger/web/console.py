"""Console pages for the ledger. Operations, attempts and events are read-only here for
everyone, superusers included: every change goes through a service and leaves its event.
Attempts and events, keyed (id, <time>), have pages of their own (review.history_pages): the
admin does not register a model with a composite primary key."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery, URLField
from django.db.models.lookups import In
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.http import urlencode

from ledger.models import (
    ADAPTER_FIELDS,
    TERMINAL_STATES,
    ApiKey,
    Attempt,
    ConfigChange,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    PromptTemplate,
    Provider,
    Tenant,
    WorkflowName,
)
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.protocol import callbacks, services, transitions
from ledger.protocol.selectors import operation_search, run_of
from ledger.providers import canary, prompts, ratelimit, revisions
from ledger.providers.credentials import credential_is_set
from ledger.rules.provider_checks import secret_env_names
from ledger.web import display
from ledger.web.console_base import ConsoleAdmin, ConsoleReadOnlyAdmin, ReadOnlyPermissions, ServiceSaveAdmin
from ledger.web.failures import failure_html
from ledger.web.story import operation_story

S = OperationStatus


# Forms of models with a URL: an address typed without a scheme is https (Django 6's default;
# 5.2 assumes http and warns), for the provider, replay target, n8n connection and alert channel.
HTTPS_URL_FORMS: dict[Any, dict[str, Any]] = {URLField: {"assume_scheme": "https"}}


def https_url_formfield(db_field: Any, **kwargs: Any) -> forms.Field | None:
    """A ModelForm's ``Meta.formfield_callback`` for the same rule (the form's own fields are
    built when its class is, before the admin's ``formfield_overrides`` apply)."""
    if isinstance(db_field, URLField):
        kwargs.setdefault("assume_scheme", "https")
    return db_field.formfield(**kwargs)


# The console's read-only page (ledger.web.console_base), under the name pages written before it use.
ReadOnlyAdmin = ConsoleReadOnlyAdmin


class ReadOnlyInline(ReadOnlyPermissions, admin.TabularInline):
    extra = 0
    can_delete = False


class TenantInlineFormSet(BaseInlineFormSet):
    """A parent's rows read by its tenant as well as its id: Citus routes a statement to one
    node by tenant_id (DESIGN §12)."""

    def __init__(self, *args: Any, instance: Any = None, queryset: Any = None, **kwargs: Any) -> None:
        if instance is not None and instance.pk is not None and queryset is not None:
            queryset = queryset.filter(tenant_id=instance.tenant_id)
        super().__init__(*args, instance=instance, queryset=queryset, **kwargs)


def attempts_with_labels(rows: Iterable[Attempt]) -> list[Attempt]:
    """Attempts for a console table, each with ``revision_label`` (its adapter revision's
    number) and ``prompt_label`` (``name@version`` of its prompt template): read from the
    per-process caches of those immutable rows, no query per attempt."""
    attempts = list(rows)
    for attempt in attempts:
        attempt.revision_label = revisions.revision_number(attempt.adapter_revision_id)  # type: ignore[attr-defined]
        attempt.prompt_label = prompts.prompt_template_label(attempt.prompt_template_id)  # type: ignore[attr-defined]
    return attempts


def may_view(request: HttpRequest, model: type[Any]) -> bool:
    """Whether the user may read ``model``'s rows in the console: its view (or change)
    permission, as the admin decides for a model's pages and inlines. The history tables'
    pages (review.history_pages) and the operation page's attempts and events sections ask it."""
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or request.user.has_perm(
        f"{opts.app_label}.change_{opts.model_name}"
    )


def shows_tenant(model_admin: Any, request: HttpRequest) -> bool:
    """A tenant column only for someone who sees more than one tenant."""
    scope_of = getattr(model_admin, "tenant_scope", None)
    scope = scope_of(request) if scope_of is not None else None
    if scope is None:
        # Counted once a request: a list asks for its columns more than once.
        if not hasattr(request, "_onceguard_tenants_counted"):
            request._onceguard_tenants_counted = Tenant.objects.count()  # type: ignore[attr-defined]
        return request._onceguard_tenants_counted > 1  # type: ignore[attr-defined]
    return len(scope) > 1


class TenantColumnMixin:
    """A tenant column, at ``tenant_column_at`` in the list, only for someone who sees more than
    one tenant (shows_tenant): the one declaration of it for every app's lists."""

    tenant_column_at = 1

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns = list(super().get_list_display(request))  # type: ignore[misc]
        if shows_tenant(self, request):
            columns.insert(self.tenant_column_at, "tenant")
        return columns


class SelectorSearchMixin:
    """The list's search box answered by a selector, ``list_search(rows, text)`` (substring
    search over the columns written once: ledger and dlq selectors), not the stock search."""

    list_search: Callable[[QuerySet[Any], str], QuerySet[Any]]

    # Whether list_search takes the user's tenants (a whole key is looked up among them).
    list_search_scoped = False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        if self.list_search_scoped:
            scope_of = getattr(self, "tenant_scope", None)
            tenant_ids = scope_of(request) if scope_of is not None else None
            return type(self).list_search(queryset, search_term, tenant_ids=tenant_ids), False
        return type(self).list_search(queryset, search_term), False


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
        now = timezone.now()
        due = Q(status__in=[S.QUEUED, S.RETRY_WAIT], next_attempt_at__lte=now)
        if self.value() == "due":
            return queryset.filter(due, mode=OperationMode.EXECUTE)
        if self.value() == "caller":
            return queryset.filter(due, status=S.RETRY_WAIT, mode=OperationMode.GUARD)
        if self.value() == "stuck":
            cutoff = now - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
            # "Not finished" spelled as the predicate of the open rows' (id, updated_at) index, in
            # constants, so any plan sees that it applies: the page and its count read that index.
            return queryset.exclude(status__in_literal=sorted(TERMINAL_STATES)).filter(updated_at__lt=cutoff)
        if self.value() == "cancellable":
            # The predicate of op_cancellable_id_idx (those rows in list order), in constants:
            # the page reads its 100 entries, its count a range of them.
            return queryset.filter(status__in_literal=list(transitions.CANCELLABLE_STATES))
        return queryset


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
        "status",
        "mode",
        "tenant",
        "provider",
        "error_class",
        ("created_at", admin.DateFieldListFilter),
    ]
    # The console's own search (ledger.protocol.selectors.operation_search); this list only shows the box.
    search_fields = ["key"]
    list_search = staticmethod(operation_search)
    list_search_scoped = True
    tenant_column_at = 2
    search_help_text = (
        "A whole key; any part of a key, reconciliation handle, execution or correlation id, workflow name"
        " or error text (any case); a provider ref from its start; an operation id."
    )
    list_select_related = ["tenant", "provider"]
    # What the columns read (review.listing.ConsoleChangeList.listed): the row's id, key and
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
    readonly_fields = ["last_attempt_error", "sent_marker_uses", "superseded_by", "run_page", "replaced_by"]
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
            {"fields": ["run_page", "step", "record", "version", "replaced_by", "eligibility_confirmed_at"]},
        ),
        ("Outcome", {"fields": ["provider_ref", "response_status", "last_attempt_error"]}),
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
        # The console site's run page (review.run_pages), by URL name: the ledger imports nothing above it.
        url = reverse(f"{self.admin_site.name}:onceguard_run") + "?" + urlencode({"run": run, "tenant": obj.tenant_id})
        source = "" if obj.run else " (its correlation id)"
        return format_html('<a href="{}">{}</a>{}', url, run, source)

    # --- detail: the story first ---

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        op = self.get_object(request, object_id)
        if op is not None:
            # By the operation's tenant too: Citus routes a statement by tenant_id (DESIGN §12).
            attempts = list(op.attempt_set.filter(tenant_id=op.tenant_id).order_by("number"))
            events = list(op.events.filter(tenant_id=op.tenant_id).order_by("at", "id"))
            extra_context["story"] = operation_story(op, attempts, events)
            # The evidence sections, each for those who may read its table (as its inline was);
            # every attempt and event links to its own page (review.history_pages).
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
    # eligibility URL (review.roles: tenants are a superuser's). A tenant-scoped user sees
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


class ProviderForm(forms.ModelForm):
    """The provider's credential is write-only: typed to set or replace it, a box to clear
    it, never rendered back (ledger.providers.credentials). Provider.clean checks the URLs against the
    outbound policy and an environment reference against the tenant's declared set.

    A change of the adapter fields records the next adapter revision (ledger.providers.revisions): the
    stable one at once, or — with a canary percentage — a canary taking that share of new
    operations while the provider keeps its stable revision."""

    new_credential = forms.CharField(
        required=False,
        label="Credential",
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as the value of the auth header. Write-only: type a value to set or replace the stored"
        " one; it is stored encrypted and never shown again.",
    )
    clear_credential = forms.BooleanField(required=False, label="Clear the stored credential")
    # Asynchronous providers (ledger.execution.polling): the key the provider signs its webhooks with.
    new_webhook_secret = forms.CharField(
        required=False,
        label="Webhook secret",
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The key the provider signs its webhooks to /api/v1/webhooks/<tenant>/<provider> with"
        " (Onceguard-Signature, HMAC-SHA256). Write-only: stored encrypted and never shown again.",
    )
    clear_webhook_secret = forms.BooleanField(required=False, label="Clear the stored webhook secret")
    # Not named like the model's own (read-only) canary_percent: ModelAdmin would refuse it.
    rollout_percent = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        label="Roll out as a canary (%)",
        help_text="For a change of the adapter fields (base URL, headers, pointers, timeout, lookup): the new"
        " revision first takes this share of new operations, watched against the stable one and rolled back"
        " on its own if it fails more. Empty: the change applies to every new attempt at once.",
    )
    change_reason = forms.CharField(
        required=False,
        max_length=500,
        label="Reason for this change",
        help_text="Recorded with the adapter revision and in the configuration trail.",
    )

    class Meta:
        model = Provider
        fields = "__all__"
        formfield_callback = https_url_formfield

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        slug = data.get("slug")
        if self.instance.pk is None and slug:
            try:
                services.provider_slug_check(slug)
            except DomainError as exc:
                self.add_error("slug", exc.detail)
        if data.get("new_credential") and data.get("clear_credential"):
            raise forms.ValidationError("Set a new credential or clear it, not both.")
        if data.get("new_webhook_secret") and data.get("clear_webhook_secret"):
            raise forms.ValidationError("Set a new webhook secret or clear it, not both.")
        changed_adapter = [name for name in ADAPTER_FIELDS if name in self.changed_data]
        stored = self.instance if self.instance.pk is not None else None
        if data.get("rollout_percent") is not None:
            if stored is None:
                raise forms.ValidationError("A new provider has no stable revision to run a canary against.")
            if not changed_adapter:
                raise forms.ValidationError("A canary needs a change of the adapter fields.")
        if stored is not None and changed_adapter and stored.canary_revision_id is not None:
            raise forms.ValidationError(
                f"Revision {revisions.revision_number(stored.canary_revision_id)} runs as a canary: promote it or"
                " roll it back (Adapter rollout) before changing the adapter again."
            )
        return data

    def secret_changes(self) -> dict[str, str | None]:
        """The credential and webhook secret as ``services.provider_upsert`` takes them: a new
        value, "" to clear, None to keep (the service seals them)."""
        data = self.cleaned_data
        changes: dict[str, str | None] = {}
        for name, typed, cleared in (
            ("auth_secret", "new_credential", "clear_credential"),
            ("webhook_secret", "new_webhook_secret", "clear_webhook_secret"),
        ):
            changes[name] = "" if data.get(cleared) else (data.get(typed) or None)
        return changes


class RolloutMoveForm(forms.Form):
    reason = forms.CharField(max_length=500, help_text="Recorded with the move in the configuration trail.")
    number = forms.IntegerField(required=False, min_value=1, label="Revision")
    percent = forms.IntegerField(required=False, min_value=1, max_value=100, label="Canary share (%)")


@admin.register(Provider)
class ProviderAdmin(ServiceSaveAdmin):
    form = ProviderForm
    # Throttling and pausing are operational state, moved by the workers and the paused
    # providers' page, never configuration (services.PROVIDER_STATE_FIELDS).
    exclude = ["throttled_until", "paused_at", "paused_reason"]
    formfield_overrides = HTTPS_URL_FORMS
    list_display = [
        "slug",
        "tenant",
        "idempotency_class",
        "base_url",
        "credential_kind",
        "rollout_state",
        "max_attempts",
        "throttled_until",
        "paused_at",
    ]
    list_filter = ["tenant", "idempotency_class"]
    search_fields = ["slug", "base_url"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        field = form.base_fields.get("auth_secret_env")
        if field is not None:
            # Exactly which names the tenant may use (its stored secret namespace, ADR 0001).
            if obj is not None:
                allowed = f"this tenant may read {secret_env_names(obj.tenant.secret_namespace)}"
            else:
                tenants = form.base_fields["tenant"].queryset if "tenant" in form.base_fields else Tenant.objects.none()
                shown = [
                    f"{slug}: {secret_env_names(ns)}"
                    for slug, ns in tenants.values_list("slug", "secret_namespace")[:10]
                ]
                allowed = "each tenant may read only its own: " + ("; ".join(shown) or "—")
            # Escaped: the admin renders help texts as HTML, and <NAME> would vanish as a tag.
            field.help_text = escape(
                f"Read the credential from this environment variable of the workers' nodes — {allowed}."
                " Empty: no variable (or store the credential above)."
            )
        return form

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Slugs are how operations, claims and caches name a provider: fixed once created.
        if obj is None:
            return ["credential_state", "webhook_secret_state"]
        return ["tenant", "slug", "credential_state", "webhook_secret_state", "rollout_link", "caps_state"]

    @admin.display(description="webhook secret")
    def webhook_secret_state(self, obj: Provider) -> str:
        return "set (stored encrypted; never shown)" if obj.webhook_secret else "not set"

    @admin.display(description="rate and concurrency now")
    def caps_state(self, obj: Provider) -> str:
        # The declared caps and where they stand: calls in flight, the effective rate (lowered
        # by a 429, climbing back while quiet). ledger.providers.ratelimit.
        return ratelimit.provider_caps(obj).summary()

    @admin.display(description="credential")
    def credential_kind(self, obj: Provider) -> str:
        # The list's short form: never the value, never the variable's name.
        if credential_is_set(obj):
            return "stored"
        return "variable" if obj.auth_secret_env else display.EMPTY

    @admin.display(description="credential")
    def credential_state(self, obj: Provider) -> str:
        if credential_is_set(obj):
            return "set (stored encrypted; never shown)"
        if obj.auth_secret_env:
            return f"from the environment variable {obj.auth_secret_env}"
        return "not set"

    @admin.display(description="adapter revision")
    def rollout_state(self, obj: Provider) -> str:
        if obj.revision_id is None:
            return display.EMPTY
        text = f"r{revisions.revision_number(obj.revision_id)}"
        if obj.canary_revision_id is not None:
            text += f" · canary r{revisions.revision_number(obj.canary_revision_id)} at {obj.canary_percent} %"
        return text

    @admin.display(description="adapter rollout")
    def rollout_link(self, obj: Provider) -> str:
        url = reverse("admin:ledger_provider_rollout", args=[obj.pk])
        return format_html(
            '{} — <a href="{}" data-testid="rollout-link">revisions, canary, promote, roll back</a>',
            self.rollout_state(obj),
            url,
        )

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        # One write path (ADR 0006): the command's service checks, seals the secrets, records
        # the adapter revision and the ConfigChange row, resets the rate bucket and forgets the
        # cached copy — for the console as for `manage.py provider_upsert`.
        names = [
            field.name
            for field in Provider._meta.concrete_fields
            if field.name in form.cleaned_data and field.name not in ("tenant", "slug")
        ]
        if change:
            names = [name for name in names if name in form.changed_data]
        secrets_typed = form.secret_changes()
        saved = services.provider_upsert(
            tenant=obj.tenant,
            slug=obj.slug,
            actor=self.actor_of(request),
            reason=form.cleaned_data.get("change_reason") or "",
            canary_percent=form.cleaned_data.get("rollout_percent"),
            auth_secret=secrets_typed["auth_secret"],
            webhook_secret=secrets_typed["webhook_secret"],
            **{name: getattr(obj, name) for name in names},
        )
        self.adopt(obj, saved)

    # --- the adapter rollout page: revisions, the watch, promote / roll back / canary ---

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [path("<int:pk>/rollout/", wrap(self.rollout_view), name="ledger_provider_rollout")]
        return own + super().get_urls()

    def rollout_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        provider = get_object_or_404(self.get_queryset(request), pk=pk)
        may_move = request.user.has_perm("ledger.rollout_provider")
        form = RolloutMoveForm(request.POST or None)
        back = reverse("admin:ledger_provider_rollout", args=[provider.pk])
        if request.method == "POST":
            if not may_move:
                raise PermissionDenied
            verb = request.POST.get("verb", "")
            if verb not in ("canary", "promote", "rollback"):
                messages.error(request, "Nothing changed: unknown action.")
            elif form.is_valid():
                data = form.cleaned_data
                actor = f"user:{request.user.get_username()}"
                tenants = [provider.tenant_id]
                try:
                    if verb == "canary":
                        if data["number"] is None or data["percent"] is None:
                            raise ValidationFailed("Name the revision and its share of new operations.")
                        canary.canary_start(
                            provider_id=provider.pk,
                            number=data["number"],
                            percent=data["percent"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = f"Revision {data['number']} runs as a canary at {data['percent']} %."
                    elif verb == "promote":
                        current = canary.revision_promote(
                            provider_id=provider.pk,
                            number=data["number"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = f"Revision {revisions.revision_number(current.revision_id)} is stable now."
                    else:
                        result = canary.revision_rollback(
                            provider_id=provider.pk,
                            number=data["number"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = (
                            f"Revision {result.rolled_back} rolled back; revision {result.stable} is stable;"
                            f" {result.requeued} operation(s) re-queued under it."
                        )
                except DomainError as exc:
                    messages.error(request, f"Nothing changed: {exc.detail}")
                else:
                    messages.success(request, done)
                    return HttpResponseRedirect(back)
        provider.refresh_from_db()
        trail = ConfigChange.objects.filter(
            Q(object_type="ledger.provider", object_id=str(provider.pk))
            | Q(
                object_type="ledger.adapterrevision",
                object_id__in=[str(i) for i in provider.revisions.values_list("pk", flat=True)],
            ),
        ).order_by("-at", "-id")[:30]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Adapter rollout: {provider}",
            "provider": provider,
            "rollout": canary.provider_rollout(provider),
            "trail": trail,
            "form": form,
            "may_move": may_move,
            "change_url": reverse("admin:ledger_provider_change", args=[provider.pk]),
        }
        return TemplateResponse(request, "admin/ledger/provider/rollout.html", context)


class PromptTemplateForm(forms.ModelForm):
    """A new version of a prompt template (ledger.providers.prompts): the name's next version is the
    service's to number; versions are never edited."""

    reason = forms.CharField(
        required=False, max_length=500, help_text="Recorded with the version in the configuration trail."
    )
    # Without the model field's own length and shape rules: the service's check says what a
    # name may be, in the words the command and the API use.
    name = forms.CharField(help_text="Lower case letters, digits, - and _ (at most 63).")

    class Meta:
        model = PromptTemplate
        fields = ["tenant", "name", "text", "slots"]
        help_texts = {
            "text": "The instructions, with {{ slot }} where each declared slot's user text goes (fenced between"
            " markers, capped). Nothing else in braces.",
            "slots": 'Each slot with its length cap: {"description": {"max_length": 500}}.',
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            # The service's own check (ADR 0006): the same message as the command's and the API's.
            prompts.prompt_template_check(name=data.get("name"), text=data.get("text"), slots=data.get("slots"))
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None
        return data


@admin.register(PromptTemplate)
class PromptTemplateAdmin(TenantColumnMixin, ConsoleAdmin):
    """Prompt templates: read-only versions; "add" creates the name's next version through
    ``prompts.prompt_template_create`` (DESIGN §5, prompt templates)."""

    form = PromptTemplateForm
    list_display = ["name", "version", "slot_caps", "created_by", "created_at", "reason"]
    list_filter = ["name"]
    search_fields = ["name"]
    ordering = ["name", "-version"]

    @admin.display(description="slots")
    def slot_caps(self, obj: PromptTemplate) -> str:
        return ", ".join(f"{name} ≤ {spec.get('max_length')}" for name, spec in obj.slots.items()) or display.EMPTY

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_model(self, request: HttpRequest, obj: PromptTemplate, form: Any, change: bool) -> None:
        created = prompts.prompt_template_create(
            tenant=obj.tenant,
            name=obj.name,
            text=obj.text,
            slots=obj.slots,
            actor=f"user:{request.user.get_username()}",
            reason=form.cleaned_data.get("reason") or "",
        )
        # The admin's redirect and message name the row the service wrote.
        obj.pk, obj.version, obj.created_at = created.pk, created.version, created.created_at
