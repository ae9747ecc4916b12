"""Input and output shapes of the DLQ API. No logic beyond shape.

Payloads are never part of an API answer: the list, the detail and the replay answers carry
ids, sources, classes and counts (revealing a payload is the console's job, with a reason).
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from dlq.models import (
    ERROR_CLASS_CHOICES,
    BulkReplay,
    FailedEvent,
    FailedEventShape,
    FailedEventStatus,
    Replay,
    RunResume,
)
from dlq.replays.runs import RunView, plan_of
from ledger.models import Checkpoint
from ledger.protocol.representation import OperationOutputSerializer, operation_representation
from ledger.providers.revisions import revision_number
from ledger.web.serializers import ApprovalOutputSerializer, no_nul_characters, queryable_time


class FailedEventListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=FailedEventStatus.choices, required=False)
    workflow = serializers.CharField(required=False, max_length=255)
    error_class = serializers.ChoiceField(choices=ERROR_CLASS_CHOICES, required=False, allow_blank=True)
    failed_after = serializers.DateTimeField(required=False, validators=[queryable_time])
    failed_before = serializers.DateTimeField(required=False, validators=[queryable_time])
    execution_id = serializers.CharField(required=False, max_length=255)
    key = serializers.CharField(required=False, max_length=255)
    shape = serializers.ChoiceField(choices=FailedEventShape.choices, required=False)


class ReplayInputSerializer(serializers.Serializer):
    target = serializers.SlugField(required=False, allow_blank=True, max_length=63, default="")
    force = serializers.BooleanField(required=False, default=False)
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    # "Re-run as new": a derived key {key}~r{n}; needs confirm and a note.
    as_new = serializers.BooleanField(required=False, default=False)
    confirm = serializers.BooleanField(required=False, default=False)


class CloseInputSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class BulkReplayInputSerializer(serializers.Serializer):
    # A dry run freezes the selection; a second call with its id confirms it.
    dry_run = serializers.BooleanField(required=False, default=False)
    id = serializers.IntegerField(required=False, min_value=1)
    count = serializers.IntegerField(required=False, min_value=0)
    confirm = serializers.BooleanField(required=False, default=True)
    status = serializers.ChoiceField(choices=FailedEventStatus.choices, required=False)
    workflow = serializers.CharField(required=False, max_length=255)
    error_class = serializers.ChoiceField(choices=ERROR_CLASS_CHOICES, required=False, allow_blank=True)
    failed_after = serializers.DateTimeField(required=False, validators=[queryable_time])
    failed_before = serializers.DateTimeField(required=False, validators=[queryable_time])
    match = serializers.ListField(child=serializers.CharField(max_length=500), required=False, max_length=10)
    target = serializers.SlugField(required=False, allow_blank=True, max_length=63, default="")
    force = serializers.BooleanField(required=False, default=False)
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class FailedEventOutputSerializer(serializers.Serializer):
    """Documentation of the entry representation (rendered by failed_event_representation)."""

    id = serializers.IntegerField()
    event_id = serializers.CharField()
    weak_identity = serializers.BooleanField()
    shape = serializers.CharField()
    status = serializers.CharField()
    source = serializers.DictField()
    error_class = serializers.CharField()
    error_message = serializers.CharField()
    failed_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    retry_count = serializers.IntegerField()
    seen_count = serializers.IntegerField()
    replay_count = serializers.IntegerField()
    original_key = serializers.CharField(help_text="sent in the target's idempotency header on replay")
    key_source = serializers.CharField(
        help_text="where original_key came from: `request_header`, `request_field` (the failed request's key header"
        " or declared field), `reported`, `reported_event`, `missing` (none found: key_note says why), `` (identity)"
    )
    key_note = serializers.CharField(help_text="why no key was found, or where it came from, in words")
    occurrence_count = serializers.IntegerField(
        help_text="failures of the same business key, tenant and target this entry stands for while open"
    )
    previous_entry = serializers.IntegerField(
        allow_null=True, help_text="the earlier, closed entry of the same business key and target"
    )
    operation_id = serializers.IntegerField(allow_null=True)
    replay_target = serializers.CharField()
    search_fields = serializers.DictField()
    status_note = serializers.CharField()
    quarantined = serializers.BooleanField(help_text="invalid input: a replay as is would be refused again")
    quarantine_reason = serializers.CharField(help_text="why, in words (masked: no personal data)")
    corrected_operation_id = serializers.IntegerField(
        allow_null=True, help_text="the next version a correction submitted (execute mode)"
    )
    adapter_revision = serializers.IntegerField(
        allow_null=True, help_text="execute mode: the number of the provider's adapter revision it failed under"
    )
    payload_source = serializers.DictField(
        help_text="where the payload came from: `source` (`reported` or `n8n_execution_fetch`), `ref` (the n8n"
        ' execution id of a fetched one), `fetch` (`""` none, `pending`, `fetched`, `failed`), `note` (what was'
        " fetched, or why the fetch failed: no personal data), `fetched_at`"
    )


class ReplayOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    event = serializers.IntegerField()
    number = serializers.IntegerField()
    trigger = serializers.CharField()
    as_new = serializers.BooleanField()
    forced = serializers.BooleanField()
    ledger_key = serializers.CharField()
    operation_id = serializers.IntegerField(allow_null=True)
    sent_key = serializers.CharField()
    target = serializers.CharField()
    actor = serializers.CharField()
    note = serializers.CharField()
    outcome = serializers.CharField()
    error_class = serializers.CharField()
    error_message = serializers.CharField()
    response_status = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    to_provider = serializers.BooleanField(help_text="sent to the operation's own provider (a resumed step)")
    corrected_fields = serializers.ListField(
        child=serializers.CharField(), help_text="a correction: the paths changed (values are not shown)"
    )


class BulkReplayOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    # Only on a confirm that waits for four-eyes approval (ADR 0013): the request.
    approval = ApprovalOutputSerializer(required=False)
    status = serializers.CharField()
    count = serializers.IntegerField()
    digest = serializers.CharField()
    event_ids = serializers.ListField(child=serializers.IntegerField())
    filters = serializers.DictField()
    target = serializers.CharField()
    force = serializers.BooleanField()
    expires_at = serializers.DateTimeField()
    position = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    skipped = serializers.IntegerField()
    # {"count", "reason"}: entries a replay leaves waiting for the decision "safe to resend".
    waiting_for_decision = serializers.DictField(required=False)


def failed_event_representation(event: FailedEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "event_id": event.event_id,
        "weak_identity": event.weak_identity,
        "shape": event.shape,
        "status": event.status,
        "source": {
            "workflow_id": event.source_workflow_id,
            "workflow_name": event.source_workflow_name,
            "execution_id": event.source_execution_id,
            "execution_url": event.source_execution_url,
            "node": event.source_node,
            "mode": event.source_mode,
        },
        "error_class": event.error_class,
        "error_message": event.error_message,
        "failed_at": event.failed_at.isoformat(),
        "last_seen_at": event.last_seen_at.isoformat(),
        "retry_count": event.retry_count,
        "seen_count": event.seen_count,
        "replay_count": event.replay_count,
        "original_key": event.original_key,
        "key_source": event.key_source,
        "key_note": event.key_note,
        "occurrence_count": event.occurrence_count,
        "previous_entry": event.previous_id,
        "operation_id": event.operation_id,
        "replay_target": event.replay_target_slug,
        "search_fields": event.search_fields,
        "status_note": event.status_note,
        "quarantined": bool(event.quarantine_reason),
        "quarantine_reason": event.quarantine_reason,
        "corrected_operation_id": event.corrected_operation_id,
        "adapter_revision": revision_number(event.adapter_revision_id),
        "payload_source": {
            "source": event.payload_source,
            "ref": event.payload_source_ref,
            "fetch": event.payload_fetch,
            "note": event.payload_fetch_note,
            "fetched_at": event.payload_fetched_at.isoformat() if event.payload_fetched_at else None,
        },
    }


def replay_representation(replay: Replay) -> dict[str, Any]:
    return {
        "id": replay.pk,
        "event": replay.event_id,
        "number": replay.number,
        "trigger": replay.trigger,
        "as_new": replay.as_new,
        "forced": replay.forced,
        "ledger_key": replay.ledger_key,
        "operation_id": replay.operation_id,
        "sent_key": replay.sent_key,
        "target": replay.target_slug,
        "actor": replay.actor,
        "note": replay.note,
        "outcome": replay.outcome,
        "error_class": replay.error_class,
        "error_message": replay.error_message,
        "response_status": replay.response_status,
        "started_at": replay.started_at.isoformat(),
        "finished_at": replay.finished_at.isoformat() if replay.finished_at else None,
        "to_provider": replay.to_provider,
        "corrected_fields": list(replay.corrected_fields or []),
    }


def bulk_replay_representation(bulk: BulkReplay, *, waiting: dict[str, Any] | None = None) -> dict[str, Any]:
    """``waiting``: dlq.entries.selectors.replay_waiting of the selection (while it can still be sent)."""
    extra = {"waiting_for_decision": waiting} if waiting is not None else {}
    return {
        **extra,
        "id": bulk.pk,
        "status": bulk.status,
        "count": bulk.count,
        "digest": bulk.digest,
        "event_ids": bulk.event_ids,
        "filters": bulk.filters,
        "target": bulk.target_slug,
        "force": bulk.force,
        "expires_at": bulk.expires_at.isoformat(),
        "position": bulk.position,
        "succeeded": bulk.succeeded,
        "failed": bulk.failed,
        "skipped": bulk.skipped,
    }


# --- Corrections and runs ------------------------------------------------------------------------


class CorrectInputSerializer(serializers.Serializer):
    fields = serializers.DictField(
        child=serializers.JSONField(allow_null=True, validators=[no_nul_characters]),
        allow_empty=False,
        help_text="dotted path → corrected value; execute mode: paths into the stored request (body.amount),"
        " guard mode: into the stored payload",
    )
    note = serializers.CharField(max_length=2000, help_text="why the fields change (recorded)")
    target = serializers.SlugField(
        required=False, allow_blank=True, max_length=63, default="", help_text="guard mode: the replay target"
    )


class CorrectOutputSerializer(serializers.Serializer):
    entry = FailedEventOutputSerializer()
    key = serializers.CharField(help_text="the next version's key, {record}:{action}:v{version}")
    version = serializers.IntegerField()
    operation = OperationOutputSerializer(allow_null=True, help_text="execute mode: the next version, queued")
    replay = ReplayOutputSerializer(allow_null=True, help_text="guard mode: the corrected replay to the target")


class RunStepOutputSerializer(serializers.Serializer):
    step = serializers.IntegerField(allow_null=True, help_text="the ordinal sent with it, if any")
    operation = OperationOutputSerializer()
    current_operation_id = serializers.IntegerField(help_text="the newest in its lineage (a replay, once resumed)")
    status = serializers.CharField(help_text="the ledger state of the current operation")
    checkpoint = serializers.ChoiceField(choices=Checkpoint.choices)
    safe_to_repeat = serializers.BooleanField(help_text="repeating it cannot add a second effect")
    will_resume = serializers.BooleanField(help_text="a resume re-drives it")
    resume_via = serializers.CharField(help_text="provider, target or empty")
    advice = serializers.CharField()
    dlq_entry_id = serializers.IntegerField(allow_null=True)
    quarantine_reason = serializers.CharField()


class RunOutputSerializer(serializers.Serializer):
    run = serializers.CharField()
    steps = RunStepOutputSerializer(many=True)
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="steps per checkpoint state")
    resume = serializers.DictField(help_text="the preview: {count, operations, plan}")


class RunResumeInputSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=2000, help_text="why (recorded with the resume)")
    target = serializers.SlugField(
        required=False, allow_blank=True, max_length=63, default="", help_text="replay target for guard-mode steps"
    )
    preview = serializers.BooleanField(required=False, default=False, help_text="answer the plan, do nothing")
    operations = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        allow_null=True,
        default=None,
        max_length=500,
        help_text="the operation ids a preview showed; refused (409) when the plan changed",
    )


class RunResumeOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.CharField()
    actor = serializers.CharField()
    note = serializers.CharField()
    at = serializers.DateTimeField()
    planned = serializers.ListField(child=serializers.DictField())
    results = serializers.ListField(child=serializers.DictField())


def run_representation(view: RunView) -> dict[str, Any]:
    return {
        "run": view.run,
        "steps": [
            {
                "step": s.operation.step,
                "operation": operation_representation(s.operation),
                "current_operation_id": s.current.pk,
                "status": s.current.status,
                "checkpoint": s.checkpoint,
                "safe_to_repeat": s.safe_to_repeat,
                "will_resume": s.will_resume,
                "resume_via": s.resume_via,
                "advice": s.advice,
                "dlq_entry_id": s.entry.pk if s.entry is not None else None,
                "quarantine_reason": s.entry.quarantine_reason if s.entry is not None else "",
            }
            for s in view.steps
        ],
        "counts": view.counts,
        "resume": {
            "count": len(view.plan),
            "operations": [s.operation.pk for s in view.plan],
            "plan": plan_of(view),
        },
    }


def run_resume_representation(resume: RunResume) -> dict[str, Any]:
    return {
        "id": resume.pk,
        "run": resume.run,
        "actor": resume.actor,
        "note": resume.note,
        "at": resume.at.isoformat(),
        "planned": resume.planned,
        "results": resume.results,
    }
