"""Review API: list items waiting for a human, record a decision."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers as drf_serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.apis import OperationCursorPagination, validated_input
from review import selectors, services
from review.serializers import DecisionInputSerializer, ReviewItemOutputSerializer, review_item_representation


class ReviewItemListApi(APIView):
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
    def get(self, request: Request) -> Response:
        older = request.query_params.get("older_than_seconds")
        try:
            older_than = float(older) if older not in (None, "") else None
        except ValueError as exc:
            raise drf_serializers.ValidationError({"older_than_seconds": ["must be a number"]}) from exc
        rows = selectors.review_item_list(
            tenant_ids=[request.user.tenant.pk],
            provider=request.query_params.get("provider", ""),
            older_than_seconds=older_than,
            search=request.query_params.get("q", ""),
        )
        paginator = OperationCursorPagination()
        paginator.ordering = "id"
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response([review_item_representation(op) for op in page])


class ReviewDecisionApi(APIView):
    @extend_schema(
        request=DecisionInputSerializer,
        responses={200: ReviewItemOutputSerializer},
        summary="Record a review decision (note mandatory)",
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
        return Response(review_item_representation(op), status=200)
