"""Execute mode (DESIGN §3), the workers' side: take, send, record. (A submission writes the
row ``queued`` first: ``ledger.execution.submission``.)

- :func:`operations_take` is the workers' one guarded UPDATE: due rows — picked round-robin
  over the tenants under the in-flight caps (``ledger.execution.fairness``, ADR 0021) — of providers that are
  neither paused nor throttled nor at their caps (``ledger.providers.ratelimit``: no more of a capped
  provider's rows than its in-flight cap and token bucket allow), ``FOR UPDATE SKIP LOCKED``
  on PostgreSQL, writing the lease,
  a new Attempt, the event and the ``sent`` marker in the same commit (workers send right
  after, so a fresh operation costs two commits: take and record).
- :func:`operation_execute` sends one taken operation through the adapter and records the
  classified outcome through the fenced services (complete/fail). A worker that holds an
  outcome does not drop it for a database blip: the record step is retried on a fresh
  connection, with the same token, for ``RECORD_RETRY_SECONDS`` (the take's lease covers it).
- :func:`operation_translated` renders an intent operation's request under the revision the
  attempt runs under, for the workers and the DLQ's replay to the provider.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from typing import Any

import httpx
from django.db import connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from ledger.execution import fairness, polling, translation
from ledger.execution.submission import normalize_envelope
from ledger.models import (
    Attempt,
    AttemptOutcome,
    ErrorClass,
    Operation,
    OperationMode,
    OperationStatus,
    Provider,
    ProviderKind,
    Tenant,
)
from ledger.platform import tracing
from ledger.platform.crypto import EncryptionKeyError, open_json
from ledger.platform.errors import DomainError
from ledger.platform.logs import log_context, operation_fields
from ledger.platform.outage import connection_discard, database_unavailable
from ledger.platform.telemetry import observe_provider_call
from ledger.protocol import callbacks, services, transitions
from ledger.providers import adapters, canary, prompts, ratelimit, revisions
from ledger.recovery import eligibility
from ledger.rules import intents
from ledger.store.open_rows import open_rows_where

S = OperationStatus
log = logging.getLogger("onceguard.execute")


# --- Take -----------------------------------------------------------------------------------


def operations_take(*, limit: int, actor: str = "worker") -> list[Operation]:
    """Take up to ``limit`` due operations: queued→claimed or retry_wait→claimed, each with a
    new Attempt, its event and the ``sent`` marker, all in one commit. Two workers never take
    the same row (SKIP LOCKED on PostgreSQL; one writer at a time on SQLite).

    A row taken after its deadline or lifetime gets no ``sent`` marker: it is failed, not sent.
    """
    if limit <= 0:
        return []
    # Due polls of rows waiting on an asynchronous provider first: each is one short GET, and
    # a backlog of new work must not starve jobs already running at a provider past their
    # lifetime (ledger.execution.polling).
    polls = polling.operations_poll_take(limit=limit, actor=actor)
    limit -= len(polls)
    if limit <= 0:
        return polls
    # Read off the work queue's mirror, locking the operation row (ADR 0017).
    due = open_rows_where(status__in=(S.QUEUED, S.RETRY_WAIT), mode=OperationMode.EXECUTE, next_attempt_at__lte=Now())
    held_back = Provider.objects.filter(
        Q(paused_at__isnull=False) | Q(throttled_until__gt=Now()) | ratelimit.held_back()
    ).values("id")
    past_deadline = ExpressionWrapper(Q(deadline__lte=Now()) | Q(expires_at__lte=Now()), output_field=BooleanField())
    taken: list[Operation] = []
    with transaction.atomic():
        # Which rows, and in what order: round-robin over the tenants with due work, first
        # attempts and retries interleaved, under the in-flight caps (ADR 0021). On PostgreSQL
        # the pick has locked them (SKIP LOCKED); the read below checks every guard again.
        order = fairness.operations_due_fair(limit=limit, held_back=list(held_back.values_list("id", flat=True)))
        if not order:
            return polls
        place = {op_id: n for n, op_id in enumerate(order)}
        rows = list(
            Operation.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(due, pk__in=order)
            .exclude(provider_id__in=held_back)
            # A retry older than its provider's recheck_after asks the tenant first.
            .exclude(eligibility.RECHECK_PENDING)
            .annotate(past_deadline=past_deadline)
            .order_by()
            .values_list(
                "id",
                "status",
                "past_deadline",
                "provider__timeout_seconds",
                "adapter_revision_id",
                "provider__revision_id",
                "provider__canary_revision_id",
                *ratelimit.CAP_COLUMNS,
            )
        )
        rows.sort(key=lambda row: place[row[0]])
        # A capped provider's share of these rows, reserved under its bucket's lock; the rest
        # of its rows stay queued, no attempt spent (ledger.providers.ratelimit).
        budget = ratelimit.TakeBudget.reserve(row[7:] for row in rows)
        for op_id, status, past, timeout, revision_id, stable_id, canary_id, provider_id, tenant_id, *_ in rows:
            if not budget.admit(provider_id):
                continue
            if revision_id is not None and revision_id not in (stable_id, canary_id):
                # Its revision was rolled back or replaced while it waited: nothing is under
                # way for it (queued or retry_wait), so it runs under the stable one now.
                revision_id = _revision_retired(
                    op_id=op_id,
                    tenant_id=tenant_id,
                    status=status,
                    revision_id=revision_id,
                    stable_id=stable_id,
                    actor=actor,
                )
            if revision_id is not None and revision_id != stable_id:
                timeout = revisions.revision_get(revision_id).config.get("timeout_seconds", timeout)
            op = transitions.operation_take(
                operation_id=op_id,
                tenant_id=tenant_id,
                from_status=status,
                lease_seconds=adapters.worker_lease_seconds(float(timeout)),
                past_deadline=bool(past),
                actor=actor,
            )
            if op is not None:
                taken.append(op)
            else:
                budget.refund(provider_id)
        budget.settle()
    return polls + taken


def _revision_retired(
    *, op_id: int, tenant_id: int, status: str, revision_id: int, stable_id: int | None, actor: str
) -> int:
    """Move a due row off a revision that is neither stable nor a canary any more (in the
    take's transaction, the row locked); the revision it runs under now."""
    if stable_id is None:
        return revision_id
    revisions.operation_revision_move(
        operation_id=op_id,
        tenant_id=tenant_id,
        from_status=status,
        from_revision_id=revision_id,
        to_revision_id=stable_id,
        actor=actor,
        reason=(
            f"runs under adapter revision {revisions.revision_number(stable_id)} from now on: revision"
            f" {revisions.revision_number(revision_id)} is no longer stable or a canary"
        ),
    )
    return stable_id


# --- Execute one taken operation --------------------------------------------------------------


def _send(
    *, op: Operation, provider: Provider, client: httpx.Client, envelope: dict[str, Any] | None = None
) -> adapters.Outcome:
    if provider.kind == ProviderKind.CALLBACK:
        url = str((open_json(op.request) or {}).get("url") or "")
        tenant = Tenant.objects.only("id", "callback_allow_list").get(pk=op.tenant_id)
        if not callbacks.callback_url_allowed(allow_list=tenant.callback_allow_list, url=url):
            return adapters.Outcome(ErrorClass.INVALID_INPUT, message="callback URL no longer allowed", sent=False)
        body = callbacks.callback_body(callback_operation=op)
        # Signed per attempt: the signature covers the time of sending (receivers bound its age);
        # during a rotation's overlap under the new and the previous secret.
        secrets_now = callbacks.callback_signing_secrets(tenant_id=op.tenant_id)
        signature = {adapters.SIGNATURE_HEADER: adapters.sign(secret=secrets_now, body=body)}
        return adapters.send(
            provider=provider, operation=op, client=client, callback_body=body, extra_headers=signature
        )
    return adapters.send(provider=provider, operation=op, client=client, envelope=envelope)


def record_outcome(*, op: Operation, provider: Provider, outcome: adapters.Outcome, actor: str) -> Operation:
    """Record an attempt's classified outcome through the fenced services."""
    if outcome.succeeded and adapters.is_asynchronous(provider) and provider.kind != ProviderKind.CALLBACK:
        # The provider accepted a job (its id is the ref): the row waits on the provider,
        # holding no lease, until a poll or its webhook finds the job done (ledger.execution.polling).
        delay = polling.poll_delay_seconds(provider, 0)
        return transitions.operation_wait(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            provider_ref=outcome.provider_ref,
            poll_in_seconds=delay,
            response_status=outcome.status,
            actor=actor,
            reason=f"accepted as job {outcome.provider_ref} in {outcome.duration_ms} ms; first poll in {delay:.2f} s",
        )
    if outcome.succeeded:
        # With a callback the terminal move and the callback row share one transaction.
        with transaction.atomic() if op.callback_url else contextlib.nullcontext():
            return transitions.operation_complete(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                provider_ref=outcome.provider_ref,
                response_status=outcome.status,
                response_body=outcome.body,
                actor=actor,
                reason=f"completed in {outcome.duration_ms} ms",
            )
    assert outcome.error_class is not None
    # The callback provider fronts every receiver of the tenant: one receiver's 429 or 403
    # must not hold back the others, so it only reschedules its own delivery.
    shared = provider.kind != ProviderKind.CALLBACK
    if outcome.throttled and shared:
        seconds = outcome.retry_after if outcome.retry_after is not None else max(1.0, provider.base_delay_seconds)
        services.provider_throttle(provider_id=provider.pk, seconds=seconds)
        if ratelimit.lowers_rate(status=outcome.status, retry_after=outcome.retry_after):
            # Fewer calls, and fewer at once, after the pause — not the same storm (multiplicative
            # decrease of the rate and of the in-flight limit, ADR 0008).
            ratelimit.provider_rate_lower(provider=provider, operation_id=op.pk, status=outcome.status)
    if outcome.error_class == ErrorClass.PERMISSION and shared:
        services.provider_pause(provider_id=provider.pk, reason=outcome.message or "permission denied", actor=actor)
    return transitions.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=outcome.error_class,
        message=f"{outcome.message} ({outcome.duration_ms} ms)",
        response_status=outcome.status,
        response_body=outcome.body if outcome.error_class == ErrorClass.INVALID_INPUT else None,
        retry_after=outcome.retry_after,
        throttled=outcome.throttled,
        actor=actor,
    )


# Backoff between tries of the record step: doubling from the first delay up to the cap,
# each with jitter, so a node's threads do not reconnect in step. The number of tries is
# bounded as well as the time (a clock that does not move must not loop forever).
RECORD_RETRY_FIRST_DELAY = 0.25
RECORD_RETRY_MAX_DELAY = 2.0
RECORD_RETRY_MAX_TRIES = 200


def _stored_by_this_attempt(op: Operation) -> Operation | None:
    """The row, when this attempt's own report is what moved it: a try whose commit landed
    but whose answer was lost to the outage. Its attempt row was finished in the same
    commit (not pending, not fenced), and nobody else moves a row within the holder's lease."""
    finished = Attempt.objects.filter(operation_id=op.pk, lease_token=op.lease_token).exclude(
        outcome__in=(AttemptOutcome.PENDING, AttemptOutcome.FENCED)
    )
    if not finished.exists():
        return None
    return Operation.objects.filter(pk=op.pk, lease_token=op.lease_token).exclude(status=S.CLAIMED).first()


def record_outcome_retrying(*, op: Operation, provider: Provider, outcome: adapters.Outcome, actor: str) -> Operation:
    """:func:`record_outcome`, retried through a database blip.

    The outcome is in hand: dropped, the row would wait for its lease to expire and then be
    reconciled — for a key-advisory provider, by a human. So a database error is retried on a
    fresh connection, with the same token, for ``RECORD_RETRY_SECONDS``, backing off. A try
    after a commit that did land is harmless: a repeated complete returns the row, and a
    repeated fail finds the row already moved by this attempt, which counts as stored.
    Inside a caller's transaction nothing is retried: the broken connection broke it. After
    the budget the error is raised and the row is left to the sweeper, as before.
    """
    give_up_at = time.monotonic() + adapters.record_retry_seconds()
    delay = RECORD_RETRY_FIRST_DELAY
    failures = 0
    for _ in range(RECORD_RETRY_MAX_TRIES):
        try:
            return record_outcome(op=op, provider=provider, outcome=outcome, actor=actor)
        except DomainError:
            stored = _stored_by_this_attempt(op) if failures else None
            if stored is None:
                raise
            log.info(
                "execute_record_found_stored key=%s attempt=%s tries=%s status=%s",
                op.key,
                op.attempts,
                failures + 1,
                stored.status,
            )
            return stored
        except Exception as exc:
            if not database_unavailable(exc) or connection.in_atomic_block:
                raise
            failures += 1
            remaining = give_up_at - time.monotonic()
            if remaining <= 0 or failures >= RECORD_RETRY_MAX_TRIES:
                log.error(
                    "execute_record_gave_up key=%s attempt=%s tries=%s error=%s outcome=%s",
                    op.key,
                    op.attempts,
                    failures,
                    type(exc).__name__,
                    outcome.error_class or "succeeded",
                )
                raise
            wait = min(remaining, delay * random.uniform(0.5, 1.0))
            # The class only: a database error's message can hold host and user names.
            log.warning(
                "execute_record_retry key=%s attempt=%s try=%s error=%s retry_in=%.2f remaining=%.1f outcome=%s",
                op.key,
                op.attempts,
                failures,
                type(exc).__name__,
                wait,
                remaining,
                outcome.error_class or "succeeded",
            )
            connection_discard()
            time.sleep(wait)
            delay = min(RECORD_RETRY_MAX_DELAY, delay * 2)
    raise AssertionError("unreachable: the last try either returns or raises")  # pragma: no cover


def operation_execute(
    *, operation: Operation, client: httpx.Client, actor: str = "worker", taken_at: float | None = None
) -> Operation | None:
    """Send one taken operation and record its outcome. Returns the recorded row, or None
    when the row moved meanwhile (the sweeper or a reviewer; the result was kept as evidence).

    ``taken_at`` is ``time.monotonic()`` read just before the take: a holder that reaches the
    send later than :func:`adapters.send_window_seconds` after it does not send (the lease
    might end mid-send), and records the attempt as not sent — a retry, not an effect."""
    op = operation
    # The provider as the revision this attempt runs under sees it (ledger.providers.revisions).
    provider = revisions.operation_adapter_view(op, services.provider_by_id(op.provider_id))
    revision = revisions.revision_number(op.adapter_revision_id)
    # A render job's preset version and aspect class on every line of the attempt, its polls
    # included, and on its provider call's histogram (ADR 0016); empty for other work.
    labels = render_labels_of(op)
    fields = operation_fields(
        op,
        provider=provider.slug,
        adapter_revision=revision,
        preset_version=labels.preset_version,
        aspect_class=labels.aspect_class,
    )
    step = "poll" if op.polls > 0 else ("callback" if provider.kind == ProviderKind.CALLBACK else "attempt")
    with (
        log_context(**fields),
        # The attempt continues the trace its claim stored (ADR 0015): the caller's trace.
        tracing.operation_span(
            f"onceguard.{step}",
            operation=op,
            attributes={"onceguard.provider": provider.slug, "onceguard.attempt": op.attempts},
        ),
    ):
        if op.polls > 0:
            # A poll lease (ledger.execution.polling): ask the provider about the job; nothing is sent.
            recorded = polling.operation_poll(op=op, provider=provider, client=client, actor=actor)
        else:
            recorded = _execute(op=op, provider=provider, client=client, actor=actor, taken_at=taken_at, labels=labels)
    if recorded is not None and op.adapter_revision_id is not None and op.adapter_revision_id != provider.revision_id:
        # A canary's attempt (or one of a revision this process does not yet know as stable):
        # the watch decides whether the canary is failing (ledger.providers.canary).
        canary.canary_watch_after_attempt(operation=recorded, provider_id=provider.pk)
    return recorded


def operation_translated(
    *, op: Operation, provider: Provider
) -> tuple[dict[str, Any] | None, Any, adapters.Outcome | None]:
    """An intent operation's request under the revision this attempt runs under (``provider``
    is its view): (the envelope to send, the prompt template it placed, None), or (None, None,
    the ``invalid_input`` outcome of an intent that revision refuses — nothing is sent). A
    plain request: (None, None, None), the stored envelope is sent. The workers and the DLQ's
    replay to the provider (under the provider's stable revision) send only through this."""
    if provider.kind != ProviderKind.HTTP:
        return None, None, None
    stored = intents.stored_intent(open_json(op.request))
    if stored is None:
        return None, None, None
    intent, pins = stored
    try:
        # The prompt versions the job was accepted with, whatever was published since (ADR 0009).
        rendered = translation.intent_translate(tenant_id=op.tenant_id, provider=provider, intent=intent, pins=pins)
        envelope = normalize_envelope(request=rendered.request, provider=provider)
    except Exception as exc:
        if not isinstance(exc, DomainError):
            if not database_unavailable(exc) or connection.in_atomic_block:
                raise
            # The uploads or prompt could not be read: nothing was sent, so a retry is safe —
            # never left to the sweeper, which would take the sent marker for a possible send.
            connection_discard()
            log.warning("execute_intent_unreadable key=%s attempt=%s error=%s", op.key, op.attempts, type(exc).__name__)
            message = "could not read the intent's uploads or prompt template; not sent"
            return None, None, adapters.Outcome(ErrorClass.TRANSIENT, message=message, sent=False)
        revision = revisions.revision_number(op.adapter_revision_id)
        log.warning("execute_intent_refused key=%s attempt=%s code=%s", op.key, op.attempts, exc.code)
        message = f"intent not valid under adapter revision {revision} ({exc.code}): {exc.detail}"
        return None, None, adapters.Outcome(ErrorClass.INVALID_INPUT, message=message[:400], sent=False)
    return envelope, rendered.prompt, None


def render_labels_of(op: Operation) -> intents.RenderLabels:
    """The preset version and aspect class of an intent operation (empty for a plain request).
    The request is opened once more for them: a small value, next to the HTTP call it labels."""
    if op.request is None:
        return intents.RenderLabels()
    try:
        return intents.render_labels(open_json(op.request))
    except EncryptionKeyError:
        # Labels never fail an attempt: an unreadable request is refused where it is rendered.
        return intents.RenderLabels()


def _execute(
    *,
    op: Operation,
    provider: Provider,
    client: httpx.Client,
    actor: str,
    taken_at: float | None,
    labels: intents.RenderLabels,
) -> Operation | None:
    stalled = taken_at is not None and time.monotonic() - taken_at > adapters.send_window_seconds()
    with contextlib.ExitStack() as context:
        if op.sent_at is None:
            # Taken after its deadline or lifetime: old work expires instead of acting.
            outcome = adapters.Outcome(
                ErrorClass.TRANSIENT, message="deadline or lifetime passed before sending", sent=False
            )
        elif stalled:
            # Stalled between take and send (a paused process, starved threads): the rest of the
            # lease may not cover the send, so the row may be swept while the request is out.
            outcome = adapters.Outcome(
                ErrorClass.TRANSIENT, message="stalled past the send window after the take; not sent", sent=False
            )
            log.warning("execute_send_skipped_stalled key=%s attempt=%s", op.key, op.attempts)
        else:
            envelope, prompt, refused = operation_translated(op=op, provider=provider)
            if prompt is not None:
                # Every line of the attempt from here on names the prompt version it sent.
                context.enter_context(log_context(prompt_template=str(prompt)))
                refused = refused or _prompt_recorded(op=op, prompt_id=prompt.pk)
            if refused is not None:
                outcome = refused
            else:
                # The provider call is a client span: its traceparent is the one the request carries.
                with tracing.client_span(f"onceguard.provider_call {provider.slug}", operation=op):
                    outcome = _send(op=op, provider=provider, client=client, envelope=envelope)
                    tracing.attributes_set(
                        {
                            "onceguard.outcome": outcome.error_class or "succeeded",
                            "onceguard.sent": bool(outcome.sent),
                            "http.response.status_code": outcome.status or 0,
                        }
                    )
                observe_provider_call(
                    provider=provider.slug,
                    seconds=outcome.duration_ms / 1000,
                    outcome="throttled" if outcome.throttled else (outcome.error_class or "succeeded"),
                    revision=str(revisions.revision_number(op.adapter_revision_id) or ""),
                    preset_version=labels.preset_version,
                    aspect_class=labels.aspect_class,
                )
        try:
            recorded = record_outcome_retrying(op=op, provider=provider, outcome=outcome, actor=actor)
        except DomainError as exc:
            log.warning(
                "execute_result_refused key=%s attempt=%s code=%s outcome=%s",
                op.key,
                op.attempts,
                exc.code,
                outcome.error_class or "succeeded",
            )
            return None
        log.info(
            "execute_attempt key=%s attempt=%s provider=%s outcome=%s status=%s provider_ref=%s duration_ms=%s"
            " correlation_id=%s workflow_version=%s adapter_revision=%s preset_version=%s aspect_class=%s to=%s",
            op.key,
            op.attempts,
            provider.slug,
            outcome.error_class or "succeeded",
            outcome.status,
            outcome.provider_ref,
            outcome.duration_ms,
            op.correlation_id,
            op.workflow_version,
            revisions.revision_number(op.adapter_revision_id),
            labels.preset_version,
            labels.aspect_class,
            recorded.status,
        )
        return recorded


def _prompt_recorded(*, op: Operation, prompt_id: int) -> adapters.Outcome | None:
    """Record the prompt version on the attempt before sending; None when recorded. A database
    blip here is "not sent" (transient): the attempt never goes out without its record."""
    try:
        prompts.attempt_prompt_record(operation_id=op.pk, lease_token=op.lease_token, prompt_id=prompt_id)
    except Exception as exc:
        if not database_unavailable(exc) or connection.in_atomic_block:
            raise
        connection_discard()
        return adapters.Outcome(
            ErrorClass.TRANSIENT, message="could not record the prompt template version; not sent", sent=False
        )
    return None
