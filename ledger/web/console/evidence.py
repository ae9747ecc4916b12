"""Failed attempts' evidence (ADR 0016): read-only rows kept past the operations' retention,
filtered by provider, class and date, exported as CSV like every console list (the site's
export: formula-safe cells, an access-log row per export)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ledger.models import AttemptEvidence
from ledger.web.console_base import ConsoleReadOnlyAdmin, TenantColumnMixin


@admin.register(AttemptEvidence)
class AttemptEvidenceAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    list_display = (
        "finished_at",
        "provider_slug",
        "attempt_number",
        "error_class",
        "outcome",
        "response_status",
        "duration_ms",
        "adapter_revision",
        "preset_version",
        "aspect_class",
        "error",
    )
    list_filter = ("provider_slug", "error_class", ("finished_at", admin.DateFieldListFilter))
    ordering = ("-finished_at", "-id")
    list_per_page = 100
    # The key digest and the operation's id are on the row's page and in the export; the list
    # keeps to what a post-mortem reads first.
    fields = (
        "provider_slug",
        "operation_id",
        "key_digest",
        "digest_key_id",
        "attempt_number",
        "outcome",
        "error_class",
        "response_status",
        "started_at",
        "finished_at",
        "duration_ms",
        "adapter_revision",
        "preset_version",
        "aspect_class",
        "error",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[AttemptEvidence]:
        rows = super().get_queryset(request)
        scope_of = getattr(self, "tenant_scope", None)
        tenants = scope_of(request) if scope_of is not None else None
        return rows if tenants is None else rows.filter(tenant_id__in=tenants)
