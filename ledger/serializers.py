"""Input and output shapes of the ledger API. No logic beyond shape."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ledger.crypto import open_json
from ledger.models import ErrorClass, Operation


def no_nul_characters(value: Any) -> None:
    """PostgreSQL stores neither U+0000 in jsonb nor NUL in text: refuse it as input (a 400),
    on every database, instead of failing at the INSERT (a 500)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise serializers.ValidationError("NUL characters (U+0000) are not allowed.")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class ClaimInputSerializer(serializers.Serializer):
    key = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=10_000)
    provider = serializers.SlugField(max_length=63)
    action = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    request = serializers.JSONField(required=False, allow_null=True, default=None, validators=[no_nul_characters])
    payload = serializers.JSONField(required=False, allow_null=True, default=None, validators=[no_nul_characters])
    reconciliation_handle = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    execution_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    workflow_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    workflow_version = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    correlation_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    lease_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0)
    uses_sent_marker = serializers.BooleanField(required=False, default=False)


class SubmitInputSerializer(serializers.Serializer):
    """POST /api/v1/operations: the provider-neutral envelope (execute mode)."""

    key = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=10_000)
    provider = serializers.SlugField(max_length=63)
    action = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    # method/path/query/headers/body; validated against the provider by the service.
    request = serializers.JSONField()
    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    deadline_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0.001)
    callback_url = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=1000, default=""
    )
    reconciliation_handle = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    execution_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    workflow_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    workflow_version = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    correlation_id = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")


class LeaseTokenSerializer(serializers.Serializer):
    lease_token = serializers.CharField(max_length=64)


class SentInputSerializer(LeaseTokenSerializer):
    reconciliation_handle = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")


class HeartbeatInputSerializer(LeaseTokenSerializer):
    lease_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0)


class CompleteInputSerializer(LeaseTokenSerializer):
    provider_ref = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    response = serializers.JSONField(required=False, allow_null=True, default=None, validators=[no_nul_characters])
    response_status = serializers.IntegerField(
        required=False, allow_null=True, default=200, min_value=100, max_value=599
    )


class FailInputSerializer(LeaseTokenSerializer):
    error_class = serializers.ChoiceField(choices=ErrorClass.choices)
    message = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")
    response_status = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=100, max_value=599
    )
    retry_after_seconds = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0)


class OperationOutputSerializer(serializers.Serializer):
    """Documentation of the operation representation (rendered by operation_representation)."""

    id = serializers.IntegerField()
    key = serializers.CharField()
    status = serializers.CharField()
    mode = serializers.CharField()
    provider = serializers.CharField(allow_null=True)
    action = serializers.CharField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    provider_ref = serializers.CharField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    response = serializers.DictField(allow_null=True)
    error_class = serializers.CharField()
    last_error = serializers.CharField()
    reconciliation_handle = serializers.CharField()
    execution_id = serializers.CharField()
    workflow_id = serializers.CharField()
    workflow_version = serializers.CharField()
    correlation_id = serializers.CharField()
    sent_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    done_at = serializers.DateTimeField(allow_null=True)
    superseded_by = serializers.IntegerField(allow_null=True)


class ClaimOutputSerializer(OperationOutputSerializer):
    lease_token = serializers.CharField()
    attempt = serializers.IntegerField()


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def operation_representation(op: Operation, *, provider_slug: str | None = None) -> dict[str, Any]:
    """The public shape of an operation. Payload and request are never included here."""
    return {
        "id": op.pk,
        "key": op.key,
        "status": op.status,
        "mode": op.mode,
        "provider": provider_slug,
        "action": op.action,
        "attempts": op.attempts,
        "max_attempts": op.max_attempts,
        "provider_ref": op.provider_ref,
        "lease_expires_at": _iso(op.lease_expires_at),
        "response": None
        if op.response_status is None and op.response_body is None
        else {"status": op.response_status, "body": open_json(op.response_body)},
        "error_class": op.error_class,
        "last_error": op.last_error,
        "reconciliation_handle": op.reconciliation_handle,
        "execution_id": op.execution_id,
        "workflow_id": op.workflow_id,
        "workflow_version": op.workflow_version,
        "correlation_id": op.correlation_id,
        "sent_at": _iso(op.sent_at),
        "next_attempt_at": _iso(op.next_attempt_at),
        "created_at": _iso(op.created_at),
        "updated_at": _iso(op.updated_at),
        "done_at": _iso(op.done_at),
        "superseded_by": op.superseded_by_id,
        **(_execute_fields(op) if op.mode == "execute" else {}),
    }


def _execute_fields(op: Operation) -> dict[str, Any]:
    """Execute mode: the retry budget the workers apply, visible on the operation."""
    return {
        "throttled_attempts": op.throttled_attempts,
        "deadline": _iso(op.deadline),
        "expires_at": _iso(op.expires_at),
        "callback_url": op.callback_url,
    }
