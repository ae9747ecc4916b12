"""Files in the objects storage (ledger.execution.objects), by their facts: what a tenant
uploaded for its jobs to name, and the validated output an operation published."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.operations import Operation
from ledger.models.providers import AdapterRevision
from ledger.models.states import OutputState, VerdictSource, VerdictValue
from ledger.models.tenants import Tenant


class Upload(models.Model):
    """A file a tenant uploaded (``POST /api/v1/uploads``, ledger.execution.uploads), stored outside
    the queue through the ``onceguard_objects`` storage (ledger.execution.objects). Content addressed
    per tenant: the same bytes from the same tenant are one row, one object and one key.
    Its facts are immutable: written once, after its checks passed; deleted by retention
    (never while a job that names it can still run: ``retain_until``) or by an erasure. Jobs
    refer to it by ``key`` and ``sha256``; the queue never carries the bytes."""

    # Indexed by the unique (tenant, sha256) and (tenant, created_at).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # "up_" + sha256: what a job names; readable only with an API key of this tenant.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    # Recognised from the content, never taken from the client's Content-Type.
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    # Where the bytes are in the objects storage; internal, never shown.
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    # Retention keeps the upload at least until then, whatever its TTL: raised (never lowered)
    # by each accepted job that names it, to the end of that job's lifetime plus its last
    # attempt's lease (ledger.execution.uploads.uploads_retain). Null: no job ever named it.
    retain_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_upload"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="upload_unique_digest_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "key"], name="upload_unique_key_per_tenant"),
        ]
        # Retention reads a tenant's uploads by age.
        indexes = [models.Index(fields=["tenant", "created_at"], name="upload_tenant_created_idx")]

    def __str__(self) -> str:
        return self.key


class OperationOutput(models.Model):
    """The validated output of an operation (ledger.execution.outputs): fetched into quarantine,
    checked (media type by content, size, dimensions, digest), then published here. A row
    exists only for an output that passed; one that failed was deleted and failed the
    operation as ``invalid_output``. Its own table (not columns of the hot operations
    table), tenant-scoped like every read of it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # Deleted with its operation (retention deletes the bytes first: review.retention).
    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, related_name="output")
    # "out_" + sha256: the same bytes have the same key, whichever operation made them.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    # The adapter revision the operation ran under when this output was published: what a
    # rollback recalls by (ADR 0020). Null only for a row published before migration 0044
    # whose operation had no revision (a callback provider has none).
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # Published, quarantined or flagged (states.OutputState; moved by ledger.recovery.recall only).
    state = models.CharField(
        max_length=12, choices=OutputState.choices, default=OutputState.PUBLISHED, db_default=OutputState.PUBLISHED
    )
    # When the tenant's caller first downloaded the bytes (the API's content view): what makes
    # an output "consumed" when its revision is rolled back — flagged then, not quarantined.
    consumed_at = models.DateTimeField(null=True, blank=True)
    # When and why it was recalled (its revision's rollback), with that revision's number.
    recalled_at = models.DateTimeField(null=True, blank=True)
    recall_reason = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        db_table = "ledger_operationoutput"
        indexes = [
            models.Index(fields=["tenant", "key"], name="opoutput_tenant_key_idx"),
            # The recall pass (a rolled-back revision's outputs still published, by id) and
            # the rollout page's counts of a revision's recalled outputs (migration 0044
            # builds it CONCURRENTLY).
            models.Index(fields=["adapter_revision", "state", "id"], name="opoutput_rev_state_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=OutputState.values), name="opoutput_state_valid"),
            # A recalled output says when; a published one was never recalled.
            models.CheckConstraint(
                condition=(Q(state=OutputState.PUBLISHED) & Q(recalled_at__isnull=True))
                | (~Q(state=OutputState.PUBLISHED) & Q(recalled_at__isnull=False)),
                name="opoutput_recalled_has_time",
            ),
        ]

    def __str__(self) -> str:
        return self.key


class OutputVerdict(models.Model):
    """What a consumer of an output (or the service's scoring against an evaluation manifest)
    said about it: accepted or rejected, a score from 0 to 1, and why (ADR 0020). One per
    operation whose output it judges, source and caller — recorded once, answered again for the same body, refused (409)
    for another. The canary gate counts the rejected and low-scored ones of the canary's
    outputs against the stable revision's (``ledger.providers.canary``); ``adapter_revision``
    is the output's, copied so the gate reads this table alone."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # The operation whose output it judges (deleted with it): a stored file's operation, or an
    # extraction job whose output is its JSON answer (evaluation manifests' scores).
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="+", db_index=False)
    # The stored file judged, when the output is one (deleted with it).
    output = models.ForeignKey(
        OperationOutput, on_delete=models.CASCADE, null=True, blank=True, related_name="verdicts", db_index=False
    )
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    source = models.CharField(max_length=10, choices=VerdictSource.choices)
    # Who said it: the API key's actor (``apikey:{prefix}``) or the manifest scorer's name.
    actor = models.CharField(max_length=150)
    verdict = models.CharField(max_length=10, choices=VerdictValue.choices)
    score = models.FloatField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        db_table = "ledger_outputverdict"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "operation", "source", "actor"], name="outputverdict_one_per_caller"
            ),
            models.CheckConstraint(condition=Q(source__in=VerdictSource.values), name="outputverdict_source_valid"),
            models.CheckConstraint(condition=Q(verdict__in=VerdictValue.values), name="outputverdict_verdict_valid"),
            models.CheckConstraint(
                condition=Q(score__isnull=True) | (Q(score__gte=0) & Q(score__lte=1)),
                name="outputverdict_score_in_range",
            ),
        ]
        # The gate: a revision's verdicts within the canary's window.
        indexes = [models.Index(fields=["adapter_revision", "created_at"], name="outputverdict_rev_time_idx")]

    def __str__(self) -> str:
        return f"{self.verdict} ({self.source})"
