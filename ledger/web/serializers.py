"""Input and output shapes of the ledger API. No logic beyond shape."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ledger.models import REPORTED_ERROR_CLASSES, ApprovalKind, ApprovalStatus, ErrorClass, VerdictValue
from ledger.platform.storable import MAX_DURATION_SECONDS, nul_problem, query_time_problem
from ledger.providers import prompts, revisions


def no_nul_characters(value: Any) -> None:
    """PostgreSQL stores neither U+0000 in jsonb nor NUL in text: refuse it as input (a 400),
    on every database, instead of failing at the INSERT (a 500)."""
    problem = nul_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


# The integer columns of runs and versions (ledger.protocol.services.MAX_VERSION).
MAX_ORDINAL = 2**31 - 1


def optional_text(
    max_length: int, *, trim_whitespace: bool = True, help_text: str | None = None
) -> serializers.CharField:
    """An optional text field that reads as "" when absent."""
    return serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=trim_whitespace,
        max_length=max_length,
        default="",
        help_text=help_text,
    )


def optional_ordinal(help_text: str) -> serializers.IntegerField:
    """An optional whole number from 0 to the integer columns' largest value, None when absent."""
    return serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=MAX_ORDINAL, help_text=help_text
    )


def optional_json() -> serializers.JSONField:
    return serializers.JSONField(required=False, allow_null=True, default=None, validators=[no_nul_characters])


class OperationInputMixin(serializers.Serializer):
    """Fields a claim and a submission share: the key (or the parts of a versioned key, sent
    instead of it: the key becomes `{record}:{action}:v{version}`), the provider and action,
    where the operation comes from, and the run it belongs to."""

    run = optional_text(
        255,
        trim_whitespace=False,
        help_text="The run (business transaction) this operation is a step of; empty: its correlation_id is the run.",
    )
    step = optional_ordinal(
        "Ordinal of this step within its run (optional; otherwise steps are ordered by creation).",
    )
    record = optional_text(
        200,
        trim_whitespace=False,
        help_text="With `action` and `version`, instead of `key`: the key is `{record}:{action}:v{version}`.",
    )
    version = optional_ordinal(
        "The record's version (newer = larger); a newer one abandons older queued/retry_wait versions.",
    )
    key = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=10_000)
    provider = serializers.SlugField(max_length=63)
    action = optional_text(100)
    payload = optional_json()
    reconciliation_handle = optional_text(255)
    execution_id = optional_text(255)
    workflow_id = optional_text(255)
    workflow_name = optional_text(
        255,
        help_text="The workflow's name (n8n: `$workflow.name`), with `workflow_id`: kept once per name, so"
        " operations are found by it (console search, `?workflow_name=`).",
    )
    workflow_version = optional_text(100)
    correlation_id = optional_text(255)


class ClaimInputSerializer(OperationInputMixin):
    request = optional_json()
    lease_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0)
    uses_sent_marker = serializers.BooleanField(required=False, default=False)


class SubmitInputSerializer(OperationInputMixin):
    """POST /api/v1/operations: the provider-neutral envelope (execute mode)."""

    # method/path/query/headers/body; validated against the provider by the service.
    request = serializers.JSONField(
        required=False,
        default=None,
        validators=[no_nul_characters],
        help_text="For a provider without an intent schema: method, path (below its base URL), query, headers"
        " (its forward_headers only), body.",
    )
    intent = serializers.JSONField(
        required=False,
        default=None,
        validators=[no_nul_characters],
        help_text="For a provider with an intent schema (instead of `request`): its declared fields, e.g."
        ' {"preset_id": "studio", "aspect_class": "square", "source_key": "up_…", "source_sha256": "…",'
        ' "description": "…"}. Unknown fields and values are refused (400 intent_unknown_field,'
        " intent_value_not_allowed); the adapter revision's request template translates it when sent.",
    )
    deadline_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0.001)
    callback_url = optional_text(1000, trim_whitespace=False)
    manifest = serializers.JSONField(
        required=False,
        default=None,
        validators=[no_nul_characters],
        help_text="A generating job's evaluation manifest (ADR 0022): what the generated document holds (vendor"
        " names, invoice ids, currency, totals, line items), a JSON object checked against the manifest schema of"
        " the job's preset (422 manifest_invalid). Stored immutable, by digest.",
    )
    evaluates = serializers.JSONField(
        required=False,
        default=None,
        help_text='An extraction job: {"operation": <the generating job\'s id>, "pointer": "/fields"} — its JSON'
        " answer (at the pointer) is scored against that job's manifest when it succeeds.",
    )


class LeaseTokenSerializer(serializers.Serializer):
    lease_token = serializers.CharField(max_length=64)


class SentInputSerializer(LeaseTokenSerializer):
    reconciliation_handle = optional_text(255)


class HeartbeatInputSerializer(LeaseTokenSerializer):
    lease_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0)


class CompleteInputSerializer(LeaseTokenSerializer):
    provider_ref = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    response = serializers.JSONField(required=False, allow_null=True, default=None, validators=[no_nul_characters])
    response_status = serializers.IntegerField(
        required=False, allow_null=True, default=200, min_value=100, max_value=599
    )


class FailInputSerializer(LeaseTokenSerializer):
    error_class = serializers.ChoiceField(
        choices=[(c.value, c.label) for c in REPORTED_ERROR_CLASSES],
        help_text="required. After the sent marker (`/sent`) the effect may have happened: send `ambiguous`"
        " (reconciled or reviewed by the provider's class) unless you know it was not sent; `transient` only"
        " when it was refused before acting (it is retried: after a send, a second effect).",
    )
    message = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")
    response_status = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=100, max_value=599
    )
    retry_after_seconds = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_SECONDS
    )


class RolloutReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, help_text="Why: recorded with the move in the configuration trail.")


class CanaryInputSerializer(RolloutReasonSerializer):
    percent = serializers.IntegerField(min_value=1, max_value=100, help_text="Share of new operations, 1–100.")
    gates = serializers.DictField(
        child=serializers.FloatField(),
        required=False,
        allow_null=True,
        help_text="This revision's canary gate thresholds (ADR 0020), any of: max_excess_percent (failure rate,"
        " points above stable: rolls back), latency_p95_max_ratio (p95 latency against stable's: pauses),"
        " max_rejected_excess_percent (rejected or low-scored outputs, points above stable: pauses), min_score"
        " (a verdict scored below it is low). Left out: the deployment's defaults (CANARY_* settings).",
    )


class RerunInputSerializer(RolloutReasonSerializer):
    limit = serializers.IntegerField(
        min_value=1, max_value=500, required=False, default=500, help_text="Most operations re-run by this call."
    )


class RerunOutputSerializer(serializers.Serializer):
    revision = serializers.IntegerField(help_text="The rolled-back revision whose recalled outputs were re-run.")
    stable_revision = serializers.IntegerField(allow_null=True, help_text="The revision the re-runs run under.")
    count = serializers.IntegerField()
    operations = serializers.ListField(
        child=serializers.DictField(), help_text="Per re-run: the original operation, the new one and its key."
    )


class VerdictInputSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=VerdictValue.choices, help_text="accepted or rejected")
    score = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0, max_value=1, help_text="0 (worst) to 1 (best)."
    )
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class VerdictOutputSerializer(serializers.Serializer):
    operation = serializers.IntegerField(source="operation_id")
    output = serializers.SerializerMethodField(
        help_text="The stored output's key (null: an output not stored as a file)."
    )
    verdict = serializers.CharField()
    score = serializers.FloatField(allow_null=True)
    reason = serializers.CharField()
    source = serializers.CharField()
    actor = serializers.CharField()
    adapter_revision = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_adapter_revision(self, row: Any) -> int | None:
        return revisions.revision_number(row.adapter_revision_id)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_output(self, row: Any) -> str | None:
        return row.output.key if row.output_id is not None else None


class RolloutMoveInputSerializer(RolloutReasonSerializer):
    number = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="The revision that becomes stable. Promote: default the canary. Roll back: with a canary running"
        " leave it out (the canary ends); without one it is required (the revision to return to).",
    )


class AdapterRevisionOutputSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    based_on = serializers.IntegerField(allow_null=True)
    config = serializers.DictField(help_text="The adapter fields of this revision (never a credential).")
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    reason = serializers.CharField()
    role = serializers.CharField(help_text="stable, canary or retired")
    gates = serializers.DictField(help_text="Its own canary gate thresholds (the rest: the deployment's defaults).")
    rolled_back_at = serializers.DateTimeField(
        allow_null=True, help_text="When it was last rolled back (its outputs are recalled)."
    )
    outputs = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Its recalled outputs by state (quarantined, flagged) and its verdicts (verdicts_accepted,"
        " verdicts_rejected).",
    )


class WatchFiguresSerializer(serializers.Serializer):
    canary_revision = serializers.IntegerField()
    stable_revision = serializers.IntegerField(allow_null=True)
    since = serializers.DateTimeField()
    window_seconds = serializers.IntegerField()
    canary_attempts = serializers.IntegerField()
    canary_failures = serializers.IntegerField()
    canary_failure_rate = serializers.FloatField()
    stable_attempts = serializers.IntegerField()
    stable_failures = serializers.IntegerField()
    stable_failure_rate = serializers.FloatField()
    min_sample = serializers.IntegerField()
    max_excess_percent = serializers.FloatField()
    verdict = serializers.CharField(
        help_text="collecting (below the minimum sample), healthy, failing (the failure rate: rolled back) or"
        " breached (another gate: paused)"
    )
    gates = serializers.ListField(
        child=serializers.DictField(),
        help_text="Each gate's figures and verdict: error_rate, latency_p95 (milliseconds), rejected_or_low_score.",
    )


class ProviderCapsSerializer(serializers.Serializer):
    max_in_flight = serializers.IntegerField(allow_null=True, help_text="Most calls at once; null = no cap.")
    in_flight = serializers.IntegerField(help_text="Calls in flight now, over every worker.")
    rate_limit = serializers.IntegerField(allow_null=True, help_text="Most calls per rate period; null = no rate.")
    rate_period_seconds = serializers.IntegerField()
    rate_burst = serializers.IntegerField()
    effective_rate = serializers.FloatField(
        allow_null=True,
        help_text="Calls per rate period the workers allow now: the declared rate, or less after a 429"
        " (halved, climbing back while quiet).",
    )
    rate_lowered = serializers.BooleanField()
    rate_lowered_at = serializers.DateTimeField(allow_null=True)
    effective_max_in_flight = serializers.IntegerField(
        allow_null=True,
        help_text="Calls at once the workers allow now: max_in_flight, or less after a 429 (halved down to 1,"
        " +1 per quiet period); null = no cap.",
    )
    in_flight_lowered = serializers.BooleanField(help_text="Whether a 429 lowered the in-flight limit.")
    in_flight_lowered_reason = serializers.CharField(allow_null=True, help_text="Why it was lowered; null when not.")
    in_flight_limit_since = serializers.DateTimeField(
        allow_null=True, help_text="When the lowered limit took its current value; null when not lowered."
    )
    in_flight_recovery_seconds = serializers.FloatField(help_text="Seconds without a 429 per +1 of a lowered limit.")


class ProviderOutputSerializer(serializers.Serializer):
    slug = serializers.CharField()
    kind = serializers.CharField()
    idempotency_class = serializers.CharField()
    base_url = serializers.CharField()
    paused = serializers.BooleanField()
    paused_reason = serializers.CharField()
    throttled_until = serializers.DateTimeField(allow_null=True)
    caps = ProviderCapsSerializer()
    auth_secret_env = serializers.CharField(
        help_text="The environment variable the credential is read from (its name, never its value); empty: none."
    )
    secret_env_names = serializers.CharField(
        help_text="The only variable names this tenant's providers may read, e.g. ONCEGUARD_SECRET_ACME_<NAME>:"
        " the platform's prefix, the tenant's secret namespace (fixed when the tenant was made), _ and a name."
    )


class RolloutOutputSerializer(serializers.Serializer):
    provider = serializers.CharField()
    stable_revision = serializers.IntegerField(allow_null=True)
    canary_revision = serializers.IntegerField(allow_null=True)
    canary_percent = serializers.IntegerField()
    canary_started_at = serializers.DateTimeField(allow_null=True)
    canary_paused_at = serializers.DateTimeField(
        allow_null=True, help_text="A gate paused the canary: it takes no new operations until resumed."
    )
    canary_pause_evidence = serializers.DictField(
        allow_null=True, help_text="The watch's figures per gate when it paused the canary."
    )
    watch = WatchFiguresSerializer(allow_null=True)
    revisions = AdapterRevisionOutputSerializer(many=True)
    requeued = serializers.IntegerField(
        required=False, help_text="Roll back: operations re-queued under the stable revision."
    )
    recalled = serializers.DictField(
        child=serializers.IntegerField(),
        required=False,
        help_text="Roll back: the rolled-back revision's outputs recalled now, by new state (quarantined: not yet"
        " consumed, no longer served; flagged: consumed, marked); the sweeper recalls any left (ADR 0020).",
    )


# --- Intent envelopes and prompt templates (ledger.rules.intents, ledger.providers.prompts) --------------------


class ProviderIntentInputSerializer(RolloutReasonSerializer):
    intent_schema = serializers.JSONField(
        allow_null=True,
        validators=[no_nul_characters],
        help_text='{"fields": {name: {"type": "string"|"integer"|"number"|"boolean"|"enum"|"upload",'
        ' "required", "max_length"/"min_length" (string), "min"/"max" (numbers), "values" (enum)}}};'
        " null: submissions send a request.",
    )
    request_template = serializers.JSONField(
        allow_null=True,
        validators=[no_nul_characters],
        help_text="method, path, query, headers, body with {{ name }} placeholders (a whole string keeps the"
        " value's type), lookups translating every value of an enum field, {{ prompt:name }} or"
        " {{ prompt:name@n }}. Nothing else in braces is accepted.",
    )
    canary_percent = serializers.IntegerField(
        min_value=1,
        max_value=100,
        required=False,
        allow_null=True,
        default=None,
        help_text="Roll the new revision out as a canary for this share of new operations; empty: stable at once.",
    )


class ProviderIntentOutputSerializer(serializers.Serializer):
    provider = serializers.CharField()
    revision = serializers.IntegerField(allow_null=True, help_text="The stable adapter revision (its schema below).")
    canary_revision = serializers.IntegerField(allow_null=True)
    intent_schema = serializers.JSONField(allow_null=True)
    request_template = serializers.JSONField(allow_null=True)


class PromptTemplateInputSerializer(serializers.Serializer):
    # No length of its own: the service's check says what a name may be (ADR 0006).
    name = serializers.CharField(help_text="Lower case letters, digits, - and _ (at most 63).")
    text = serializers.CharField(
        max_length=50_000,
        trim_whitespace=False,
        validators=[no_nul_characters],
        help_text="The instructions, with {{ slot }} where a declared slot's user text goes (fenced).",
    )
    slots = serializers.DictField(child=serializers.DictField(), help_text='{"description": {"max_length": 500}, …}')
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    manifest_schema = serializers.JSONField(
        required=False,
        default=None,
        validators=[no_nul_characters],
        help_text="A JSON Schema (2020-12) the evaluation manifests of jobs pinned to this version must match"
        " (ADR 0022); x-match (exact, normalized, numeric), x-tolerance and x-key tune the scoring.",
    )


class PromptTemplateOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    text = serializers.CharField()
    slots = serializers.DictField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    reason = serializers.CharField()
    manifest_schema = serializers.JSONField(allow_null=True)


class ManifestInputSerializer(serializers.Serializer):
    manifest = serializers.JSONField(validators=[no_nul_characters], help_text="The evaluation manifest (an object).")


class ManifestOutputSerializer(serializers.Serializer):
    """A generating job's evaluation manifest (ADR 0022)."""

    operation = serializers.IntegerField(source="operation_id")
    sha256 = serializers.CharField(help_text="sha256 of the manifest's canonical JSON (sorted keys, no spaces).")
    preset = serializers.SerializerMethodField(help_text="The preset whose manifest schema it matched (name@version).")
    output = serializers.SerializerMethodField(help_text="The key of the job's output, once published.")
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_preset(self, manifest: Any) -> str | None:
        return str(manifest.preset) if manifest.preset_id else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_output(self, manifest: Any) -> str | None:
        return manifest.output.key if manifest.output_id else None


class ManifestContentOutputSerializer(ManifestOutputSerializer):
    content = serializers.JSONField(help_text="The manifest (API keys with the write or admin scope).")


class ManifestScoreOutputSerializer(serializers.Serializer):
    """An extraction job's score against its document's manifest (ADR 0022)."""

    operation = serializers.IntegerField(source="operation_id")
    evaluates = serializers.IntegerField(source="evaluates_id", allow_null=True)
    pointer = serializers.CharField()
    status = serializers.CharField(help_text="pending, scored or unscorable.")
    score = serializers.FloatField(allow_null=True, help_text="0..1: matched fields over compared ones.")
    manifest_sha256 = serializers.CharField()
    details = serializers.JSONField(
        help_text="Per field: {field, match (exact|normalized|numeric|item), result (match|mismatch|missing|unexpected)}."
    )
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    scored_at = serializers.DateTimeField(allow_null=True)


class AttemptOutputSerializer(serializers.Serializer):
    """One try of an operation, as evidence: what it ran under and what came of it."""

    number = serializers.IntegerField()
    outcome = serializers.CharField()
    started_at = serializers.DateTimeField()
    sent_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    error_class = serializers.CharField()
    message = serializers.CharField()
    provider_ref = serializers.CharField()
    response_status = serializers.IntegerField(allow_null=True)
    adapter_revision = serializers.SerializerMethodField(
        help_text="The number of the adapter revision the attempt ran under (execute mode)."
    )
    prompt_template = serializers.SerializerMethodField(
        help_text="name@version of the prompt template the attempt's request was rendered with, if any."
    )

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_adapter_revision(self, attempt: Any) -> int | None:
        return revisions.revision_number(attempt.adapter_revision_id)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_prompt_template(self, attempt: Any) -> str | None:
        return prompts.prompt_template_label(attempt.prompt_template_id)


class KeyDeriveInputSerializer(serializers.Serializer):
    """What to hash into a key (ledger.rules.key_derivation): one value, or named fields."""

    value = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        trim_whitespace=False,
        max_length=10_000,
        help_text="The value to hash as is (an e-mail address, a phone number): 1 to 10000 characters. Normalise it"
        " first if the same lead may arrive spelt differently (lowercase an address).",
    )
    parts = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        allow_null=True,
        default=None,
        help_text="Instead of `value`: named fields to hash together (1 to 20; strings or integers), order-free.",
    )
    prefix = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=64,
        help_text="Put in front of the derived key, in clear (`lead` gives `lead:h1:…`): letters, digits, . _ -.",
    )


class KeyDeriveOutputSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="`<prefix>:<key id>:<digest>`: the same input always gives the same key.")
    key_id = serializers.CharField(help_text="The derivation key's id (it never rotates).")


def queryable_time(value: datetime) -> None:
    """A time a filter compares against: converted to UTC by the database adapters, so it
    must not lie at the very ends of Python's datetime (ledger.platform.storable)."""
    problem = query_time_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


class AttemptEvidenceListQuerySerializer(serializers.Serializer):
    provider = serializers.SlugField(required=False, max_length=63)
    error_class = serializers.ChoiceField(choices=ErrorClass.choices, required=False)
    finished_after = serializers.DateTimeField(required=False, validators=[queryable_time])
    finished_before = serializers.DateTimeField(required=False, validators=[queryable_time])


class AttemptEvidenceOutputSerializer(serializers.Serializer):
    """A failed attempt's evidence (ADR 0016): no personal data, the key as a keyed digest."""

    id = serializers.IntegerField()
    provider = serializers.CharField(source="provider_slug")
    operation_id = serializers.IntegerField(help_text="The operation's id; it may have been deleted since.")
    key_digest = serializers.CharField(help_text="HMAC-SHA256 of the key (empty after an erasure).")
    attempt_number = serializers.IntegerField()
    outcome = serializers.CharField()
    error_class = serializers.CharField()
    response_status = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField(allow_null=True)
    adapter_revision = serializers.IntegerField(allow_null=True)
    preset_version = serializers.CharField()
    aspect_class = serializers.CharField()
    error = serializers.CharField(help_text="The error text, the job's own values and personal data cut out.")


# --- Four-eyes approval of re-sends (ADR 0013) ------------------------------------------------


class ApprovalDecisionInputSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=500, help_text="Why you approve or reject (required: it is in the audit trail)."
    )


class ApprovalListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=ApprovalStatus.choices, required=False, default=None, allow_null=True)


class ApprovalOutputSerializer(serializers.Serializer):
    """A re-send waiting for (or given) a second person: never its parameters (a correction's
    values are sealed and shown to no one)."""

    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ApprovalKind.choices)
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    provider = serializers.CharField(allow_null=True, help_text="the provider whose setting asked, if any")
    target_ids = serializers.ListField(child=serializers.IntegerField(), help_text="entry or operation ids")
    target_ref = serializers.CharField(help_text="a run id, a bulk replay's id")
    requested_by = serializers.CharField()
    request_reason = serializers.CharField()
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    decided_by = serializers.CharField()
    decision_reason = serializers.CharField()
    decided_at = serializers.DateTimeField(allow_null=True)
    settled_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField()


def approval_representation(request: Any) -> dict[str, Any]:
    return {
        "id": request.pk,
        "kind": request.kind,
        "status": request.status,
        "provider": request.provider.slug if request.provider_id else None,
        "target_ids": list(request.target_ids),
        "target_ref": request.target_ref,
        "requested_by": request.requested_by,
        "request_reason": request.request_reason,
        "requested_at": request.requested_at,
        "expires_at": request.expires_at,
        "decided_by": request.decided_by,
        "decision_reason": request.decision_reason,
        "decided_at": request.decided_at,
        "settled_at": request.settled_at,
        "outcome": request.outcome,
    }
