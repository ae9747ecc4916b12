"""Dead-letter queue tables (DESIGN §4). No business logic: every move of an entry between
states lives in dlq.entries.transitions, every other write in dlq.services."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from dlq.rules.conf import dlq_setting
from ledger.models import AdapterRevision, ErrorClass, IdempotencyClass, Operation, Tenant
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed
from ledger.rules.outbound import outbound_check


class FailedEventStatus(models.TextChoices):
    # Every move out of a state is a named function in dlq.entries.transitions; nothing else writes
    # an entry's status (tests/test_state_writes.py).

    # waiting for an operator (or the auto-replay schedule). Out: a replay
    # (failed_event_replay_take), resolve or discard (failed_event_close), a correction
    # (failed_event_correct), an ambiguous replay later found succeeded
    # (failed_event_replay_settled_late).
    PENDING = "pending", "pending"
    # a replay is being sent (the guarded pending→replaying update allocated its number).
    # Out: the replay's own outcome (replayed / back to pending: failed_event_replay_settle);
    # dlq.tasks.replays_recover when the sender died mid-way (the same settle).
    REPLAYING = "replaying", "replaying"
    # the last replay succeeded. Out: a forced re-replay (needs a note:
    # failed_event_replay_take), resolve, discard (failed_event_close).
    REPLAYED = "replayed", "replayed"
    # an operator fixed it another way. Terminal.
    RESOLVED = "resolved", "resolved"
    # an operator (or retention) decided to drop it. Terminal.
    DISCARDED = "discarded", "discarded"


FE = FailedEventStatus
FE_TERMINAL_STATES = frozenset({FE.RESOLVED, FE.DISCARDED})
# Entries an operator still has to look at (the console's default view, the alert counts).
FE_OPEN_STATES = frozenset({FE.PENDING, FE.REPLAYING})

# The only moves there are; services raise IllegalTransition for anything else.
# A change row whose from and to are the same status records a note, not a move (an occurrence
# of the entry's key, an n8n retry, a rolled-back adapter revision, a payload fetch that failed).
FE_ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # replayed: a replay that came back ambiguous was later settled as succeeded (a
    # reviewer's decision or the sweeper's lookup on its ledger operation).
    FE.PENDING: frozenset({FE.REPLAYING, FE.REPLAYED, FE.RESOLVED, FE.DISCARDED}),
    # replayed when the replay succeeded, pending when it failed (history stays on Replay).
    FE.REPLAYING: frozenset({FE.REPLAYED, FE.PENDING}),
    # replaying again only with `force` and a note.
    FE.REPLAYED: frozenset({FE.REPLAYING, FE.RESOLVED, FE.DISCARDED}),
    FE.RESOLVED: frozenset(),
    FE.DISCARDED: frozenset(),
}


def fe_sources_of(target: str) -> frozenset[str]:
    return frozenset(s for s, targets in FE_ALLOWED_TRANSITIONS.items() if target in targets)


class FailedEventShape(models.TextChoices):
    """What the ingest parser recognised; `raw` entries are stored as received and flagged."""

    OPERATION = "operation", "ledger operation"
    ENVELOPE = "envelope", "Onceguard envelope"
    N8N_EXECUTION = "n8n_execution", "n8n Error Trigger (execution)"
    N8N_TRIGGER = "n8n_trigger", "n8n Error Trigger (trigger)"
    RAW = "raw", "unrecognised (raw)"


class PayloadSource(models.TextChoices):
    """Where an entry's payload came from (shown on the entry's page and in the API)."""

    # the body the workflow (or the ledger, for a failed operation) reported.
    REPORTED = "reported", "as reported"
    # the failed node's input items, fetched from the n8n execution the Error Trigger named
    # (lead capture: dlq.n8n.client); ``payload_source_ref`` holds the execution id.
    N8N_EXECUTION_FETCH = "n8n_execution_fetch", "fetched from the n8n execution"


class PayloadFetch(models.TextChoices):
    """Lead capture of an n8n Error Trigger entry. Only dlq.n8n.client moves it, once per entry:
    ``pending`` → ``fetched`` or ``failed``; nothing moves it back."""

    # no fetch: not an Error Trigger report, or the tenant has no n8n connection.
    NONE = "", "none"
    # ingested; the after-commit task has not finished yet.
    PENDING = "pending", "waiting for n8n"
    # the payload holds the failed node's input items.
    FETCHED = "fetched", "fetched"
    # the entry kept its reported payload; ``payload_fetch_note`` says why.
    FAILED = "failed", "failed"


class KeySource(models.TextChoices):
    """Where an entry's ``original_key`` (the key a replay is sent under) came from. An entry
    with a business key is one entry per key, tenant and target while it is open: a second
    failure of the key there is another occurrence of it (DESIGN §7, occurrences)."""

    # no business key was looked for: the entry's identity stands in (entries stored before
    # occurrences, and operation entries, whose key is their operation's).
    IDENTITY = "", "the entry's identity"
    # the report named it (the envelope's idempotency_key or the ingest's Idempotency-Key)
    # and no event id of its own: the key identifies the failure.
    REPORTED = "reported", "named by the report"
    # the report named it with its own event_id: one entry per reported event, as the node's
    # batches are (one per item), not merged by key.
    REPORTED_WITH_ID = "reported_event", "named by the report, with its own event id"
    # the failed request's Idempotency-Key / X-Idempotency-Key header (n8n's
    # execution.error.context.request).
    REQUEST_HEADER = "request_header", "the failed request's key header"
    # the body field the workflow declared (``key_field``), in the failed request or item.
    REQUEST_FIELD = "request_field", "the declared field of the failed request"
    # none could be found: the identity stands in and ``key_note`` says why, in words.
    MISSING = "missing", "none found"
    # none was found, and a person set one on the entry's page before replaying it
    # (dlq.services.failed_event_key_set; the change trail says who and why). Not a business key
    # of the report's: later failures of it are not folded into this entry.
    SET_BY_PERSON = "set", "set by a person"


# Entries that are one per business key, tenant and target while open.
BUSINESS_KEY_SOURCES = frozenset({KeySource.REPORTED, KeySource.REQUEST_HEADER, KeySource.REQUEST_FIELD})


# The error classes of the ledger, plus "not known" for ingested failures that do not say.
ERROR_CLASS_CHOICES = [("", "unclassified"), *ErrorClass.choices]


N8N_PURPOSE = "n8n connection"


def n8n_base_url_check(url: str) -> str:
    """The n8n base URL as stored: allowed by the outbound policy, canonical, without query,
    and without a trailing slash (``/api/v1/…`` is appended). Raises DestinationNotAllowed."""
    normalised = outbound_check(url, purpose=N8N_PURPOSE)
    if normalised.query:
        raise DestinationNotAllowed(f"{N8N_PURPOSE}: the base URL has no query string.")
    return normalised.url.rstrip("/")


def n8n_timeout_check(seconds: float) -> float:
    """One request to n8n waits this long at most: from half a second to 30. Raises
    ValidationFailed (the console's form, ``manage.py n8n_connect`` and the service say the same)."""
    if not 0.5 <= float(seconds or 0) <= 30:
        raise ValidationFailed(
            "The n8n timeout must be between 0.5 and 30 seconds.", extra={"field": "timeout_seconds"}
        )
    return float(seconds)


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
        # Console saves: the same checks as dlq.n8n.client.n8n_connection_save.
        if self.base_url:
            try:
                self.base_url = n8n_base_url_check(self.base_url)
            except DestinationNotAllowed as exc:
                raise ValidationError({"base_url": exc.detail}) from None
        try:
            n8n_timeout_check(self.timeout_seconds)
        except ValidationFailed as exc:
            raise ValidationError({"timeout_seconds": exc.detail}) from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Stands in for {key} while a lookup URL is normalised (braces would be percent-encoded).
_KEY_MARK = "onceguardkeymark7f3a"


def replay_target_url_check(url: str, *, lookup: bool = False) -> str:
    """A replay target's URL (or lookup URL, which must hold ``{key}``) as stored: allowed by
    the outbound policy, canonical, and ``https`` unless it is a loopback address or the
    deployment allows plain http (DLQ ``REPLAY_ALLOW_HTTP``): a replay carries a credential
    and personal data. Raises DestinationNotAllowed."""
    purpose = "replay target lookup URL" if lookup else "replay target URL"
    if lookup and "{key}" not in url:
        raise DestinationNotAllowed(f"{purpose}: it must hold {{key}}, where the business key is put.")
    checked = outbound_check(url.replace("{key}", _KEY_MARK) if lookup else url, purpose=purpose)
    host = (urlsplit(checked.url).hostname or "").lower()
    if urlsplit(checked.url).scheme != "https" and not _is_loopback(host) and not dlq_setting("REPLAY_ALLOW_HTTP"):
        raise DestinationNotAllowed(
            f"{purpose}: https is required for a target that is not on this machine (a replay carries the"
            " target's credential and the entry's data)."
        )
    return checked.url.replace(_KEY_MARK, "{key}") if lookup else checked.url


class ReplayAck(models.TextChoices):
    """What counts as "delivered" for a replay target (ADR 0007). A 2xx alone is what n8n
    answers for a workflow that stopped before its Respond node, so for an n8n receiver it
    proves nothing."""

    # The receiver answers ``Onceguard-Ack: v1=<HMAC-SHA256(signing secret, "ack." + replay
    # id)>`` from the step that runs after its work succeeded; a 2xx without it is "not
    # acknowledged" (ambiguous), never a success. Required for n8n receivers.
    ECHO = "echo", "echo (the receiver signs the replay id back)"
    # A 2xx is enough: a key-enforced API that answers with its own bodies and cannot echo.
    STATUS = "status", "status (a 2xx is enough)"


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
        # (dlq.services.replay_target_upsert does the same; the send checks again after DNS).
        for field in ("url", "lookup_url"):
            value = getattr(self, field)
            if not value:
                continue
            try:
                setattr(self, field, replay_target_url_check(value, lookup=field == "lookup_url"))
            except DestinationNotAllowed as exc:
                raise ValidationError({field: exc.detail}) from None


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
            # the key loses the insert and becomes an occurrence (dlq.services ingest retries).
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


class ReplayTrigger(models.TextChoices):
    MANUAL = "manual", "manual"
    BULK = "bulk", "bulk"
    AUTO = "auto", "automatic (schedule)"


class ReplayOutcome(models.TextChoices):
    # sending (or the sender died; dlq.tasks.replays_recover settles it).
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    # a definitive "not done" answer (4xx, refused before send).
    FAILED = "failed", "failed"
    # sent, answer never seen or 5xx: the target may or may not have acted.
    AMBIGUOUS = "ambiguous", "ambiguous"
    # the ledger refused the send (the replay key was already taken).
    REFUSED = "refused", "refused"


class BulkReplayStatus(models.TextChoices):
    # dry run: the selection is frozen and waits for a confirm before expires_at.
    DRAFT = "draft", "draft (dry run)"
    # confirmed; the task works through the selection at the configured rate.
    RUNNING = "running", "running"
    DONE = "done", "done"
    EXPIRED = "expired", "expired"


class BulkReplay(models.Model):
    """A frozen selection: the dry run stores the ids, a confirm replays exactly those."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bulk_replays")
    filters = models.JSONField(default=dict, blank=True)
    event_ids = models.JSONField(default=list)
    count = models.PositiveIntegerField()
    # sha256 of the sorted ids: shown with the count so a confirm can be checked against it.
    digest = models.CharField(max_length=64)
    target_slug = models.CharField(max_length=63, blank=True)
    force = models.BooleanField(default=False)
    note = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=BulkReplayStatus.choices, default=BulkReplayStatus.DRAFT)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    confirmed_by = models.CharField(max_length=150, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # How far the runner got in event_ids (resumable across task runs).
    position = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"bulk replay #{self.pk} ({self.count})"


class Replay(models.Model):
    """Lineage: one row per replay attempt of an entry — who, when, why, where, what came back."""

    # The entry's tenant (DESIGN §12, Citus: every statement names it; migration dlq 0012).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(FailedEvent, on_delete=models.CASCADE, related_name="replays")
    number = models.PositiveIntegerField()
    trigger = models.CharField(max_length=8, choices=ReplayTrigger.choices, default=ReplayTrigger.MANUAL)
    # "Re-run as new": a derived key {key}~r{n} instead of the original one.
    as_new = models.BooleanField(default=False)
    forced = models.BooleanField(default=False)
    # The ledger key guarding the send: replay:{event id}:{n}.
    ledger_key = models.CharField(max_length=255)
    operation = models.ForeignKey(Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # The idempotency key the target received.
    sent_key = models.CharField(max_length=255)
    # Sent to the failed operation's own provider (an execute-mode step resumed with its
    # stored request), not to a replay target.
    to_provider = models.BooleanField(default=False, db_default=False)
    # A correction: the field paths the operator changed (names only; the values are in the
    # sealed payload that was sent, never here). The sent key is the next version's.
    corrected_fields = models.JSONField(default=list, db_default=[], blank=True)
    target = models.ForeignKey(ReplayTarget, on_delete=models.SET_NULL, null=True, blank=True, related_name="replays")
    target_slug = models.CharField(max_length=63)
    target_url = models.CharField(max_length=1000)
    bulk = models.ForeignKey(BulkReplay, on_delete=models.SET_NULL, null=True, blank=True, related_name="replays")
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=16, choices=ReplayOutcome.choices, default=ReplayOutcome.PENDING)
    error_class = models.CharField(max_length=16, blank=True)
    # Our description of what went wrong (status code, exception class): never payload text.
    error_message = models.CharField(max_length=500, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    # The target's answer (JSON, or {"text": …} truncated); masked in the console.
    response_body = models.JSONField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # With the tenant: Citus keeps a unique constraint of a distributed table only when it
            # holds the distribution column (an entry's replays are one tenant's anyway).
            models.UniqueConstraint(fields=["tenant", "event", "number"], name="replay_unique_number"),
            models.CheckConstraint(
                condition=Q(outcome="pending") | Q(finished_at__isnull=False), name="replay_finished_has_time"
            ),
        ]
        indexes = [
            models.Index(fields=["ledger_key"], name="replay_ledger_key_idx"),
            models.Index(fields=["outcome", "started_at"], name="replay_pending_idx", condition=Q(outcome="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event_id}#{self.number}"


class RunResume(models.Model):
    """One resume of a run (DESIGN §7, runs): who asked, why, which steps it re-drove and how
    each went. Append-only, written by ``dlq.replays.runs.run_resume``; the re-drives themselves are
    Replay rows of the steps' DLQ entries (lineage), this row is the audit of the action."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    run = models.CharField(max_length=255)
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)
    # [{"operation": id, "key", "step", "via": "provider"|"target"|…}] as previewed.
    planned = models.JSONField(default=list)
    # [{"operation": id, "replay": n, "outcome", "entry"}] or {"operation", "error"} per step.
    results = models.JSONField(default=list)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "run", "at"], name="runresume_tenant_run_idx")]

    def __str__(self) -> str:
        return f"resume of {self.run} by {self.actor}"
