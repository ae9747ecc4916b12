"""Every move of an operation between states, one named function each (STYLE.md: one place
for every state change).

Each function checks its move against the declared table (``ledger.models.
ALLOWED_TRANSITIONS``, where each state says who moves rows out of it), runs its named
statement — a static one from ``ledger/store/queries.sql`` on the hot path, a guarded ORM update
for the rest — with its guard in the WHERE clause, and writes the move's event row in the same
transaction. Zero rows matched means someone else moved the row first: a named error, never an
overwrite. Nothing outside this package writes an operation's status
(tests/test_state_writes.py walks the code and fails on any other write).

Where does an operation become …

==============  ==========================================================================
claimed         ``operation_claim`` (new key, guard mode), ``operation_reclaim``,
                ``operation_take``, ``operation_poll_take``                  — claim, holder
queued          ``operation_claim`` (new key, execute mode)                  — claim
waiting         ``operation_wait``; ``operation_poll_lease_expire``,
                ``operation_found_waiting``                                  — holder, recovery
retry_wait      ``operation_fail``; ``operation_lease_expire``, ``operation_reissue``,
                ``operation_review_resolve``                                 — holder, recovery
uncertain       ``operation_fail``; ``operation_lease_expire``               — holder, recovery
review          ``operation_fail``; ``operation_lease_expire``, ``operation_hand_to_review``,
                ``operation_unpolled_review``, ``operation_poll_review``     — holder, recovery
succeeded       ``operation_complete``; ``operation_found_succeeded``,
                ``operation_review_resolve``                                 — holder, recovery
failed          ``operation_fail``; ``operation_expire_retry``; ``operation_lease_expire``,
                ``operation_found_failed``, ``operation_not_found_failed``,
                ``operation_output_reject``, ``operation_replay_not_retried``,
                ``operation_redrive``                                        — holder, claim, recovery
abandoned       ``operation_cancel``; ``operation_review_resolve``, ``operation_not_wanted``
                                                                             — claim, recovery
==============  ==========================================================================

Events without a change of state: ``operation_mark_sent`` (the sent marker),
``operation_retry_now``, ``operation_supersede``, ``operation_still_wanted`` and
``operation_eligibility_unanswered`` (recovery).

The modules, lowest first; each imports only those before it:

- ``trace``: the event row, the table check, the named refusal errors, fenced evidence.
- ``claim``: a key becomes an operation or is taken again; ``guarded_move``, the update every
  service-side move runs; what a finished operation sets off (its callback is a claim).
- ``holder``: the lease holder's moves (a worker's take, wait, poll, sent, heartbeat, complete,
  fail).
- ``recovery``: the service's moves on rows nobody holds (sweeper, reconciliation, reviewers,
  eligibility, polling, outputs, replays, operators).

They import the ledger's models, statements and inputs, never ``ledger.protocol.services`` (which
re-exports the claim and holder moves for its older callers).
"""

from ledger.protocol.transitions.claim import (
    CANCELLABLE_STATES,
    ClaimResult,
    ExecuteTerms,
    callback_enqueue,
    eligibility_ask_interval,
    eligibility_recheck_due,
    operation_cancel,
    operation_claim,
    operation_expire_retry,
    operation_reclaim,
)
from ledger.protocol.transitions.holder import (
    FailureDecision,
    decide_unsent_expiry,
    operation_complete,
    operation_fail,
    operation_heartbeat,
    operation_mark_sent,
    operation_poll_take,
    operation_take,
    operation_wait,
)
from ledger.protocol.transitions.recovery import (
    operation_eligibility_unanswered,
    operation_found_failed,
    operation_found_succeeded,
    operation_found_waiting,
    operation_hand_to_review,
    operation_lease_expire,
    operation_not_found_failed,
    operation_not_wanted,
    operation_output_reject,
    operation_poll_lease_expire,
    operation_poll_review,
    operation_redrive,
    operation_reissue,
    operation_replay_not_retried,
    operation_retry_now,
    operation_review_resolve,
    operation_still_wanted,
    operation_supersede,
    operation_unpolled_review,
)

__all__ = [
    "CANCELLABLE_STATES",
    "ClaimResult",
    "ExecuteTerms",
    "FailureDecision",
    "callback_enqueue",
    "decide_unsent_expiry",
    "eligibility_ask_interval",
    "eligibility_recheck_due",
    "operation_cancel",
    "operation_claim",
    "operation_complete",
    "operation_expire_retry",
    "operation_fail",
    "operation_found_failed",
    "operation_found_succeeded",
    "operation_found_waiting",
    "operation_hand_to_review",
    "operation_heartbeat",
    "operation_lease_expire",
    "operation_mark_sent",
    "operation_not_found_failed",
    "operation_not_wanted",
    "operation_output_reject",
    "operation_poll_lease_expire",
    "operation_poll_review",
    "operation_poll_take",
    "operation_reclaim",
    "operation_redrive",
    "operation_reissue",
    "operation_replay_not_retried",
    "operation_retry_now",
    "operation_review_resolve",
    "operation_still_wanted",
    "operation_eligibility_unanswered",
    "operation_supersede",
    "operation_take",
    "operation_unpolled_review",
    "operation_wait",
]
