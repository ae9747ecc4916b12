"""A tenant's n8n connection, for lead capture (DESIGN §7), written through
``dlq.n8n.connections`` (ADR 0006); the API key is write-only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from dlq.models import N8nConnection
from dlq.n8n import connections as dlq_connections
from ledger.platform.errors import DomainError
from ledger.web import display
from ledger.web.console_base import HTTPS_URL_FORMS, ServiceSaveAdmin, https_url_formfield


class N8nConnectionForm(forms.ModelForm):
    """The n8n API key is write-only: typed to set or replace it, never rendered back (the
    page says when it was set). N8nConnection.clean checks the URL against the outbound
    policy and stores it canonical; the save is dlq.n8n.connections.n8n_connection_save's, which
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
            return dlq_connections.n8n_api_key_check(key)
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
        connection = dlq_connections.n8n_connection_save(
            tenant=obj.tenant,
            base_url=obj.base_url,
            api_key=form.cleaned_data.get("new_api_key") or None,
            timeout_seconds=obj.timeout_seconds,
            active=obj.active,
            actor=self.actor_of(request),
        )
        self.adopt(obj, connection)
