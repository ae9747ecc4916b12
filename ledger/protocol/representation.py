"""The shapes an operation is rendered in, wherever it leaves the service: the API's answers, callback bodies, review items (DESIGN §4). Below the web room, so a callback built by a worker renders the operation exactly as the API does."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import api_settings

from ledger.models import RECALLED_OUTPUT_STATES, Operation, OperationMode, OperationOutput, OperationStatus
from ledger.platform.crypto import open_json
from ledger.platform.masking import stored_value_masked
from ledger.protocol import selectors
from ledger.protocol.serializer_reuse import prototype
from ledger.providers import revisions


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

    # Every rendering masks the recorded response (ledger.platform.masking), except the one answer the
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
    form: ledger.protocol.callbacks)."""

    response_in_clear = True


class ClaimOutputSerializer(OperationOutputSerializer):
    """A claim that acquired the key: the operation plus the lease the caller now holds."""

    lease_token = serializers.CharField()
    attempt = serializers.IntegerField(source="attempts")


def _iso(value: Any) -> str | None:
    """A datetime as the API renders it (DRF's ISO 8601, UTC as ``Z``)."""
    return serializers.DateTimeField().to_representation(value) if value is not None else None


_row_plans = threading.local()


def operation_represented(serializer_class: type[OperationOutputSerializer], op: Operation) -> dict[str, Any]:
    """``represented(serializer_class, op)`` — the same keys, order and values — rendered by
    the plan ``PlannedListSerializer`` renders each row of a list with, made once per thread
    and serializer on this thread's reused instance (ledger.protocol.serializer_reuse): every
    answer of a claim, completion or replay renders one operation of 36 fields, and DRF's
    per-field steps (``get_attribute``'s source walk, the None check, the field's
    ``to_representation``) were a tenth of a fresh claim→complete's server CPU.
    ``tests/ledger/test_list_rendering.py`` holds it equal to a fresh serializer's ``.data``."""
    plans: dict[type[serializers.Serializer], list[tuple[str, Any]]] | None = getattr(_row_plans, "plans", None)
    if plans is None:
        plans = _row_plans.plans = {}
    plan = plans.get(serializer_class)
    if plan is None:
        plan = plans[serializer_class] = _plan(prototype(serializer_class))
    item = {}
    for name, render in plan:
        value = render(op)
        if value is not _SKIP:
            item[name] = value
    return item


def operation_representation(op: Operation, *, response_in_clear: bool = False, **_: Any) -> dict[str, Any]:
    """OperationOutputSerializer's rendering of ``op``, for callers outside a view
    (callback bodies, review items): the response masked unless ``response_in_clear``.
    Extra keyword arguments are accepted and ignored."""
    serializer = ReplayedOperationOutputSerializer if response_in_clear else OperationOutputSerializer
    return operation_represented(serializer, op)


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


class OutputRecallSerializer(serializers.Serializer):
    """What an output says once its adapter revision was rolled back (ADR 0020)."""

    state = serializers.CharField(
        help_text="quarantined — recalled before it was consumed: its bytes answer 410 output_quarantined;"
        " flagged — consumed before the recall: still served, marked."
    )
    produced_by_rolled_back_revision = serializers.SerializerMethodField()
    adapter_revision = serializers.SerializerMethodField(help_text="The rolled-back revision's number.")
    recalled_at = serializers.DateTimeField()
    reason = serializers.CharField(source="recall_reason")
    consumed_at = serializers.DateTimeField(
        allow_null=True, help_text="When this tenant's caller first downloaded the bytes (null: never)."
    )

    @extend_schema_field(serializers.BooleanField())
    def get_produced_by_rolled_back_revision(self, output: Any) -> bool:
        return output.state in RECALLED_OUTPUT_STATES

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_adapter_revision(self, output: Any) -> int | None:
        return revisions.revision_number(output.adapter_revision_id)


class OutputObjectSerializer(StoredObjectSerializer):
    operation = serializers.IntegerField(source="operation_id")
    content = serializers.SerializerMethodField(help_text="Where the bytes are read (this tenant's API keys only).")
    # Not read-only, so the schema does not list it as required: it appears once recalled.
    recall = OutputRecallSerializer(
        source="*",
        required=False,
        help_text="Present only once the output was recalled (ADR 0020): its adapter revision was rolled back.",
    )

    def to_representation(self, instance: Any) -> dict[str, Any]:
        # An output that stands says nothing of recalls: the field appears once it was recalled.
        data = super().to_representation(instance)
        if instance.state not in RECALLED_OUTPUT_STATES:
            data.pop("recall", None)
        return data

    @extend_schema_field(serializers.CharField())
    def get_content(self, output: Any) -> str:
        return f"/api/v1/operations/{output.operation_id}/output/content"


# --- Adapter revisions (ledger.providers.canary) ----------------------------------------------------------
