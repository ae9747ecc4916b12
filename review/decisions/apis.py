"""Review API: list items waiting for a human, record a decision."""

from __future__ import annotations

from django.db.models import prefetch_related_objects
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.store import sql
from ledger.web.apis.operations import OperationCursorPagination, validated_input
from ledger.web.serializers import ApprovalOutputSerializer
from review.decisions import selectors, services
from review.decisions.serializers import (
    DecisionInputSerializer,
    ReviewItemListQuerySerializer,
    ReviewItemOutputSerializer,
    review_item_representation,
)


class ReviewItemListApi(APIView):
    # Read by drf-spectacular: the answer is documented as a cursor page of review items.
    pagination_class = OperationCursorPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("provider", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("older_than_seconds", float, OpenApiParameter.QUERY, required=False),
            OpenApiParameter(
                "q",
                str,
                OpenApiParameter.QUERY,
                required=False,
                description="exact key, reconciliation handle, provider ref, execution id or correlation id",
            ),
        ],
        responses={200: ReviewItemOutputSerializer(many=True)},
        summary="Operations waiting for a human decision",
    )
    @sql.planned_per_call()
    def get(self, request: Request) -> Response:
        query = ReviewItemListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.review_item_list(
            tenant_ids=[request.user.tenant.pk],
            provider=query.validated_data["provider"],
            older_than_seconds=query.validated_data["older_than_seconds"],
            search=query.validated_data["q"],
        )
        paginator = self.pagination_class()
        paginator.ordering = "id"
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response([review_item_representation(op) for op in page])


class ReviewDecisionApi(APIView):
    @extend_schema(
        request=DecisionInputSerializer,
        responses={200: ReviewItemOutputSerializer, 202: ApprovalOutputSerializer},
        summary="Record a review decision (note mandatory)",
        description="safe_to_retry where the tenant or the provider requires four-eyes approval answers 202 with"
        " the request a second person decides (ADR 0013); the operation stays in review until then.",
    )
    def post(self, request: Request, operation_id: int) -> Response:
        data = validated_input(DecisionInputSerializer, request)
        op = services.review_decision_record(
            operation_id=operation_id,
            decision=data["decision"],
            note=data["note"],
            provider_ref=data["provider_ref"],
            actor=request.user.actor,
            tenant_ids=[request.user.tenant.pk],
        )
        prefetch_related_objects([op], *selectors.review_evidence([op.tenant_id]))
        return Response(review_item_representation(op), status=200)
