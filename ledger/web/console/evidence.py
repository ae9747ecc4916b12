"""Failed attempts' evidence (ADR 0016): read-only rows kept past the operations' retention,
filtered by provider, class and date, exported as CSV like every console list (the site's
export: formula-safe cells, an access-log row per export)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from ledger.models import AttemptEvidence
from ledger.web.console_base import ConsoleReadOnlyAdmin, TenantColumnMixin
from ledger.web.display import age, truncate


@admin.register(AttemptEvidence)
class AttemptEvidenceAdmin(TenantColumnMixin, ConsoleReadOnlyAdmin):
    # What a post-mortem reads first, in columns that fit a 1,280 px screen: short headers, the
    # time as an age (exact on hover), the render labels in one column, the error cut (whole on
    # the row's page and in the export).
    list_display = (
        "finished",
        "provider_slug",
        "error_class",
        "attempt",
        "http",
        "ms",
        "revision",
        "render",
        "error_short",
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

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, row: AttemptEvidence) -> SafeString | str:
        return age(row.finished_at)

    @admin.display(description="#", ordering="attempt_number")
    def attempt(self, row: AttemptEvidence) -> int:
        return row.attempt_number

    @admin.display(description="HTTP")
    def http(self, row: AttemptEvidence) -> int | None:
        return row.response_status

    @admin.display(description="ms", ordering="duration_ms")
    def ms(self, row: AttemptEvidence) -> int | None:
        return row.duration_ms

    @admin.display(description="rev")
    def revision(self, row: AttemptEvidence) -> int | None:
        return row.adapter_revision

    @admin.display(description="preset / aspect")
    def render(self, row: AttemptEvidence) -> str:
        return " / ".join(v for v in (str(row.preset_version or ""), row.aspect_class or "") if v)

    @admin.display(description="error")
    def error_short(self, row: AttemptEvidence) -> str:
        return truncate(row.error or "", 60)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AttemptEvidence]:
        rows = super().get_queryset(request)
        scope_of = getattr(self, "tenant_scope", None)
        tenants = scope_of(request) if scope_of is not None else None
        return rows if tenants is None else rows.filter(tenant_id__in=tenants)
