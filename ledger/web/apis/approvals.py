"""The four-eyes API (ADR 0013): a tenant's re-sends waiting for a second person, and their
approval or rejection. Reading needs ``read``; deciding needs the ``approve`` scope itself —
not implied by ``admin`` or ``write``, so the key that asks for a re-send cannot also be the
one that approves it unless someone granted both on purpose (and even then the server refuses
the requester: ``403 approval_by_requester``).

A re-send is asked for through its own endpoint (replay, bulk replay, correct, resend decision,
run resume, review decision): where approval is required it answers ``202`` with the request
(``config.problems`` turns ``ApprovalPending`` into that answer)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.models import ApprovalStatus
from ledger.protocol import approvals
from ledger.web.apis.operations import validated_input
from ledger.web.pagination import KeysetCursorPagination
from ledger.web.serializers import (
    ApprovalDecisionInputSerializer,
    ApprovalListQuerySerializer,
    ApprovalOutputSerializer,
    approval_representation,
)

APPROVE_SCOPE = "approve"


class ApprovalCursorPagination(KeysetCursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class ApprovalListApi(APIView):
    pagination_class = ApprovalCursorPagination

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "status",
                str,
                OpenApiParameter.QUERY,
                required=False,
                enum=ApprovalStatus.values,
            ),
            OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("page_size", int, OpenApiParameter.QUERY, required=False),
        ],
        responses={200: ApprovalOutputSerializer(many=True)},
        summary="Re-sends waiting for (or given) a second person's approval, newest first",
    )
    def get(self, request: Request) -> Response:
        query = ApprovalListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = approvals.approval_requests_of(tenant_ids=[request.user.tenant.pk]).select_related("provider")
        if query.validated_data["status"]:
            rows = rows.filter(status=query.validated_data["status"])
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(rows.order_by("-id"), request, view=self)
        return paginator.get_paginated_response([approval_representation(r) for r in page])


class ApprovalDetailApi(APIView):
    @extend_schema(responses={200: ApprovalOutputSerializer}, summary="One approval request")
    def get(self, request: Request, approval_id: int) -> Response:
        row = approvals.approval_request_get(tenant_id=request.user.tenant.pk, request_id=approval_id)
        return Response(approval_representation(row))


class ApprovalApproveApi(APIView):
    required_scope = APPROVE_SCOPE

    @extend_schema(
        request=ApprovalDecisionInputSerializer,
        responses={200: ApprovalOutputSerializer},
        summary="Approve a re-send (the approve scope; not the requester): it is sent now, in your name",
        description=(
            "The re-send runs through the same service as a direct one; the answer's `status` is `executed` "
            "(with `outcome` saying what the receiver answered) or `failed` (the service refused: the entry moved "
            "meanwhile). 403 approval_by_requester: you asked for it. 409 approval_not_pending: another approver "
            "was first, or it was rejected or expired."
        ),
    )
    def post(self, request: Request, approval_id: int) -> Response:
        data = validated_input(ApprovalDecisionInputSerializer, request)
        row = approvals.approval_request_approve(
            tenant_id=request.user.tenant.pk, request_id=approval_id, actor=request.user.actor, reason=data["reason"]
        )
        return Response(approval_representation(row))


class ApprovalRejectApi(APIView):
    required_scope = APPROVE_SCOPE

    @extend_schema(
        request=ApprovalDecisionInputSerializer,
        responses={200: ApprovalOutputSerializer},
        summary="Reject a re-send (the approve scope; not the requester): nothing is sent",
    )
    def post(self, request: Request, approval_id: int) -> Response:
        data = validated_input(ApprovalDecisionInputSerializer, request)
        row = approvals.approval_request_reject(
            tenant_id=request.user.tenant.pk, request_id=approval_id, actor=request.user.actor, reason=data["reason"]
        )
        return Response(approval_representation(row))
