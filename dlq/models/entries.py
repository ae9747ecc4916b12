"""The dead-letter entries (DESIGN §4): a failure kept once by its identity, its payload
sealed, with the identities that stand for it (aliases), each failure of it (occurrences) and
the append-only trail of its moves and notes (changes).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from dlq.models.states import (
    BUSINESS_KEY_SOURCES,
    ERROR_CLASS_CHOICES,
    FE,
    FailedEventShape,
    FailedEventStatus,
    KeySource,
    PayloadFetch,
    PayloadSource,
)
from ledger.models import AdapterRevision, Operation, Tenant


class FailedEvent(models.Model):
    """One failure, however often it was reported. Replays never edit it: each is a Replay row."""

    # No index of its own: the list indexes below all start with the tenant.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="failed_events", db_index=False)
    # The identity of DESIGN §4 (explicit id, n8n workflow+execution, trigger, or sha256).
    event_id = models.CharField(max_length=255)
    # True when the identity is the digest of the raw body (nothing better was found).
    weak_identity = models.BooleanField(default=False)
    shape = models.CharField(max_length=16, choices=FailedEventShape.choices, default=FailedEventShape.ENVELOPE)
    source_workflow_id = models.CharField(max_length=255, blank=True)
    source_workflow_name = models.CharField(max_length=255, blank=True)
    source_execution_id = models.CharField(max_length=255, blank=True)
    source_execution_url = models.CharField(max_length=1000, blank=True)
    source_node = models.CharField(max_length=255, blank=True)
    source_mode = models.CharField(max_length=50, blank=True)
    payload = models.JSONField(null=True, blank=True)
    # Only the configured non-personal paths of the payload, in plain text, for filtering
    # (DESIGN §6). Keys are the dotted paths, values scalars.
    search_fields = models.JSONField(default=dict, blank=True)
    error_message = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, blank=True, choices=ERROR_CLASS_CHOICES)
    failed_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # How often the source retried this failure (n8n `retryOf` chains, operation attempts).
    retry_count = models.PositiveIntegerField(default=0)
    # How often the same report was posted again (an identical repost).
    seen_count = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, choices=FailedEventStatus.choices, default=FailedEventStatus.PENDING)
    # Sent in the target's idempotency header on replay: the explicit key, else the ledger
    # key of the operation, else the identity.
    original_key = models.CharField(max_length=255, blank=True)
    operation = models.OneToOneField(
        Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="failed_event"
    )
    # The target named at ingest (a slug, resolved at replay time so a target configured
    # later still applies); empty → the tenant's default target.
    replay_target_slug = models.CharField(max_length=63, blank=True)
    # Replay numbers handed out so far (the n of `replay:{id}:{n}`).
    replay_count = models.PositiveIntegerField(default=0)
    # Automatic replays of this lineage root so far (capped by AUTO_REPLAY_MAX_PER_ROOT).
    auto_replay_count = models.PositiveIntegerField(default=0)
    status_note = models.CharField(max_length=500, blank=True)
    # Quarantine (DESIGN §7): the receiver refused the input (`invalid_input`), so replaying it
    # unchanged would be refused again. Why, in words (ledger.protocol.services.sanitize_message: no
    # personal data). Empty: not quarantined. A correction replays it as the next version.
    quarantine_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    # The operation a correction created (the next version of the key, execute mode); the
    # entry and its original operation stay as they were, as evidence.
    corrected_operation = models.ForeignKey(
        Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # The adapter revision the operation failed under (execute mode): a rejection under a
    # canary that was rolled back names it, and is never re-sent on its own (ledger.providers.canary).
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Where the payload came from (dlq.n8n.client): as reported, or fetched from the n8n execution
    # (`payload_source_ref` = its id). The fetch's state and, when it failed, why — in our
    # words, never the fetched data (sanitize_message).
    payload_source = models.CharField(
        max_length=32, choices=PayloadSource.choices, default=PayloadSource.REPORTED, db_default="reported"
    )
    payload_source_ref = models.CharField(max_length=255, blank=True, default="", db_default="")
    payload_fetch = models.CharField(
        max_length=16, choices=PayloadFetch.choices, blank=True, default=PayloadFetch.NONE, db_default=""
    )
    payload_fetch_note = models.CharField(max_length=500, blank=True, default="", db_default="")
    payload_fetched_at = models.DateTimeField(null=True, blank=True)
    # Where original_key came from (KeySource) and, when no key was found or it came from a
    # declared field, why in words (never the key's data beyond the key itself).
    key_source = models.CharField(
        max_length=16, choices=KeySource.choices, blank=True, default=KeySource.IDENTITY, db_default=""
    )
    key_note = models.CharField(max_length=500, blank=True, default="", db_default="")
    # The body field the reporting workflow declared as its key (a dotted path), looked for in
    # the failed request, or in the fetched item when the report named no request.
    key_field = models.CharField(max_length=255, blank=True, default="", db_default="")
    # Headers of the failed request kept with the payload: an allow-list only (Content-Type and
    # the key headers; never Authorization, cookies or credentials). A replay's credentials
    # come from its target.
    request_headers = models.JSONField(default=dict, db_default={}, blank=True)
    # "Safe to resend": a person's decision that this entry, whose first try may have acted,
    # may be re-sent to a key-advisory target (DESIGN §4, replay by target class). Who and
    # when; the reason is in the change trail. The next replay that is sent uses it up.
    resend_decided_by = models.CharField(max_length=150, blank=True, default="", db_default="")
    resend_decided_at = models.DateTimeField(null=True, blank=True)
    # How many failures this entry stands for (each report of the same key while it was open).
    occurrence_count = models.PositiveIntegerField(default=1, db_default=1)
    # The earlier, closed entry of the same business key and target: a failure after that one
    # was replayed, resolved or discarded opens this one, linked to it.
    previous = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # event_id first: the same index answers the console's search by identity
            # across tenants (a superuser's search) and the per-tenant identity lookup.
            models.UniqueConstraint(fields=["event_id", "tenant"], name="failedevent_unique_identity"),
            # One open entry per business key, tenant and target: a concurrent second failure of
            # the key loses the insert and becomes an occurrence (dlq.ingest.services retries).
            # Entries without a business key (and those stored before) are not in it.
            models.UniqueConstraint(
                fields=["tenant", "original_key", "replay_target_slug"],
                condition=Q(status__in=["pending", "replaying"], key_source__in=sorted(BUSINESS_KEY_SOURCES)),
                name="failedevent_one_open_per_key",
            ),
            models.CheckConstraint(condition=Q(status__in=list(FE.values)), name="failedevent_status_valid"),
            models.CheckConstraint(
                condition=Q(payload_fetch__in=list(PayloadFetch.values)), name="failedevent_payload_fetch_valid"
            ),
        ]
        indexes = [
            # The list (console and API) is always per tenant, newest first, with an
            # optional filter on one of these columns; each index serves filter + order.
            models.Index(fields=["tenant", "status", "failed_at", "id"], name="fe_tenant_status_idx"),
            models.Index(fields=["tenant", "failed_at", "id"], name="fe_tenant_failed_idx"),
            models.Index(fields=["tenant", "source_workflow_id", "failed_at", "id"], name="fe_tenant_workflow_idx"),
            models.Index(fields=["tenant", "error_class", "failed_at", "id"], name="fe_tenant_class_idx"),
            # The console of a superuser (all tenants): newest first, optionally by status.
            models.Index(fields=["failed_at", "id"], name="fe_failed_idx"),
            models.Index(fields=["status", "failed_at", "id"], name="fe_status_failed_idx"),
            models.Index(fields=["error_class", "failed_at", "id"], name="fe_class_failed_idx"),
            # Exact searches (console search box, API filters), with or without a tenant.
            models.Index(fields=["source_execution_id", "tenant"], name="fe_execution_idx"),
            models.Index(fields=["original_key", "tenant"], name="fe_key_idx"),
            # The auto-replay schedule reads only pending transient entries.
            models.Index(
                fields=["failed_at"],
                name="fe_auto_replay_idx",
                condition=Q(status="pending", error_class="transient"),
            ),
            # The recovery pass reads only entries stuck in replaying.
            models.Index(fields=["updated_at"], name="fe_replaying_idx", condition=Q(status="replaying")),
            # A rollback notes the entries of its revision; most entries have none.
            models.Index(
                fields=["adapter_revision", "status"],
                name="fe_revision_idx",
                condition=Q(adapter_revision__isnull=False),
            ),
            # (PostgreSQL also gets a GIN index on search_fields, made in migration 0003.)
        ]
        permissions = [
            ("replay_failedevent", "Can replay dead-lettered events"),
            ("resolve_failedevent", "Can resolve or discard dead-lettered events"),
        ]

    def __str__(self) -> str:
        return self.event_id


class FailedEventAlias(models.Model):
    """Further identities of one failure: an n8n retry (`retryOf`) is the same failure again,
    so the retry's own execution identity points at the entry of the execution it retried."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    identity = models.CharField(max_length=255)
    event = models.ForeignKey(FailedEvent, on_delete=models.CASCADE, related_name="aliases")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "identity"], name="failedeventalias_unique")]

    def __str__(self) -> str:
        return self.identity


class FailedEventOccurrence(models.Model):
    """Append-only: each failure an entry stands for — the first and every later report of the
    same business key while the entry was open — with its execution, for the trail."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(FailedEvent, on_delete=models.CASCADE, related_name="occurrences")
    number = models.PositiveIntegerField()
    # The report's identity (n8n:{workflow}:{execution}, an explicit event_id, …).
    identity = models.CharField(max_length=255)
    source_workflow_id = models.CharField(max_length=255, blank=True)
    source_execution_id = models.CharField(max_length=255, blank=True)
    # Masked like every error text (ledger.protocol.services.sanitize_message).
    error_message = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, blank=True, choices=ERROR_CLASS_CHOICES)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "event", "number"], name="feoccurrence_unique_number"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id}/{self.number}"


class FailedEventChange(models.Model):
    """Append-only history of an entry: every status change, its actor and its note."""

    # The entry's tenant (DESIGN §12, Citus: every statement names it; migration dlq 0012).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(FailedEvent, on_delete=models.CASCADE, related_name="changes")
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["event", "at"], name="fechange_event_at_idx")]

    def __str__(self) -> str:
        return f"{self.event_id}: {self.from_status or '∅'} → {self.to_status}"
