"""Every choice list of the ledger's tables, declared once: the operation's states with, per
value, who moves rows out of it, their named groups and the table of allowed ``from → to``
moves (``ALLOWED_TRANSITIONS``), the checkpoint states a run shows, and the other enumerations
(modes, error classes, idempotency classes, attempt outcomes, provider kinds, configuration
change actions). The transitions (``ledger.protocol.transitions``), the console, the API and
the sweeper import these; nobody writes a status string literal twice."""

from __future__ import annotations

from django.db import models


class OperationStatus(models.TextChoices):
    # Every move out of a state is a named function in ledger.protocol.transitions (its __init__ lists
    # where each state is entered); nothing else writes a status (tests/test_state_writes.py).

    # execute mode: accepted, waiting for a worker. Out: a worker taking the lease
    # (operation_take); an operator's cancel (operation_cancel).
    QUEUED = "queued", "queued"
    # a lease is held; the effect may be under way. Out: the holder (operation_complete,
    # operation_fail, operation_wait); the sweeper once the lease has expired
    # (operation_lease_expire, operation_poll_lease_expire for a poll's lease); for a poll,
    # the poller past the lifetime (operation_poll_review) or the output check
    # (operation_output_reject).
    CLAIMED = "claimed", "claimed"
    # failed before the effect could have happened; next_attempt_at set. Out: the next
    # claim once due (guard: operation_reclaim), a worker once due (execute: operation_take),
    # the sweeper or a late claim at end of life (operation_expire_retry), an operator's
    # cancel (operation_cancel), the eligibility webhook's "not wanted" (operation_not_wanted),
    # a replay not retried in place or a run's resume (operation_replay_not_retried,
    # operation_redrive).
    RETRY_WAIT = "retry_wait", "retry wait"
    # sent to an asynchronous provider, which accepted it as a job (provider_ref holds its job
    # id); no lease is held; next_attempt_at is the next poll. Out: a worker's poll or the
    # provider's signed webhook (→ claimed under a short poll lease: operation_poll_take); the
    # sweeper when the lifetime passed and no worker polled it (→ review:
    # operation_unpolled_review). DESIGN §5, asynchronous providers.
    WAITING = "waiting", "waiting on provider"
    # outcome unknown (timeout/reset after send, lease expired after `sent`). Out: the
    # sweeper's reconciliation (operation_found_succeeded, operation_found_failed,
    # operation_found_waiting, operation_reissue, operation_not_found_failed,
    # operation_hand_to_review); the last holder's late operation_complete/operation_fail.
    UNCERTAIN = "uncertain", "uncertain"
    # a human must decide. Out: a reviewer's decision (operation_review_resolve); the last
    # holder's late operation_complete/operation_fail.
    REVIEW = "review", "review"
    # effect confirmed, provider_ref and response recorded. Terminal.
    SUCCEEDED = "succeeded", "succeeded"
    # the effect definitely did not happen and won't be retried; a DLQ entry exists.
    # Terminal (a replay creates lineage, never edits: operation_supersede records it).
    FAILED = "failed", "failed"
    # a reviewer decided not to do it, or an operator cancelled it while queued or waiting
    # for a retry. Terminal.
    ABANDONED = "abandoned", "abandoned"


S = OperationStatus
TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.ABANDONED})
OPEN_STATES = frozenset(set(S) - TERMINAL_STATES)
# States whose latest lease holder may still report a result (DESIGN §3 fencing).
REPORTABLE_STATES = frozenset({S.CLAIMED, S.UNCERTAIN, S.REVIEW})
UNRESOLVED_STATES = frozenset({S.UNCERTAIN, S.REVIEW})

# The only moves there are. Anything else is a bug and raises IllegalTransition.
ALLOWED_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({S.CLAIMED, S.QUEUED}),
    # → abandoned: an operator's cancel (operation_cancel), only while nothing is under way.
    S.QUEUED: frozenset({S.CLAIMED, S.ABANDONED}),
    # → waiting: an asynchronous provider accepted the job (or a poll found it still pending,
    # or a poll lease expired: polls change nothing at the provider).
    S.CLAIMED: frozenset({S.SUCCEEDED, S.FAILED, S.RETRY_WAIT, S.UNCERTAIN, S.REVIEW, S.WAITING}),
    S.RETRY_WAIT: frozenset({S.CLAIMED, S.FAILED, S.ABANDONED}),
    # → claimed: a poll or the provider's webhook takes it under a short lease; → review: its
    # lifetime passed while nobody polled it (the provider may still render).
    S.WAITING: frozenset({S.CLAIMED, S.REVIEW}),
    # → waiting: the sweeper's lookup found the asynchronous provider's job.
    S.UNCERTAIN: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.REVIEW, S.FAILED, S.WAITING}),
    S.REVIEW: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.ABANDONED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.ABANDONED: frozenset(),
}


class Checkpoint(models.TextChoices):
    """A step's state as its run shows it (DESIGN §3, runs): what an operator needs to know to
    resume a business transaction — done, failed (not done, and nothing will do it on its
    own), uncertain (may have happened), in progress, or pending (not yet, but it will be)."""

    PENDING = "pending", "pending"
    IN_PROGRESS = "in_progress", "in progress"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    UNCERTAIN = "uncertain", "uncertain"


# Every ledger state in exactly one checkpoint state; the runs API and console read this.
CHECKPOINT_OF: dict[str, str] = {
    S.QUEUED: Checkpoint.PENDING,
    # nothing happened yet; a worker (or, guard mode, its caller) retries it.
    S.RETRY_WAIT: Checkpoint.PENDING,
    S.CLAIMED: Checkpoint.IN_PROGRESS,
    # the provider has the job and is working on it; polls follow it.
    S.WAITING: Checkpoint.IN_PROGRESS,
    S.UNCERTAIN: Checkpoint.UNCERTAIN,
    S.REVIEW: Checkpoint.UNCERTAIN,
    S.SUCCEEDED: Checkpoint.DONE,
    S.FAILED: Checkpoint.FAILED,
    # not done, and decided so (a cancel, a reviewer, a newer version, "not wanted"): the run
    # shows why; a resume never re-drives it.
    S.ABANDONED: Checkpoint.FAILED,
}
assert set(CHECKPOINT_OF) == set(S.values), "every state needs its checkpoint state"


def sources_of(target: str) -> frozenset[str]:
    """Every state a row may move to ``target`` from, read off the table above."""
    return frozenset(s for s, targets in ALLOWED_TRANSITIONS.items() if s is not None and target in targets)


class OperationMode(models.TextChoices):
    GUARD = "guard", "guard (caller performs the effect)"
    EXECUTE = "execute", "execute (the service performs the effect)"


class ErrorClass(models.TextChoices):
    TRANSIENT = "transient", "transient"
    INVALID_INPUT = "invalid_input", "invalid input"
    PERMISSION = "permission", "permission"
    AMBIGUOUS = "ambiguous", "ambiguous"
    # The provider's output failed its checks (media type by content, size, dimensions,
    # digest: ledger.execution.outputs). Never published; no retry — with the same key a key-enforced
    # provider answers the same job, and so the same output.
    INVALID_OUTPUT = "invalid_output", "invalid output"


# Classes a holder reports through /fail. invalid_output is the service's own verdict on an
# output it fetched (ledger.execution.outputs records it with its own move), not a caller's report.
REPORTED_ERROR_CLASSES = (ErrorClass.TRANSIENT, ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION, ErrorClass.AMBIGUOUS)
# Failures that are final at once: retrying would be refused, or would fetch the same output.
NO_RETRY_ERROR_CLASSES = frozenset({ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION, ErrorClass.INVALID_OUTPUT})


class IdempotencyClass(models.TextChoices):
    # Re-issuing with the same key is safe (Stripe's Idempotency-Key, a unique constraint).
    KEY_ENFORCED = "key_enforced", "key-enforced"
    # Nothing stops a second effect (SMTP, webhooks): uncertain rows go to review.
    KEY_ADVISORY = "key_advisory", "key-advisory"


class AttemptOutcome(models.TextChoices):
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed (definitive)"
    # failed with a definitive "not done" answer; a retry is safe.
    TRANSIENT = "transient", "transient failure"
    # sent, answer unknown; stays so until reconciliation resolves it.
    AMBIGUOUS = "ambiguous", "ambiguous"
    # reconciliation established the effect did not happen.
    NOT_FOUND = "not_found", "not found at provider"
    # lease expired before anything was sent.
    EXPIRED = "expired", "lease expired before send"
    # the result arrived with a superseded token; kept here as evidence only.
    FENCED = "fenced", "fenced (superseded)"


class ProviderKind(models.TextChoices):
    # A receiver the tenant configured; execute-mode submissions name it.
    HTTP = "http", "HTTP provider"
    # The tenant's own callback receivers: operations created by the service only.
    CALLBACK = "callback", "callbacks (internal)"


class ConfigChangeAction(models.TextChoices):
    CREATE = "create", "created"
    UPDATE = "update", "changed"
    DELETE = "delete", "deleted"


class OutputState(models.TextChoices):
    """A published output's standing (ADR 0020). Moved only by
    ``ledger.recovery.recall.outputs_recall`` (the recall of a rolled-back revision's outputs)."""

    # Served to its tenant. Out: the recall pass once its revision was rolled back (→
    # quarantined when nobody consumed it yet, → flagged when its caller already had it).
    PUBLISHED = "published", "published"
    # Recalled before anyone consumed it: its bytes are no longer served (410
    # output_quarantined). Terminal; a re-run under the good revision is a new key version.
    QUARANTINED = "quarantined", "quarantined (rolled-back revision)"
    # Consumed before the recall: still served (the caller has it anyway), marked as produced
    # by a rolled-back revision in every answer and a recall callback. Terminal.
    FLAGGED = "flagged", "produced by a rolled-back revision"


OUTPUT_MOVES: dict[str, frozenset[str]] = {
    OutputState.PUBLISHED: frozenset({OutputState.QUARANTINED, OutputState.FLAGGED}),
    OutputState.QUARANTINED: frozenset(),
    OutputState.FLAGGED: frozenset(),
}
RECALLED_OUTPUT_STATES = frozenset({OutputState.QUARANTINED, OutputState.FLAGGED})


class VerdictValue(models.TextChoices):
    """What a consumer (or an evaluation manifest) said about an output (ADR 0020)."""

    ACCEPTED = "accepted", "accepted"
    REJECTED = "rejected", "rejected"


class VerdictSource(models.TextChoices):
    # The tenant's caller, through POST /api/v1/operations/{id}/output/verdict.
    CONSUMER = "consumer", "consumer"
    # The service's own scoring of an extraction output against its evaluation manifest.
    MANIFEST = "manifest", "evaluation manifest"
