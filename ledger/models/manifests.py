"""Evaluation manifests (ADR 0022): what a generated test document is known to hold, written
when it is generated, and the score of an extraction job's output against it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.fields import SealedJSONField
from ledger.models.objects import OperationOutput
from ledger.models.operations import Operation
from ledger.models.providers import PromptTemplate
from ledger.models.tenants import Tenant


class OperationManifest(models.Model):
    """The manifest of a generating job: the fields its document is generated to hold (vendor
    names, invoice ids, currency, totals, line items). Written once, at submission or by
    ``PUT …/manifest`` before any output exists, never from the output (ledger.execution.manifests);
    immutable after. Its own table, beside the job's output, like the output itself."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # Deleted with its operation (retention's cascade; an erasure deletes it at once).
    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, related_name="manifest")
    # sha256 of the manifest's canonical JSON (sorted keys, no spaces, UTF-8): its identity.
    sha256 = models.CharField(max_length=64)
    # The manifest itself, sealed like a payload: a vendor name can be a person's, an address
    # or an invoice id a person's too (ADR 0022).
    content = SealedJSONField()
    # The preset (prompt template version) whose manifest schema it was checked against; null
    # when the job's presets declare none.
    preset = models.ForeignKey(
        PromptTemplate, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # The job's published output, once there is one (set in the publish's transaction).
    output = models.OneToOneField(
        OperationOutput, on_delete=models.SET_NULL, null=True, blank=True, related_name="manifest"
    )
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "ledger_operationmanifest"
        constraints = [
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="manifest_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"manifest of {self.operation_id}"


class ManifestScoreStatus(models.TextChoices):
    # Written with the extraction job's submission; moved by manifest_score_record (its
    # output scored) or manifest_score_unscorable (no output to score, or no manifest left).
    PENDING = "pending", "waiting for the extraction's output"
    # Final.
    SCORED = "scored", "scored against the manifest"
    # Final: the extraction did not succeed, its output is not a JSON object, or the manifest
    # is gone (erased, deleted by retention).
    UNSCORABLE = "unscorable", "could not be scored"


MANIFEST_SCORE_FINAL = (ManifestScoreStatus.SCORED, ManifestScoreStatus.UNSCORABLE)
MANIFEST_SCORE_MOVES = {
    ManifestScoreStatus.PENDING: MANIFEST_SCORE_FINAL,
    ManifestScoreStatus.SCORED: (),
    ManifestScoreStatus.UNSCORABLE: (),
}


class ManifestScore(models.Model):
    """An extraction job's evaluation: the generating job it extracts from (``evaluates``), and,
    once its output is in, the score of that output against the generating job's manifest —
    0..1 and per-field details. The details name fields and how they matched, never their
    values: they outlive neither job's retention, yet hold nothing of the document."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # The extraction job.
    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, related_name="manifest_score")
    # The generating job; cleared when retention deletes it (the score stays with its extractor).
    # Named in reverse (not "+"): retention clears the references its Operation's relations list.
    evaluates = models.ForeignKey(
        Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="manifest_evaluations", db_index=False
    )
    # Where in the extraction's JSON answer the extracted fields are (a JSON pointer; "" the whole).
    pointer = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=12, choices=ManifestScoreStatus.choices, default=ManifestScoreStatus.PENDING)
    # The manifest scored against (its digest), set with the score.
    manifest_sha256 = models.CharField(max_length=64, blank=True, default="")
    score = models.FloatField(null=True, blank=True)
    details = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    scored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_manifestscore"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=list(ManifestScoreStatus.values)), name="manifestscore_status_valid"
            ),
            # A score exactly when scored, in 0..1; a final state has its time, pending has none.
            models.CheckConstraint(
                condition=(Q(status=ManifestScoreStatus.SCORED) & Q(score__gte=0) & Q(score__lte=1))
                | (~Q(status=ManifestScoreStatus.SCORED) & Q(score__isnull=True)),
                name="manifestscore_scored_has_score",
            ),
            models.CheckConstraint(
                condition=(Q(status=ManifestScoreStatus.PENDING) & Q(scored_at__isnull=True))
                | (~Q(status=ManifestScoreStatus.PENDING) & Q(scored_at__isnull=False)),
                name="manifestscore_final_has_time",
            ),
        ]
        indexes = [
            # Deleting a generating job (retention) clears the links to it: partial, as most
            # rows of a deployment link nothing once their generator is gone.
            models.Index(
                fields=["evaluates"], name="manifestscore_evaluates_idx", condition=Q(evaluates__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"score of {self.operation_id}: {self.status}"
