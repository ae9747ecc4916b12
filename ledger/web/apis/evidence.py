"""Failed attempts' evidence (ADR 0016): the tenant's list, newest first, cursor-paginated.
Rows hold no personal data by construction; the key is a keyed digest."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.protocol.evidence import LIST_ORDERING, attempt_evidence_list
from ledger.store import sql
from ledger.web.pagination import KeysetCursorPagination
from ledger.web.serializers import AttemptEvidenceListQuerySerializer, AttemptEvidenceOutputSerializer


class AttemptEvidenceCursorPagination(KeysetCursorPagination):
    ordering = LIST_ORDERING
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class AttemptEvidenceListApi(APIView):
    # Read by drf-spectacular: the GET answer is documented as a cursor page of evidence.
    pagination_class = AttemptEvidenceCursorPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("provider", str, OpenApiParameter.QUERY, required=False, description="provider slug"),
            OpenApiParameter("error_class", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("finished_after", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("finished_before", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("page_size", int, OpenApiParameter.QUERY, required=False),
        ],
        responses={200: AttemptEvidenceOutputSerializer(many=True)},
        summary="List failed attempts' evidence (cursor-paginated, newest first)",
        description=(
            "What a post-mortem needs of each failed attempt — provider, class, status, timing, adapter"
            " revision, a render job's preset version and aspect class, the error text with the job's own"
            " values cut out — kept past the operation's retention (FAILED_ATTEMPT_EVIDENCE_DAYS)."
        ),
    )
    @sql.planned_per_call()
    def get(self, request: Request) -> Response:
        query = AttemptEvidenceListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = attempt_evidence_list(tenant_id=request.user.tenant.pk, **query.validated_data)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(AttemptEvidenceOutputSerializer(page, many=True).data)
