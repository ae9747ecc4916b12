"""Replays and what groups them: one row per replay of an entry (its number, the key it was
sent under, the ledger operation guarding it as ``replay:{entry}:{n}``, its outcome), bulk
replays (a frozen selection, confirmed, run paced) and the audit of run resumes.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from dlq.models.configuration import ReplayTarget
from dlq.models.entries import FailedEvent
from dlq.models.states import BulkReplayStatus, ReplayOutcome, ReplayTrigger
from ledger.models import Operation, Tenant


class BulkReplay(models.Model):
    """A frozen selection: the dry run stores the ids, a confirm replays exactly those."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bulk_replays")
    filters = models.JSONField(default=dict, blank=True)
    event_ids = models.JSONField(default=list)
    count = models.PositiveIntegerField()
    # sha256 of the sorted ids: shown with the count so a confirm can be checked against it.
    digest = models.CharField(max_length=64)
    target_slug = models.CharField(max_length=63, blank=True)
    force = models.BooleanField(default=False)
    note = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=BulkReplayStatus.choices, default=BulkReplayStatus.DRAFT)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    confirmed_by = models.CharField(max_length=150, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # How far the runner got in event_ids (resumable across task runs).
    position = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"bulk replay #{self.pk} ({self.count})"


class Replay(models.Model):
    """Lineage: one row per replay attempt of an entry — who, when, why, where, what came back."""

    # The entry's tenant (DESIGN §12, Citus: every statement names it; migration dlq 0012).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(FailedEvent, on_delete=models.CASCADE, related_name="replays")
    number = models.PositiveIntegerField()
    trigger = models.CharField(max_length=8, choices=ReplayTrigger.choices, default=ReplayTrigger.MANUAL)
    # "Re-run as new": a derived key {key}~r{n} instead of the original one.
    as_new = models.BooleanField(default=False)
    forced = models.BooleanField(default=False)
    # The ledger key guarding the send: replay:{event id}:{n}.
    ledger_key = models.CharField(max_length=255)
    operation = models.ForeignKey(Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # The idempotency key the target received.
    sent_key = models.CharField(max_length=255)
    # Sent to the failed operation's own provider (an execute-mode step resumed with its
    # stored request), not to a replay target.
    to_provider = models.BooleanField(default=False, db_default=False)
    # A correction: the field paths the operator changed (names only; the values are in the
    # sealed payload that was sent, never here). The sent key is the next version's.
    corrected_fields = models.JSONField(default=list, db_default=[], blank=True)
    target = models.ForeignKey(ReplayTarget, on_delete=models.SET_NULL, null=True, blank=True, related_name="replays")
    target_slug = models.CharField(max_length=63)
    target_url = models.CharField(max_length=1000)
    bulk = models.ForeignKey(BulkReplay, on_delete=models.SET_NULL, null=True, blank=True, related_name="replays")
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=16, choices=ReplayOutcome.choices, default=ReplayOutcome.PENDING)
    error_class = models.CharField(max_length=16, blank=True)
    # Our description of what went wrong (status code, exception class): never payload text.
    error_message = models.CharField(max_length=500, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    # The target's answer (JSON, or {"text": …} truncated); masked in the console.
    response_body = models.JSONField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # With the tenant: Citus keeps a unique constraint of a distributed table only when it
            # holds the distribution column (an entry's replays are one tenant's anyway).
            models.UniqueConstraint(fields=["tenant", "event", "number"], name="replay_unique_number"),
            models.CheckConstraint(
                condition=Q(outcome="pending") | Q(finished_at__isnull=False), name="replay_finished_has_time"
            ),
        ]
        indexes = [
            models.Index(fields=["ledger_key"], name="replay_ledger_key_idx"),
            models.Index(fields=["outcome", "started_at"], name="replay_pending_idx", condition=Q(outcome="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event_id}#{self.number}"


class RunResume(models.Model):
    """One resume of a run (DESIGN §7, runs): who asked, why, which steps it re-drove and how
    each went. Append-only, written by ``dlq.replays.runs.run_resume``; the re-drives themselves are
    Replay rows of the steps' DLQ entries (lineage), this row is the audit of the action."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    run = models.CharField(max_length=255)
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    # [{"operation": id, "key", "step", "via": "provider"|"target"|…}] as previewed.
    planned = models.JSONField(default=list)
    # [{"operation": id, "replay": n, "outcome", "entry"}] or {"operation", "error"} per step.
    results = models.JSONField(default=list)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "run", "at"], name="runresume_tenant_run_idx")]

    def __str__(self) -> str:
        return f"resume of {self.run} by {self.actor}"


# The ledger key guarding replay n of an entry: replay:{entry id}:{n}.
REPLAY_KEY_PREFIX = "replay:"


def replay_ledger_key(event_pk: int, number: int) -> str:
    return f"{REPLAY_KEY_PREFIX}{event_pk}:{number}"
