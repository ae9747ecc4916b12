"""Models: the ledger's tables, states and constraints. No business logic: writes live in the
transitions and services of the rooms above.

By purpose: ``states`` (every choice list: the operation's states, who moves rows out of each,
the allowed moves; the other enumerations), ``fields`` (the ledger's own column types and
lookups), ``tenants`` (the tenant, its API keys, configuration changes, workflow names),
``providers`` (providers, their rate buckets, adapter revisions, prompt templates),
``operations`` (operations, attempts, events, admission refusals, tombstones), ``manifests``
(evaluation manifests and the scores of extractions against them, ADR 0022), ``evidence``
(failed attempts' de-identified evidence, ADR 0016), ``objects`` (uploads and published
outputs), ``approvals`` (four-eyes requests for re-sends, ADR 0013), ``fencing`` (the ledger's
identity and epoch, restore holds).

Import from the package (``from ledger.models import Operation``), as Django's convention and
the migrations do: it names every model, choice, field and helper of the modules below, so a
move between them changes no importer.

May import: ``ledger.rules``, ``ledger.platform``.
"""

from ledger.models.approvals import (  # noqa: F401
    APPROVAL_DECIDED_STATES,
    APPROVAL_MOVES,
    APPROVAL_OPEN_STATES,
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
)
from ledger.models.evidence import EVIDENCE_ERROR_LENGTH, AttemptEvidence  # noqa: F401
from ledger.models.fencing import (  # noqa: F401
    FENCE_RELEASED,
    FenceHold,
    FenceHoldResolution,
    LedgerIdentity,
)
from ledger.models.fields import (  # noqa: F401
    ENVELOPE,
    STORED_JSON,
    STORED_SEALED,
    Counter,
    HexBytesField,
    NewRowId,
    SealedHasKey,
    SealedJSONField,
    SealedUnder,
    bytes_to_hex,
    bytes_to_sealed,
    hex_to_bytes,
    sealed_to_bytes,
)
from ledger.models.manifests import (  # noqa: F401
    MANIFEST_SCORE_FINAL,
    MANIFEST_SCORE_MOVES,
    ManifestScore,
    ManifestScoreStatus,
    OperationManifest,
)
from ledger.models.objects import OperationOutput, OutputVerdict, Upload  # noqa: F401
from ledger.models.operations import (  # noqa: F401
    SEARCH_SEPARATOR,
    AdmissionRefusalCount,
    Attempt,
    OpenOperation,
    Operation,
    OperationEvent,
    OperationSearch,
    Tombstone,
)
from ledger.models.providers import (  # noqa: F401
    ADAPTER_FIELDS,
    ASYNC_ADAPTER_FIELDS,
    PROVIDER_CAP_FIELDS,
    AdapterRevision,
    PromptTemplate,
    Provider,
    ProviderRate,
    prompt_slots_of,
    provider_caps_errors,
)
from ledger.models.states import (  # noqa: F401
    ALLOWED_TRANSITIONS,
    CHECKPOINT_OF,
    NO_RETRY_ERROR_CLASSES,
    OPEN_STATES,
    OUTPUT_MOVES,
    RECALLED_OUTPUT_STATES,
    REPORTABLE_STATES,
    REPORTED_ERROR_CLASSES,
    TERMINAL_STATES,
    UNRESOLVED_STATES,
    AttemptOutcome,
    Checkpoint,
    ConfigChangeAction,
    ErrorClass,
    IdempotencyClass,
    OperationMode,
    OperationStatus,
    OutputState,
    ProviderKind,
    S,
    VerdictSource,
    VerdictValue,
    sources_of,
)
from ledger.models.tenants import (  # noqa: F401
    ApiKey,
    ConfigChange,
    Tenant,
    TenantManager,
    WorkflowName,
    secret_namespace_for,
)
