"""The DLQ's states and choice lists, declared once: an entry's states with who moves entries
out of each and the allowed moves (``FE_ALLOWED_TRANSITIONS``, enforced by
``dlq.entries.transitions``), the open and terminal groups, where an entry's payload and key
came from, and what a replay target's acknowledgement, a replay's trigger and outcome, and a
bulk replay's status can be.
"""

from __future__ import annotations

from django.db import models

from ledger.models import ErrorClass


class FailedEventStatus(models.TextChoices):
    # Every move out of a state is a named function in dlq.entries.transitions; nothing else writes
    # an entry's status (tests/test_state_writes.py).

    # waiting for an operator (or the auto-replay schedule). Out: a replay
    # (failed_event_replay_take), resolve or discard (failed_event_close), a correction
    # (failed_event_correct), an ambiguous replay later found succeeded
    # (failed_event_replay_settled_late).
    PENDING = "pending", "pending"
    # a replay is being sent (the guarded pending→replaying update allocated its number).
    # Out: the replay's own outcome (replayed / back to pending: failed_event_replay_settle);
    # dlq.tasks.replays_recover when the sender died mid-way (the same settle).
    REPLAYING = "replaying", "replaying"
    # the last replay succeeded. Out: a forced re-replay (needs a note:
    # failed_event_replay_take), resolve, discard (failed_event_close).
    REPLAYED = "replayed", "replayed"
    # an operator fixed it another way. Terminal.
    RESOLVED = "resolved", "resolved"
    # an operator (or retention) decided to drop it. Terminal.
    DISCARDED = "discarded", "discarded"


FE = FailedEventStatus
FE_TERMINAL_STATES = frozenset({FE.RESOLVED, FE.DISCARDED})
# Entries an operator still has to look at (the console's default view, the alert counts).
FE_OPEN_STATES = frozenset({FE.PENDING, FE.REPLAYING})

# The only moves there are; services raise IllegalTransition for anything else.
# A change row whose from and to are the same status records a note, not a move (an occurrence
# of the entry's key, an n8n retry, a rolled-back adapter revision, a payload fetch that failed).
FE_ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # replayed: a replay that came back ambiguous was later settled as succeeded (a
    # reviewer's decision or the sweeper's lookup on its ledger operation).
    FE.PENDING: frozenset({FE.REPLAYING, FE.REPLAYED, FE.RESOLVED, FE.DISCARDED}),
    # replayed when the replay succeeded, pending when it failed (history stays on Replay).
    FE.REPLAYING: frozenset({FE.REPLAYED, FE.PENDING}),
    # replaying again only with `force` and a note.
    FE.REPLAYED: frozenset({FE.REPLAYING, FE.RESOLVED, FE.DISCARDED}),
    FE.RESOLVED: frozenset(),
    FE.DISCARDED: frozenset(),
}


def fe_sources_of(target: str) -> frozenset[str]:
    return frozenset(s for s, targets in FE_ALLOWED_TRANSITIONS.items() if target in targets)


class FailedEventShape(models.TextChoices):
    """What the ingest parser recognised; `raw` entries are stored as received and flagged."""

    OPERATION = "operation", "ledger operation"
    ENVELOPE = "envelope", "Onceguard envelope"
    N8N_EXECUTION = "n8n_execution", "n8n Error Trigger (execution)"
    N8N_TRIGGER = "n8n_trigger", "n8n Error Trigger (trigger)"
    RAW = "raw", "unrecognised (raw)"


class PayloadSource(models.TextChoices):
    """Where an entry's payload came from (shown on the entry's page and in the API)."""

    # the body the workflow (or the ledger, for a failed operation) reported.
    REPORTED = "reported", "as reported"
    # the failed node's input items, fetched from the n8n execution the Error Trigger named
    # (lead capture: dlq.n8n.client); ``payload_source_ref`` holds the execution id.
    N8N_EXECUTION_FETCH = "n8n_execution_fetch", "fetched from the n8n execution"


class PayloadFetch(models.TextChoices):
    """Lead capture of an n8n Error Trigger entry. Only dlq.n8n.client moves it, once per entry:
    ``pending`` → ``fetched`` or ``failed``; nothing moves it back."""

    # no fetch: not an Error Trigger report, or the tenant has no n8n connection.
    NONE = "", "none"
    # ingested; the after-commit task has not finished yet.
    PENDING = "pending", "waiting for n8n"
    # the payload holds the failed node's input items.
    FETCHED = "fetched", "fetched"
    # the entry kept its reported payload; ``payload_fetch_note`` says why.
    FAILED = "failed", "failed"


class KeySource(models.TextChoices):
    """Where an entry's ``original_key`` (the key a replay is sent under) came from. An entry
    with a business key is one entry per key, tenant and target while it is open: a second
    failure of the key there is another occurrence of it (DESIGN §7, occurrences)."""

    # no business key was looked for: the entry's identity stands in (entries stored before
    # occurrences, and operation entries, whose key is their operation's).
    IDENTITY = "", "the entry's identity"
    # the report named it (the envelope's idempotency_key or the ingest's Idempotency-Key)
    # and no event id of its own: the key identifies the failure.
    REPORTED = "reported", "named by the report"
    # the report named it with its own event_id: one entry per reported event, as the node's
    # batches are (one per item), not merged by key.
    REPORTED_WITH_ID = "reported_event", "named by the report, with its own event id"
    # the failed request's Idempotency-Key / X-Idempotency-Key header (n8n's
    # execution.error.context.request).
    REQUEST_HEADER = "request_header", "the failed request's key header"
    # the body field the workflow declared (``key_field``), in the failed request or item.
    REQUEST_FIELD = "request_field", "the declared field of the failed request"
    # none could be found: the identity stands in and ``key_note`` says why, in words.
    MISSING = "missing", "none found"
    # none was found, and a person set one on the entry's page before replaying it
    # (dlq.entries.services.failed_event_key_set; the change trail says who and why). Not a
    # business key of the report's: later failures of it are not folded into this entry.
    SET_BY_PERSON = "set", "set by a person"


# Entries that are one per business key, tenant and target while open.
BUSINESS_KEY_SOURCES = frozenset({KeySource.REPORTED, KeySource.REQUEST_HEADER, KeySource.REQUEST_FIELD})


# The error classes of the ledger, plus "not known" for ingested failures that do not say.
ERROR_CLASS_CHOICES = [("", "unclassified"), *ErrorClass.choices]


class ReplayAck(models.TextChoices):
    """What counts as "delivered" for a replay target (ADR 0007). A 2xx alone is what n8n
    answers for a workflow that stopped before its Respond node, so for an n8n receiver it
    proves nothing."""

    # The receiver answers ``Onceguard-Ack: v1=<HMAC-SHA256(signing secret, "ack." + replay
    # id)>`` from the step that runs after its work succeeded; a 2xx without it is "not
    # acknowledged" (ambiguous), never a success. Required for n8n receivers.
    ECHO = "echo", "echo (the receiver signs the replay id back)"
    # A 2xx is enough: a key-enforced API that answers with its own bodies and cannot echo.
    STATUS = "status", "status (a 2xx is enough)"


class ReplayTrigger(models.TextChoices):
    MANUAL = "manual", "manual"
    BULK = "bulk", "bulk"
    AUTO = "auto", "automatic (schedule)"


class ReplayOutcome(models.TextChoices):
    # sending (or the sender died; dlq.tasks.replays_recover settles it).
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    # a definitive "not done" answer (4xx, refused before send).
    FAILED = "failed", "failed"
    # sent, answer never seen or 5xx: the target may or may not have acted.
    AMBIGUOUS = "ambiguous", "ambiguous"
    # the ledger refused the send (the replay key was already taken).
    REFUSED = "refused", "refused"


class BulkReplayStatus(models.TextChoices):
    # dry run: the selection is frozen and waits for a confirm before expires_at.
    DRAFT = "draft", "draft (dry run)"
    # confirmed; the task works through the selection at the configured rate.
    RUNNING = "running", "running"
    DONE = "done", "done"
    EXPIRED = "expired", "expired"
