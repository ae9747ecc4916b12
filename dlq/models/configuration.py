"""What a tenant configures for its dead letters: its n8n connection (lead capture) and the
replay targets replays are sent to. Written only through their rooms' services (ADR 0006); a
form's ``clean`` asks the same destination checks (``dlq.rules.destinations``).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from dlq.models.states import ReplayAck
from dlq.rules.destinations import n8n_base_url_check, n8n_timeout_check, replay_target_url_check
from ledger.models import IdempotencyClass, Tenant
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed


class N8nConnection(models.Model):
    """A tenant's n8n instance, for lead capture (DESIGN §7): when an n8n Error Trigger report
    arrives, the failed execution is fetched through n8n's public REST API and the failed
    node's input items become the entry's payload.

    ``base_url`` passes the deployment's outbound policy and is stored canonical; the API key
    is sealed (``ledger.providers.credentials.sealed_credential``, even where payload encryption is off)
    and write-only: set or replaced in the console or with ``manage.py n8n_connect``, never
    rendered again, masked in the configuration trail."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="n8n_connection")
    base_url = models.URLField(
        max_length=1000, help_text="The n8n instance's address, e.g. https://n8n.example.com (its /api/v1 is used)."
    )
    # {"_enc": …}: the n8n API key, sent as X-N8N-API-KEY. Never shown, never logged.
    api_key_secret = models.JSONField(null=True, blank=True)
    api_key_set_at = models.DateTimeField(null=True, blank=True)
    timeout_seconds = models.FloatField(
        default=5.0, help_text="How long one request to n8n may take (0.5–30 s); ingestion never waits for it."
    )
    active = models.BooleanField(default=True, help_text="Off: Error Trigger entries keep the reported payload.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "n8n connection"
        constraints = [
            models.CheckConstraint(
                condition=Q(timeout_seconds__gte=0.5, timeout_seconds__lte=30), name="n8nconnection_timeout_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"n8n of {self.tenant}"

    def clean(self) -> None:
        # Console saves: the same checks as dlq.n8n.connections.n8n_connection_save.
        if self.base_url:
            try:
                self.base_url = n8n_base_url_check(self.base_url)
            except DestinationNotAllowed as exc:
                raise ValidationError({"base_url": exc.detail}) from None
        try:
            n8n_timeout_check(self.timeout_seconds)
        except ValidationFailed as exc:
            raise ValidationError({"timeout_seconds": exc.detail}) from None


class ReplayTarget(models.Model):
    """An HTTP endpoint replays are sent to (e.g. an n8n Webhook node URL).

    The original idempotency key travels in ``idempotency_header`` so a key-enforced
    receiver dedups the replay against the first try. Like a provider, a target declares
    its class (ADR 0003): only a key-enforced one is re-sent an entry whose first try may
    have acted; to a key-advisory one such an entry waits for a person's decision. Each
    replay is signed (``Onceguard-Signature``, the callback scheme) with the target's own
    secret, and may carry the target's credential header; both are sealed at rest.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="replay_targets")
    slug = models.SlugField(max_length=63)
    url = models.URLField(max_length=1000)
    idempotency_header = models.CharField(max_length=100, default="Idempotency-Key")
    timeout_seconds = models.FloatField(default=10.0)
    # The tenant's default target: events that name none inherit it.
    is_default = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    # Opt-in: the schedule may replay transient failures to this target on its own.
    auto_replay = models.BooleanField(default=False)
    # Whether the receiver dedups on the key (ledger.models.IdempotencyClass). Targets stored
    # before classes existed were migrated to key-advisory, the safe default, unconfirmed.
    idempotency_class = models.CharField(
        max_length=16,
        choices=IdempotencyClass.choices,
        default=IdempotencyClass.KEY_ADVISORY,
        db_default=IdempotencyClass.KEY_ADVISORY,
        help_text="Key-enforced: the receiver refuses a second effect for the same key, so an entry whose first"
        " try may have acted is re-sent. Key-advisory: it may not, so such an entry waits for a person's decision.",
    )
    # False for targets migrated to key-advisory: the console lists them for the operator to confirm.
    class_confirmed = models.BooleanField(default=True, db_default=True)
    # What counts as delivered (ReplayAck, ADR 0007). Targets stored before acknowledgements
    # existed were migrated to "status" (what they did), unconfirmed, and are listed.
    ack = models.CharField(
        max_length=8,
        choices=ReplayAck.choices,
        default=ReplayAck.STATUS,
        db_default=ReplayAck.STATUS,
        help_text="Echo: a replay counts as delivered only when the receiver answers Onceguard-Ack (the"
        " replay-receiver template does, from its Respond node after the work succeeded); required for n8n"
        " receivers, whose 2xx alone may be n8n's own answer for a workflow that stopped half-way."
        " Status: a 2xx is enough (a key-enforced API that answers its own bodies).",
    )
    # False for targets migrated (or created without declaring it): the console lists them.
    ack_confirmed = models.BooleanField(default=True, db_default=True)
    # A search by the business key, asked before a replay: a URL with {key} (GET; 2xx found,
    # 404 not found, anything else: no answer). Empty: no lookup.
    lookup_url = models.CharField(max_length=1000, blank=True, default="", db_default="")
    # {"_enc": …}: the HMAC secret replays are signed with, and the previous one while a
    # rotation's overlap lasts (DLQ REPLAY_SECRET_OVERLAP_SECONDS). Never shown after it was made.
    signing_secret = models.JSONField(null=True, blank=True)
    signing_secret_previous = models.JSONField(null=True, blank=True)
    signing_secret_rotated_at = models.DateTimeField(null=True, blank=True)
    # An optional credential the receiver checks: a header name and its sealed value (write-only).
    credential_header = models.CharField(max_length=100, blank=True, default="", db_default="")
    credential_secret = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="replaytarget_unique_slug"),
            # At most one default per tenant.
            models.UniqueConstraint(fields=["tenant"], condition=Q(is_default=True), name="replaytarget_one_default"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.slug}"

    def clean(self) -> None:
        # Console saves: the URL passes the outbound policy and is stored in canonical form
        # (dlq.targets.services.replay_target_upsert does the same; the send checks again after
        # DNS).
        for field in ("url", "lookup_url"):
            value = getattr(self, field)
            if not value:
                continue
            try:
                setattr(self, field, replay_target_url_check(value, lookup=field == "lookup_url"))
            except DestinationNotAllowed as exc:
                raise ValidationError({field: exc.detail}) from None
