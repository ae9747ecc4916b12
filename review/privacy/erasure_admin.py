"""The console's list of erasure runs (read-only: only review.privacy.erasure writes them). Registered
from ``ReviewConfig.ready`` so this page lives in its own file."""

from __future__ import annotations

from django.contrib import admin

from ledger.web.console_base import ConsoleReadOnlyAdmin
from review.models import ErasureRun
from review.privacy.erasure_n8n import n8n_report
from review.privacy.subjects import erasure_summary


class ErasureRunAdmin(ConsoleReadOnlyAdmin):
    list_display = ["id", "tenant", "state", "progress", "requested_at", "actor", "finished_at", "touched"]
    list_filter = ["state", "tenant"]
    list_select_related = ["tenant"]
    # The person appears only as keyed references; targets are ids; digests are gone when done.
    exclude = ["targets", "digests", "n8n_left"]
    readonly_fields = [
        "tenant",
        "subject_ref",
        "state",
        "progress",
        "actor",
        "reason",
        "requested_at",
        "started_at",
        "updated_at",
        "finished_at",
        "passes",
        "touched",
        "n8n_not_deleted",
        "error",
    ]

    @admin.display(description="progress")
    def progress(self, obj: ErasureRun) -> str:
        return f"{obj.cursor} / {len(obj.targets or [])}"

    @admin.display(description="what it touched")
    def touched(self, obj: ErasureRun) -> str:
        return erasure_summary(obj)

    @admin.display(description="n8n executions not deleted")
    def n8n_not_deleted(self, obj: ErasureRun) -> str:
        # The report's list for a person to act on (review.privacy.erasure_n8n): never silently dropped.
        items = n8n_report(obj)["left"]
        return (
            "; ".join(
                f"execution {i.get('execution')} of workflow {i.get('workflow') or '?'}: {i['action']} — {i.get('reason')}"
                for i in items
            )
            or "none"
        )


def register() -> None:
    if not admin.site.is_registered(ErasureRun):
        admin.site.register(ErasureRun, ErasureRunAdmin)
