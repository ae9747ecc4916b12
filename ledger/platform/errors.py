"""Named domain errors. Each carries its HTTP status and stable problem code (DESIGN §5);
config.problems maps them to RFC 9457 problem+json in one place."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    status: int = 400
    code: str = "bad_request"
    title: str = "Bad request"

    def __init__(self, detail: str = "", *, retry_after: int | None = None, extra: dict[str, Any] | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.retry_after = retry_after
        self.extra = extra or {}


class InvalidKey(DomainError):
    code, title = "invalid_idempotency_key", "Invalid idempotency key"


class UnknownProvider(DomainError):
    code, title = "unknown_provider", "Unknown provider"


class ReservedProvider(DomainError):
    """A claim or submission naming one of the service's own providers (slugs beginning with
    ``_``, such as each tenant's ``_callbacks``): only the service claims under them."""

    code, title = "reserved_provider", "Reserved provider"


class ValidationFailed(DomainError):
    code, title = "validation_error", "Request is not valid"


# Input refused at the door because, once stored, some read could not render it
# (ledger.platform.storable has the rules).
class MalformedJson(DomainError):
    code, title = "malformed_json", "Malformed request body"


class TimestampOutOfRange(DomainError):
    code, title = "timestamp_out_of_range", "Timestamp out of range"


class InvalidCursor(DomainError):
    code, title = "invalid_cursor", "Invalid cursor"


class InvalidQueryParameter(DomainError):
    code, title = "invalid_query_parameter", "Invalid query parameter"


class LookupNotOffered(InvalidQueryParameter):
    """A console list asked to filter by what it does not offer, or by a value its filter
    cannot take (ledger.web.console_base): a 400 page, never a list filtered by it."""

    code, title = "lookup_not_offered", "Not a filter of this list"


class KeyReusedWithDifferentRequest(DomainError):
    status, code, title = 422, "key_reused_with_different_request", "Key reused with a different request"


class OperationInProgress(DomainError):
    status, code, title = 409, "operation_in_progress", "Operation in progress"


class OperationRetryScheduled(DomainError):
    status, code, title = 409, "operation_retry_scheduled", "Retry scheduled"


class OperationNeedsReconciliation(DomainError):
    status, code, title = 409, "operation_needs_reconciliation", "Operation outcome is being reconciled"


class OperationHeldAfterRestore(DomainError):
    """A claim of a key the fence journal says may have been performed, which the database —
    restored from a backup — does not know (ADR 0012): held until a person resolves it or the
    provider's lookup proves the outcome. Retrying does not help; the console lists the hold."""

    status, code, title = 409, "operation_held_after_restore", "Held: the database was restored from a backup"


class FenceJournalUnavailable(DomainError):
    """The fence journal (ADR 0012) could not be written: the move that needed it was not
    committed, so nothing is recorded as sent or finished that the journal does not know. Like
    an unreachable database: try again shortly."""

    status, code, title = 503, "fence_journal_unavailable", "Fence journal unavailable"


class OperationManagedByService(DomainError):
    status, code, title = 409, "operation_managed_by_service", "Operation is executed by the service"


class OperationAlreadyFinished(DomainError):
    status, code, title = 409, "operation_already_finished", "Operation already finished"


class LeaseLost(DomainError):
    """The token is not the latest attempt's, or the row left the state that token held."""

    status, code, title = 409, "lease_lost", "Lease lost"


class LeaseExpired(DomainError):
    status, code, title = 409, "lease_expired", "Lease expired"


class IllegalTransition(DomainError):
    status, code, title = 409, "illegal_transition", "Illegal state transition"


class OperationNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class OperationNotCancellable(DomainError):
    """Cancel (and retry now) act only on rows nothing is under way for: ``queued`` and
    ``retry_wait`` (retry now: execute mode only; a guard-mode row waits for its caller)."""

    status, code, title = 409, "operation_not_cancellable", "Operation cannot be changed that way"


class OperationVersionSuperseded(DomainError):
    """A versioned key (``{record}:{action}:v{version}``) older than a version of the same
    record and action that succeeded, or older than one already claimed when it is new.
    ``replaced_by`` names the newer operation (not the DLQ's ``superseded_by``)."""

    status, code, title = 409, "operation_version_superseded", "A newer version of this record and action exists"


class AdmissionRefused(DomainError):
    status, code, title = 429, "admission_refused", "Admission refused"


class DestinationNotAllowed(DomainError):
    """A URL the outbound policy refuses (ledger.rules.outbound): a special address the deployment
    does not allow, or a URL that is not in canonical form."""

    code, title = "destination_not_allowed", "Destination not allowed"


class ReservedKey(DomainError):
    """Keys of the service's own key spaces (``replay:…``, ``callback:…``, ``…~r{n}``)."""

    code, title = "reserved_idempotency_key", "Reserved idempotency key"


class AdapterRolloutConflict(DomainError):
    """An adapter revision move that the provider's rollout state does not allow now: a
    change while a canary runs (promote or roll it back first), a promotion without a
    canary, or a move that lost a race with another one (ledger.providers.canary)."""

    status, code, title = 409, "adapter_rollout_conflict", "The adapter rollout does not allow that now"


# --- Four-eyes approval of re-sends (ADR 0013) ------------------------------------------------


class ApprovalNotFound(DomainError):
    status, code, title = 404, "approval_not_found", "No such approval request"


class ApprovalNotPending(DomainError):
    """Approved, rejected or expired already — by another approver, or by the clock."""

    status, code, title = 409, "approval_not_pending", "The approval request is not pending"


class ApprovalBySameActor(DomainError):
    """Four eyes: whoever asked for a re-send cannot approve it (nor reject it: they withdraw
    it by letting it expire, or ask someone else)."""

    status, code, title = 403, "approval_by_requester", "The requester cannot decide their own request"


class ApprovalRequired(DomainError):
    """A re-send reached the sending path without an approved request while its tenant or
    provider requires one: a path that forgot to ask is refused, never sent."""

    status, code, title = 403, "approval_required", "This re-send needs a second person's approval"


class PlatformOwnedSetting(DomainError):
    """A setting the platform owns (a tenant's or provider's four-eyes requirement) changed by
    a tenant-scoped actor."""

    status, code, title = 403, "platform_owned_setting", "This setting is the platform's"


class TakeShareAboveDeployment(DomainError):
    """A tenant's take_share above the deployment's EXECUTE_TENANT_MAX_SHARE (ADR 0021)."""

    status, code, title = 422, "take_share_above_deployment", "Share above the deployment's bound"


class TakeInFlightAboveDeployment(DomainError):
    """A tenant's take_max_in_flight above the deployment's per-tenant or system-wide cap (ADR
    0021): a tenant's own cap may only lower the deployment's."""

    status, code, title = 422, "take_in_flight_above_deployment", "In-flight cap above the deployment's"
