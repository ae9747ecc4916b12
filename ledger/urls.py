from django.urls import path

from ledger.web import apis

urlpatterns = [
    path("claims", apis.ClaimCreateApi.as_view(), name="claim-create"),
    path("keys/derive", apis.KeyDeriveApi.as_view(), name="key-derive"),
    path("operations", apis.OperationListApi.as_view(), name="operation-list"),
    path("operations/<int:operation_id>", apis.OperationDetailApi.as_view(), name="operation-detail"),
    path("operations/<int:operation_id>/attempts", apis.OperationAttemptsApi.as_view(), name="operation-attempts"),
    path("operations/<int:operation_id>/sent", apis.OperationSentApi.as_view(), name="operation-sent"),
    path("operations/<int:operation_id>/complete", apis.OperationCompleteApi.as_view(), name="operation-complete"),
    path("operations/<int:operation_id>/fail", apis.OperationFailApi.as_view(), name="operation-fail"),
    path("operations/<int:operation_id>/heartbeat", apis.OperationHeartbeatApi.as_view(), name="operation-heartbeat"),
    path("operations/<int:operation_id>/output", apis.OperationOutputApi.as_view(), name="operation-output"),
    path(
        "operations/<int:operation_id>/output/content",
        apis.OperationOutputContentApi.as_view(),
        name="operation-output-content",
    ),
    path("operations/<int:operation_id>/manifest", apis.OperationManifestApi.as_view(), name="operation-manifest"),
    path(
        "operations/<int:operation_id>/manifest-score",
        apis.OperationManifestScoreApi.as_view(),
        name="operation-manifest-score",
    ),
    path(
        "operations/<int:operation_id>/output/verdict",
        apis.OperationOutputVerdictApi.as_view(),
        name="operation-output-verdict",
    ),
    path("uploads", apis.UploadCreateApi.as_view(), name="upload-create"),
    path("uploads/<str:key>", apis.UploadDetailApi.as_view(), name="upload-detail"),
    path("uploads/<str:key>/content", apis.UploadContentApi.as_view(), name="upload-content"),
    path("providers/<slug:slug>", apis.ProviderDetailApi.as_view(), name="provider-detail"),
    path("webhooks/<slug:tenant>/<slug:slug>", apis.ProviderWebhookApi.as_view(), name="provider-webhook"),
    path("providers/<slug:slug>/revisions", apis.ProviderRolloutApi.as_view(), name="provider-revisions"),
    path("providers/<slug:slug>/intent", apis.ProviderIntentApi.as_view(), name="provider-intent"),
    path("attempt-evidence", apis.AttemptEvidenceListApi.as_view(), name="attempt-evidence-list"),
    path("approvals", apis.ApprovalListApi.as_view(), name="approval-list"),
    path("approvals/<int:approval_id>", apis.ApprovalDetailApi.as_view(), name="approval-detail"),
    path("approvals/<int:approval_id>/approve", apis.ApprovalApproveApi.as_view(), name="approval-approve"),
    path("approvals/<int:approval_id>/reject", apis.ApprovalRejectApi.as_view(), name="approval-reject"),
    path("prompt-templates", apis.PromptTemplateListApi.as_view(), name="prompt-template-list"),
    path(
        "providers/<slug:slug>/revisions/<int:number>/canary",
        apis.ProviderCanaryApi.as_view(),
        name="provider-revision-canary",
    ),
    path("providers/<slug:slug>/revisions/promote", apis.ProviderPromoteApi.as_view(), name="provider-promote"),
    path("providers/<slug:slug>/revisions/rollback", apis.ProviderRollbackApi.as_view(), name="provider-rollback"),
    path(
        "providers/<slug:slug>/revisions/<int:number>/rerun",
        apis.ProviderRerunApi.as_view(),
        name="provider-revision-rerun",
    ),
]
