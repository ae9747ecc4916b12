"""A failed attempt's evidence (ADR 0016): what a post-mortem needs of a failure, kept past the
operation's payload and record retention, in a form that holds no personal data.

One row per failed attempt, written in the failed attempt's own transaction
(``ledger.protocol.evidence``). No foreign key to the operation or the attempt: it outlives
both — retention deletes operations, drops months of attempts, and leaves these rows alone;
only their own period (``FAILED_ATTEMPT_EVIDENCE_DAYS``) removes them (``review.retention``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.fields import HexBytesField
from ledger.models.states import AttemptOutcome, ErrorClass
from ledger.models.tenants import Tenant

# The redacted error text is cut to this many characters.
EVIDENCE_ERROR_LENGTH = 300


class AttemptEvidence(models.Model):
    """A failed attempt, de-identified: class, status, timing, revision, render labels and the
    error text with the job's own values cut out. The key only as a keyed digest."""

    # Indexed by (tenant, finished_at, id): the console's and API's lists, and the purge.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # The provider by slug, as it was: a provider renamed or deleted later keeps its evidence.
    provider_slug = models.CharField(max_length=63, blank=True)
    # The operation's id, a number with no meaning once the operation is gone; not a foreign
    # key, since the row outlives it. Erasure finds a person's evidence by it (ADR 0016).
    operation_id = models.BigIntegerField()
    # HMAC-SHA256 of the key under the current encryption key's digest key (ledger.platform.crypto:
    # never a bare hash, never the key); which key is ``digest_key_id``. Empty after erasure.
    key_digest = HexBytesField(hex_length=64, blank=True)
    digest_key_id = models.CharField(max_length=32, blank=True)
    attempt_number = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error_class = models.CharField(max_length=16, choices=ErrorClass.choices)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    # The adapter revision's number the attempt ran under (execute mode); None outside one.
    adapter_revision = models.PositiveIntegerField(null=True, blank=True)
    # A render job's intent labels (ledger.rules.intents.render_labels): bounded words, never
    # free text; empty for work that has none.
    preset_version = models.CharField(max_length=32, blank=True)
    aspect_class = models.CharField(max_length=32, blank=True)
    # The attempt's error text with the payload's and request's strings, the key, e-mail
    # addresses, phone numbers and secrets cut out (ledger.platform.cutting), then cut short.
    error = models.CharField(max_length=EVIDENCE_ERROR_LENGTH, blank=True)

    class Meta:
        db_table = "ledger_attemptevidence"
        verbose_name = "failed-attempt evidence"
        verbose_name_plural = "failed-attempt evidence"
        constraints = [
            # The classes and outcomes are declared once (ledger.models.states); the database holds them.
            models.CheckConstraint(condition=Q(error_class__in=ErrorClass.values), name="evidence_error_class_known"),
            models.CheckConstraint(
                condition=Q(
                    outcome__in=[
                        AttemptOutcome.FAILED,
                        AttemptOutcome.TRANSIENT,
                        AttemptOutcome.AMBIGUOUS,
                        AttemptOutcome.NOT_FOUND,
                    ]
                ),
                name="evidence_outcome_is_a_failure",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__gte=models.F("started_at")), name="evidence_finished_after"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "finished_at", "id"], name="evidence_tenant_finished_idx"),
            # Erasure finds a person's operations' evidence by the operation's id.
            models.Index(fields=["tenant", "operation_id"], name="evidence_tenant_op_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.provider_slug or '-'} #{self.attempt_number} {self.error_class}"
