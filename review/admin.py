"""Review console: the queue, and one page per item with the evidence and the decision form."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ledger.admin import ReadOnlyAdmin
from ledger.errors import DomainError
from review.models import ReviewDecision, ReviewItem
from review.services import review_decision_record


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
