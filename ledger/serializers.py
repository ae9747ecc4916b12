"""Input and output shapes of the ledger API. No logic beyond shape."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import api_settings

from ledger import prompts, revisions, selectors
from ledger.crypto import open_json
from ledger.masking import stored_value_masked
from ledger.models import REPORTED_ERROR_CLASSES, Operation, OperationMode, OperationOutput, OperationStatus
from ledger.serializer_reuse import represented
from ledger.storable import MAX_DURATION_SECONDS, nul_problem


def no_nul_characters(value: Any) -> None:
    """PostgreSQL stores neither U+0000 in jsonb nor NUL in text: refuse it as input (a 400),
    on every database, instead of failing at the INSERT (a 500)."""
    problem = nul_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


# The integer columns of runs and versions (ledger.services.MAX_VERSION).
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


class OperationResponseSerializer(serializers.Serializer):
    """What the provider answered, as recorded on the operation."""

    status = serializers.IntegerField(allow_null=True)
    body = serializers.JSONField(
        allow_null=True,
        help_text="In clear only in the answer to a claim or submission that replays the key"
        " (`Idempotent-Replayed: true`); everywhere else masked: the keys, each value a placeholder"
        " such as ‹text·12›. The payload reveal (scope `payload`, a reason, logged) shows it in clear.",
    )
    masked = serializers.BooleanField(help_text="true when `body` is the masked shape, not the value")


class UtcDateTimeField(serializers.DateTimeField):
    """DRF's DateTimeField, the same text, for the UTC times the database returns: without
    asking for the current time zone per value (a context-local lookup; a 500-row page
    renders some 2,000 times, a quarter of its time). The service never activates another
    zone; any other value goes through DRF's own path."""

    def to_representation(self, value: Any) -> Any:
        iso = str(getattr(self, "format", api_settings.DATETIME_FORMAT)).lower() == ISO_8601
        if iso and isinstance(value, datetime) and value.tzinfo is UTC and settings.TIME_ZONE == "UTC":
            text = value.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return super().to_representation(value)


class PlannedListSerializer(serializers.ListSerializer):
    """DRF's ListSerializer, each row rendered by a plan made once per list instead of DRF's
    per-field steps per row (a 500-row page of operations is 17,000 fields). The
    plan does what ``Serializer.to_representation`` does for each readable field: for a method
    field, call its method with the row; for a Char, Integer or UTC time field reading one
    attribute, read it and render ``None`` as None, else ``str``, ``int`` or the field's own
    rendering; any other field goes through DRF's ``get_attribute`` and ``to_representation``.
    ``tests/ledger/test_list_rendering.py`` holds that its rows are DRF's."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        rows = data.all() if hasattr(data, "all") and not isinstance(data, (list, tuple)) else data
        plan = _plan(self.child)
        out = []
        for row in rows:
            item = {}
            for name, render in plan:
                value = render(row)
                if value is not _SKIP:
                    item[name] = value
            out.append(item)
        return out


_SKIP = object()


def _plan(child: serializers.Serializer) -> list[tuple[str, Any]]:
    plan = []
    # DRF's readable fields (its private ``_readable_fields``), from its public ``fields``.
    for field in (f for f in child.fields.values() if not f.write_only):
        plan.append((field.field_name, _renderer(child, field)))
    return plan


def _renderer(child: serializers.Serializer, field: serializers.Field) -> Any:
    kind = type(field)
    if kind is serializers.SerializerMethodField:
        return getattr(child, field.method_name)
    simple = len(field.source_attrs) == 1
    if simple and kind in (serializers.CharField, serializers.IntegerField, UtcDateTimeField):
        attr = field.source_attrs[0]
        convert = {serializers.CharField: str, serializers.IntegerField: int}.get(kind, field.to_representation)

        def render(row: Any) -> Any:
            value = getattr(row, attr)
            return None if value is None else convert(value)

        return render

    def generic(row: Any) -> Any:
        try:
            value = field.get_attribute(row)
        except serializers.SkipField:  # pragma: no cover - no operation field is skipped
            return _SKIP
        check = value.pk if isinstance(value, PKOnlyObject) else value
        return None if check is None else field.to_representation(value)

    return generic


class OperationOutputSerializer(serializers.Serializer):
    """The public shape of an operation: what every API answer renders and the OpenAPI
    schema documents (one declaration). Payload and request are never part of it."""

    class Meta:
        list_serializer_class = PlannedListSerializer

    id = serializers.IntegerField(source="pk")
    key = serializers.CharField()
    status = serializers.CharField()
    mode = serializers.CharField()
    provider = serializers.SerializerMethodField()
    action = serializers.CharField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    provider_ref = serializers.CharField()
    lease_expires_at = UtcDateTimeField(allow_null=True)
    response = serializers.SerializerMethodField()
    error_class = serializers.CharField()
    last_error = serializers.CharField()
    reconciliation_handle = serializers.CharField()
    execution_id = serializers.CharField()
    workflow_id = serializers.CharField()
    workflow_version = serializers.CharField()
    correlation_id = serializers.CharField()
    sent_at = UtcDateTimeField(allow_null=True)
    next_attempt_at = UtcDateTimeField(allow_null=True)
    created_at = UtcDateTimeField()
    updated_at = UtcDateTimeField()
    done_at = UtcDateTimeField(allow_null=True)
    superseded_by = serializers.IntegerField(source="superseded_by_id", allow_null=True)
    # Runs and versioned keys: the run is the explicit one, else the correlation id.
    run = serializers.SerializerMethodField()
    step = serializers.IntegerField(allow_null=True)
    record = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    replaced_by = serializers.IntegerField(
        source="replaced_by_id",
        allow_null=True,
        help_text="The newer version of the same record and action (not superseded_by, which links DLQ replays).",
    )
    # The retry budget the workers apply (execute mode; a guard-mode operation shows its
    # defaults: 0 throttled attempts, no deadline, no callback).
    throttled_attempts = serializers.IntegerField()
    deadline = UtcDateTimeField(allow_null=True)
    expires_at = UtcDateTimeField(allow_null=True)
    callback_url = serializers.CharField()
    adapter_revision = serializers.SerializerMethodField(
        help_text="Execute mode: the number of the provider's adapter revision the operation runs under"
        " (each attempt keeps its own); null in guard mode."
    )

    output = serializers.SerializerMethodField(
        help_text="Execute mode: the validated output once published (key, sha256, media type, size, width,"
        " height, where its bytes are read); null otherwise. A replay of the key answers the same output."
    )

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_output(self, op: Operation) -> dict[str, Any] | None:
        # Only a succeeded execute-mode row can have one: every other answer costs no query.
        if op.mode != OperationMode.EXECUTE or op.status != OperationStatus.SUCCEEDED:
            return None
        try:
            output = op.output
        except OperationOutput.DoesNotExist:
            return None
        return OutputObjectSerializer(output).data

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_adapter_revision(self, op: Operation) -> int | None:
        return revisions.revision_number(op.adapter_revision_id)

    @extend_schema_field(serializers.CharField())
    def get_run(self, op: Operation) -> str:
        return selectors.run_of(run=op.run, correlation_id=op.correlation_id)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_provider(self, op: Operation) -> str | None:
        # Slugs never change: a per-process cache instead of a join or a query per answer.
        return selectors.provider_slug(op.provider_id)

    # Every rendering masks the recorded response (ledger.masking), except the one answer the
    # protocol owes it to: ReplayedOperationOutputSerializer below.
    response_in_clear = False

    @extend_schema_field(OperationResponseSerializer(allow_null=True))
    def get_response(self, op: Operation) -> dict[str, Any] | None:
        if op.response_status is None and op.response_body is None:
            return None
        if self.response_in_clear:
            return {"status": op.response_status, "body": open_json(op.response_body), "masked": False}
        return {"status": op.response_status, "body": stored_value_masked(op.response_body), "masked": True}


class ReplayedOperationOutputSerializer(OperationOutputSerializer):
    """The answer to a claim or submission that replays a finished key: the caller holds a
    write-scoped key of the operation's tenant and sent the same request fingerprint (or it
    would have been refused), so it gets the recorded response in clear — what the first
    answer would have told it. Used for that answer only (and the callback, its asynchronous
    form: ledger.callbacks)."""

    response_in_clear = True


class ClaimOutputSerializer(OperationOutputSerializer):
    """A claim that acquired the key: the operation plus the lease the caller now holds."""

    lease_token = serializers.CharField()
    attempt = serializers.IntegerField(source="attempts")


def _iso(value: Any) -> str | None:
    """A datetime as the API renders it (DRF's ISO 8601, UTC as ``Z``)."""
    return serializers.DateTimeField().to_representation(value) if value is not None else None


def operation_representation(op: Operation, *, response_in_clear: bool = False, **_: Any) -> dict[str, Any]:
    """OperationOutputSerializer's rendering of ``op``, for callers outside a view
    (callback bodies, review items): the response masked unless ``response_in_clear``.
    Extra keyword arguments are accepted and ignored."""
    serializer = ReplayedOperationOutputSerializer if response_in_clear else OperationOutputSerializer
    return represented(serializer, op)


class StoredObjectSerializer(serializers.Serializer):
    """What every answer says about a stored object (an upload or a validated output): facts
    read from its content, never from what its sender claimed."""

    key = serializers.CharField(help_text="Immutable, content-addressed: the same bytes have the same key.")
    sha256 = serializers.CharField(help_text="Hex sha256 of the bytes.")
    size = serializers.IntegerField(help_text="Bytes.")
    media_type = serializers.CharField(help_text="Recognised from the content (magic bytes, decoded by Pillow).")
    width = serializers.IntegerField(allow_null=True, help_text="Pixels, for images.")
    height = serializers.IntegerField(allow_null=True, help_text="Pixels, for images.")
    created_at = serializers.DateTimeField()


class UploadOutputSerializer(StoredObjectSerializer):
    content = serializers.SerializerMethodField(help_text="Where the bytes are read (this tenant's API keys only).")

    @extend_schema_field(serializers.CharField())
    def get_content(self, upload: Any) -> str:
        return f"/api/v1/uploads/{upload.key}/content"


class OutputObjectSerializer(StoredObjectSerializer):
    operation = serializers.IntegerField(source="operation_id")
    content = serializers.SerializerMethodField(help_text="Where the bytes are read (this tenant's API keys only).")

    @extend_schema_field(serializers.CharField())
    def get_content(self, output: Any) -> str:
        return f"/api/v1/operations/{output.operation_id}/output/content"


# --- Adapter revisions (ledger.canary) ----------------------------------------------------------


class RolloutReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, help_text="Why: recorded with the move in the configuration trail.")


class CanaryInputSerializer(RolloutReasonSerializer):
    percent = serializers.IntegerField(min_value=1, max_value=100, help_text="Share of new operations, 1–100.")


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
    verdict = serializers.CharField(help_text="collecting (below the minimum sample), healthy or failing")


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
    watch = WatchFiguresSerializer(allow_null=True)
    revisions = AdapterRevisionOutputSerializer(many=True)
    requeued = serializers.IntegerField(
        required=False, help_text="Roll back: operations re-queued under the stable revision."
    )


# --- Intent envelopes and prompt templates (ledger.intents, ledger.prompts) --------------------


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


class PromptTemplateOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    text = serializers.CharField()
    slots = serializers.DictField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    reason = serializers.CharField()


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
    """What to hash into a key (ledger.key_derivation): one value, or named fields."""

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
