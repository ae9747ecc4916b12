"""Alerts: what an operator should hear about, the channels that carry it, and each message.

Alerts are raised by the ledger (through ``ledger.platform.hooks.alert_raised``), the DLQ and
retention; they are rows written in the transaction that causes them, delivered after
commit (``alerts.services``).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from ledger.models import SealedJSONField, Tenant
from ledger.platform.errors import DestinationNotAllowed
from ledger.providers.credentials import sealed_credential
from ledger.rules.outbound import outbound_check


class AlertChannelKind(models.TextChoices):
    SLACK = "slack", "Slack incoming webhook"
    DISCORD = "discord", "Discord webhook"
    WEBHOOK = "webhook", "generic JSON webhook"


class AlertChannel(models.Model):
    """Where alerts go. Messages carry ids, counts and a console link — never payload text."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_channels")
    name = models.SlugField(max_length=63)
    kind = models.CharField(max_length=16, choices=AlertChannelKind.choices)
    # The webhook URL: a bearer secret (whoever has a Slack or Discord webhook URL may post to
    # the channel), stored sealed like payloads (ledger.platform.crypto, always) and opened only to send
    # (alerts.services.channel_url). The console takes a new one and shows url_masked at most.
    url = SealedJSONField(editable=False)
    # Alert kinds this channel wants; empty = all.
    kinds = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    timeout_seconds = models.FloatField(default=5.0)
    # More than this many alerts waiting at once → one digest message instead.
    digest_threshold = models.PositiveIntegerField(default=3)
    # At most this many messages per rate window; the rest wait and go out as a digest.
    max_messages_per_window = models.PositiveIntegerField(default=5)
    window_seconds = models.PositiveIntegerField(default=60)
    # Every alert with an id at or below this has been handed to a delivery for this
    # channel. Moved by a guarded UPDATE, so two dispatchers never take the same alerts.
    cursor_alert_id = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="alertchannel_unique_name")]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name} ({self.kind})"

    def clean(self) -> None:
        # A URL given in clear passes the outbound policy and is stored sealed, in canonical
        # form (the console's form and alerts.services.alert_channel_upsert check and seal it
        # themselves; delivery checks again after DNS). A sealed one was checked when set.
        if isinstance(self.url, str) and self.url:
            try:
                self.url = sealed_credential(outbound_check(self.url, purpose="alert webhook URL").url)
            except DestinationNotAllowed as exc:
                raise ValidationError({"url": exc.detail}) from None


class AlertState(models.TextChoices):
    # nobody has said they are on it. Out: an operator's acknowledge or resolve; the clearing
    # evaluator (alerts.clearing) once the kind's condition has cleared.
    OPEN = "open", "open"
    # someone is on it (silenced, not dealt with). Out: resolve (an operator, a review decision
    # on its item, or the clearing evaluator once the condition has cleared).
    ACKNOWLEDGED = "acknowledged", "acknowledged"
    # dealt with or cleared. Terminal: a recurrence opens a new alert (the next episode).
    RESOLVED = "resolved", "resolved"


class Alert(models.Model):
    """Something an operator should hear about, written in the transaction that caused it.

    Deduplicated on (tenant, kind, ref) per episode: while an alert is unresolved, raising
    the same (kind, ref) again only counts it; once it is resolved (by a person, or by the
    clearing evaluator when its condition has passed), the next raise opens episode n + 1.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=50)
    ref = models.CharField(max_length=255)
    summary = models.CharField(max_length=300)
    dedup_key = models.CharField(max_length=400)
    repeat_count = models.PositiveIntegerField(default=0)
    # 1, 2, … per (tenant, kind, ref): the dedup key ends in it (migration alerts 0006).
    episode = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField()
    last_raised_at = models.DateTimeField()
    # An operator says "I am on it" (acknowledged) and "it is dealt with" (resolved), each
    # once, with who and when (alerts.services: guarded updates, never undone). A reviewer's
    # decision resolves the review item's alerts.
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolution_note = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "dedup_key"], name="alert_dedup")]
        permissions = [("respond_alert", "Can acknowledge and resolve alerts")]
        indexes = [
            models.Index(fields=["tenant", "id"], name="alert_tenant_id_idx"),
            # A raise looks up the open alert (and the last episode) of its (kind, ref).
            models.Index(fields=["tenant", "kind", "ref"], name="alert_tenant_kind_ref_idx"),
            # The clearing evaluator walks the unresolved alerts only: resolved ones leave it.
            models.Index(fields=["id"], name="alert_unresolved_idx", condition=Q(resolved_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.ref}"

    @property
    def state(self) -> str:
        """open → acknowledged → resolved (AlertState)."""
        if self.resolved_at is not None:
            return AlertState.RESOLVED
        if self.acknowledged_at is not None:
            return AlertState.ACKNOWLEDGED
        return AlertState.OPEN


class AlertDeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    SENT = "sent", "sent"
    # the last try failed; next_attempt_at says when the retry is due.
    RETRYING = "retrying", "retrying"
    # out of attempts.
    DEAD = "dead", "dead"


class AlertDelivery(models.Model):
    """One message to one channel: a single alert, or a digest of many."""

    # The channel's tenant (DESIGN §12, Citus: every statement names it; migration alerts 0004).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    alert_ids = models.JSONField(default=list)
    alert_count = models.PositiveIntegerField(default=1)
    digest = models.BooleanField(default=False)
    # The exact body posted (built from ids, kinds and counts only), so a retry resends it.
    body = models.JSONField()
    status = models.CharField(max_length=16, choices=AlertDeliveryStatus.choices, default=AlertDeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        indexes = [
            models.Index(fields=["channel", "created_at"], name="alertdelivery_channel_idx"),
            models.Index(
                fields=["next_attempt_at"],
                name="alertdelivery_due_idx",
                condition=Q(status__in=["pending", "retrying"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.alert_count} alert(s) {self.status}"
