"""A person's data trail over the API: look it up, export it for an access
request, erase on request.

Identifiers travel in the JSON body, never in a URL: query strings and paths end up in proxy
and server access logs, browser history and referrers. Hence ``POST`` for the lookup too.
The key's tenant bounds everything. Who may do what:

* the trail and its masked export: scope ``audit`` (or ``admin``, which implies it) — a
  trail is about a person, so ``read`` is not enough; every lookup and export is logged
  (access log, with the reason) and appears in the trail itself;
* the export with the person's data decrypted (an access request): also scope ``payload``,
  the scope a reveal needs;
* an erasure: scope ``admin``.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.platform.errors import ValidationFailed
from ledger.protocol.serializer_reuse import validated_data
from review.audit.accesslog import accesslog_append
from review.models import AccessAction, ErasureRun
from review.privacy.apis import PAYLOAD_SCOPE
from review.privacy.erasure import ErasureNotFound, erasure_request
from review.privacy.erasure_n8n import n8n_report
from review.privacy.payloads import MIN_REASON_LENGTH
from review.privacy.subjects import (
    EXPORT_FORMATS,
    Subject,
    Trail,
    erasure_summary,
    subject_resolve,
    subject_trail,
    trail_csv,
    trail_document,
    trail_values,
)
from review.staff.security import client_ip

AUDIT_SCOPE = "audit"


class SubjectInputSerializer(serializers.Serializer):
    identifiers = serializers.DictField(
        child=serializers.CharField(max_length=254, allow_blank=True),
        help_text='kind → value, e.g. {"email": "…", "phone": "…"} (phone, email, or a configured kind)',
    )
    reason = serializers.CharField(
        min_length=MIN_REASON_LENGTH, max_length=500, help_text="why (logged; e.g. the access request's reference)"
    )


class ErasureInputSerializer(SubjectInputSerializer):
    n8n_executions = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="also delete the n8n executions that carried their data, through the tenant's n8n connection"
        " (default: when the tenant has an active one); those not deleted are listed in `n8n.left`",
    )


class SubjectExportInputSerializer(SubjectInputSerializer):
    format = serializers.ChoiceField(choices=EXPORT_FORMATS, default="json")
    decrypt = serializers.BooleanField(
        default=False, help_text="include the person's data in clear (needs the `payload` scope)"
    )


class SubjectTrailOutputSerializer(serializers.Serializer):
    """Documentation of the trail answer."""

    tenant = serializers.IntegerField()
    subject = serializers.DictField(help_text="kinds asked for and their keyed references (never the values)")
    decrypted = serializers.BooleanField()
    truncated = serializers.BooleanField()
    records = serializers.ListField(child=serializers.DictField())
    events = serializers.ListField(child=serializers.DictField(), help_text="oldest first")
    erasures = serializers.ListField(child=serializers.DictField())


class ErasureOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    subject_ref = serializers.CharField()
    records = serializers.IntegerField()
    cursor = serializers.IntegerField()
    counts = serializers.DictField()
    summary = serializers.CharField()
    n8n = serializers.DictField(
        help_text="n8n's copies: delete (asked), executions, cursor, deleted, and left — each execution not deleted"
        " with its workflow, outcome, reason and action (to remove by hand, or not found in n8n)"
    )
    requested_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


def _body(request: Request, serializer: type[serializers.Serializer]) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ValidationFailed("The request body must be a JSON object.")
    return validated_data(serializer, request.data)


def _log(
    request: Request, *, action: str, subject: Subject, reason: str, fields: list[str], object_id: str = ""
) -> None:
    accesslog_append(
        tenant_id=request.user.tenant.pk,
        action=action,
        actor=request.user.actor,
        object_type="subject",
        object_id=object_id,
        object_ref=subject.ref_text,
        fields=fields,
        reason=reason,
        ip=client_ip(request),
    )


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


def erasure_representation(run: ErasureRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "state": run.state,
        "subject_ref": run.subject_ref,
        "records": len(run.targets),
        "cursor": run.cursor,
        "counts": {
            name: getattr(run, name)
            for name in (
                "operations",
                "failed_events",
                "attempts",
                "replays",
                "outputs",
                "uploads",
                "texts",
                "index_entries",
                "cancelled",
                "discarded",
                "missing",
            )
        },
        "summary": erasure_summary(run),
        "n8n": n8n_report(run),
        "passes": run.passes,
        "requested_at": run.requested_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


class SubjectTrailApi(APIView):
    required_scope = AUDIT_SCOPE

    @extend_schema(
        request=SubjectInputSerializer,
        responses={200: SubjectTrailOutputSerializer},
        summary="A person's data trail: their records and every event on them (scope `audit`; logged)",
    )
    def post(self, request: Request) -> Response:
        data = _body(request, SubjectInputSerializer)
        subject = subject_resolve(data["identifiers"])
        trail = subject_trail(tenant_id=request.user.tenant.pk, subject=subject)
        _log(request, action=AccessAction.SUBJECT_SEARCH, subject=subject, reason=data["reason"], fields=["trail"])
        return _no_store(Response(trail_document(trail, data=None)))


def export_response(trail: Trail, *, fmt: str, decrypted: bool) -> HttpResponse:
    """The export as a download (the caller has checked permission and written the log row)."""
    document = trail_document(trail, data=trail_values(trail) if decrypted else None)
    name = f"subject-trail-{trail.tenant_id}-{'data' if decrypted else 'masked'}"
    if fmt == "csv":
        response = HttpResponse(trail_csv(document), content_type="text/csv; charset=utf-8")
    else:
        body = json.dumps(document, ensure_ascii=False, indent=2).encode()
        response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return _no_store(response)


class SubjectExportApi(APIView):
    required_scope = AUDIT_SCOPE

    @extend_schema(
        request=SubjectExportInputSerializer,
        responses={(200, "application/json"): SubjectTrailOutputSerializer, (200, "text/csv"): str},
        summary="Export a person's trail as JSON or CSV; `decrypt` adds their data (scope `payload` too; logged)",
    )
    def post(self, request: Request) -> HttpResponse:
        data = _body(request, SubjectExportInputSerializer)
        if data["decrypt"] and PAYLOAD_SCOPE not in request.user.scopes:
            raise exceptions.PermissionDenied(
                "Exporting a person's data in clear needs an API key with the 'payload' scope."
            )
        subject = subject_resolve(data["identifiers"])
        trail = subject_trail(tenant_id=request.user.tenant.pk, subject=subject)
        what = [f"{data['format']} export", "data in clear" if data["decrypt"] else "masked"]
        # Logged before anything is read in clear, like a reveal.
        _log(request, action=AccessAction.EXPORT, subject=subject, reason=data["reason"], fields=what)
        return export_response(trail, fmt=data["format"], decrypted=data["decrypt"])


class SubjectErasureCreateApi(APIView):
    required_scope = "admin"

    @extend_schema(
        request=ErasureInputSerializer,
        responses={202: ErasureOutputSerializer, 200: ErasureOutputSerializer},
        summary="Erase a person's data on request: a recorded, resumable run (scope `admin`)",
    )
    def post(self, request: Request) -> Response:
        data = _body(request, ErasureInputSerializer)
        subject = subject_resolve(data["identifiers"])
        run, created = erasure_request(
            tenant_id=request.user.tenant.pk,
            subject=subject,
            actor=request.user.actor,
            reason=data["reason"],
            ip=client_ip(request),
            delete_n8n_executions=data.get("n8n_executions"),
        )
        return _no_store(Response(erasure_representation(run), status=202 if created else 200))


class SubjectErasureDetailApi(APIView):
    required_scope = AUDIT_SCOPE

    @extend_schema(responses={200: ErasureOutputSerializer}, summary="An erasure run's progress and what it touched")
    def get(self, request: Request, erasure_id: int) -> Response:
        run = ErasureRun.objects.filter(pk=erasure_id, tenant_id=request.user.tenant.pk).first()
        if run is None:
            raise ErasureNotFound("No such erasure run.")
        return Response(erasure_representation(run))
