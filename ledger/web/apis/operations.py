"""The operations API: claims (guard mode) and submissions (execute mode), the holder's
reports (sent, complete, fail, heartbeat), an operation, its attempts, the filtered list, and
keys derived from personal data.

Also the request helpers every ledger view uses: ``validated_input`` (the body through its
input serializer), the key of a claim or submission (``claim_key``: the body, the
``Idempotency-Key`` header or a record's versioned parts) and the answers that render an
operation (``operation_response``, ``replay_answer`` with ``Idempotent-Replayed``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers as drf_serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationStatus, Provider
from ledger.platform import tracing
from ledger.platform.errors import InvalidKey, ValidationFailed
from ledger.platform.telemetry import claim_timer
from ledger.protocol import selectors, services, transitions
from ledger.protocol.representation import (
    ClaimOutputSerializer,
    OperationOutputSerializer,
    ReplayedOperationOutputSerializer,
    operation_represented,
)
from ledger.protocol.serializer_reuse import validated_data
from ledger.rules.key_derivation import derivation_key, key_derive
from ledger.rules.key_rules import key_lookup_shape, key_refusal
from ledger.store import sql
from ledger.tenants.workflows import workflow_name_note
from ledger.web.pagination import KeysetCursorPagination
from ledger.web.serializers import (
    AttemptOutputSerializer,
    ClaimInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
    HeartbeatInputSerializer,
    KeyDeriveInputSerializer,
    KeyDeriveOutputSerializer,
    SentInputSerializer,
    SubmitInputSerializer,
)

REPLAYED_HEADER = "Idempotent-Replayed"


def validated_input(serializer_class: type[drf_serializers.Serializer], request: Request) -> dict[str, Any]:
    """The request body validated by ``serializer_class`` (reused, see ledger.protocol.serializer_reuse);
    DRF's ValidationError (a 400 problem) when it is not valid."""
    if not isinstance(request.data, dict):
        raise ValidationFailed("The request body must be a JSON object.")
    return validated_data(serializer_class, request.data)


def idempotency_header(request: Request) -> str | None:
    """The `Idempotency-Key` header as sent. Read from ``META`` (the WSGI name Django files it
    under): ``request.headers`` would build a mapping of every header of the request first,
    some 20 µs a claim spent on nothing else."""
    return request.META.get("HTTP_IDEMPOTENCY_KEY")


def idempotency_key_from(request: Request, body_key: str | None) -> str:
    """The key comes in the body (`key`) or the `Idempotency-Key` header; both must agree."""
    header_key = idempotency_header(request)
    if body_key not in (None, "") and header_key not in (None, "") and body_key != header_key:
        raise InvalidKey("The `key` field and the Idempotency-Key header disagree.")
    key = body_key if body_key not in (None, "") else header_key
    # The key rule is the claim's (services.claim_key_check): a stored key keeps its answer.
    if not key_lookup_shape(key):
        raise key_refusal(key) or InvalidKey()
    return key


def claim_key(request: Request, data: dict[str, Any]) -> str:
    """The key of a claim or submission: `key` (body or `Idempotency-Key` header), or composed
    from `record`, `action` and `version` (``{record}:{action}:v{version}``); a key sent with
    the parts must be their composition. Pops `key` from ``data``; the parts stay (stored)."""
    body_key = data.pop("key", None)
    if data.get("record") or data.get("version") is not None:
        composed = services.versioned_key(
            record=data.get("record") or "", action=data.get("action") or "", version=data.get("version")
        )
        for given in (body_key, idempotency_header(request)):
            if given not in (None, "") and given != composed:
                raise InvalidKey("The key sent is not {record}:{action}:v{version} of the parts sent.")
        return composed
    return idempotency_key_from(request, body_key)


def operation_response(
    op: Operation,
    *,
    status: int,
    replayed: bool = False,
    headers: dict[str, str] | None = None,
    response_in_clear: bool = False,
) -> Response:
    """The operation as the API renders it: its recorded response masked, unless
    ``response_in_clear`` (the answer that replays the key, see replay_answer)."""
    # The request's server span names the operation by its key's HMAC (ADR 0015).
    tracing.operation_annotate(op)
    headers = dict(headers or {})
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    serializer = ReplayedOperationOutputSerializer if response_in_clear else OperationOutputSerializer
    return Response(operation_represented(serializer, op), status=status, headers=headers)


def replay_answer(request: Request, op: Operation) -> Response:
    """The answer to a claim or submission that replays a finished key: the recorded response
    in clear, as the protocol needs — the service answered a replay only for the same tenant
    and the same request fingerprint (another one is a 422), and only a write-scoped key
    gets this far (these are POSTs); the scope is checked here again so the rule does not
    rest on the view's permission alone."""
    scopes = request.user.scopes
    return operation_response(op, status=200, replayed=True, response_in_clear=bool({"write", "admin"} & scopes))


class ClaimCreateApi(APIView):
    @extend_schema(
        request=ClaimInputSerializer,
        responses={201: ClaimOutputSerializer, 200: OperationOutputSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)],
        summary="Claim an idempotency key before performing a side effect (guard mode)",
    )
    def post(self, request: Request) -> Response:
        data = validated_input(ClaimInputSerializer, request)
        key = claim_key(request, data)
        tenant = request.user.tenant
        provider = services.provider_for(tenant=tenant, slug=data.pop("provider"))
        workflow_name = data.pop("workflow_name")
        with claim_timer() as timer:
            result = transitions.operation_claim(
                tenant=tenant, key=key, provider=provider, actor=request.user.actor, via_claims=True, **data
            )
            timer.outcome = "replayed" if result.replayed else "created"
        op = result.operation
        if result.acquired:
            workflow_name_note(tenant_id=tenant.pk, workflow_id=op.workflow_id, name=workflow_name)
        if result.replayed:
            return replay_answer(request, op)
        tracing.operation_annotate(op)
        location = {"Location": f"/api/v1/operations/{op.pk}"}
        return Response(operation_represented(ClaimOutputSerializer, op), status=201, headers=location)


class KeyDeriveApi(APIView):
    """ "Hash this field into the key": a key for a lead known only by personal data, which a key
    may not carry (ledger.rules.key_rules). Writes nothing, so the read scope is enough; the value is
    neither logged nor stored nor echoed (ledger.rules.key_derivation)."""

    required_scope = "read"

    @extend_schema(
        request=KeyDeriveInputSerializer,
        responses={200: KeyDeriveOutputSerializer},
        summary="Derive an idempotency key from a value that must not appear in clear (e-mail, phone)",
    )
    def post(self, request: Request) -> Response:
        data = validated_input(KeyDeriveInputSerializer, request)
        key = key_derive(
            tenant_id=request.user.tenant.pk, prefix=data["prefix"], value=data["value"], parts=data["parts"]
        )
        return Response({"key": key, "key_id": derivation_key().key_id})


class OperationSentApi(APIView):
    @extend_schema(
        request=SentInputSerializer,
        responses={200: OperationOutputSerializer},
        summary="Write the sent marker before the effect",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(SentInputSerializer, request)
        op = transitions.operation_mark_sent(
            operation_id=operation_id,
            lease_token=data["lease_token"],
            reconciliation_handle=data["reconciliation_handle"],
            actor=request.user.actor,
            tenant_id=request.user.tenant.pk,
        )
        return operation_response(op, status=200)


class OperationCompleteApi(APIView):
    @extend_schema(
        request=CompleteInputSerializer,
        responses={200: OperationOutputSerializer},
        summary="Record the effect's outcome",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(CompleteInputSerializer, request)
        op = transitions.operation_complete(
            operation_id=operation_id,
            lease_token=data["lease_token"],
            provider_ref=data["provider_ref"],
            response_status=data["response_status"],
            response_body=data["response"],
            actor=request.user.actor,
            tenant_id=request.user.tenant.pk,
        )
        return operation_response(op, status=200)


class OperationFailApi(APIView):
    @extend_schema(
        request=FailInputSerializer,
        responses={200: OperationOutputSerializer},
        summary="Record a failure and its class",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(FailInputSerializer, request)
        op = transitions.operation_fail(
            operation_id=operation_id,
            lease_token=data["lease_token"],
            error_class=data["error_class"],
            message=data["message"],
            response_status=data["response_status"],
            retry_after=data["retry_after_seconds"],
            actor=request.user.actor,
            tenant_id=request.user.tenant.pk,
        )
        return operation_response(op, status=200)


class OperationHeartbeatApi(APIView):
    @extend_schema(
        request=HeartbeatInputSerializer, responses={200: OperationOutputSerializer}, summary="Extend the lease"
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(HeartbeatInputSerializer, request)
        op = transitions.operation_heartbeat(
            operation_id=operation_id,
            lease_token=data["lease_token"],
            lease_seconds=data["lease_seconds"],
            tenant_id=request.user.tenant.pk,
        )
        return operation_response(op, status=200)


class OperationDetailApi(APIView):
    @extend_schema(responses={200: OperationOutputSerializer}, summary="One operation")
    def get(self, request: Request, operation_id: int) -> Response:
        op = selectors.operation_get(tenant=request.user.tenant, operation_id=operation_id)
        return operation_response(op, status=200)


class OperationAttemptsApi(APIView):
    @extend_schema(
        responses={200: AttemptOutputSerializer(many=True)},
        summary="An operation's attempts, oldest first: outcome, adapter revision and prompt template version",
    )
    def get(self, request: Request, operation_id: int) -> Response:
        op = selectors.operation_get(tenant=request.user.tenant, operation_id=operation_id)
        return Response(AttemptOutputSerializer(op.attempt_set.order_by("number"), many=True).data)


class OperationFilter(django_filters.FilterSet):
    key = django_filters.CharFilter(field_name="key")
    # Neither is served by an index on the operation row (ADR 0017): see the selectors.
    status = django_filters.ChoiceFilter(method="in_state", choices=OperationStatus.choices)
    provider = django_filters.CharFilter(method="by_provider")
    updated_after = django_filters.IsoDateTimeFilter(method="changed_after")
    reconciliation_handle = django_filters.CharFilter(method="by_handle")
    provider_ref = django_filters.CharFilter(method="by_provider_ref")
    execution_id = django_filters.CharFilter(field_name="execution_id")
    correlation_id = django_filters.CharFilter(field_name="correlation_id")
    workflow_id = django_filters.CharFilter(field_name="workflow_id")
    # Any part of a name the workflow was seen with, in any case (ledger.protocol.selectors.workflows_named).
    workflow_name = django_filters.CharFilter(method="named")
    # Any part of the error text of one of the operation's failures, in any case, from the
    # append-only failure events (ledger.protocol.selectors.operations_failed_with; the DLQ list's
    # ``error`` is the same over its entries' error message).
    error = django_filters.CharFilter(method="failed_with")

    class Meta:
        model = Operation
        fields: list[str] = []

    def by_provider(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        # The slug is resolved to the tenant's provider id first, by its unique (tenant, slug)
        # index: filtered through a join on the slug, PostgreSQL walked the tenant's rows newest
        # first looking for a provider that does not exist (576 ms p95 at 2M rows). No such
        # provider: no rows, without reading the operation table.
        found = Provider.objects.filter(tenant=self.request.user.tenant, slug=value).values_list("pk", flat=True)
        provider_id = found.first()
        return rows.none() if provider_id is None else rows.filter(provider_id=provider_id)

    def in_state(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        return selectors.operations_in_state(rows, value, tenant_ids=[self.request.user.tenant.pk])

    def changed_after(self, rows: QuerySet[Operation], name: str, value: datetime) -> QuerySet[Operation]:
        return selectors.operations_updated_after(rows, value, tenant_ids=[self.request.user.tenant.pk])

    def by_provider_ref(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        # The reference is indexed on the write-once search rows, not on the operation (ADR
        # 0018): they name the candidates, the row's own column keeps the filter exact (a row
        # given another reference since no longer matches).
        found = selectors.operations_with_provider_ref(value, tenant_id=self.request.user.tenant.pk)
        return rows.filter(pk__in=found, provider_ref=value)

    def by_handle(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        # Not indexed on the operation row (ADR 0023): the search rows, written once, name the
        # candidates; the row's own column keeps the filter exact.
        found = selectors.operations_with_handle(value, tenant_id=self.request.user.tenant.pk)
        return rows.filter(pk__in=found, reconciliation_handle=value)

    def named(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        found = selectors.workflows_named(value)
        return rows.none() if found is None else rows.filter(found)

    def failed_with(self, rows: QuerySet[Operation], name: str, value: str) -> QuerySet[Operation]:
        text = value.strip()
        if not selectors.ERROR_SEARCH_MIN <= len(text) <= selectors.ERROR_SEARCH_MAX:
            raise ValidationFailed(
                f"error must hold {selectors.ERROR_SEARCH_MIN} to {selectors.ERROR_SEARCH_MAX} characters"
                " (a part of the error text)."
            )
        # The caller's tenant bound on the events too (their tenant column; Citus routes by it).
        failed = selectors.operation_ids_failed_with(text, tenant_ids=[self.request.user.tenant.pk])
        return rows.filter(pk__in=failed)


class OperationCursorPagination(KeysetCursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class OperationListApi(APIView):
    # Read by drf-spectacular: the GET answer is documented as a cursor page of operations.
    pagination_class = OperationCursorPagination

    @extend_schema(
        request=SubmitInputSerializer,
        responses={202: OperationOutputSerializer, 200: OperationOutputSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)],
        summary="Submit an operation for the service to execute (execute mode)",
    )
    def post(self, request: Request) -> Response:
        data = validated_input(SubmitInputSerializer, request)
        key = claim_key(request, data)
        workflow_name = data.pop("workflow_name")
        result = operation_submit(tenant=request.user.tenant, key=key, actor=request.user.actor, **data)
        op = result.operation
        if result.created:
            workflow_name_note(tenant_id=request.user.tenant.pk, workflow_id=op.workflow_id, name=workflow_name)
        if result.replayed:
            return replay_answer(request, op)
        # New, or accepted before and still open (a retry of a submission whose 202 was lost):
        # the same operation either way; the repeat says so with Idempotent-Replayed.
        location = {"Location": f"/api/v1/operations/{op.pk}"}
        return operation_response(op, status=202, replayed=result.still_open, headers=location)

    @extend_schema(
        parameters=[
            OpenApiParameter(name, str, OpenApiParameter.QUERY, required=False)
            for name in (
                "key",
                "status",
                "provider",
                "updated_after",
                "reconciliation_handle",
                "provider_ref",
                "execution_id",
                "correlation_id",
                "workflow_id",
                "workflow_name",
                "error",
                "match",
                "cursor",
                "page_size",
            )
        ],
        responses={200: OperationOutputSerializer(many=True)},
        summary="List operations (cursor-paginated)",
    )
    @sql.planned_per_call(indexed=True)
    def get(self, request: Request) -> Response:
        rows = selectors.operation_list(tenant=request.user.tenant, match=request.query_params.getlist("match"))
        filterset = OperationFilter(request.query_params, queryset=rows, request=request)
        if not filterset.is_valid():
            raise drf_serializers.ValidationError(filterset.errors)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(filterset.qs, request, view=self)
        return paginator.get_paginated_response(OperationOutputSerializer(page, many=True).data)
