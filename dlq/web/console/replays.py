"""The replay lineage, bulk replays and run resumes: read-only pages of what the services
recorded (``dlq.replays``).
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from dlq.models import BulkReplay, Replay, RunResume
from dlq.web.console.common import masked_json
from ledger.web.console_base import ConsoleReadOnlyAdmin


@admin.register(RunResume)
class RunResumeAdmin(ConsoleReadOnlyAdmin):
    """The audit of run resumes (dlq.replays.runs): who resumed which run, why, what it planned to
    re-drive and what came of each step. Written only by run_resume; read-only here."""

    list_display = ["at", "run", "actor", "note", "summary"]
    search_fields = ["run__exact", "actor"]
    ordering = ["-at", "-id"]
    show_full_result_count = False
    fields = ["tenant", "run", "actor", "note", "at", "planned", "results"]
    readonly_fields = fields

    @admin.display(description="steps re-driven")
    def summary(self, obj: RunResume) -> str:
        return "; ".join(f"{r.get('key')}: {r.get('outcome') or r.get('error') or '—'}" for r in obj.results or [])


@admin.register(Replay)
class ReplayAdmin(ConsoleReadOnlyAdmin):
    list_display = ["event", "number", "trigger", "outcome", "target_slug", "actor", "started_at", "response_status"]
    list_filter = ["outcome", "trigger", "as_new", "forced"]
    search_fields = ["ledger_key__exact", "sent_key__exact"]
    list_select_related = ["event"]
    ordering = ["-id"]
    show_full_result_count = False
    exclude = ["response_body"]
    readonly_fields = ["response_masked"]

    @admin.display(description="target's answer")
    def response_masked(self, obj: Replay) -> str:
        return format_html("<pre>{}</pre>", masked_json(obj.response_body))


@admin.register(BulkReplay)
class BulkReplayAdmin(ConsoleReadOnlyAdmin):
    list_display = ["id", "tenant", "status", "count", "position", "succeeded", "failed", "skipped", "created_by"]
    list_filter = ["status"]
    ordering = ["-id"]
    exclude = ["event_ids"]
