"""DLQ HTTP API: parse input, call a service or selector, render the output."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http.request import RawPostDataException
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dlq.entries import selectors
from dlq.entries import services as dlq_entries
from dlq.ingest import services as dlq_ingest
from dlq.models import BulkReplay, BulkReplayStatus
from dlq.replays import bulk as dlq_bulk
from dlq.replays import corrections as dlq_corrections
from dlq.replays import runs
from dlq.replays import services as dlq_replays
from dlq.rules.conf import dlq_setting
from dlq.rules.errors import EventTooLarge
from dlq.web.serializers import (
    BulkReplayInputSerializer,
    BulkReplayOutputSerializer,
    CloseInputSerializer,
    CorrectInputSerializer,
    CorrectOutputSerializer,
    FailedEventListQuerySerializer,
    FailedEventOutputSerializer,
    ReplayInputSerializer,
    ReplayOutputSerializer,
    RunOutputSerializer,
    RunResumeInputSerializer,
    RunResumeOutputSerializer,
    bulk_replay_representation,
    failed_event_representation,
    replay_representation,
    run_representation,
    run_resume_representation,
)
from ledger.platform.errors import ValidationFailed
from ledger.protocol import approvals
from ledger.protocol.representation import operation_representation
from ledger.store import sql
from ledger.web.apis.operations import validated_input
from ledger.web.pagination import KeysetCursorPagination
from ledger.web.serializers import ApprovalOutputSerializer, approval_representation

_LIST_PARAMS = [
    OpenApiParameter("status", str, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("workflow", str, OpenApiParameter.QUERY, required=False, description="source workflow id"),
    OpenApiParameter("error_class", str, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("failed_after", OpenApiTypes.DATETIME, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("failed_before", OpenApiTypes.DATETIME, OpenApiParameter.QUERY, required=False),
    OpenApiParameter(
        "match",
        str,
        OpenApiParameter.QUERY,
        required=False,
        many=True,
        description="path:value on a configured searchable payload path (repeatable; all must match)",
    ),
    OpenApiParameter("execution_id", str, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("key", str, OpenApiParameter.QUERY, required=False, description="original idempotency key"),
    OpenApiParameter("shape", str, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
    OpenApiParameter("page_size", int, OpenApiParameter.QUERY, required=False),
]


class FailedEventCursorPagination(KeysetCursorPagination):
    ordering = selectors.LIST_ORDERING
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def _list_filters(query: dict[str, Any], match: dict[str, str]) -> dict[str, Any]:
    return {
        "status": query.get("status"),
        "workflow": query.get("workflow"),
        "error_class": query.get("error_class"),
        "failed_after": query.get("failed_after"),
        "failed_before": query.get("failed_before"),
        "execution_id": query.get("execution_id"),
        "original_key": query.get("key"),
        "shape": query.get("shape"),
        "match": match,
    }


class FailedEventsApi(APIView):
    """GET lists the tenant's entries (read scope); POST ingests a failure (write scope)."""

    # Read by drf-spectacular: the GET answer is documented as a cursor page of entries.
    pagination_class = FailedEventCursorPagination

    @extend_schema(
        parameters=_LIST_PARAMS,
        responses={200: FailedEventOutputSerializer(many=True)},
        summary="List dead-letter entries (cursor-paginated, newest first)",
    )
    @sql.planned_per_call()
    def get(self, request: Request) -> Response:
        serializer = FailedEventListQuerySerializer(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        match = selectors.parse_match(request.query_params.getlist("match"))
        qs = selectors.failed_event_list(
            tenant_id=request.user.tenant.pk, **_list_filters(dict(serializer.validated_data), match)
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response([failed_event_representation(e) for e in page])

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[
            OpenApiParameter(
                "replay_target", str, OpenApiParameter.QUERY, required=False, description="replay target slug"
            ),
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="the original idempotency key of the failed work (if the body names none)",
            ),
        ],
        responses={201: FailedEventOutputSerializer, 200: FailedEventOutputSerializer},
        summary="Report a failure: our envelope, n8n's Error Trigger payload as is, or any JSON",
        description=(
            "Idempotent by the failure's identity: the same failure posted again answers 200 with the existing "
            "entry (an n8n `retryOf` counts as the same failure and bumps retry_count). Bodies over the DLQ size "
            "limit answer 413."
        ),
    )
    def post(self, request: Request) -> Response:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        too_large = dlq_ingest.event_too_large(declared)
        if too_large is not None:
            raise too_large
        try:
            raw = request.body
        except (RequestDataTooBig, RawPostDataException) as exc:
            limit = int(dlq_setting("MAX_EVENT_BYTES"))
            raise EventTooLarge(f"The event exceeds the limit of {limit} bytes.", extra={"limit": limit}) from exc
        result = dlq_ingest.failed_event_ingest(
            tenant=request.user.tenant,
            raw=raw,
            actor=request.user.actor,
            replay_target=request.query_params.get("replay_target", ""),
            explicit_key=request.headers.get("Idempotency-Key", ""),
        )
        body = failed_event_representation(result.event)
        body["ingest"] = result.outcome
        headers = {"Location": f"/api/v1/dlq/events/{result.event.pk}"}
        return Response(body, status=201 if result.created else 200, headers=headers)


class FailedEventDetailApi(APIView):
    @extend_schema(responses={200: FailedEventOutputSerializer}, summary="One entry with its replay history")
    def get(self, request: Request, event_id: int) -> Response:
        event = selectors.failed_event_get(tenant_id=request.user.tenant.pk, event_pk=event_id)
        body = failed_event_representation(event)
        body["replays"] = [replay_representation(r) for r in selectors.replay_history(event=event)]
        return Response(body)


class FailedEventReplayApi(APIView):
    @extend_schema(
        request=ReplayInputSerializer,
        responses={201: ReplayOutputSerializer, 202: ApprovalOutputSerializer},
        summary="Replay an entry to its target with the original idempotency key",
        description=(
            "409 replay_in_progress when another replay holds the entry; 409 replay_needs_force for an entry "
            "replayed already (send force=true and a note). as_new=true re-runs with a derived key {key}~r{n} "
            "and needs confirm=true and a note. The answer's `outcome` says what the target answered. "
            "409 replay_needs_decision: the entry's first try (or last replay) may have acted and its target is "
            'key-advisory; nothing was sent until the decision "safe to resend" is recorded (resend-decision). '
            "409 replay_original_in_flight / replay_original_unsettled: the key's own operation is held by its "
            "workflow now, or being reconciled; nothing was sent. A replay takes over the key's claim waiting for "
            "a retry, so its outcome answers that key. To a target whose acknowledgement is `echo`, a 2xx "
            "without Onceguard-Ack is outcome `ambiguous` (not acknowledged), never `succeeded`."
        ),
    )
    def post(self, request: Request, event_id: int) -> Response:
        data = validated_input(ReplayInputSerializer, request)
        replay = dlq_replays.failed_event_replay(
            tenant_id=request.user.tenant.pk,
            event_pk=event_id,
            actor=request.user.actor,
            target_slug=data["target"],
            force=data["force"],
            note=data["note"],
            as_new=data["as_new"],
            confirm=data["confirm"],
        )
        return Response(replay_representation(replay), status=201)


class FailedEventResendDecisionApi(APIView):
    @extend_schema(
        request=CloseInputSerializer,
        responses={200: FailedEventOutputSerializer, 202: ApprovalOutputSerializer},
        summary='Record the decision "safe to resend" (reason required)',
        description=(
            "For a pending entry whose first try may have acted (ambiguous) and whose target is key-advisory: the "
            "next replay is sent once. The decision, its actor and reason are in the entry's trail."
        ),
    )
    def post(self, request: Request, event_id: int) -> Response:
        data = validated_input(CloseInputSerializer, request)
        event = dlq_entries.failed_event_resend_decide(
            tenant_id=request.user.tenant.pk, event_pk=event_id, actor=request.user.actor, note=data["note"]
        )
        return Response(failed_event_representation(event))


class FailedEventResolveApi(APIView):
    @extend_schema(
        request=CloseInputSerializer, responses={200: FailedEventOutputSerializer}, summary="Mark resolved (note)"
    )
    def post(self, request: Request, event_id: int) -> Response:
        data = validated_input(CloseInputSerializer, request)
        event = dlq_entries.failed_event_resolve(
            tenant_id=request.user.tenant.pk, event_pk=event_id, actor=request.user.actor, note=data["note"]
        )
        return Response(failed_event_representation(event))


class FailedEventDiscardApi(APIView):
    @extend_schema(
        request=CloseInputSerializer, responses={200: FailedEventOutputSerializer}, summary="Mark discarded (note)"
    )
    def post(self, request: Request, event_id: int) -> Response:
        data = validated_input(CloseInputSerializer, request)
        event = dlq_entries.failed_event_discard(
            tenant_id=request.user.tenant.pk, event_pk=event_id, actor=request.user.actor, note=data["note"]
        )
        return Response(failed_event_representation(event))


def _waiting(bulk: BulkReplay) -> dict[str, Any] | None:
    """What of the selection will wait for a decision — while any of it can still be sent."""
    if bulk.status not in (BulkReplayStatus.DRAFT, BulkReplayStatus.RUNNING):
        return None
    return selectors.replay_waiting(
        tenant_id=bulk.tenant_id, event_ids=bulk.event_ids[bulk.position :], target_slug=bulk.target_slug
    )


class BulkReplayApi(APIView):
    @extend_schema(
        request=BulkReplayInputSerializer,
        responses={201: BulkReplayOutputSerializer, 202: BulkReplayOutputSerializer},
        summary="Bulk replay: a dry run freezes the selection; a second call with its id confirms it",
        description=(
            "`dry_run: true` with filters (status, workflow, error_class, failed_after, failed_before, match) "
            "answers 201 with the frozen selection (id, count, event_ids, digest); nothing is sent. "
            '`{"id": N}` (optionally with `count` to check) confirms: exactly those entries are replayed, '
            "paced, in the background (202). One bulk replay runs per tenant at a time (429 otherwise). Where the "
            "tenant or a provider of the selection requires four-eyes approval, the confirm answers 202 with the "
            "selection still a draft and `approval`: the request a second person decides (the dry run's note is its "
            "reason)."
        ),
    )
    def post(self, request: Request) -> Response:
        data = validated_input(BulkReplayInputSerializer, request)
        tenant = request.user.tenant
        if data.get("id") is not None:
            if not data["confirm"]:
                raise ValidationFailed("Send confirm=true (or leave it out) to confirm a selection.")
            try:
                bulk = dlq_bulk.bulk_replay_confirm(
                    tenant=tenant, bulk_id=data["id"], actor=request.user.actor, count=data.get("count")
                )
            except approvals.ApprovalPending as pending:
                # Four-eyes (ADR 0013): the draft waits for a second person, and says so.
                bulk = selectors.bulk_replay_get(tenant_id=tenant.pk, bulk_id=data["id"])
                body = bulk_replay_representation(bulk, waiting=_waiting(bulk))
                body["approval"] = approval_representation(pending.request)
                return Response(body, status=202, headers={"Location": f"/api/v1/approvals/{pending.request.pk}"})
            return Response(bulk_replay_representation(bulk, waiting=_waiting(bulk)), status=202)
        if not data["dry_run"]:
            raise ValidationFailed("A bulk replay starts with a dry run: send dry_run=true with the filters.")
        match = selectors.parse_match(data.get("match") or [])
        bulk = dlq_bulk.bulk_replay_prepare(
            tenant=tenant,
            filters={k: v for k, v in _list_filters(data, match).items() if k != "original_key"},
            actor=request.user.actor,
            target_slug=data["target"],
            force=data["force"],
            note=data["note"],
        )
        return Response(
            bulk_replay_representation(bulk, waiting=_waiting(bulk)),
            status=201,
            headers={"Location": f"/api/v1/dlq/replays/{bulk.pk}"},
        )


class BulkReplayDetailApi(APIView):
    @extend_schema(responses={200: BulkReplayOutputSerializer}, summary="A bulk replay's selection and progress")
    def get(self, request: Request, bulk_id: int) -> Response:
        bulk = selectors.bulk_replay_get(tenant_id=request.user.tenant.pk, bulk_id=bulk_id)
        return Response(bulk_replay_representation(bulk, waiting=_waiting(bulk)))


class FailedEventCorrectApi(APIView):
    @extend_schema(
        request=CorrectInputSerializer,
        responses={201: CorrectOutputSerializer, 202: ApprovalOutputSerializer},
        summary="Replay a (quarantined) entry with corrected fields, as the next version of its key",
        description=(
            "The key must be versioned ({record}:{action}:v{version}); the correction is version n+1 of the same "
            "record and action. Execute mode: `fields` are dotted paths into the stored request; the corrected "
            "request is submitted as the next version (same run and step), the original failed operation records it "
            "as `replaced_by`, and the entry is resolved pointing at it. Guard mode: the paths apply to the stored "
            "payload, which is replayed to the replay target under the next version's key. The entry, its payload "
            "and the original stay as evidence; the history records who changed which fields and why (`note`)."
        ),
    )
    def post(self, request: Request, event_id: int) -> Response:
        data = validated_input(CorrectInputSerializer, request)
        result = dlq_corrections.failed_event_correct(
            tenant_id=request.user.tenant.pk,
            event_pk=event_id,
            actor=request.user.actor,
            fields=data["fields"],
            note=data["note"],
            target_slug=data["target"],
        )
        body = {
            "entry": failed_event_representation(result.event),
            "key": result.key,
            "version": result.version,
            "operation": operation_representation(result.operation) if result.operation is not None else None,
            "replay": replay_representation(result.replay) if result.replay is not None else None,
        }
        return Response(body, status=201)


class RunDetailApi(APIView):
    @extend_schema(
        responses={200: RunOutputSerializer},
        summary="A run: its steps in order, each in a checkpoint state, and what a resume would re-drive",
        description=(
            "A run is the operations sent with this `run` id, or without one whose `correlation_id` it is. Each "
            "step's `checkpoint` is one of pending, in_progress, done, failed, uncertain (of the newest operation in "
            "its lineage); `safe_to_repeat` says whether repeating it can add a second effect; `will_resume` marks "
            "what `POST …/resume` would re-drive (`resume.operations`). URL-encode the run id."
        ),
    )
    @sql.planned_per_call()
    def get(self, request: Request, run_id: str) -> Response:
        view = runs.run_view(tenant_id=request.user.tenant.pk, run=run_id)
        return Response(run_representation(view))


class RunResumeApi(APIView):
    @extend_schema(
        request=RunResumeInputSerializer,
        responses={201: RunResumeOutputSerializer, 200: RunOutputSerializer, 202: ApprovalOutputSerializer},
        summary="Resume a run: re-drive only its failed steps through the DLQ replay path (audited)",
        description=(
            "`preview: true` answers the run (200) with `resume.operations`, doing nothing. Otherwise the failed "
            "steps with a pending, non-quarantined DLQ entry — and guard-mode steps resolved as not done — are "
            "re-driven: execute-mode steps to their provider under the original key, guard-mode steps to the replay "
            "target (`target`, else the entry's, else the tenant's default). Send the previewed `operations` to be "
            "refused (409 run_changed_since_preview) if the plan changed. 409 run_nothing_to_resume when no step "
            "qualifies. The answer (201) is the recorded resume with each step's replay outcome."
        ),
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = validated_input(RunResumeInputSerializer, request)
        tenant_id = request.user.tenant.pk
        if data["preview"]:
            return Response(run_representation(runs.run_view(tenant_id=tenant_id, run=run_id)))
        resume = runs.run_resume(
            tenant_id=tenant_id,
            run=run_id,
            actor=request.user.actor,
            note=data["note"],
            target_slug=data["target"],
            expected=data["operations"],
        )
        return Response(run_resume_representation(resume), status=201)
