"""The alerts console: channels are configured here; alerts and deliveries are read-only
(they change only through alerts.services)."""

from __future__ import annotations

from django.contrib import admin

from alerts.models import Alert, AlertChannel, AlertDelivery
from ledger.admin import ReadOnlyAdmin


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "active", "digest_threshold", "max_messages_per_window"]
    list_filter = ["kind", "active"]
    exclude = ["cursor_alert_id"]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "kind", "ref", "summary", "repeat_count", "created_at"]
    list_filter = ["kind"]
    ordering = ["-id"]
    show_full_result_count = False


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "channel", "status", "digest", "alert_count", "attempts", "last_error", "sent_at"]
    list_filter = ["status", "digest"]
    ordering = ["-id"]
