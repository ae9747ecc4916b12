"""Console pages for uploads and published outputs (DESIGN §11): tenant data, shown read-only.

Lists and detail pages show what a file *is* — key, sha256, size, media type, dimensions,
when — never its bytes (no preview, no inline image: a page that renders an upload would
render whatever a tenant uploaded). The bytes leave only through a download: it needs the
``view_payload`` permission (the admin role) and a reason, writes an access-log row first
(action ``reveal``, fields ``content``) and answers through ``ledger.web.apis.files.object_content_response``,
the same response the authenticated API views give (an attachment, a sandboxing CSP, no
shared caching). The console's staff sessions are not API keys, so the link is the console's
own view, scoped to the user's tenants like every console page (review.staff.tenancy).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from ledger.models import OperationOutput, Upload
from ledger.platform.errors import DomainError
from ledger.web import display
from ledger.web.apis.files import object_content_response
from ledger.web.console_base import ConsoleReadOnlyAdmin, TenantColumnMixin
from review.console.pages import actor_of, can_reveal, client_ip
from review.privacy.payloads import MIN_REASON_LENGTH, object_download_record


class DownloadForm(forms.Form):
    reason = forms.CharField(
        min_length=MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Required: why you need the file. Recorded in the access log with your name and address.",
    )


def size_words(size: int | None) -> str:
    """Bytes as people read them: 812 B, 12.4 KiB, 3.1 MiB."""
    if size is None:
        return display.EMPTY
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


class StoredObjectAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    """A stored file's facts, never its bytes; a download page with a reason for those allowed."""

    list_display = ["short_key", "media_type", "size_shown", "dimensions", "created", "download_link"]
    list_display_links = ["short_key"]
    list_select_related = ["tenant"]
    # Newest first by id, which every row has indexed with its tenant; no other sort (a large
    # table would be sorted whole).
    ordering = ["-id"]
    sortable_by: list[str] = []
    search_fields = ["=key", "=sha256"]
    list_filter = ["media_type"]
    readonly_fields = ["key", "sha256", "size_shown", "media_type", "dimensions", "created_at", "download_link"]
    exclude = ["storage_name"]
    # Shown in the access log's object_type.
    download_title = "file"

    def export_columns(self, request: HttpRequest) -> list[str]:
        # The CSV carries the facts in full (the list's cells are HTML: a shortened key, an age,
        # a link); never the storage name.
        return ["created_at", "tenant", "key", "sha256", "size", "media_type", "width", "height"]

    @admin.display(description="key")
    def short_key(self, obj: Any) -> str:
        return display.short_id(obj.key, keep=22)

    @admin.display(description="size")
    def size_shown(self, obj: Any) -> str:
        return size_words(obj.size)

    @admin.display(description="dimensions")
    def dimensions(self, obj: Any) -> str:
        if obj.width is None or obj.height is None:
            return display.EMPTY
        return f"{obj.width} × {obj.height}"

    @admin.display(description="created")
    def created(self, obj: Any) -> Any:
        return display.age(obj.created_at)

    @admin.display(description="file")
    def download_link(self, obj: Any) -> str:
        opts = self.model._meta
        url = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_download", args=[obj.pk])
        return format_html('<a href="{}" data-testid="download-link">download…</a>', url)

    def get_urls(self) -> list[Any]:
        opts = self.model._meta
        own = [
            path(
                "<path:object_id>/download/",
                self.admin_site.admin_view(self.download_view),
                name=f"{opts.app_label}_{opts.model_name}_download",
            )
        ]
        return own + super().get_urls()

    def download_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        obj = self.get_object(request, object_id)  # scoped to the user's tenants
        if obj is None or not self.has_view_permission(request, obj):
            raise Http404("No such file in your tenants.")
        allowed = can_reveal(request)
        form = DownloadForm(request.POST or None)
        if request.method == "POST":
            if not allowed:
                raise PermissionDenied("You do not have the view_payload permission.")
            if form.is_valid():
                try:
                    object_download_record(
                        obj=obj,
                        tenant_id=obj.tenant_id,
                        reason=form.cleaned_data["reason"],
                        actor=actor_of(request),
                        user_id=request.user.pk,
                        ip=client_ip(request),
                    )
                    return object_content_response(obj)
                except DomainError as exc:
                    messages.error(request, exc.detail)
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": f"Download {obj.key}",
            "opts": opts,
            "obj": obj,
            "facts": [
                ("key", obj.key),
                ("sha256", obj.sha256),
                ("size", size_words(obj.size)),
                ("media type", obj.media_type),
                ("dimensions", self.dimensions(obj)),
            ],
            "form": form,
            "allowed": allowed,
            "back_url": reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]),
        }
        response = TemplateResponse(
            request, "admin/onceguard/object_download.html", context, status=200 if allowed else 403
        )
        response["Cache-Control"] = "no-store"
        return response


@admin.register(Upload)
class UploadAdmin(StoredObjectAdmin):
    pass


@admin.register(OperationOutput)
class OperationOutputAdmin(StoredObjectAdmin):
    list_display = [
        "short_key",
        "operation_link",
        "state",
        "media_type",
        "size_shown",
        "dimensions",
        "created",
        "download_link",
    ]
    list_select_related = ["tenant", "operation"]
    # Recalled with a rolled-back adapter revision or not (ADR 0020).
    list_filter = ["state", "media_type"]
    readonly_fields = [
        "operation_link",
        "state",
        "consumed_at",
        "recalled_at",
        "recall_reason",
        *StoredObjectAdmin.readonly_fields,
    ]
    exclude = ["storage_name", "operation", "adapter_revision"]

    def export_columns(self, request: HttpRequest) -> list[str]:
        return ["created_at", "tenant", "operation_key", *super().export_columns(request)[2:]]

    @admin.display(description="operation")
    def operation_key(self, obj: OperationOutput) -> str:
        return obj.operation.key

    @admin.display(description="operation")
    def operation_link(self, obj: OperationOutput) -> str:
        url = reverse(f"{self.admin_site.name}:ledger_operation_change", args=[obj.operation_id])
        return format_html('<a href="{}">{}</a>', url, display.short_id(obj.operation.key, keep=22))
