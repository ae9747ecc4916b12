"""The providers API: an asynchronous provider's signed webhook (``ledger.execution.polling``),
a provider's detail (pause, throttle, caps), its adapter rollout (revisions, canary, promote,
roll back: ``ledger.providers.canary``), its intent schema and request template, and the
tenant's prompt templates (``ledger.providers.prompts``). Reading needs the ``read`` scope,
changing ``admin``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.execution import polling, rerun
from ledger.models import PromptTemplate, Provider, ProviderKind
from ledger.platform.errors import OperationNotFound
from ledger.protocol import services
from ledger.protocol.serializer_reuse import represented
from ledger.providers import canary, prompts, ratelimit, revisions
from ledger.recovery import recall
from ledger.rules.provider_checks import secret_env_names
from ledger.web.apis.operations import validated_input
from ledger.web.serializers import (
    CanaryInputSerializer,
    PromptTemplateInputSerializer,
    PromptTemplateOutputSerializer,
    ProviderIntentInputSerializer,
    ProviderIntentOutputSerializer,
    ProviderOutputSerializer,
    RerunInputSerializer,
    RerunOutputSerializer,
    RolloutMoveInputSerializer,
    RolloutOutputSerializer,
)

# --- Asynchronous providers' webhooks (ledger.execution.polling) -----------------------------------


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
            gates=data.get("gates"),
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
        # Its outputs are recalled too (ADR 0020).
        result, recalled = recall.revision_rollback_recall(
            provider_id=_tenant_provider(request, slug).pk,
            number=data.get("number"),
            actor=request.user.actor,
            reason=data["reason"],
            tenant_ids=[request.user.tenant.pk],
        )
        body = {**canary.provider_rollout(result.provider), "requeued": result.requeued, "recalled": recalled}
        return Response(represented(RolloutOutputSerializer, body))


class ProviderRerunApi(APIView):
    required_scope = "admin"

    @extend_schema(
        request=RerunInputSerializer,
        responses={200: RerunOutputSerializer},
        summary="Re-run a rolled-back revision's recalled outputs under the stable revision, as next key versions",
        description="Each operation whose output was recalled (quarantined or flagged) and that no newer version"
        " replaced is submitted again as the next version of its key ({record}:{action}:v{n+1}), under the"
        " provider's stable revision (ADR 0020); at most `limit` per call. Where the tenant or provider requires"
        " four eyes for re-sends (ADR 0013), the answer is 202 with the pending approval request.",
    )
    def post(self, request: Request, slug: str, number: int) -> Response:
        data = validated_input(RerunInputSerializer, request)
        result = rerun.recalled_outputs_rerun(
            tenant_id=request.user.tenant.pk,
            provider_id=_tenant_provider(request, slug).pk,
            number=number,
            actor=request.user.actor,
            reason=data["reason"],
            limit=data["limit"],
        )
        body = {
            "revision": result.revision,
            "stable_revision": result.stable,
            "count": len(result.rerun),
            "operations": [{"original": a, "operation": b, "key": k} for a, b, k in result.rerun],
        }
        return Response(represented(RerunOutputSerializer, body))


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
