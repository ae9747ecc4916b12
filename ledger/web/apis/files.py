"""Files in and out: uploads (``ledger.execution.uploads``) and an operation's validated
output (``ledger.execution.outputs``), their facts and their bytes. ``object_content_response``
answers stored bytes the one safe way (a download, sandboxed, never cached by a shared cache),
for these views and the console's reveal (review.console.object_pages)."""

from __future__ import annotations

import mimetypes

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.execution import objects, outputs, uploads, verdicts
from ledger.models import OperationOutput, Upload, VerdictSource
from ledger.protocol.representation import OutputObjectSerializer, UploadOutputSerializer
from ledger.protocol.serializer_reuse import represented
from ledger.web.apis.operations import REPLAYED_HEADER, validated_input
from ledger.web.serializers import VerdictInputSerializer, VerdictOutputSerializer


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
        description="The first download records the output as consumed (ADR 0020). An output recalled before"
        " anyone consumed it — its adapter revision was rolled back — answers 410 output_quarantined.",
    )
    def get(self, request: Request, operation_id: int) -> FileResponse:
        output = outputs.output_consume(tenant=request.user.tenant, operation_id=operation_id)
        return object_content_response(output)


class OperationOutputVerdictApi(APIView):
    @extend_schema(
        request=VerdictInputSerializer,
        responses={
            201: VerdictOutputSerializer,
            200: OpenApiResponse(VerdictOutputSerializer, description="The same verdict again: the recorded one."),
        },
        summary="Report what you made of an operation's output: accepted or rejected, a score, why",
        description="One verdict per output and API key (ADR 0020): the same body again answers the recorded"
        " verdict (200, Idempotent-Replayed: true); a different one answers 409 verdict_conflict. Rejected and"
        " low-scored outputs of a canary adapter revision count in its quality gate, which pauses the canary"
        " when it breaches its threshold.",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(VerdictInputSerializer, request)
        output = outputs.output_get(tenant=request.user.tenant, operation_id=operation_id)
        result = verdicts.output_verdict_record(
            output=output,
            score=data["score"],
            verdict=data["verdict"],
            reason=data["reason"],
            source=VerdictSource.CONSUMER,
            actor=request.user.actor,
        )
        body = represented(VerdictOutputSerializer, result.verdict)
        if not result.created:
            return Response(body, status=200, headers={REPLAYED_HEADER: "true"})
        return Response(body, status=201)
