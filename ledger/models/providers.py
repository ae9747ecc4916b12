"""A tenant's providers, configured as data: the provider, its rate bucket, the adapter
fields an adapter revision snapshots and the revisions themselves, and the tenant's prompt
templates that request templates name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from ledger.models.states import IdempotencyClass, ProviderKind
from ledger.models.tenants import Tenant
from ledger.platform.storable import MAX_DURATION_SECONDS
from ledger.rules.intents import intent_config_errors
from ledger.rules.provider_checks import async_config_errors, provider_config_errors


class Provider(models.Model):
    """A receiver of side effects, configured as data (DESIGN §3 execute mode)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="providers")
    slug = models.SlugField(max_length=63)
    kind = models.CharField(max_length=16, choices=ProviderKind.choices, default=ProviderKind.HTTP, db_default="http")
    # Request headers a submitter may set (case-insensitive names). Credentials never come
    # from the caller: the adapter sets `auth_header` to the provider's credential
    # (ledger.providers.credentials) — `auth_secret`, stored sealed and never shown, or else the
    # environment variable `auth_secret_env` names, which must be one of the platform's
    # declared variables for this tenant (ONCEGUARD_PROVIDER_SECRET_PREFIX + the tenant's
    # secret namespace + "_").
    forward_headers = models.JSONField(default=list, db_default=[], blank=True)
    auth_header = models.CharField(max_length=100, blank=True, default="", db_default="")
    auth_secret_env = models.CharField(max_length=100, blank=True, default="", db_default="")
    auth_secret = models.JSONField(null=True, blank=True, editable=False)
    idempotency_class = models.CharField(max_length=16, choices=IdempotencyClass.choices)
    idempotency_header = models.CharField(max_length=100, default="Idempotency-Key")
    base_url = models.URLField(max_length=500, blank=True)
    # May use {key} and {reconciliation_handle}. 200 = found, 404 = not found.
    lookup_path = models.CharField(max_length=500, blank=True)
    ref_pointer = models.CharField(max_length=200, default="/id")
    status_pointer = models.CharField(max_length=200, blank=True)
    success_values = models.JSONField(default=list, blank=True)
    lookup_settle_seconds = models.PositiveIntegerField(default=30)
    # Asynchronous providers (DESIGN §5, asynchronous providers; ledger.execution.polling). A status path
    # makes the provider asynchronous: the submit's answer names a job (ref_pointer), and the
    # operation waits on the provider, polled at base_url + poll_path ({provider_ref} = the job
    # id) with backoff from poll_initial_seconds doubling to poll_max_seconds, or moved by the
    # provider's signed webhook. The status answer's poll_status_pointer value is one of the
    # succeeded / failed / pending values; a succeeded job's output is where
    # output_url_pointer says (a path under base_url or an absolute URL), checked against the
    # announced sha256/size (pointers, optional), output_media_types, and the width/height
    # asked for (pointers into the stored request, e.g. /body/width) before it is published.
    poll_path = models.CharField(max_length=500, blank=True, default="", db_default="")
    poll_status_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    poll_succeeded_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_failed_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_pending_values = models.JSONField(default=list, db_default=[], blank=True)
    poll_initial_seconds = models.FloatField(default=1.0, db_default=1.0)
    poll_max_seconds = models.FloatField(default=30.0, db_default=30.0)
    output_url_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_sha256_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_size_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_media_types = models.JSONField(default=list, db_default=[], blank=True)
    output_width_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    output_height_pointer = models.CharField(max_length=200, blank=True, default="", db_default="")
    # HMAC-SHA256 key the provider signs its webhooks with (Onceguard-Signature, the callbacks'
    # scheme). Sealed and write-only like auth_secret: the provider's, not a revision's.
    webhook_secret = models.JSONField(null=True, blank=True, editable=False)
    key_ttl_seconds = models.PositiveIntegerField(default=86400)
    timeout_seconds = models.FloatField(default=10.0)
    # Retry policy (DESIGN §3): visible on every operation as a snapshot.
    max_attempts = models.PositiveIntegerField(default=4)
    lifetime_seconds = models.PositiveIntegerField(default=1800)
    base_delay_seconds = models.FloatField(default=1.0)
    max_delay_seconds = models.FloatField(default=300.0)
    unit_price = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    throttled_until = models.DateTimeField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=200, blank=True)
    # Four-eyes (ADR 0013): re-sends to or of this provider wait for a second person's
    # approval, and automatic replay skips its entries. Platform-owned: only a superuser (or
    # `provider_upsert(platform=True)`) changes it; a tenant admin's save keeps it.
    resend_approval_required = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Re-sends of this provider's failures wait for a second person's approval (four-eyes). Set by"
        " the platform; a tenant's roles cannot switch it off.",
    )
    # Seconds: a retry of an operation older than this (since its creation or the tenant's
    # last "still wanted") first asks the tenant's eligibility webhook (ledger.recovery.eligibility).
    # Empty: retries never ask.
    recheck_after = models.PositiveIntegerField(null=True, blank=True, help_text="seconds; empty = never recheck")
    # Rate and concurrency caps (DESIGN §5, rate and concurrency caps; ledger.providers.ratelimit). The
    # provider's, not an adapter revision's: they say what the receiver can take. Workers of
    # every process respect them through the database: in flight = this provider's claimed
    # execute-mode rows; the rate = a token bucket (ProviderRate) refilled on the database's
    # clock, lowered by 429s and climbing back while it is quiet. Empty = no cap.
    max_in_flight = models.PositiveIntegerField(
        null=True, blank=True, help_text="most calls at once, over every worker; empty = no cap"
    )
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="most calls per rate period, over every worker; empty = no rate"
    )
    rate_period_seconds = models.PositiveIntegerField(
        default=1, db_default=1, help_text="seconds: the period of the rate (1 = per second, 60 = per minute)"
    )
    rate_burst = models.PositiveIntegerField(
        default=1,
        db_default=1,
        help_text="calls that may go at once after a quiet spell (1 spaces the calls evenly); at most the rate",
    )
    # After a 429 the effective in-flight limit halves and climbs back by 1 per this many quiet
    # seconds (ADR 0008). Empty: the deployment's PROVIDER_CONCURRENCY_RECOVERY_SECONDS.
    concurrency_recovery_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="seconds without a 429 per +1 of a lowered in-flight limit; empty = the deployment's default",
    )
    # Intent envelopes (DESIGN §5, intents; ledger.rules.intents). With a schema, submissions carry
    # `intent` (named, typed, bounded values) instead of a request, and the request template
    # translates it into the provider's request when an attempt is sent. Both are adapter
    # fields: a revision holds them as a pair, so a rollback restores the schema with the
    # translation written for it. Checked on every save path (Provider.clean, provider_upsert).
    intent_schema = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text='{"fields": {"aspect_class": {"type": "enum", "values": ["square", "portrait"],'
        ' "required": true}, …}}; empty: submissions send a request (method, path, body).',
    )
    request_template = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text='The provider\'s request with placeholders: {"method": "POST", "path": "/v1/renders",'
        ' "body": {"size": "{{ size }}", "prompt": "{{ prompt:render-default }}"}, "lookups": {"size":'
        ' {"field": "aspect_class", "values": {"square": "1024x1024", …}}}}. Only {{ name }} substitutes;'
        " nothing is evaluated.",
    )
    # Adapter revisions (DESIGN §5, adapter revisions; ledger.providers.revisions, ledger.providers.canary). The
    # adapter fields above (ADAPTER_FIELDS) always hold the stable revision's snapshot;
    # `revision` points at it. A canary revision takes `canary_percent` of new operations,
    # chosen by a hash of the key, until it is promoted or rolled back. Moved only by
    # ledger.providers.canary (recorded as configuration changes), never by a form.
    revision = models.ForeignKey(
        "AdapterRevision", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False
    )
    canary_revision = models.ForeignKey(
        "AdapterRevision", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False
    )
    canary_percent = models.PositiveSmallIntegerField(default=0, db_default=0, editable=False)
    canary_started_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A canary gate's breach pauses the canary (ADR 0020): it keeps its share and figures but
    # takes no new operations until an operator resumes it (canary_start), promotes or rolls
    # it back. The evidence: the gates' figures at the breach.
    canary_paused_at = models.DateTimeField(null=True, blank=True, editable=False)
    canary_pause_evidence = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The console's rollout moves (ledger.providers.canary): an operator may roll a canary back in an
        # incident without being allowed to edit the provider.
        permissions = [("rollout_provider", "Can start, promote and roll back adapter revisions")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="provider_unique_slug_per_tenant"),
            models.CheckConstraint(
                condition=(Q(max_in_flight__isnull=True) | Q(max_in_flight__gte=1))
                & (Q(rate_limit__isnull=True) | Q(rate_limit__gte=1))
                & Q(rate_period_seconds__gte=1)
                & Q(rate_period_seconds__lte=86400)
                & Q(rate_burst__gte=1)
                & (
                    Q(concurrency_recovery_seconds__isnull=True)
                    | Q(concurrency_recovery_seconds__gte=1, concurrency_recovery_seconds__lte=86400)
                ),
                name="provider_caps_valid",
            ),
            models.CheckConstraint(
                condition=(Q(canary_revision__isnull=True) & Q(canary_percent=0))
                | (Q(canary_revision__isnull=False) & Q(canary_percent__gte=1) & Q(canary_percent__lte=100)),
                name="provider_canary_has_percent",
            ),
            models.CheckConstraint(
                condition=Q(canary_paused_at__isnull=True) | Q(canary_revision__isnull=False),
                name="provider_paused_canary_exists",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.slug}"

    def clean(self) -> None:
        # Checked on every save path (console forms call this; services.provider_upsert too):
        # where it sends, and which credential it may read. Checked again at send time.
        namespace = Tenant.objects.filter(pk=self.tenant_id).values_list("secret_namespace", flat=True).first() or ""
        errors, self.base_url = provider_config_errors(
            namespace=namespace,
            base_url=self.base_url,
            lookup_path=self.lookup_path,
            auth_secret_env=self.auth_secret_env,
        )
        # Durations the workers and the sweeper add to "now": bounded, so that stays a
        # datetime (a 1e300-second timeout would break every sweep, for every tenant).
        for name in ("timeout_seconds", "base_delay_seconds", "max_delay_seconds"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_DURATION_SECONDS:
                errors[name] = f"Must lie between 0 and {MAX_DURATION_SECONDS} seconds (ten years)."
        errors.update(
            provider_caps_errors(
                max_in_flight=self.max_in_flight,
                rate_limit=self.rate_limit,
                rate_period_seconds=self.rate_period_seconds,
                rate_burst=self.rate_burst,
                concurrency_recovery_seconds=self.concurrency_recovery_seconds,
            )
        )
        # What a submission may say and how it is translated (ledger.rules.intents): a template that
        # would evaluate anything is refused here, never at send time.
        errors.update(
            intent_config_errors(
                intent_schema=self.intent_schema,
                request_template=self.request_template,
                prompt_slots=prompt_slots_of(self.tenant_id),
            )
        )
        for name, message in async_config_errors({name: getattr(self, name) for name in ADAPTER_FIELDS}).items():
            errors.setdefault(name, message)
        # Slugs beginning with "_" are the service's own (the tenant's `_callbacks`, created
        # by ledger.protocol.callbacks): none is created, nor renamed into, from a form.
        if self.slug.startswith("_"):
            stored = Provider.objects.filter(pk=self.pk).values_list("slug", flat=True).first() if self.pk else None
            if stored != self.slug:
                errors["slug"] = "Slugs beginning with _ belong to the service's own providers; choose another."
        if errors:
            raise ValidationError(errors)


def provider_caps_errors(
    *,
    max_in_flight: int | None,
    rate_limit: int | None,
    rate_period_seconds: int | None,
    rate_burst: int | None,
    concurrency_recovery_seconds: int | None = None,
) -> dict[str, str]:
    """What is wrong with a provider's rate and concurrency caps, by field (empty: nothing)."""
    errors: dict[str, str] = {}
    if max_in_flight is not None and max_in_flight < 1:
        errors["max_in_flight"] = "At least 1 call in flight (empty = no cap)."
    if rate_limit is not None and rate_limit < 1:
        errors["rate_limit"] = "At least 1 call per period (empty = no rate)."
    if rate_period_seconds is None or not 1 <= rate_period_seconds <= 86400:
        errors["rate_period_seconds"] = "The rate's period lies between 1 second and a day (86400)."
    if rate_burst is None or rate_burst < 1:
        errors["rate_burst"] = "The burst is at least 1 call."
    elif rate_limit is not None and rate_burst > rate_limit:
        errors["rate_burst"] = f"The burst is at most the rate ({rate_limit} calls)."
    if concurrency_recovery_seconds is not None and not 1 <= concurrency_recovery_seconds <= 86400:
        errors["concurrency_recovery_seconds"] = (
            "The quiet period lies between 1 second and a day (86400); empty = the deployment's default."
        )
    return errors


# The fields of a provider's rate and concurrency caps; a change of one resets its bucket.
PROVIDER_CAP_FIELDS = (
    "max_in_flight",
    "rate_limit",
    "rate_period_seconds",
    "rate_burst",
    "concurrency_recovery_seconds",
)


class ProviderRate(models.Model):
    """A capped or throttled provider's token bucket, effective rate and effective in-flight limit
    (ledger.providers.ratelimit), one row per provider, moved only by the statements in
    ledger/store/queries.sql (``provider_rate_…``) on the database's clock. The row is also the
    lock takers of one provider queue on, so each one counts the in-flight rows the previous one
    committed. Not configuration: never in a form."""

    provider = models.OneToOneField(Provider, on_delete=models.CASCADE, primary_key=True, related_name="rate_state")
    # The provider's tenant: Citus distributes the bucket by it, beside that tenant's
    # operations, and every statement on the bucket names it (DESIGN §12; migration 0029).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Calls that may start now (refilled at `rate` per second up to the provider's burst).
    tokens = models.FloatField()
    # The effective rate in calls per second: the declared one, halved by a 429 and climbing
    # back a step at a time while it is quiet.
    rate = models.FloatField()
    refilled_at = models.DateTimeField()
    # The last 429 (or 503 with Retry-After) or the last step back up: the next step waits
    # for PROVIDER_RATE_RECOVERY_SECONDS after it.
    quiet_since = models.DateTimeField()
    # The last lowering: an answer to a call sent before it (the same storm) does not lower again.
    lowered_at = models.DateTimeField(null=True, blank=True)
    # When the bucket will hold a whole call again (the workers' take passes the provider over
    # until then); empty when it holds one now.
    next_take_at = models.DateTimeField(null=True, blank=True)
    # The effective in-flight limit after a 429 (ADR 0008): halved by each storm (down to 1),
    # +1 per quiet period; empty when not lowered (the declared max_in_flight, or none, holds).
    # At least 1 by its only writers' statements (GREATEST(1, …)); no CHECK: adding one would
    # scan every bucket under an exclusive lock at migration, as migration 0029 took care not to.
    concurrency = models.IntegerField(null=True, blank=True)
    # When the limit took its current value (lowered or stepped back up).
    concurrency_since = models.DateTimeField(null=True, blank=True)
    # The quiet clock of the limit: the last 429 or step; the next step waits a quiet period.
    concurrency_quiet_since = models.DateTimeField(null=True, blank=True)
    # Why it was lowered, in words (the answer and the limit before it); no personal data.
    concurrency_reason = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        db_table = "ledger_providerrate"

    def __str__(self) -> str:
        return f"rate of provider {self.provider_id}"


# The adapter fields of an asynchronous provider (ledger.execution.polling): how its jobs are polled and
# its outputs found and checked.
ASYNC_ADAPTER_FIELDS = (
    "poll_path",
    "poll_status_pointer",
    "poll_succeeded_values",
    "poll_failed_values",
    "poll_pending_values",
    "poll_initial_seconds",
    "poll_max_seconds",
    "output_url_pointer",
    "output_sha256_pointer",
    "output_size_pointer",
    "output_media_types",
    "output_width_pointer",
    "output_height_pointer",
)

# How the service talks to a provider in execute mode: what an adapter revision snapshots
# (DESIGN §5, adapter revisions). Everything else on a provider — its idempotency class, retry
# policy, price, credential, pause — belongs to the provider and applies to every revision at
# once: a rollback must never bring back a credential that was replaced (it may be revoked),
# and the class says what the receiver is, not how we call it.
ADAPTER_FIELDS = (
    "base_url",
    "idempotency_header",
    "auth_header",
    "forward_headers",
    "ref_pointer",
    "status_pointer",
    "success_values",
    "timeout_seconds",
    "lookup_path",
    "lookup_settle_seconds",
    "intent_schema",
    "request_template",
    # asynchronous providers (DESIGN §5, asynchronous providers)
    *ASYNC_ADAPTER_FIELDS,
)


class AdapterRevision(models.Model):
    """One immutable snapshot of a provider's adapter configuration (``config``: the
    ``ADAPTER_FIELDS`` as JSON). Numbered 1..n per provider; written by ``ledger.providers.revisions``
    on every change of those fields, never updated or deleted (the console shows them
    read-only). Which revision is stable and which is a canary is the provider's (its
    ``revision`` and ``canary_revision``); the moves are recorded as configuration changes."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Indexed by the unique (provider, number).
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="revisions", db_index=False)
    number = models.PositiveIntegerField()
    # The adapter fields, as data: later adapter kinds add their own keys here.
    config = models.JSONField()
    # The stable revision this one was made from (its number); None for the first.
    based_on = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True)
    # The rollout's, not the snapshot's (``config`` never changes; ADR 0020): the canary
    # gates' thresholds this revision is judged by (a key missing: the deployment's default,
    # ledger.providers.canary.GATE_SETTINGS), set when it starts as a canary; and when it was
    # last rolled back (its outputs are recalled: ledger.recovery.recall), cleared when it
    # runs again.
    gates = models.JSONField(default=dict, db_default={}, blank=True)
    rolled_back_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_adapterrevision"
        constraints = [models.UniqueConstraint(fields=["provider", "number"], name="adapterrevision_unique_number")]

    def __str__(self) -> str:
        return f"revision {self.number}"


class PromptTemplate(models.Model):
    """One immutable version of a tenant's prompt text (DESIGN §5, prompt templates;
    ledger.providers.prompts). ``text`` holds the instructions and ``{{ slot }}`` placeholders for the
    declared ``slots`` (name → ``{"max_length": n}``); a request template names the prompt
    (``{{ prompt:name }}``, the newest version, or ``{{ prompt:name@3 }}``), and user text goes
    only into the slots, fenced and capped. Numbered 1..n per tenant and name; a change is a
    new version, never an edit; the attempt that used one records it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.SlugField(max_length=63)
    version = models.PositiveIntegerField()
    text = models.TextField()
    slots = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True)
    # The JSON Schema a job's evaluation manifest must match when the job is pinned to this
    # version (ledger.execution.manifests, ADR 0022); null: this preset declares none.
    manifest_schema = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "ledger_prompttemplate"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name", "version"], name="prompttemplate_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


def prompt_slots_of(tenant_id: int | None) -> Callable[[str, int | None], dict[str, Any] | None]:
    """A tenant's prompt templates' declared slots by name and version (None: the newest), or
    None for a prompt that does not exist: what ``intents.template_problems`` checks a request
    template's prompt references against."""

    def slots(name: str, version: int | None) -> dict[str, Any] | None:
        rows = PromptTemplate.objects.filter(tenant_id=tenant_id, name=name)
        row = rows.filter(version=version).first() if version else rows.order_by("-version").first()
        return None if row is None else dict(row.slots)

    return slots
