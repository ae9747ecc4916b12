"""The story a console detail page leads with: what happened, why the row is where it is, and
what a person can do about it — read off the row, its attempts and its events (no guessing:
every "why" is an event's recorded reason)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from ledger.models import (
    Attempt,
    AttemptOutcome,
    IdempotencyClass,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
)
from ledger.providers.prompts import prompt_template_label
from ledger.providers.revisions import revision_number
from ledger.web.display import age_words, waits_for_caller, when

S = OperationStatus


@dataclass
class Why:
    at: datetime
    moved: str
    actor: str
    reason: str


@dataclass
class Story:
    headline: str
    # The moves that brought the row where it is (since its latest attempt began), oldest
    # first, each with its recorded reason.
    why: list[Why] = field(default_factory=list)
    # Plain sentences: what the state means and who must act.
    notes: list[str] = field(default_factory=list)
    # The error of the last attempt that failed, labelled as such (a finished row's history
    # may hold one; it is not the row's outcome).
    last_attempt_error: str = ""


def _last_failed_attempt(attempts: list[Attempt]) -> Attempt | None:
    for attempt in reversed(attempts):
        if attempt.error_class or attempt.message:
            return attempt
    return None


def operation_story(
    op: Operation, attempts: list[Attempt], events: list[OperationEvent], now: datetime | None = None
) -> Story:
    now = now or timezone.now()
    provider = op.provider.slug if op.provider_id and op.provider else "no provider"
    failed = _last_failed_attempt(attempts)
    error = ""
    if failed is not None:
        error = f"attempt {failed.number}: {failed.error_class or 'error'}"
        if failed.message:
            error += f" — {failed.message}"
    story = Story(headline="", last_attempt_error=error)

    # Why: the events since the latest attempt began (the row's current chapter).
    start = next((e.at for e in events if e.to_status == S.CLAIMED and e.attempt == op.attempts), None)
    chapter = [e for e in events if start is None or e.at >= start] or events[-1:]
    story.why = [
        Why(e.at, f"{e.from_status or 'new'} → {e.to_status}", e.actor, e.reason) for e in chapter if e.from_status
    ]

    status = op.status
    if status == S.QUEUED:
        story.headline = f"Accepted {age_words(op.created_at, now)}; waiting for a worker to send it to {provider}."
        if op.provider and op.provider.paused_at:
            story.notes.append(f"The provider {provider} is paused: nothing is sent until it is resumed.")
    elif status == S.WAITING:
        story.headline = (
            f"{provider} accepted it as job {op.provider_ref}; waiting on the provider, next poll {_due(op, now)}."
        )
        story.notes.append(
            "No lease is held: a worker polls the job (or the provider's signed webhook announces it), and the"
            " output is published only after its checks pass. Past the lifetime it goes to review, not failed:"
            " the provider may still finish it."
        )
    elif status == S.CLAIMED and op.polls > 0:
        story.headline = f"A poll of job {op.provider_ref} at {provider} holds a short lease; nothing is being sent."
    elif status == S.CLAIMED:
        story.headline = f"Attempt {op.attempts} holds the lease; the effect may be under way at {provider}."
        if op.sent_at:
            story.notes.append(
                f"The sent marker was written at {when(op.sent_at)}: the request may have reached the provider."
            )
        if op.lease_expires_at and op.lease_expires_at < now:
            story.notes.append(
                f"The lease expired at {when(op.lease_expires_at)}; the sweeper moves the row on its next pass "
                "(to uncertain when the sent marker was written)."
            )
    elif status == S.RETRY_WAIT:
        if waits_for_caller(op, now):
            story.headline = "Waiting for the caller: it must claim the key again."
            story.notes.append(
                "Guard mode: the workflow that claimed this key performs the effect itself, so Onceguard will not "
                "send it. Nothing happens until the caller claims the key again (it then gets a new attempt); "
                "past the provider's lifetime the sweeper fails the row."
            )
        elif op.mode == OperationMode.GUARD:
            story.headline = f"The last attempt failed before the effect; the caller may retry {_due(op, now)}."
        else:
            story.headline = f"The last attempt failed before the effect; the next one is due {_due(op, now)}."
    elif status == S.UNCERTAIN:
        story.headline = "Outcome unknown: the request may or may not have taken effect. It is never re-sent blindly."
        enforced = op.provider and op.provider.idempotency_class == IdempotencyClass.KEY_ENFORCED
        story.notes.append(
            "The sweeper asks the provider by key (or re-issues with the same key) and records what it finds."
            if enforced
            else "The provider does not dedup on the key: the sweeper hands the row to a reviewer."
        )
    elif status == S.REVIEW:
        story.headline = "Waiting for a reviewer: nobody can tell automatically whether the effect happened."
        if op.sent_at:
            story.notes.append(f"The sent marker was written at {when(op.sent_at)}.")
        if op.mode == OperationMode.GUARD:
            story.notes.append(
                "Guard mode: if a reviewer decides it is safe to retry, the row waits for the caller to claim the "
                "key again — Onceguard does not send it."
            )
    elif status == S.SUCCEEDED:
        ref = f" (provider ref {op.provider_ref})" if op.provider_ref else ""
        answer = f", HTTP {op.response_status}" if op.response_status else ""
        story.headline = f"Succeeded {age_words(op.done_at or op.updated_at, now)}{ref}{answer}."
        if op.attempts > 1:
            story.notes.append(f"It took {op.attempts} attempts; the earlier attempts' errors are in the evidence.")
    elif status == S.FAILED:
        story.headline = (
            f"Failed {age_words(op.done_at or op.updated_at, now)}: it did not happen and will not be retried."
        )
        story.notes.append("A dead-letter entry holds its payload: replay it from there once the cause is fixed.")
        if op.superseded_by_id:
            story.notes.append(f"A replay superseded it: operation {op.superseded_by_id} answers its key now.")
    elif status == S.ABANDONED:
        last = events[-1] if events else None
        who = f" by {last.actor}" if last else ""
        story.headline = f"Abandoned{who} {age_words(op.done_at or op.updated_at, now)}: it will not be done."
    if op.expires_at and op.status not in (S.SUCCEEDED, S.FAILED, S.ABANDONED):
        story.notes.append(
            f"Gives up {age_words(op.expires_at, now)} (lifetime ends {when(op.expires_at)}); "
            f"{op.attempts} of {op.max_attempts} attempts used."
        )
    rendered = next((a for a in reversed(attempts) if a.prompt_template_id is not None), None)
    if rendered is not None:
        # An intent's request is rendered per attempt: say from what, so a reader can tell
        # which instructions the provider was given.
        story.notes.append(
            f"Attempt {rendered.number} was rendered from prompt template"
            f" {prompt_template_label(rendered.prompt_template_id)} under adapter revision"
            f" {revision_number(rendered.adapter_revision_id)}."
        )
    outcomes = {a.outcome for a in attempts}
    if AttemptOutcome.FENCED in outcomes:
        story.notes.append("A superseded holder reported late; its result is kept on its attempt as evidence only.")
    return story


def _due(op: Operation, now: datetime) -> str:
    if op.next_attempt_at is None:
        return "when it is due"
    if op.next_attempt_at <= now:
        return "now"
    return f"{age_words(op.next_attempt_at, now)} ({when(op.next_attempt_at)})"
