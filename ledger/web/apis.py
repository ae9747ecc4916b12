"""Ledger HTTP API: parse input, call a service or selector, render the output."""

from __future__ import annotations

import mimetypes
from typing import Any

import django_filters
from django.db.models import QuerySet
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers as drf_serializers
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.execution import objects, outputs, polling, uploads
from ledger.execution.attempts import operation_submit
from ledger.models import Operation, OperationOutput, OperationStatus, PromptTemplate, Provider, ProviderKind, Upload
from ledger.platform.errors import InvalidKey, OperationNotFound, ValidationFailed
from ledger.platform.telemetry import claim_timer
from ledger.protocol import selectors, services, transitions
from ledger.protocol.representation import (
    ClaimOutputSerializer,
    OperationOutputSerializer,
    OutputObjectSerializer,
    ReplayedOperationOutputSerializer,
    UploadOutputSerializer,
)
from ledger.protocol.serializer_reuse import represented, validated_data
from ledger.providers import canary, prompts, ratelimit, revisions
from ledger.rules.key_derivation import derivation_key, key_derive
from ledger.rules.key_rules import key_lookup_shape, key_refusal
from ledger.rules.provider_checks import secret_env_names
from ledger.store import sql
from ledger.tenants.workflows import workflow_name_note
from ledger.web.pagination import KeysetCursorPagination
from ledger.web.serializers import (
    AttemptOutputSerializer,
    CanaryInputSerializer,
    ClaimInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
    HeartbeatInputSerializer,
    KeyDeriveInputSerializer,
    KeyDeriveOutputSerializer,
    PromptTemplateInputSerializer,
    PromptTemplateOutputSerializer,
    ProviderIntentInputSerializer,
    ProviderIntentOutputSerializer,
    ProviderOutputSerializer,
    RolloutMoveInputSerializer,
    RolloutOutputSerializer,
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


def idempotency_key_from(request: Request, body_key: str | None) -> str:
    """The key comes in the body (`key`) or the `Idempotency-Key` header; both must agree."""
    header_key = request.headers.get("Idempotency-Key")
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
        for given in (body_key, request.headers.get("Idempotency-Key")):
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
    headers = dict(headers or {})
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    serializer = ReplayedOperationOutputSerializer if response_in_clear else OperationOutputSerializer
    return Response(represented(serializer, op), status=status, headers=headers)


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
        location = {"Location": f"/api/v1/operations/{op.pk}"}
        return Response(represented(ClaimOutputSerializer, op), status=201, headers=location)


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
    status = django_filters.ChoiceFilter(field_name="status", choices=OperationStatus.choices)
    provider = django_filters.CharFilter(field_name="provider__slug")
    updated_after = django_filters.IsoDateTimeFilter(field_name="updated_at", lookup_expr="gt")
    reconciliation_handle = django_filters.CharFilter(field_name="reconciliation_handle")
    provider_ref = django_filters.CharFilter(field_name="provider_ref")
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
        failed = selectors.operations_failed_with(text, tenant_ids=[self.request.user.tenant.pk])
        return rows.filter(pk__in=failed.values("operation_id"))


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


# --- Uploads and validated outputs (ledger.execution.uploads, ledger.execution.outputs) ----------------


def object_content_response(stored: Upload | OperationOutput) -> FileResponse:
    """A stored object's bytes as they are, to the tenant that owns them: never cached by a
    shared cache, never rendered as a page (a download, sandboxed), tagged with their digest."""
    media_type, sha256, filename = stored.media_type, stored.sha256, stored.key
    try:
        handle = objects.objects_storage().open(stored.storage_name, "rb")
    except FileNotFoundError:
        # Deleted by retention between the row's read and this open.
        raise uploads.UploadNotFound("No such object.") from None
    extension = mimetypes.guess_extension(media_type) or ""
    response = FileResponse(handle, content_type=media_type, as_attachment=True, filename=filename + extension)
    response["ETag"] = f'"{sha256}"'
    response["Cache-Control"] = "private, no-cache"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["X-Content-Type-Options"] = "nosniff"
    return response


class ObjectBytesApi(APIView):
    """A view that answers stored bytes: whatever the client accepts, the bytes are answered
    with their own media type, and a problem is JSON."""

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        return JSONRenderer(), "application/json"


class UploadCreateApi(APIView):
    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            201: UploadOutputSerializer,
            200: OpenApiResponse(
                UploadOutputSerializer, description="These bytes were already uploaded: the same key."
            ),
        },
        summary="Upload a file (the body is the file); answers its immutable key and sha256",
        description="The body is the file's bytes (any Content-Type; the type is recognised from the content)."
        " Refused before anything is stored: over UPLOAD_MAX_BYTES (413 payload_too_large, counted while it"
        " streams in), empty (400 upload_empty), not of an accepted type or not decodable"
        " (415 upload_media_type_not_allowed).",
    )
    def post(self, request: Request) -> Response:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        # DRF's stream of the raw body (None when it is empty); never parsed.
        stream = request.stream
        result = uploads.upload_store(
            tenant=request.user.tenant,
            stream=stream if stream is not None else _EmptyStream(),
            declared_length=declared,
        )
        body = UploadOutputSerializer(result.upload).data
        if not result.created:
            return Response(body, status=200, headers={REPLAYED_HEADER: "true"})
        return Response(body, status=201, headers={"Location": f"/api/v1/uploads/{result.upload.key}"})


class _EmptyStream:
    def read(self, size: int = -1, /) -> bytes:
        return b""


class UploadDetailApi(APIView):
    @extend_schema(responses={200: UploadOutputSerializer}, summary="One upload's facts (this tenant's only)")
    def get(self, request: Request, key: str) -> Response:
        return Response(UploadOutputSerializer(uploads.upload_get(tenant=request.user.tenant, key=key)).data)


class UploadContentApi(ObjectBytesApi):
    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
        summary="An upload's bytes (this tenant's only), with its recognised media type",
    )
    def get(self, request: Request, key: str) -> FileResponse:
        upload = uploads.upload_get(tenant=request.user.tenant, key=key)
        return object_content_response(upload)


class OperationOutputApi(APIView):
    @extend_schema(
        responses={200: OutputObjectSerializer},
        summary="An operation's validated output: key, sha256, media type, size, dimensions",
    )
    def get(self, request: Request, operation_id: int) -> Response:
        output = outputs.output_get(tenant=request.user.tenant, operation_id=operation_id)
        return Response(OutputObjectSerializer(output).data)


class OperationOutputContentApi(ObjectBytesApi):
    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
        summary="An operation's validated output bytes (published only after every check passed)",
    )
    def get(self, request: Request, operation_id: int) -> FileResponse:
        output = outputs.output_get(tenant=request.user.tenant, operation_id=operation_id)
        return object_content_response(output)


class ProviderWebhookApi(APIView):
    """An asynchronous provider's signed note that a job changed (ledger.execution.polling). The
    provider holds no API key: the signature under the provider's webhook secret is the
    authentication, so every refusal of it — unknown tenant or provider, no secret, a wrong
    or stale signature — is the same 401."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={200: OpenApiTypes.OBJECT},
        summary="A provider's signed webhook: the job it names is polled at once (its state and output are read"
        " from the provider's status answer, never from the note)",
        description="Signed like Onceguard's callbacks: `Onceguard-Signature: t=<unix seconds>,v1=<hex"
        ' HMAC-SHA256(webhook secret, "<t>." + body)>`, at most 300 s old. 401 webhook_signature_invalid'
        " otherwise; 404 when no operation has this job.",
    )
    def post(self, request: Request, tenant: str, slug: str) -> Response:
        # The raw bytes, exactly as signed (read before anything parses them).
        body = request.body
        result = polling.webhook_receive(
            tenant_slug=tenant,
            provider_slug=slug,
            body=body,
            signature=request.headers.get(polling.WEBHOOK_SIGNATURE_HEADER, ""),
        )
        op = result.operation
        return Response({"operation": op.pk, "status": op.status, "applied": result.applied})


# --- Adapter revisions: the rollout of a provider's adapter changes (ledger.providers.canary) --------------


def _tenant_provider(request: Request, slug: str) -> Provider:
    provider = Provider.objects.filter(tenant_id=request.user.tenant.pk, slug=slug, kind=ProviderKind.HTTP).first()
    if provider is None:
        raise OperationNotFound(f"No provider named {slug!r}.")
    return provider


class ProviderDetailApi(APIView):
    @extend_schema(
        responses={200: ProviderOutputSerializer},
        summary="A provider: its pause and throttle, its rate and concurrency caps and where they stand now",
    )
    def get(self, request: Request, slug: str) -> Response:
        provider = _tenant_provider(request, slug)
        body = {
            "slug": provider.slug,
            "kind": provider.kind,
            "idempotency_class": provider.idempotency_class,
            "base_url": provider.base_url,
            "paused": provider.paused_at is not None,
            "paused_reason": provider.paused_reason,
            "throttled_until": provider.throttled_until,
            "caps": ratelimit.provider_caps(provider).as_dict(),
            "auth_secret_env": provider.auth_secret_env,
            "secret_env_names": secret_env_names(request.user.tenant.secret_namespace),
        }
        return Response(represented(ProviderOutputSerializer, body))


class ProviderRolloutApi(APIView):
    @extend_schema(
        responses={200: RolloutOutputSerializer},
        summary="A provider's adapter revisions: which is stable, which is a canary, and the watch's figures",
    )
    def get(self, request: Request, slug: str) -> Response:
        provider = _tenant_provider(request, slug)
        return Response(represented(RolloutOutputSerializer, canary.provider_rollout(provider)))


class ProviderCanaryApi(APIView):
    required_scope = "admin"

    @extend_schema(
        request=CanaryInputSerializer,
        responses={200: RolloutOutputSerializer},
        summary="Run an adapter revision as a canary for a share of new operations (or change its share)",
    )
    def post(self, request: Request, slug: str, number: int) -> Response:
        data = validated_input(CanaryInputSerializer, request)
        provider = canary.canary_start(
            provider_id=_tenant_provider(request, slug).pk,
            number=number,
            percent=data["percent"],
            actor=request.user.actor,
            reason=data["reason"],
            tenant_ids=[request.user.tenant.pk],
        )
        return Response(represented(RolloutOutputSerializer, canary.provider_rollout(provider)))


class ProviderPromoteApi(APIView):
    required_scope = "admin"

    @extend_schema(
        request=RolloutMoveInputSerializer,
        responses={200: RolloutOutputSerializer},
        summary="Roll forward: make a revision (by default the canary) the stable one",
    )
    def post(self, request: Request, slug: str) -> Response:
        data = validated_input(RolloutMoveInputSerializer, request)
        provider = canary.revision_promote(
            provider_id=_tenant_provider(request, slug).pk,
            number=data.get("number"),
            actor=request.user.actor,
            reason=data["reason"],
            tenant_ids=[request.user.tenant.pk],
        )
        return Response(represented(RolloutOutputSerializer, canary.provider_rollout(provider)))


class ProviderRollbackApi(APIView):
    required_scope = "admin"

    @extend_schema(
        request=RolloutMoveInputSerializer,
        responses={200: RolloutOutputSerializer},
        summary="Roll back: end the canary (its unsent operations re-queued under the stable revision), or return"
        " the stable revision to an earlier one",
    )
    def post(self, request: Request, slug: str) -> Response:
        data = validated_input(RolloutMoveInputSerializer, request)
        result = canary.revision_rollback(
            provider_id=_tenant_provider(request, slug).pk,
            number=data.get("number"),
            actor=request.user.actor,
            reason=data["reason"],
            tenant_ids=[request.user.tenant.pk],
        )
        body = {**canary.provider_rollout(result.provider), "requeued": result.requeued}
        return Response(represented(RolloutOutputSerializer, body))


# --- Intent envelopes and prompt templates (ledger.rules.intents, ledger.providers.prompts) -------------------------


class AdminToWrite:
    """Reading needs `read`; a change needs `admin` (ledger.tenants.auth reads ``required_scope``)."""

    request: Request

    @property
    def required_scope(self) -> str | None:
        return None if self.request.method in ("GET", "HEAD", "OPTIONS") else "admin"


def _intent_view(provider: Provider) -> dict[str, Any]:
    return {
        "provider": provider.slug,
        "revision": revisions.revision_number(provider.revision_id),
        "canary_revision": revisions.revision_number(provider.canary_revision_id),
        "intent_schema": provider.intent_schema,
        "request_template": provider.request_template,
    }


class ProviderIntentApi(AdminToWrite, APIView):
    @extend_schema(
        responses={200: ProviderIntentOutputSerializer},
        summary="A provider's intent schema and request template (its stable adapter revision's)",
    )
    def get(self, request: Request, slug: str) -> Response:
        return Response(represented(ProviderIntentOutputSerializer, _intent_view(_tenant_provider(request, slug))))

    @extend_schema(
        request=ProviderIntentInputSerializer,
        responses={200: ProviderIntentOutputSerializer},
        summary="Set a provider's intent schema and request template: the next adapter revision (stable, or a"
        " canary); a template that would evaluate anything is 400 request_template_invalid",
    )
    def put(self, request: Request, slug: str) -> Response:
        data = validated_input(ProviderIntentInputSerializer, request)
        _tenant_provider(request, slug)
        provider = services.provider_upsert(
            tenant=request.user.tenant,
            slug=slug,
            actor=request.user.actor,
            reason=data["reason"],
            canary_percent=data["canary_percent"],
            intent_schema=data["intent_schema"],
            request_template=data["request_template"],
        )
        return Response(represented(ProviderIntentOutputSerializer, _intent_view(provider)))


class PromptTemplateListApi(AdminToWrite, APIView):
    @extend_schema(
        parameters=[OpenApiParameter("name", str, OpenApiParameter.QUERY, required=False)],
        responses={200: PromptTemplateOutputSerializer(many=True)},
        summary="The tenant's prompt templates, every version, newest first",
    )
    def get(self, request: Request) -> Response:
        rows = PromptTemplate.objects.filter(tenant_id=request.user.tenant.pk).order_by("name", "-version")
        if request.query_params.get("name"):
            rows = rows.filter(name=request.query_params["name"])
        return Response(PromptTemplateOutputSerializer(rows[:500], many=True).data)

    @extend_schema(
        request=PromptTemplateInputSerializer,
        responses={201: PromptTemplateOutputSerializer},
        summary="Create the next version of a prompt template (versions are immutable)",
    )
    def post(self, request: Request) -> Response:
        data = validated_input(PromptTemplateInputSerializer, request)
        prompt = prompts.prompt_template_create(tenant=request.user.tenant, actor=request.user.actor, **data)
        return Response(represented(PromptTemplateOutputSerializer, prompt), status=201)
