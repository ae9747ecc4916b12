"""Payload reveal over the API: the key's `payload` scope, a reason, an AccessLog row.

``POST`` with the reason (and optionally the fields) in the JSON body: a reason says why
someone looked at a person's data, and query strings end up in proxy and server access logs,
browser history and referrers — the body does not.

The `payload` scope is deliberately NOT implied by `admin`: handing an automation an admin
key must not hand it the personal data in every payload. The key's tenant bounds what it
can reveal; the AccessLog actor is ``apikey:<prefix>``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dlq.models import FailedEvent
from ledger.models import Operation
from ledger.platform.errors import DomainError, OperationNotFound, ValidationFailed
from ledger.protocol.serializer_reuse import validated_data
from review.privacy import payloads as privacy
from review.staff.security import client_ip

PAYLOAD_SCOPE = "payload"


class PayloadRevealOutputSerializer(serializers.Serializer):
    """Documentation of the reveal answer."""

    object = serializers.CharField(help_text="e.g. ledger.operation, dlq.failedevent")
    id = serializers.IntegerField()
    ref = serializers.CharField(help_text="the key or event id")
    fields = serializers.DictField(help_text="field name → plaintext value (null when redacted)")
    access_log = serializers.DictField(help_text="seq, at and hash of the AccessLog row this reveal wrote")


class FailedEventNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class PayloadRevealInputSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, help_text="why (logged; at least 8 characters)")
    fields = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, default=list, help_text="default: all"
    )


def _reveal(request: Request, obj: Any) -> Response:
    if not isinstance(request.data, dict):
        raise ValidationFailed("The request body must be a JSON object with a reason.")
    data = validated_data(PayloadRevealInputSerializer, request.data)
    values, entry = privacy.payload_reveal(
        obj=obj,
        tenant_id=request.user.tenant.pk,
        fields=[f.strip() for f in data["fields"] if f.strip()],
        reason=data["reason"],
        actor=request.user.actor,
        ip=client_ip(request),
    )
    response = Response(
        {
            "object": entry.object_type,
            "id": obj.pk,
            "ref": entry.object_ref,
            "fields": values,
            "access_log": {"seq": entry.seq, "at": entry.at.isoformat(), "hash": entry.hash},
        }
    )
    response["Cache-Control"] = "no-store"
    return response


class OperationPayloadRevealApi(APIView):
    required_scope = PAYLOAD_SCOPE

    @extend_schema(
        request=PayloadRevealInputSerializer,
        responses={200: PayloadRevealOutputSerializer},
        summary="Reveal an operation's payload/request/response (scope `payload`; reason in the body; logged)",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        op = Operation.objects.filter(pk=operation_id, tenant_id=request.user.tenant.pk).first()
        if op is None:
            raise OperationNotFound("No such operation.")
        return _reveal(request, op)


class FailedEventPayloadRevealApi(APIView):
    required_scope = PAYLOAD_SCOPE

    @extend_schema(
        request=PayloadRevealInputSerializer,
        responses={200: PayloadRevealOutputSerializer},
        summary="Reveal a DLQ entry's payload (scope `payload`; reason in the body; logged)",
    )
    def post(self, request: Request, event_id: int) -> Response:
        event = FailedEvent.objects.filter(pk=event_id, tenant_id=request.user.tenant.pk).first()
        if event is None:
            raise FailedEventNotFound("No such entry.")
        return _reveal(request, event)
