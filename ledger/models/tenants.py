"""The tenant and what is its own: API keys, the trail of configuration changes (who changed
what, when), and the names its workflows were seen with."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models
from django.db.models import Q

from ledger.models.fields import SealedJSONField
from ledger.models.states import ConfigChangeAction
from ledger.platform.errors import DestinationNotAllowed, DomainError
from ledger.rules import take_limits
from ledger.rules.outbound import outbound_check, outbound_prefixes_check
from ledger.rules.provider_checks import NAMESPACE_MAX_LENGTH, NAMESPACE_PATTERN, secret_namespace_choose


def secret_namespace_for(slug: str, *, also_taken: tuple[str, ...] = ()) -> str:
    """The namespace a tenant created now with ``slug`` gets (ledger.rules.provider_checks)."""
    taken = list(Tenant.objects.values_list("secret_namespace", flat=True)) + list(also_taken)
    return secret_namespace_choose(slug, taken)


class TenantManager(models.Manager["Tenant"]):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Tenant]:
        # Tenant.save is not called here: each new tenant still gets its namespace, free of
        # the stored ones and of those given earlier in the batch.
        objs = list(objs)
        given: list[str] = []
        for tenant in objs:
            if not tenant.secret_namespace:
                tenant.secret_namespace = secret_namespace_for(tenant.slug, also_taken=tuple(given))
            given.append(tenant.secret_namespace)
        return super().bulk_create(objs, *args, **kwargs)


class Tenant(models.Model):
    """A customer of the service. Every field here is the platform's: only a superuser changes
    a tenant (the console's ADMIN role sees it, and may only rotate its callback secret)."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Admission limits for execute-mode submissions (None = no limit). They are checked
    # against the open rows under a per-tenant lock, never against a counter that could drift.
    max_in_flight = models.PositiveIntegerField(
        null=True, blank=True, help_text="queued + claimed + retry_wait + waiting"
    )
    max_unresolved = models.PositiveIntegerField(null=True, blank=True, help_text="uncertain + review")
    max_queued_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="request bytes not yet sent")
    budget_amount = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    # Fair admission at the workers' take (ADR 0021). Empty: the deployment's default
    # (EXECUTE_TENANT_SHARE, EXECUTE_TENANT_MAX_IN_FLIGHT); a value may lower the default cap
    # or raise the share only up to the deployment's bound (EXECUTE_TENANT_MAX_SHARE), which
    # the services and the console's form refuse past (ledger.rules.take_limits).
    take_share = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Rows per round of the workers' take (weight against other tenants); empty = the deployment's"
        " default",
    )
    take_max_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Operations being sent at once (claimed); empty = the deployment's default, never above it",
    )
    budget_period_seconds = models.PositiveIntegerField(default=86400, db_default=86400)
    # Callbacks go only to URLs under one of these prefixes (scheme://host[:port]/path), each
    # allowed by the outbound policy and stored in canonical form (ledger.rules.outbound).
    callback_allow_list = models.JSONField(default=list, db_default=[], blank=True)
    # HMAC-SHA256 key signing callback bodies; generated on first use, shown once when made or
    # rotated (manage.py tenant_callback_secret, the console's rotate action), never again.
    # Sealed like payloads (ledger.platform.crypto, under the payload keys, even where payload
    # encryption is off; ledger.protocol.callbacks opens it to sign): a database dump, a replica or a
    # column lookup never holds it in clear. NULL: not made yet.
    callback_secret = SealedJSONField(null=True, blank=True, editable=False)
    # After a rotation the previous secret still signs (a second v1 signature) until
    # rotated_at + CALLBACK_SECRET_OVERLAP_SECONDS, so receivers can switch without a gap.
    callback_secret_previous = SealedJSONField(null=True, blank=True, editable=False)
    callback_secret_rotated_at = models.DateTimeField(null=True, blank=True)
    # Asked "is this still wanted?" before a retry older than its provider's recheck_after
    # (ledger.recovery.eligibility): POSTed a signed question (callback_secret), allowed by the
    # outbound policy, stored in canonical form. Empty: no recheck, retries go ahead.
    eligibility_url = models.CharField(max_length=1000, blank=True, default="", db_default="")
    # Whether new keys may hold an e-mail address or an international phone number (the
    # key rule's `personal_data`, ledger.rules.key_rules): keys are logged and shown in clear.
    # Platform-owned: only a superuser changes it (ledger.web.console.tenants.TenantAdmin).
    personal_data_in_keys_allowed = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Accept new idempotency keys that contain an e-mail address or an international phone"
        " number. Keys are logged and shown in clear: prefer hashing the value into the key.",
    )
    # Four-eyes (ADR 0013): every re-send of this tenant's entries and operations — replays,
    # bulk, corrected, re-run as new, forced re-issues, run resumes, "safe to resend/retry" —
    # waits for a second person's approval. Platform-owned like every field here; its
    # providers may require it on their own (Provider.resend_approval_required).
    resend_approval_required = models.BooleanField(
        default=False,
        db_default=False,
        help_text='Every re-send of this tenant\'s failures (replays, corrections, "safe to retry") waits for a'
        " second person's approval. Set by the platform; a tenant's roles cannot switch it off.",
    )
    # Which environment variables its providers may read credentials from:
    # <PROVIDER_SECRET_PREFIX><secret_namespace>_<NAME> (ledger.providers.credentials). Assigned once
    # when the tenant is made (derived from the slug where free), never changed with the slug,
    # never on any form (ADR 0001). The database refuses a duplicate, a character outside
    # [A-Z0-9], and one namespace a prefix of another's (triggers of ledger.0032).
    secret_namespace = models.CharField(max_length=NAMESPACE_MAX_LENGTH, unique=True, editable=False)

    objects = TenantManager()

    class Meta:
        # A tenant's callback signing secret is its receivers' business: its admins may rotate
        # it without being allowed to change the tenant (whose fields are the platform's).
        permissions = [("rotate_callback_secret", "Can rotate a tenant's callback signing secret")]
        constraints = [
            models.CheckConstraint(
                condition=Q(secret_namespace__regex=NAMESPACE_PATTERN), name="tenant_secret_namespace_valid"
            ),
            models.CheckConstraint(
                condition=Q(take_share__isnull=True) | Q(take_share__gte=1), name="tenant_take_share_valid"
            ),
            models.CheckConstraint(
                condition=Q(take_max_in_flight__isnull=True) | Q(take_max_in_flight__gte=1),
                name="tenant_take_max_in_flight_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Assigned once, on the first save; a later slug change keeps it.
        if not self.secret_namespace:
            self.secret_namespace = secret_namespace_for(self.slug)
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # Every allow-list entry passes the outbound policy and is kept in canonical form, so
        # the prefix check at submission compares like with like.
        try:
            self.callback_allow_list = outbound_prefixes_check(
                self.callback_allow_list, purpose="callback allow-list entry"
            )
        except DestinationNotAllowed as exc:
            raise ValidationError({"callback_allow_list": exc.detail}) from None
        # The deployment's bound of the fair take (ADR 0021): a value past it is refused on the
        # form as by the services (which name it: take_…_above_deployment).
        try:
            take_limits.tenant_take_limits_check(take_share=self.take_share, take_max_in_flight=self.take_max_in_flight)
        except DomainError as exc:
            raise ValidationError({str(exc.extra.get("field", NON_FIELD_ERRORS)): exc.detail}) from None
        if self.eligibility_url:
            try:
                self.eligibility_url = outbound_check(self.eligibility_url, purpose="eligibility webhook").url
            except DestinationNotAllowed as exc:
                raise ValidationError({"eligibility_url": exc.detail}) from None


class ApiKey(models.Model):
    """A tenant's API key. Only a sha256 of the secret is stored; the prefix identifies it."""

    # `payload`: may reveal payloads (with a reason, logged); not implied by `admin` (the same).
    # `audit`: may read a person's data trail (review.privacy.subject_apis; implied by `admin`, not by
    # `read`: a trail is about a person).
    # `approve`: may approve or reject another's re-send under four-eyes (ADR 0013); not
    # implied by `admin` (ledger.tenants.auth.SCOPES_NOT_IMPLIED_BY_ADMIN), like `payload`.
    SCOPES = ("read", "write", "admin", "payload", "audit", "approve")

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    hashed_key = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # After this moment the key authenticates nothing (ledger.tenants.auth); empty = no expiry.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant})"


class ConfigChange(models.Model):
    """Who changed which configuration, when, from what to what (DESIGN §8, audit trail).

    Append-only: written by ``ledger.protocol.services.config_change_record`` — called by the services
    and console save paths of every app (providers, API keys, tenants and their callback
    settings in the ledger; replay targets, alert channels, retention policies, staff roles and
    tenant memberships in the apps above) in the transaction of the change; nothing updates or deletes a row,
    and the console shows them read-only. ``before``/``after`` hold only the fields that
    changed (every field on create/delete), secrets masked. Plain values, not foreign keys:
    deleting the object (or the user) must not delete its history.
    """

    # None: a platform-level change (a role's permissions, a user without tenants). No
    # database constraint: the trail outlives a deleted tenant (and never blocks deleting it).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField()
    # "user:<username>", "apikey:<prefix>", "cli:<os user>", "system".
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=8, choices=ConfigChangeAction.choices)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    # Why, where the change path asks (an adapter revision's rollout, promotion or rollback,
    # the canary watch's figures); empty for plain saves.
    reason = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        verbose_name = "configuration change"
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "at"], name="configchange_tenant_at_idx"),
            models.Index(fields=["object_type", "object_id"], name="configchange_object_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type} {self.object_repr or self.object_id}"


class WorkflowName(models.Model):
    """A name a tenant's workflow was seen with (n8n's ``$workflow.name``: sent with a claim or
    a submission, or in a failed event), so that operations, which carry only the workflow's
    id, are found by its name (ledger.protocol.selectors.operation_search, the API's ``workflow_name``).

    One row per workflow and name, written once when the name is first seen
    (ledger.tenants.workflows): a renamed workflow gains a row and stays findable by either name; the
    claim's own INSERT never writes a name, so operations pay nothing for the search. The
    name is searched by a trigram index on PostgreSQL (migration 0016)."""

    # (No index of its own: the unique constraint's leads with the tenant.)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    workflow_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    first_seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "workflow_id", "name"], name="workflowname_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (workflow {self.workflow_id})"
