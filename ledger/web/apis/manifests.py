"""Evaluation manifests (ADR 0022): a generating job's manifest (written before its output
exists, read back by digest) and an extraction job's score against it."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.execution import manifests
from ledger.web.apis.operations import REPLAYED_HEADER, validated_input
from ledger.web.serializers import (
    ManifestContentOutputSerializer,
    ManifestInputSerializer,
    ManifestOutputSerializer,
    ManifestScoreOutputSerializer,
)


def _shown(request: Request, manifest: object) -> dict:
    # The manifest itself to keys that may write (it can name a person), its facts to any reader.
    serializer = (
        ManifestContentOutputSerializer if {"write", "admin"} & request.user.scopes else ManifestOutputSerializer
    )
    data = dict(serializer(manifest).data)
    if "content" in data:
        data["content"] = manifests.manifest_content(manifest)
    return data


class OperationManifestApi(APIView):
    @extend_schema(
        responses={200: ManifestContentOutputSerializer},
        summary="A generating job's evaluation manifest (its content to write-scoped keys only)",
    )
    def get(self, request: Request, operation_id: int) -> Response:
        manifest = manifests.manifest_get(tenant=request.user.tenant, operation_id=operation_id)
        return Response(_shown(request, manifest))

    @extend_schema(
        request=ManifestInputSerializer,
        responses={
            201: ManifestContentOutputSerializer,
            200: OpenApiResponse(ManifestContentOutputSerializer, description="The same manifest was stored before."),
        },
        summary="Write a job's evaluation manifest, before its output exists (immutable, by digest)",
        description="Refused once the job has an output or has finished (409 manifest_after_output), when another"
        " manifest is stored (409 manifest_conflict), or when it does not match the manifest schema of the job's"
        " preset (422 manifest_invalid). The same manifest again answers 200.",
    )
    def put(self, request: Request, operation_id: int) -> Response:
        data = validated_input(ManifestInputSerializer, request)
        manifest, created = manifests.manifest_put(
            tenant=request.user.tenant, operation_id=operation_id, manifest=data["manifest"], actor=request.user.actor
        )
        if created:
            return Response(_shown(request, manifest), status=201)
        return Response(_shown(request, manifest), status=200, headers={REPLAYED_HEADER: "true"})


class OperationManifestScoreApi(APIView):
    @extend_schema(
        responses={200: ManifestScoreOutputSerializer},
        summary="An extraction job's score against its document's manifest (0..1, per field)",
    )
    def get(self, request: Request, operation_id: int) -> Response:
        score = manifests.manifest_score_get(tenant=request.user.tenant, operation_id=operation_id)
        return Response(ManifestScoreOutputSerializer(score).data)
