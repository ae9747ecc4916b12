"""Four-eyes approval of re-sends (ADR 0013): a re-send that a tenant or provider requires a
second person for is stored as a request, and only its approval by someone else sends it.

The states are declared once here, with who moves a request out of each and the allowed
moves; ``ledger.protocol.approvals`` is the one place that moves them."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from ledger.models.fields import SealedJSONField
from ledger.models.providers import Provider
from ledger.models.tenants import Tenant


class ApprovalKind(models.TextChoices):
    """Which re-send a request holds; each names the service that runs it once approved."""

    REPLAY = "replay", "replay"
    RERUN_AS_NEW = "rerun_as_new", "re-run as new"
    # A replayed entry sent again (force) or an execute-mode step re-issued to its provider.
    FORCED_REISSUE = "forced_reissue", "forced re-issue"
    CORRECTED_REPLAY = "corrected_replay", "corrected replay"
    BULK_REPLAY = "bulk_replay", "bulk replay"
    RUN_RESUME = "run_resume", "run resumed"
    # The DLQ decision a key-advisory target waits for, and the review decision "safe to retry".
    SAFE_TO_RESEND = "safe_to_resend", 'decision "safe to resend"'
    SAFE_TO_RETRY = "safe_to_retry", 'review decision "safe to retry"'
    # A rolled-back revision's recalled outputs re-run under the good revision as the next
    # versions of their keys (ADR 0020; ledger.execution.rerun).
    RECALLED_RERUN = "recalled_rerun", "re-run of recalled outputs"


class ApprovalStatus(models.TextChoices):
    # In: approval_request_create. Out: approval_request_approve (→ approved),
    # approval_request_reject (→ rejected), approval_requests_expire (→ expired).
    PENDING = "pending", "waiting for a second person"
    # Approved, the re-send running in the approver's name. Out: approval_request_settle
    # (→ executed | failed), approval_requests_expire for one interrupted past its TTL (→ failed).
    APPROVED = "approved", "approved, sending"
    EXECUTED = "executed", "approved and sent"
    # Approved, but the re-send did not happen (the entry moved meanwhile, the send refused).
    FAILED = "failed", "approved, not sent"
    REJECTED = "rejected", "rejected"
    EXPIRED = "expired", "expired unanswered"


APPROVAL_OPEN_STATES = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)
# The states a second person's decision put the request in (decided_by set, ≠ requested_by).
APPROVAL_DECIDED_STATES = (
    ApprovalStatus.APPROVED,
    ApprovalStatus.EXECUTED,
    ApprovalStatus.FAILED,
    ApprovalStatus.REJECTED,
)
APPROVAL_MOVES: dict[str, frozenset[str]] = {
    ApprovalStatus.PENDING: frozenset({ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED}),
    ApprovalStatus.APPROVED: frozenset({ApprovalStatus.EXECUTED, ApprovalStatus.FAILED}),
}


class ApprovalRequest(models.Model):
    """One re-send waiting for (or given) a second person's approval. The target is named by
    ids (entries, operations, a bulk replay's frozen selection, a run), the request's own
    parameters (a corrected payload among them) are sealed like payloads."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # The provider whose setting asked for approval (None: the tenant's setting, or no provider).
    provider = models.ForeignKey(Provider, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    kind = models.CharField(max_length=20, choices=ApprovalKind.choices)
    status = models.CharField(max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    # DLQ entry ids, or the operation id of a review decision; a bulk replay's frozen ids.
    target_ids = models.JSONField(default=list)
    # A run id (run resume), a bulk replay's id; shown with the ids.
    target_ref = models.CharField(max_length=255, blank=True, default="")
    # What the re-send is called with (target, force, note, the corrected fields…): sealed,
    # since a correction holds the payload's values (ledger.platform.crypto).
    params = SealedJSONField(null=True, blank=True)
    requested_by = models.CharField(max_length=150)
    request_reason = models.CharField(max_length=500)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decision_reason = models.CharField(max_length=500, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    # What came of it in words: "replay #2 succeeded", the refusal of the service.
    outcome = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        verbose_name = "approval request"
        ordering = ["-requested_at", "-id"]
        permissions = [("approve_approvalrequest", "Approve or reject re-sends of others (four-eyes)")]
        indexes = [
            models.Index(fields=["tenant", "status", "requested_at"], name="approval_tenant_status_idx"),
            models.Index(fields=["expires_at"], name="approval_pending_expiry", condition=Q(status="pending")),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values), name="approval_request_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=ApprovalKind.values), name="approval_request_kind_valid"),
            # Four eyes held by the database: whoever decides is not who asked.
            models.CheckConstraint(
                condition=Q(decided_by="") | ~Q(decided_by=F("requested_by")),
                name="approval_request_second_person",
            ),
            models.CheckConstraint(
                condition=(
                    Q(status__in=APPROVAL_DECIDED_STATES, decided_at__isnull=False)
                    & ~Q(decided_by="")
                    & ~Q(decision_reason="")
                )
                | (~Q(status__in=APPROVAL_DECIDED_STATES) & Q(decided_at__isnull=True)),
                name="approval_request_decided_has_who",
            ),
            models.CheckConstraint(condition=~Q(request_reason=""), name="approval_request_has_reason"),
        ]

    def __str__(self) -> str:
        return f"approval #{self.pk}: {self.get_kind_display()} ({self.get_status_display()})"
