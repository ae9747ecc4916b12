"""Named DLQ errors. Like the ledger's, each carries its HTTP status and stable code;
config.problems renders every DomainError as problem+json."""

from __future__ import annotations

from ledger.platform.errors import DomainError


class FailedEventNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class EventTooLarge(DomainError):
    status, code, title = 413, "payload_too_large", "Payload too large"


class NoteRequired(DomainError):
    code, title = "note_required", "A note is required"


class ConfirmationRequired(DomainError):
    code, title = "confirmation_required", "Confirmation required"


class ReplayTargetMissing(DomainError):
    status, code, title = 409, "replay_target_missing", "No replay target"


class ReplayInProgress(DomainError):
    """Another replay of the entry holds it (double click, two operators, the schedule)."""

    status, code, title = 409, "replay_in_progress", "Replay in progress"


class ReplayNeedsForce(DomainError):
    status, code, title = 409, "replay_needs_force", "Already replayed"


class FailedEventClosed(DomainError):
    status, code, title = 409, "failed_event_closed", "Entry is resolved or discarded"


class KeyOpenInNewerEntry(DomainError):
    """A forced re-replay of a closed entry whose business key a newer entry holds open: that
    entry (one open entry per key and target) is the one to replay."""

    status, code, title = 409, "key_open_in_newer_entry", "A newer entry holds this key"


class FailedEventBusy(DomainError):
    status, code, title = 409, "failed_event_busy", "Entry is being replayed"


class BulkReplayNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class BulkReplayNotConfirmable(DomainError):
    status, code, title = 409, "bulk_replay_not_confirmable", "Selection cannot be confirmed"


class BulkReplayTooLarge(DomainError):
    code, title = "bulk_selection_too_large", "Selection too large"


class BulkReplayRateLimited(DomainError):
    status, code, title = 429, "bulk_replay_rate_limited", "A bulk replay is already running"


class RunNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class RunNothingToResume(DomainError):
    """No step of the run is one a resume re-drives (failed with a replayable entry, or a
    guard-mode step resolved as not done)."""

    status, code, title = 409, "run_nothing_to_resume", "Nothing to resume"


class RunChangedSincePreview(DomainError):
    """The steps a resume would re-drive are not the ones the caller previewed."""

    status, code, title = 409, "run_changed_since_preview", "The run changed since the preview"


class ReplayNeedsDecision(DomainError):
    """The entry's first try may have acted and its target is key-advisory: nothing is sent
    until a person records the decision "safe to resend" with a reason (DESIGN §4)."""

    status, code, title = 409, "replay_needs_decision", "Replay waits for a decision"


class KeyNotSettable(DomainError):
    """A key set by hand only on an entry that has none and was never replayed; the key itself
    is checked by the key rule (ledger.rules.key_rules), refused as ``invalid_idempotency_key``."""

    status, code, title = 409, "key_not_settable", "The key cannot be set"


class ReplayOriginalInFlight(DomainError):
    """The entry's business key is held by its own workflow (or queued for a worker) right
    now: a replay would do the work a second time; nothing is sent (ADR 0007)."""

    status, code, title = 409, "replay_original_in_flight", "The key's own operation is under way"


class ReplayOriginalUnsettled(DomainError):
    """The entry's business key's operation is uncertain or in review: whether its work was
    done is being decided; nothing is sent until it is (ADR 0007)."""

    status, code, title = 409, "replay_original_unsettled", "The key's own operation is being reconciled"
