"""The alerts console: channels are configured here; alerts and deliveries are read-only
(they change only through alerts.services)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from alerts.models import Alert, AlertChannel, AlertDelivery, AlertState
from alerts.services import (
    NEW_CHANNEL_NEEDS_URL,
    alert_acknowledge,
    alert_channel_upsert,
    alert_channel_url_check,
    alert_resolve,
    channel_url_masked,
)
from ledger.platform.errors import DestinationNotAllowed
from ledger.web import display
from ledger.web.console_base import ConsoleReadOnlyAdmin, ServiceSaveAdmin, TenantColumnMixin


class AlertChannelForm(forms.ModelForm):
    """The webhook URL is write-only (a Slack or Discord webhook URL is a bearer secret): typed
    to set or replace it, never rendered back; blank on a change keeps the stored one. The
    save is ``alerts.services.alert_channel_upsert``'s (ADR 0006), which checks the URL
    against the outbound policy and stores it sealed, in canonical form."""

    webhook_url = forms.CharField(
        required=False,
        max_length=1000,
        strip=True,
        label="Webhook URL",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Write-only: type a URL to set or replace the stored one; it is stored encrypted and only its"
        " host and last 4 characters are shown again. Leave blank to keep the stored URL.",
    )

    class Meta:
        model = AlertChannel
        exclude = ["cursor_alert_id"]

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data.get("webhook_url", "")
        if not url:
            if self.instance.pk is None:
                raise forms.ValidationError(NEW_CHANNEL_NEEDS_URL)
            return ""
        try:
            # The service's check: the refusal names the purpose and the host at most.
            return alert_channel_url_check(url)
        except DestinationNotAllowed as exc:
            raise forms.ValidationError(exc.detail) from None


@admin.register(AlertChannel)
class AlertChannelAdmin(ServiceSaveAdmin):
    form = AlertChannelForm
    list_display = ["name", "tenant", "kind", "webhook", "active", "digest_threshold", "max_messages_per_window"]
    list_filter = ["kind", "active"]
    exclude = ["cursor_alert_id"]
    readonly_fields = ["webhook"]
    service_keys = ("tenant", "name")

    @admin.display(description="webhook URL")
    def webhook(self, obj: AlertChannel) -> str:
        return channel_url_masked(obj) if obj.url else display.EMPTY

    def save_model(self, request: HttpRequest, obj: AlertChannel, form: Any, change: bool) -> None:
        # One write path (ADR 0006): `manage.py alertchannel_upsert`'s service checks, seals
        # the URL and records the change with it masked.
        channel = alert_channel_upsert(
            tenant=obj.tenant,
            name=obj.name,
            kind=obj.kind,
            url=form.cleaned_data.get("webhook_url") or None,
            kinds=obj.kinds,
            active=obj.active,
            timeout_seconds=obj.timeout_seconds,
            digest_threshold=obj.digest_threshold,
            max_messages_per_window=obj.max_messages_per_window,
            window_seconds=obj.window_seconds,
            actor=self.actor_of(request),
        )
        self.adopt(obj, channel)


class AlertStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(AlertState.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Alert]) -> QuerySet[Alert]:
        if self.value() == AlertState.OPEN:
            return queryset.filter(acknowledged_at__isnull=True, resolved_at__isnull=True)
        if self.value() == AlertState.ACKNOWLEDGED:
            return queryset.filter(acknowledged_at__isnull=False, resolved_at__isnull=True)
        if self.value() == AlertState.RESOLVED:
            return queryset.filter(resolved_at__isnull=False)
        return queryset


def console_path(alert: Alert) -> str | None:
    """The console page an alert is about (relative), as alerts.services.alert_link."""
    ref = alert.ref
    if alert.kind.startswith("dlq") and ref.isdigit():
        return reverse("admin:dlq_failedevent_change", args=[ref])
    if alert.kind == "provider_paused":
        return reverse("admin:review_pausedprovider_changelist") + "?paused=yes"
    if alert.kind in ("provider_canary_rolled_back", "provider_canary_paused"):
        return reverse("admin:ledger_provider_changelist") + "?" + urlencode({"q": ref})
    if ref.isdigit():
        return reverse("admin:ledger_operation_change", args=[ref])
    if ref:
        return reverse("admin:ledger_operation_changelist") + "?" + urlencode({"q": ref})
    return None


@admin.register(Alert)
class AlertAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    """Alerts are raised by services; here an operator acknowledges ("I am on it") and
    resolves them (alerts.services), each recorded on the alert with who and when."""

    list_display = ["id", "state_badge", "kind", "about", "summary", "repeat_count", "raised", "handled_by"]
    list_filter = [AlertStateFilter, "kind"]
    tenant_column_at = 2
    ordering = ["-id"]
    show_full_result_count = False
    actions = ["acknowledge_selected", "resolve_selected"]
    change_form_template = "admin/alerts/alert/change_form.html"

    @admin.display(description="state")
    def state_badge(self, obj: Alert) -> str:
        return display.badge(obj.state)

    @admin.display(description="about", ordering="ref")
    def about(self, obj: Alert) -> str:
        url = console_path(obj)
        shown = display.short_id(obj.ref, keep=30)
        return format_html('<a href="{}">{}</a>', url, shown) if url else shown

    @admin.display(description="raised", ordering="created_at")
    def raised(self, obj: Alert) -> str:
        if obj.repeat_count:
            return format_html(
                '{}<div class="og-muted">last {}</div>', display.age(obj.created_at), display.age(obj.last_raised_at)
            )
        return display.age(obj.created_at)

    @admin.display(description="acknowledged / resolved")
    def handled_by(self, obj: Alert) -> str:
        if obj.resolved_at:
            # Why, too: "cleared: provider stripe resumed" when it resolved itself (alerts.clearing).
            return format_html(
                'resolved by {} {}<div class="og-muted">{}</div>',
                obj.resolved_by,
                display.age(obj.resolved_at),
                obj.resolution_note,
            )
        if obj.acknowledged_at:
            return format_html("acknowledged by {} {}", obj.acknowledged_by, display.age(obj.acknowledged_at))
        return display.EMPTY

    def has_respond_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("alerts.respond_alert")

    def _scope(self, request: HttpRequest) -> list[int] | None:
        scope_of = getattr(self, "tenant_scope", None)
        return scope_of(request) if scope_of is not None else None

    @admin.action(description="Acknowledge selected alerts", permissions=["respond"])
    def acknowledge_selected(self, request: HttpRequest, queryset: QuerySet[Alert]) -> None:
        ids = list(queryset.values_list("pk", flat=True)[:1000])
        done = alert_acknowledge(alert_ids=ids, actor=_actor(request), tenant_ids=self._scope(request))
        messages.success(
            request, f"Acknowledged {done} alert(s); {len(ids) - done} were already acknowledged or resolved."
        )

    @admin.action(description="Resolve selected alerts", permissions=["respond"])
    def resolve_selected(self, request: HttpRequest, queryset: QuerySet[Alert]) -> None:
        ids = list(queryset.values_list("pk", flat=True)[:1000])
        done = alert_resolve(alert_ids=ids, actor=_actor(request), tenant_ids=self._scope(request))
        messages.success(request, f"Resolved {done} alert(s).")

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path("<int:pk>/acknowledge/", wrap(self.acknowledge_view), name="alerts_alert_acknowledge"),
            path("<int:pk>/resolve/", wrap(self.resolve_view), name="alerts_alert_resolve"),
        ]
        return own + super().get_urls()

    def _respond(self, request: HttpRequest, pk: int, *, resolve: bool) -> HttpResponse:
        if not self.has_respond_permission(request):
            raise PermissionDenied
        alert = get_object_or_404(self.get_queryset(request), pk=pk)
        if request.method == "POST":
            if resolve:
                done = alert_resolve(
                    alert_ids=[alert.pk],
                    actor=_actor(request),
                    note=request.POST.get("note", ""),
                    tenant_ids=self._scope(request),
                )
            else:
                done = alert_acknowledge(alert_ids=[alert.pk], actor=_actor(request), tenant_ids=self._scope(request))
            verb = "resolved" if resolve else "acknowledged"
            if done:
                messages.success(request, f"Alert {alert.pk} {verb}.")
            else:
                messages.warning(request, f"Alert {alert.pk} was already {alert.state}.")
        return HttpResponseRedirect(reverse("admin:alerts_alert_change", args=[alert.pk]))

    def acknowledge_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._respond(request, pk, resolve=False)

    def resolve_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._respond(request, pk, resolve=True)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        alert = self.get_object(request, object_id)
        if alert is not None:
            extra_context.update(
                alert_state=display.badge(alert.state),
                about_url=console_path(alert),
                can_respond=self.has_respond_permission(request),
            )
        return super().change_view(request, object_id, form_url, extra_context)


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ConsoleReadOnlyAdmin):
    list_display = ["id", "channel", "status", "digest", "alert_count", "attempts", "last_error", "sent_at"]
    list_filter = ["status", "digest"]
    ordering = ["-id"]
