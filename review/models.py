"""Review queue: operations whose outcome a human must decide (DESIGN §3 `review`)."""

from __future__ import annotations

import base64
import time
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone
from django_otp.models import Device, ThrottlingMixin
from django_otp.oath import TOTP

from ledger.models import Operation, OperationStatus, Provider, Tenant
from ledger.providers.credentials import secret_open
from ledger.store.open_rows import open_rows_where


class ReviewDecision(models.TextChoices):
    # The reviewer has evidence the effect happened (e.g. seen in the provider's dashboard).
    CONFIRM_SUCCEEDED = "confirm_succeeded", "confirm succeeded"
    # The reviewer asserts the effect did not happen: re-issue with the original key.
    SAFE_TO_RETRY = "safe_to_retry", "safe to retry"
    # Do not do it at all.
    ABANDON = "abandon", "abandon"


class ReviewItemManager(models.Manager["ReviewItem"]):
    def get_queryset(self) -> models.QuerySet[ReviewItem]:
        # Through the work queue's mirror (its (tenant, status) index, ADR 0017), as the review
        # API reads them: on the row alone no index names the state any more, and the console's
        # review list scanned the operation table (7.8 s at ten million rows,
        # bench/results/scale-10M.md).
        return super().get_queryset().filter(open_rows_where(status=OperationStatus.REVIEW))


class ReviewItem(Operation):
    """An operation in `review`, as the review console and API see it."""

    objects = ReviewItemManager()

    class Meta:
        proxy = True
        verbose_name = "review item"
        permissions = [("decide_reviewitem", "Can record review decisions")]


# --- Staff ↔ tenants ------------------------------------------------------------------------


class StaffTenant(models.Model):
    """A staff user works for these tenants and sees nothing of any other (superusers: all)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="onceguard_tenants")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="staff")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "staff tenant membership"
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="stafftenant_unique")]

    def __str__(self) -> str:
        return f"{self.user} → {self.tenant}"


# --- Access log (hash-chained per tenant) ---------------------------------------------------


class AccessAction(models.TextChoices):
    # a masked payload was shown in plain text (console or API), with a reason.
    REVEAL = "reveal", "payload revealed"
    # a CSV export was downloaded.
    EXPORT = "export", "export"
    # a data-subject search was run, or a person's trail looked at (the search itself is
    # about a person).
    SUBJECT_SEARCH = "subject_search", "data-subject search"
    # a person's data was asked to be erased (review.privacy.erasure); the run itself says what it did.
    ERASE = "erase", "erasure requested"
    # an erasure deleted an n8n execution that carried the person's data, through the
    # tenant's n8n connection (review.privacy.erasure_n8n); object_id is the erasure run.
    N8N_DELETE = "n8n_delete", "n8n execution deleted"


class AccessLog(models.Model):
    """Who looked at personal data, what, why, when and from where.

    Append-only and chained per tenant (review.audit.accesslog): ``hash`` covers the canonical row
    and ``prev_hash``; ``seq`` numbers the tenant's chain. ``chain_version`` says how:
    ``v2`` = HMAC-SHA256 under the server's access-log key ``key_id`` (kept outside the
    database), ``v1`` = the first, unkeyed sha256 (rows written before the key existed,
    sealed by a signed ``legacy`` checkpoint). A purge cuts a prefix of a chain and records
    the new anchor as a signed ``purge`` checkpoint.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    seq = models.PositiveBigIntegerField()
    at = models.DateTimeField()
    action = models.CharField(max_length=20, choices=AccessAction.choices)
    # "user:<username>" or "apikey:<prefix>". Plain values, not foreign keys: deleting a user
    # must not rewrite (and so break) the chain.
    actor = models.CharField(max_length=150)
    user_id_at_time = models.BigIntegerField(null=True, blank=True)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=64, blank=True)
    # The object's key or event id (never personal data, DESIGN §3).
    object_ref = models.CharField(max_length=255, blank=True)
    fields = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500)
    ip = models.GenericIPAddressField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)
    # "v1" (sha256, before the keyed chain) for rows that existed when the column came;
    # every row appended since is "v2" (HMAC under key ``key_id``).
    chain_version = models.CharField(max_length=4, default="v1")
    key_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        verbose_name = "access-log entry"
        verbose_name_plural = "access log"
        ordering = ["-at", "-id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "seq"], name="accesslog_unique_seq")]
        indexes = [
            models.Index(fields=["tenant", "at"], name="accesslog_tenant_at_idx"),
            models.Index(fields=["object_type", "object_id"], name="accesslog_object_idx"),
        ]
        permissions = [
            ("view_payload", "Can reveal masked payloads (a reason is required and logged)"),
            ("export_data", "Can export lists as CSV"),
            ("search_subjects", "Can search records by data subject (phone, email)"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}#{self.seq} {self.actor} {self.action} {self.object_type}:{self.object_id}"


class CheckpointKind(models.TextChoices):
    # the chain's head (seq, hash) as it was: written by the django-q2 schedule, by every
    # purge and by `manage.py accesslog_checkpoint`.
    HEAD = "head", "head"
    # a purge cut the chain's prefix up to here: the anchor the rest verifies from.
    PURGE = "purge", "purge anchor"
    # the head of the unkeyed (v1) rows when the keyed chain began: no v1 row may lie beyond.
    LEGACY = "legacy", "end of the unkeyed rows"


class AccessLogCheckpoint(models.Model):
    """A signed statement "tenant T's access log had row ``seq`` with ``hash`` at ``at``".

    HMAC-SHA256 under the access-log key (never in the database), numbered per tenant
    (``n``, no gaps): ``accesslog_verify`` reports rows a checkpoint covered that are gone
    (truncation, deleted tail rows), a checkpoint deleted or forged, and checkpoints that
    stopped coming. Append-only; nothing in the console changes them.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    n = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=8, choices=CheckpointKind.choices)
    seq = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=64)
    at = models.DateTimeField()
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=64)

    class Meta:
        verbose_name = "access-log checkpoint"
        ordering = ["-at", "-id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "n"], name="accesslogcheckpoint_unique_n")]

    def __str__(self) -> str:
        return f"{self.tenant_id} checkpoint #{self.n} ({self.kind}) at seq {self.seq}"


# --- Data-subject index ---------------------------------------------------------------------


class SubjectKind(models.TextChoices):
    PHONE = "phone", "phone number"
    EMAIL = "email", "email address"


class RecordType(models.TextChoices):
    OPERATIONS = "operations", "operations"
    FAILED_EVENTS = "failed_events", "DLQ entries"
    ACCESS_LOG = "access_log", "access log"
    # Files tenants uploaded (ledger.Upload): the bytes are the record, so the earlier of the
    # two TTLs deletes row and object together.
    UPLOADS = "uploads", "uploads"


class SubjectIndex(models.Model):
    """Keyed HMACs of normalized identifiers found in a payload: find every record about a
    person without decrypting anything. ``key_id`` names the HMAC key (rotation)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    record_type = models.CharField(max_length=16, choices=RecordType.choices)
    record_id = models.BigIntegerField()
    # phone, email, or a kind the deployment configured (ONCEGUARD_PRIVACY["SUBJECT_KEYS"]).
    kind = models.CharField(max_length=32, choices=SubjectKind.choices)
    key_id = models.CharField(max_length=32)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    # The record was deleted (retention) at this time. The link stays, a keyed digest and an
    # id, so the person's trail can say what became of the record; it goes with an erasure,
    # or once the access log's floor has passed (review.retention.purge).
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "subject index entry"
        verbose_name_plural = "subject index"
        constraints = [
            models.UniqueConstraint(
                fields=["record_type", "record_id", "kind", "key_id", "digest"], name="subjectindex_unique"
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "digest"], name="subjectindex_digest_idx"),
            models.Index(fields=["record_type", "record_id"], name="subjectindex_record_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.record_type}:{self.record_id} {self.kind}"


# --- Retention ------------------------------------------------------------------------------


class RetentionPolicy(models.Model):
    """Per tenant and record type: payload TTL (then redact), record TTL (then delete),
    legal hold (nothing purged). Empty TTL = keep forever."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="retention_policies")
    record_type = models.CharField(max_length=16, choices=RecordType.choices)
    payload_ttl = models.DurationField(
        "keep the payload for", null=True, blank=True, help_text="e.g. 30 days; empty: never redact"
    )
    record_ttl = models.DurationField(
        "keep the record for", null=True, blank=True, help_text="e.g. 365 days; empty: never delete"
    )
    legal_hold = models.BooleanField(default=False, help_text="While set, nothing of this kind is purged.")
    legal_hold_note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "retention policies"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "record_type"], name="retentionpolicy_unique"),
            models.CheckConstraint(
                condition=Q(payload_ttl__isnull=True)
                | Q(record_ttl__isnull=True)
                | Q(payload_ttl__lte=F("record_ttl")),
                name="retentionpolicy_payload_before_record",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.record_type}"


class RetentionRunStatus(models.TextChoices):
    RUNNING = "running", "running"
    # every batch finished.
    DONE = "done", "done"
    # stopped at the batch limit; the next run continues.
    PARTIAL = "partial", "partial (batch limit reached)"
    FAILED = "failed", "failed"


class RetentionRun(models.Model):
    """One purge pass over one tenant: what was redacted, deleted, discarded, by which policy."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    pass_id = models.CharField(max_length=32, db_index=True)
    trigger = models.CharField(max_length=16, default="schedule")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=RetentionRunStatus.choices, default=RetentionRunStatus.RUNNING)
    redacted = models.PositiveIntegerField(default=0)
    deleted = models.PositiveIntegerField(default=0)
    discarded = models.PositiveIntegerField(default=0)
    tombstones_created = models.PositiveIntegerField(default=0)
    tombstones_expired = models.PositiveIntegerField(default=0)
    batches = models.PositiveIntegerField(default=0)
    # Per record type: {"operations": {"policy": id, "redacted": n, "deleted": n, "held": bool}, …}
    details = models.JSONField(default=dict, blank=True)
    # The access-log chain's anchor after this run cut a prefix: the last deleted row.
    accesslog_anchor_seq = models.PositiveBigIntegerField(null=True, blank=True)
    accesslog_anchor_hash = models.CharField(max_length=64, blank=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["tenant", "started_at"], name="retentionrun_tenant_idx")]

    def __str__(self) -> str:
        return f"retention {self.tenant_id} {self.started_at:%Y-%m-%d %H:%M}"


# --- Erasure on request ------------------------------------------------------------------


class ErasureState(models.TextChoices):
    # requested, nothing erased yet. Out: the task (review.privacy.erasure.erasure_continue) → running.
    PENDING = "pending", "pending"
    # working through its records in batches, each batch committed with the cursor. A crash
    # leaves it here; running the task again (or the purge schedule's recovery) continues at
    # the cursor. Out: erasure_continue → done.
    RUNNING = "running", "running"
    # every record redacted and the person's index entries gone. Terminal.
    DONE = "done", "done"


ERASURE_OPEN_STATES = frozenset({ErasureState.PENDING, ErasureState.RUNNING})
ERASURE_ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    ErasureState.PENDING: frozenset({ErasureState.RUNNING}),
    ErasureState.RUNNING: frozenset({ErasureState.DONE}),
    ErasureState.DONE: frozenset(),
}


class ErasureRun(models.Model):
    """One erasure of a person's data on request (APP 11.2 / an erasure request): every
    payload that names them redacted, their index entries removed; the audit trail and the
    digests stay. The person is named only by keyed references (``subject_ref``: HMACs under
    the deployment's key, never the plaintext); the records are a snapshot of ids taken when
    the request was made, worked through from ``cursor`` in batches (review.privacy.erasure)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # "email:<32 hex> phone:<32 hex>": keyed references of the identifiers asked for.
    subject_ref = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=ErasureState.choices, default=ErasureState.PENDING)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    # [[record_type, id], …] — ids only, in the order they are erased.
    targets = models.JSONField(default=list)
    # The subject index digests still to remove (keyed HMACs); emptied when the run is done.
    digests = models.JSONField(default=list, blank=True)
    cursor = models.PositiveIntegerField(default=0)
    # How often a task worked on it (more than one: it was resumed after a stop).
    passes = models.PositiveIntegerField(default=0)
    # What it touched.
    operations = models.PositiveIntegerField(default=0)
    failed_events = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    replays = models.PositiveIntegerField(default=0)
    outputs = models.PositiveIntegerField(default=0, help_text="published outputs (files) of their operations deleted")
    uploads = models.PositiveIntegerField(
        default=0, db_default=0, help_text="uploads their operations named deleted (rows and files)"
    )
    index_entries = models.PositiveIntegerField(default=0)
    texts = models.PositiveIntegerField(default=0, help_text="free-text columns the person's values were cut from")
    cancelled = models.PositiveIntegerField(default=0, help_text="queued or waiting operations cancelled first")
    discarded = models.PositiveIntegerField(default=0, help_text="open DLQ entries discarded")
    missing = models.PositiveIntegerField(default=0, help_text="records already deleted when their turn came")
    # n8n's copies of the person's data (review.privacy.erasure_n8n): the executions Onceguard knows
    # carried it (its operations' and DLQ entries' execution ids), snapshotted with the
    # records as [[workflow_id, execution_id], …], worked through from ``n8n_cursor`` once
    # the records are done.
    n8n_executions = models.JSONField(default=list, blank=True)
    n8n_delete = models.BooleanField(
        default=False, help_text="asked with the request: delete them through the tenant's n8n connection"
    )
    n8n_cursor = models.PositiveIntegerField(default=0)
    n8n_deleted = models.PositiveIntegerField(default=0, help_text="n8n executions deleted through n8n's API")
    # The executions not deleted, for a person to remove by hand (or not found in n8n):
    # [{"workflow", "execution", "outcome", "reason"}, …]. Never silently dropped.
    n8n_left = models.JSONField(default=list, blank=True)
    requested_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last error class a pass stopped on (never its text: it could hold payload values).
    error = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["tenant", "requested_at"], name="erasurerun_tenant_idx")]
        constraints = [
            models.CheckConstraint(
                condition=(Q(state=ErasureState.DONE) & Q(finished_at__isnull=False))
                | (~Q(state=ErasureState.DONE) & Q(finished_at__isnull=True)),
                name="erasurerun_finished_iff_done",
            ),
            models.CheckConstraint(condition=Q(state__in=list(ErasureState.values)), name="erasurerun_state_valid"),
            # One open erasure per person and tenant: a second request answers the first.
            models.UniqueConstraint(
                fields=["tenant", "subject_ref"],
                condition=Q(state__in=["pending", "running"]),
                name="erasurerun_one_open_per_subject",
            ),
        ]
        permissions = [("erase_subject", "Can erase a person's data on request")]

    def __str__(self) -> str:
        return f"erasure #{self.pk} ({self.state})"


class PausedProvider(Provider):
    """Providers as operators see them: pause state and a resume action."""

    class Meta:
        proxy = True
        verbose_name = "provider pause"
        permissions = [("resume_provider", "Can resume paused providers")]


class LoginFailure(models.Model):
    """Failed console logins, for throttling (kept a day)."""

    username = models.CharField(max_length=150, db_index=True)
    ip = models.GenericIPAddressField(null=True, blank=True, db_index=True)
    at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.username}@{self.ip} {self.at}"


# --- The dashboard's activity chart ------------------------------------------------------------


class ActivityHour(models.Model):
    """A finished hour of the dashboard's activity chart, one tenant's: how many of
    its operations per provider succeeded or failed in it, its DLQ entries, its review
    decisions. An hour is over once and its counts stay, so each is read from the ledger once
    — by the hourly schedule (``review.schedules.activity_rollup_task``) or by the first
    dashboard that needs it — instead of once per process; the row with an empty series says
    the hour was read (an hour without activity has no other). Counts as the hour ended:
    rows a purge deletes later stay counted until the hour leaves the chart (2 days kept)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    hour = models.DateTimeField()
    # The provider's slug ("(posted by workflows)" for DLQ entries without one); "" with series "".
    provider = models.CharField(max_length=100, blank=True)
    series = models.CharField(max_length=16, blank=True)
    n = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "hour", "series", "provider"], name="activityhour_unique")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.hour:%Y-%m-%d %H:00} {self.provider} {self.series} {self.n}"


# --- Console sign-in: single sign-on identities and second factors (ADR 0014) ---------------


class OidcIdentity(models.Model):
    """A person as the organisation's identity provider names them: the (issuer, subject)
    pair of their ID tokens, bound to one console user. Never matched by e-mail: an address
    can be reissued, and another issuer may vouch for the same one (ADR 0014)."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidcidentity_issuer_subject_unique"),
            models.CheckConstraint(condition=~Q(issuer="") & ~Q(subject=""), name="oidcidentity_named"),
        ]

    def __str__(self) -> str:
        return f"{self.issuer} · {self.subject}"


# RFC 6238's defaults, which every authenticator app reads from an otpauth:// address.
TOTP_STEP, TOTP_DIGITS = 30, 6


class ConsoleTotpDevice(ThrottlingMixin, Device):
    """A local account's authenticator app (RFC 6238 TOTP), as a django-otp device so the
    session's verification and the throttling of wrong codes are django-otp's. Unlike
    django-otp's own TOTPDevice the shared key is sealed at rest like every other secret of
    the service (ledger.platform.crypto): a copy of the database alone cannot mint codes.
    ``confirmed`` is False while enrolling (the key shown once, no code typed yet); a user has
    at most one confirmed device. Verification and enrolment: review.staff.mfa."""

    # seal_json(base32 key, always=True): opened only to check a code.
    sealed_key = models.JSONField()
    # The last time step a code was accepted for: a code is never accepted twice.
    last_t = models.BigIntegerField(default=-1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "authenticator app"
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=Q(confirmed=True), name="consoletotpdevice_one_confirmed_per_user"
            ),
            models.CheckConstraint(condition=Q(last_t__gte=-1), name="consoletotpdevice_last_t_valid"),
        ]

    def get_throttle_factor(self) -> int:
        # Seconds before the next try after the first wrong code, doubled with each one more.
        return 1

    def verify_token(self, token: str) -> bool:
        """Whether ``token`` is this device's code now (one step of clock drift either way),
        throttled as django-otp throttles: each wrong code doubles the wait before the next,
        and CONSOLE_MFA_MAX_FAILURES in a row lock the device until ``mfa_reset``."""
        allowed, _ = self.verify_is_allowed()
        if not allowed:
            return False
        totp = TOTP(base64.b32decode(secret_open(self.sealed_key)), step=TOTP_STEP, digits=TOTP_DIGITS)
        totp.time = time.time()
        code = "".join(str(token or "").split())
        matched = (
            code.isdigit() and len(code) == TOTP_DIGITS and totp.verify(int(code), tolerance=1, min_t=self.last_t + 1)
        )
        devices = ConsoleTotpDevice.objects.filter(pk=self.pk)
        # Guarded writes, not save(): two sign-ins racing with one code both read the old
        # last_t, and only the UPDATE that still sees it wins (a code is good for one session).
        if matched and devices.filter(last_t__lt=totp.t()).update(
            last_t=totp.t(), throttling_failure_count=0, throttling_failure_timestamp=None
        ):
            self.last_t, self.throttling_failure_count, self.throttling_failure_timestamp = totp.t(), 0, None
            return True
        now = timezone.now()
        devices.update(throttling_failure_count=F("throttling_failure_count") + 1, throttling_failure_timestamp=now)
        self.throttling_failure_count += 1
        self.throttling_failure_timestamp = now
        return False

    def verify_is_allowed(self) -> tuple[bool, dict[str, Any] | None]:
        if self.throttling_failure_count >= settings.CONSOLE_MFA_MAX_FAILURES:
            return False, {"reason": "locked", "failure_count": self.throttling_failure_count}
        return super().verify_is_allowed()
