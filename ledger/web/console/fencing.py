"""The restore holds page (ADR 0012): keys a restored database forgot that the fence journal says
may have been performed. Read-only rows; each hold has a resolve page where a person releases it
or records it as performed (with a reason, in the audit trail), or asks the provider's lookup."""

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

from ledger.models import ConfigChange, FenceHold, FenceHoldResolution
from ledger.platform.errors import DomainError
from ledger.protocol import fencing
from ledger.web.console_base import ConsoleReadOnlyAdmin, TenantColumnMixin


class HoldResolveForm(forms.Form):
    reason = forms.CharField(max_length=500, widget=forms.TextInput(attrs={"size": 60}))


@admin.register(FenceHold)
class FenceHoldAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    list_display = ("key", "journaled_state", "found_at", "resolution", "refused_claims", "resolve_link")
    list_filter = ("resolution",)
    search_fields = ("=key",)
    ordering = ("-found_at", "-id")
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet[FenceHold]:
        rows = super().get_queryset(request)
        tenants = self._tenants(request)
        return rows if tenants is None else rows.filter(tenant_id__in=tenants)

    def _tenants(self, request: HttpRequest) -> list[int] | None:
        scope_of = getattr(self, "tenant_scope", None)
        return scope_of(request) if scope_of is not None else None

    @admin.display(description="")
    def resolve_link(self, obj: FenceHold) -> str:
        label = "resolve" if obj.resolution == FenceHoldResolution.OPEN else "details"
        return format_html('<a href="{}">{}</a>', reverse("admin:ledger_fencehold_resolve", args=[obj.pk]), label)

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [path("<int:pk>/resolve/", wrap(self.resolve_view), name="ledger_fencehold_resolve")]
        return own + super().get_urls()

    def resolve_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        hold = get_object_or_404(self.get_queryset(request), pk=pk)
        may_resolve = request.user.has_perm("ledger.resolve_fencehold")
        form = HoldResolveForm(request.POST or None)
        back = reverse("admin:ledger_fencehold_resolve", args=[hold.pk])
        if request.method == "POST":
            if not may_resolve:
                raise PermissionDenied
            verb = request.POST.get("verb", "")
            actor = f"user:{request.user.get_username()}"
            tenants = [hold.tenant_id]
            try:
                if verb == "lookup":
                    done = fencing.fence_hold_lookup(hold_id=hold.pk, actor=actor, tenant_ids=tenants)
                elif verb in fencing.RESOLVE_CHOICES:
                    if not form.is_valid():
                        raise _FormIncomplete
                    done = fencing.fence_hold_resolve(
                        hold_id=hold.pk,
                        resolution=verb,
                        actor=actor,
                        reason=form.cleaned_data["reason"],
                        tenant_ids=tenants,
                    )
                else:
                    messages.error(request, "Nothing changed: unknown action.")
                    return HttpResponseRedirect(back)
            except DomainError as exc:
                messages.error(request, f"Nothing changed: {exc.detail}")
            except _FormIncomplete:
                pass
            else:
                messages.success(request, f"The hold is {done.get_resolution_display()}.")
                return HttpResponseRedirect(back)
        hold.refresh_from_db()
        trail = ConfigChange.objects.filter(object_type="fence_hold", object_id=str(hold.pk)).order_by("-at", "-id")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Restore hold: {hold.key}",
            "hold": hold,
            "form": form,
            "may_resolve": may_resolve and hold.resolution == FenceHoldResolution.OPEN,
            "trail": trail[:30],
            "list_url": reverse("admin:ledger_fencehold_changelist"),
        }
        return TemplateResponse(request, "admin/ledger/fencehold/resolve.html", context)


class _FormIncomplete(Exception):
    """The resolve form lacks its reason: shown with its field error."""
