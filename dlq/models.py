"""Dead-letter queue tables (DESIGN §4)."""

from __future__ import annotations

from django.db import models

from ledger.models import Operation, Tenant


class FailedEventStatus(models.TextChoices):
    # waiting for an operator: replay, resolve or discard.
    PENDING = "pending", "pending"
    # a replay is being sent (the guarded pending→replaying update allocated its number).
    REPLAYING = "replaying", "replaying"
    # the last replay succeeded. Replaying again needs `force` and a note.
    REPLAYED = "replayed", "replayed"
    # an operator fixed it another way. Terminal.
    RESOLVED = "resolved", "resolved"
    # an operator (or retention) decided to drop it. Terminal.
    DISCARDED = "discarded", "discarded"


class FailedEvent(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="failed_events")
    event_id = models.CharField(max_length=255)
    weak_identity = models.BooleanField(default=False)
    source_workflow_id = models.CharField(max_length=255, blank=True)
    source_workflow_name = models.CharField(max_length=255, blank=True)
    source_execution_id = models.CharField(max_length=255, blank=True)
    source_execution_url = models.CharField(max_length=1000, blank=True)
    source_node = models.CharField(max_length=255, blank=True)
    source_mode = models.CharField(max_length=50, blank=True)
    payload = models.JSONField(null=True, blank=True)
    error_message = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, blank=True)
    failed_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    retry_count = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=FailedEventStatus.choices, default=FailedEventStatus.PENDING)
    original_key = models.CharField(max_length=255, blank=True)
    operation = models.OneToOneField(
        Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="failed_event"
    )
    replay_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "event_id"], name="failedevent_unique_identity"),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "failed_at"], name="fe_tenant_status_idx"),
        ]

    def __str__(self) -> str:
        return self.event_id
