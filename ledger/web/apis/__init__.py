"""The ledger's HTTP API views (``ledger.urls`` names them from here): parse input, call a
service or selector, render the output.

- ``operations``: claims, submissions, the holder's reports, operations and their attempts,
  derived keys; with the request helpers every view uses (``validated_input``, ``claim_key``,
  ``operation_response``).
- ``files``: uploads and validated outputs, their facts and bytes.
- ``approvals``: four-eyes requests for re-sends, their approval and rejection (ADR 0013).
- ``providers``: provider webhooks, a provider's caps and adapter rollout, intents, prompt
  templates.
- ``evidence``: failed attempts' evidence (ADR 0016).
- ``manifests``: evaluation manifests and extraction scores (ADR 0022).
"""

from ledger.web.apis.approvals import (
    ApprovalApproveApi,
    ApprovalDetailApi,
    ApprovalListApi,
    ApprovalRejectApi,
)
from ledger.web.apis.evidence import AttemptEvidenceListApi
from ledger.web.apis.files import (
    OperationOutputApi,
    OperationOutputContentApi,
    OperationOutputVerdictApi,
    UploadContentApi,
    UploadCreateApi,
    UploadDetailApi,
)
from ledger.web.apis.manifests import OperationManifestApi, OperationManifestScoreApi
from ledger.web.apis.operations import (
    ClaimCreateApi,
    KeyDeriveApi,
    OperationAttemptsApi,
    OperationCompleteApi,
    OperationDetailApi,
    OperationFailApi,
    OperationHeartbeatApi,
    OperationListApi,
    OperationSentApi,
)
from ledger.web.apis.providers import (
    PromptTemplateListApi,
    ProviderCanaryApi,
    ProviderDetailApi,
    ProviderIntentApi,
    ProviderPromoteApi,
    ProviderRerunApi,
    ProviderRollbackApi,
    ProviderRolloutApi,
    ProviderWebhookApi,
)

__all__ = [
    "AttemptEvidenceListApi",
    "ApprovalApproveApi",
    "ApprovalDetailApi",
    "ApprovalListApi",
    "ApprovalRejectApi",
    "ClaimCreateApi",
    "KeyDeriveApi",
    "OperationAttemptsApi",
    "OperationCompleteApi",
    "OperationDetailApi",
    "OperationFailApi",
    "OperationHeartbeatApi",
    "OperationListApi",
    "OperationManifestApi",
    "OperationManifestScoreApi",
    "OperationOutputApi",
    "OperationOutputContentApi",
    "OperationOutputVerdictApi",
    "OperationSentApi",
    "PromptTemplateListApi",
    "ProviderCanaryApi",
    "ProviderDetailApi",
    "ProviderIntentApi",
    "ProviderPromoteApi",
    "ProviderRerunApi",
    "ProviderRollbackApi",
    "ProviderRolloutApi",
    "ProviderWebhookApi",
    "UploadContentApi",
    "UploadCreateApi",
    "UploadDetailApi",
]
