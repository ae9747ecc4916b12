"""The approvals page (four-eyes, ADR 0013): re-sends waiting for a second person, pending
first. Read-only rows; each has a decide page where someone with the right to approve (the
``ledger.approve_approvalrequest`` permission: the admin role) approves — the re-send runs
then, in their name — or rejects, with a reason. The requester sees their own request with no
buttons, and the service refuses them anyway (``approval_by_requester``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from ledger.models import ApprovalRequest, ApprovalStatus, ConfigChange
from ledger.platform.errors import DomainError
from ledger.protocol import approvals
from ledger.web.console_base import ConsoleReadOnlyAdmin, TenantColumnMixin
from ledger.web.display import age, short_id

APPROVE_PERMISSION = "ledger.approve_approvalrequest"


class DecideForm(forms.Form):
    reason = forms.CharField(max_length=500, widget=forms.TextInput(attrs={"size": 60}))


class ApprovalStateFilter(admin.SimpleListFilter):
    """Waiting or decided: the console's "Needs attention" counts the waiting ones through this
    filter (review.console.round.ATTENTION), so the count and the list agree."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "waiting for a second person"), ("decided", "decided, expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
        if self.value() == "pending":
            return queryset.filter(status=ApprovalStatus.PENDING)
        if self.value() == "decided":
            return queryset.exclude(status=ApprovalStatus.PENDING)
        return queryset


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    # Fits 1,280 px: who asked shortened (whole on hover), times as ages (exact on hover).
    list_display = ("id", "kind", "status", "targets", "requester", "requested", "expires", "decide_link")
    list_filter = (ApprovalStateFilter, "kind", "status")
    ordering = ("-requested_at", "-id")
    list_per_page = 100
    # Never the parameters (a correction's values, sealed).
    exclude = ("params",)
    # The detail page links to where the request is decided (or its decision read): a person who
    # opened the row from the list or a link must not have to go back for the button.
    readonly_fields = ("decision_page",)

    @admin.display(description="requested by", ordering="requested_by")
    def requester(self, row: ApprovalRequest) -> Any:
        return short_id(row.requested_by)

    @admin.display(description="requested", ordering="requested_at")
    def requested(self, row: ApprovalRequest) -> Any:
        return age(row.requested_at)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, row: ApprovalRequest) -> Any:
        return age(row.expires_at)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalRequest]:
        rows = super().get_queryset(request).select_related("provider")
        scope_of = getattr(self, "tenant_scope", None)
        tenants = scope_of(request) if scope_of is not None else None
        return rows if tenants is None else rows.filter(tenant_id__in=tenants)

    @admin.display(description="which")
    def targets(self, obj: ApprovalRequest) -> str:
        ids = ", ".join(str(i) for i in obj.target_ids[:5]) + (" …" if len(obj.target_ids) > 5 else "")
        ref = f" ({obj.target_ref})" if obj.target_ref else ""
        return f"{ids}{ref}"

    @admin.display(description="")
    def decide_link(self, obj: ApprovalRequest) -> str:
        label = "decide" if obj.status == ApprovalStatus.PENDING else "details"
        return format_html('<a href="{}">{}</a>', reverse("admin:ledger_approvalrequest_decide", args=[obj.pk]), label)

    @admin.display(description="decision")
    def decision_page(self, obj: ApprovalRequest) -> str:
        label = "approve or reject it" if obj.status == ApprovalStatus.PENDING else "how it was decided"
        return format_html(
            '<a href="{}" data-testid="decide-link">{}</a>',
            reverse("admin:ledger_approvalrequest_decide", args=[obj.pk]),
            label,
        )

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [path("<int:pk>/decide/", wrap(self.decide_view), name="ledger_approvalrequest_decide")]
        return own + super().get_urls()

    def decide_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        row = get_object_or_404(self.get_queryset(request), pk=pk)
        if not self.has_view_permission(request, row):
            raise PermissionDenied
        actor = f"user:{request.user.get_username()}"
        may_approve = request.user.has_perm(APPROVE_PERMISSION)
        form = DecideForm(request.POST or None)
        back = reverse("admin:ledger_approvalrequest_decide", args=[row.pk])
        if request.method == "POST":
            if not may_approve:
                raise PermissionDenied
            verb = request.POST.get("verb", "")
            if verb not in ("approve", "reject"):
                messages.error(request, "Nothing changed: unknown action.")
                return HttpResponseRedirect(back)
            if form.is_valid():
                decide = approvals.approval_request_approve if verb == "approve" else approvals.approval_request_reject
                try:
                    done = decide(
                        tenant_id=row.tenant_id, request_id=row.pk, actor=actor, reason=form.cleaned_data["reason"]
                    )
                except DomainError as exc:
                    messages.error(request, f"Nothing changed: {exc.detail}")
                else:
                    level = messages.SUCCESS if done.status != ApprovalStatus.FAILED else messages.WARNING
                    outcome = f" — {done.outcome}" if done.outcome else ""
                    messages.add_message(request, level, f"Request #{done.pk} {done.get_status_display()}{outcome}.")
                    return HttpResponseRedirect(back)
        row.refresh_from_db()
        trail = ConfigChange.objects.filter(
            object_type=ApprovalRequest._meta.label_lower, object_id=str(row.pk)
        ).order_by("-at", "-id")
        own = row.requested_by == actor
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Approval request #{row.pk}: {row.get_kind_display()}",
            "row": row,
            "form": form,
            "own": own,
            # The requester gets no buttons; the service refuses them regardless.
            "may_decide": may_approve and not own and row.status == ApprovalStatus.PENDING,
            "trail": trail[:30],
            "list_url": reverse("admin:ledger_approvalrequest_changelist") + "?state=pending",
        }
        return TemplateResponse(request, "admin/ledger/approvalrequest/decide.html", context)
