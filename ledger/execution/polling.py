"""Asynchronous providers (DESIGN §5, "Asynchronous providers").

A provider with a status path (``Provider.poll_path``) answers a submission with a job id,
not a result. The worker that sent it records the job id as the operation's
``provider_ref`` and moves the row ``claimed → waiting`` (``transitions.operation_wait``): the
provider has it, and the row holds no lease. From then on:

- **Polls.** A worker's take also takes due ``waiting`` rows (:func:`operations_poll_take`:
  ``waiting → claimed`` under a new token and a short poll lease, no new attempt — a poll
  sends nothing that changes the provider's state). :func:`operation_poll` GETs the status
  path and applies the answer (:func:`answer_apply`): pending → back to ``waiting`` with the
  next poll further off (``poll_initial_seconds`` doubling to ``poll_max_seconds``);
  succeeded → the output is fetched, checked and published (``ledger.execution.outputs``), then the
  row completes; failed → ``failed`` (its DLQ entry); an output that fails its checks →
  ``failed`` as ``invalid_output``, never published. No answer (an error, a non-200) is
  treated like pending: asked again later. A 429 or 503 to the poll or to the provider's
  output fetch is a throttle, as it is to a send (``execute.record_outcome``): the provider is
  held back until its Retry-After (``services.provider_throttle``), a 429 — or 503 with
  Retry-After — lowers the provider's effective rate and in-flight limit
  (``ratelimit.provider_rate_lower``, ADR 0008), and the job's next poll is no earlier than the
  Retry-After.
- **Webhooks.** The provider may POST a signed note that a job changed
  (:func:`webhook_receive`, HMAC-SHA256 under the provider's sealed ``webhook_secret``, the
  scheme of our callbacks). A valid one takes the row exactly as a worker's poll take does
  (not for a paused, throttled or capped provider; spent from its rate) and polls at once: the note only names the job — what the job's state and output are is always read
  from the provider's own status answer, so a leaked webhook secret can make us poll early,
  never publish what the note says.
- **Lifetime.** A job still pending once the operation's lifetime has passed is not failed:
  the provider may still render it, and a ``failed`` row may be replayed, which would order
  a second render. It goes to ``review`` (with an alert) for both idempotency classes: a
  reviewer's *retry* re-submits under the same key — a key-enforced provider answers with the
  same job, so polling resumes without a second render —, *abandon* ends it. The worker's
  last poll is timed to the lifetime's end; the sweeper moves rows nobody polled
  (``ledger.recovery.sweeper``).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from ledger.execution import objects, outputs, translation
from ledger.models import ErrorClass, Operation, OperationStatus, Provider, ProviderKind
from ledger.platform import hooks, storable
from ledger.platform.crypto import open_json
from ledger.platform.errors import DomainError, LeaseLost, OperationNotFound, ValidationFailed
from ledger.platform.logs import log_context
from ledger.platform.redaction import scrub
from ledger.protocol import services, transitions
from ledger.protocol.selectors import attempt_log_fields
from ledger.providers import adapters, ratelimit
from ledger.providers.credentials import stored_credential_value
from ledger.providers.reconcile import json_pointer
from ledger.providers.revisions import operation_adapter_view, revision_get
from ledger.rules import intents
from ledger.rules.key_rules import key_header_value
from ledger.rules.provider_checks import POLL_PLACEHOLDER, path_fill
from ledger.store import sql
from ledger.store.open_rows import open_rows_where

S = OperationStatus
log = logging.getLogger("onceguard.polling")

# The callbacks' signature scheme and header (adapters.sign / verify_signature).
WEBHOOK_SIGNATURE_HEADER = adapters.SIGNATURE_HEADER


def poll_delay_seconds(provider: Provider, polls: int) -> float:
    """The wait before the next poll after ``polls`` polls: the first delay, doubling, capped."""
    first = max(0.01, float(provider.poll_initial_seconds))
    cap = max(first, float(provider.poll_max_seconds))
    return min(cap, first * 2 ** min(max(0, polls), 30))


def status_url(provider: Provider, op: Operation) -> str:
    path = path_fill(provider.poll_path, {POLL_PLACEHOLDER: quote(op.provider_ref, safe="")})
    return adapters.join_url(provider.base_url, path)


class Verdict(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PENDING = "pending"
    # No usable answer (an error, a non-200, not JSON): asked again, like pending.
    NO_ANSWER = "no_answer"


@dataclass(frozen=True)
class StatusAnswer:
    verdict: Verdict
    status_value: str = ""
    body: Any = None
    http_status: int | None = None
    error: str = ""
    # A 429/503: the provider throttles us (and how long it asked us to stay away).
    throttled: bool = False
    retry_after: float | None = None

    def said(self) -> str:
        """What the answer said, for events and logs (masked, short)."""
        if self.verdict == Verdict.NO_ANSWER:
            return f"no answer ({self.error})"
        return f"status {scrub(self.status_value)[:40]!r}"


def read_status(provider: Provider, body: Any) -> StatusAnswer:
    """A status document classified by the provider's declared values. A value it does not
    declare is pending: the job exists, and the lifetime bounds the wait."""
    value = json_pointer(body, provider.poll_status_pointer) if isinstance(body, (dict, list)) else None
    text = "" if value is None or isinstance(value, (dict, list)) else str(value)
    if text and text in {str(v) for v in provider.poll_succeeded_values}:
        verdict = Verdict.SUCCEEDED
    elif text and text in {str(v) for v in provider.poll_failed_values}:
        verdict = Verdict.FAILED
    else:
        verdict = Verdict.PENDING
    return StatusAnswer(verdict, status_value=text, body=body, http_status=200)


def status_fetch(*, provider: Provider, op: Operation, client: httpx.Client) -> StatusAnswer:
    """GET the job's status (the key and the credential go along, as with the submit)."""
    try:
        headers = {provider.idempotency_header: key_header_value(op.key), **adapters.credential_headers(provider)}
        url = status_url(provider, op)
    except adapters.CredentialUnavailable as exc:
        return StatusAnswer(Verdict.NO_ANSWER, error=f"credential refused: {exc}")
    except (KeyError, IndexError, ValueError) as exc:
        return StatusAnswer(Verdict.NO_ANSWER, error=f"status path not usable ({type(exc).__name__})")
    status, body, error, answer_headers = adapters.get_json(
        client=client, url=url, headers=headers, timeout=float(provider.timeout_seconds)
    )
    if status is None:
        return StatusAnswer(Verdict.NO_ANSWER, error=error)
    throttled, retry_after = adapters.throttle_of(provider=provider, status=status, headers=answer_headers)
    if throttled:
        return StatusAnswer(
            Verdict.NO_ANSWER,
            http_status=status,
            error=f"HTTP {status}: throttled",
            throttled=True,
            retry_after=retry_after,
        )
    if status != 200 or body is None:
        return StatusAnswer(
            Verdict.NO_ANSWER, http_status=status, error=f"HTTP {status}" + ("" if body else ", no JSON")
        )
    return read_status(provider, body)


def _number(document: Any, pointer: str) -> int | None:
    value = json_pointer(document, pointer) if pointer else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _request_as_sent(*, provider: Provider, op: Operation) -> Any:
    """The request the submit sent: the stored envelope, or an intent's translation under the
    revision the operation runs under (the size pointers name the provider's fields)."""
    stored = open_json(op.request) or {}
    accepted = intents.stored_intent(stored)
    if accepted is None:
        return stored
    intent, pins = accepted
    try:
        return translation.intent_as_sent(tenant_id=op.tenant_id, provider=provider, intent=intent, pins=pins).request
    except DomainError:
        # Refused now (the revision changed): no size to compare with; the type and digest
        # checks still hold.
        return {}


def expectation(*, provider: Provider, op: Operation, body: Any) -> outputs.OutputExpectation:
    """What the output must be: the provider's accepted media types, the width and height the
    request asked for, and the sha256 and size the status answer announced (where declared)."""
    envelope = _request_as_sent(provider=provider, op=op)
    sha256 = json_pointer(body, provider.output_sha256_pointer) if provider.output_sha256_pointer else None
    types = tuple(provider.output_media_types or ()) or tuple(objects.setting("UPLOAD_MEDIA_TYPES"))
    return outputs.OutputExpectation(
        media_types=types,
        width=_number(envelope, provider.output_width_pointer),
        height=_number(envelope, provider.output_height_pointer),
        sha256=sha256 if isinstance(sha256, str) and sha256 else None,
        size=_number(body, provider.output_size_pointer),
    )


def answer_apply(*, op: Operation, provider: Provider, answer: StatusAnswer, actor: str) -> Operation | None:
    """Apply a status answer to a row this caller holds under a poll lease. The recorded row,
    or None when it moved meanwhile (a lost lease publishes and records nothing)."""
    try:
        if answer.verdict == Verdict.SUCCEEDED:
            return _finish(op=op, provider=provider, answer=answer, actor=actor)
        if answer.verdict == Verdict.FAILED:
            return transitions.operation_fail(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                error_class=ErrorClass.INVALID_INPUT,
                message=f"the provider's job {op.provider_ref} ended with {answer.said()}",
                response_status=answer.http_status,
                actor=actor,
            )
        not_before = None
        if answer.throttled:
            not_before = provider_throttled(
                op=op, provider=provider, status=answer.http_status, retry_after=answer.retry_after
            )
        return _wait_again(op=op, provider=provider, why=answer.said(), actor=actor, not_before=not_before)
    except DomainError as exc:
        log.warning("poll_result_refused key=%s code=%s verdict=%s", op.key, exc.code, answer.verdict.value)
        return None


def _finish(*, op: Operation, provider: Provider, answer: StatusAnswer, actor: str) -> Operation | None:
    """The job is done: publish its output (when the provider declares one), then complete."""
    note = "no output declared"
    if provider.output_url_pointer:
        url = json_pointer(answer.body, provider.output_url_pointer)
        try:
            if not isinstance(url, str) or not url:
                outputs.output_reject(operation=op, actor=actor, reason="the provider says done but names no output")
            published = outputs.output_fetch_publish(
                operation=op,
                url=url,
                expect=expectation(provider=provider, op=op, body=answer.body),
                actor=actor,
                provider=provider,
            )
        except outputs.InvalidOutput as invalid:
            return invalid.operation
        except outputs.OutputUnavailable as unavailable:
            not_before = None
            throttled, retry_after = adapters.throttle_of(
                provider=provider, status=unavailable.status, headers=unavailable.headers
            )
            if throttled:
                if same_origin(provider, url):
                    not_before = provider_throttled(
                        op=op, provider=provider, status=unavailable.status, retry_after=retry_after
                    )
                else:
                    # Another origin (a CDN, signed storage) throttled the fetch: its wait holds
                    # for this job, not for the provider's other calls or its rate.
                    not_before = _throttle_seconds(provider, retry_after)
            why = f"output not fetched: {unavailable.reason}"
            return _wait_again(op=op, provider=provider, why=why, actor=actor, not_before=not_before)
        except outputs.OutputErased as erased:
            # The job is done at the provider; of this person's data nothing more is kept here.
            return transitions.operation_complete(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                provider_ref=op.provider_ref,
                response_status=answer.http_status or 200,
                response_body=None,
                actor=actor,
                reason=f"job {op.provider_ref} {answer.said()}; {erased}",
            )
        note = f"output {published.key} published"
    return transitions.operation_complete(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=op.provider_ref,
        response_status=answer.http_status or 200,
        response_body=answer.body,
        actor=actor,
        reason=f"job {op.provider_ref} {answer.said()}; {note}",
    )


def same_origin(provider: Provider, url: str) -> bool:
    """Whether an output URL is the provider's own (a path under its base URL, or an absolute
    URL of its scheme, host and port)."""
    if url.startswith("/") and not url.startswith("//"):
        return True
    theirs, ours = urlsplit(url), urlsplit(provider.base_url)
    return (theirs.scheme, theirs.hostname, theirs.port) == (ours.scheme, ours.hostname, ours.port)


def _throttle_seconds(provider: Provider, retry_after: float | None) -> float:
    """How long a throttle holds: the Retry-After, or the provider's base delay (as for a send)."""
    return retry_after if retry_after is not None else max(1.0, float(provider.base_delay_seconds))


def provider_throttled(*, op: Operation, provider: Provider, status: int | None, retry_after: float | None) -> float:
    """A 429/503 answered a poll or an output fetch of ``op``: what ``execute.record_outcome``
    does for a send's — the provider is held back until its Retry-After (or base delay), and a
    429 (or 503 with Retry-After) lowers the provider's effective rate and in-flight limit (once
    per storm: ``ratelimit.provider_rate_lower`` compares the poll's take time with the last
    lowering). Returns the seconds the job's next poll must wait at least."""
    seconds = _throttle_seconds(provider, retry_after)
    services.provider_throttle(provider_id=provider.pk, seconds=seconds)
    if ratelimit.lowers_rate(status=status, retry_after=retry_after):
        ratelimit.provider_rate_lower(provider=provider, operation_id=op.pk, status=status)
    return seconds


def _wait_again(
    *, op: Operation, provider: Provider, why: str, actor: str, not_before: float | None = None
) -> Operation:
    """Back to waiting with the next poll further off — or, past the lifetime, to review.
    ``not_before``: seconds the provider asked us to stay away (a throttle); the next poll is
    no earlier, even past the lifetime's end (the provider's work is held back until then
    anyway, and the poll that follows it sends the row to review)."""
    now = sql.db_now()
    if op.expires_at is not None and op.expires_at <= now:
        reason = (
            f"lifetime passed while the provider's job {op.provider_ref} was not done ({why}); it may still"
            " finish there: a reviewer decides (retry re-submits under the same key)"
        )
        with transaction.atomic():
            moved = transitions.operation_poll_review(operation=op, actor=actor, reason=reason)
            review_alert(moved)
        return moved
    delay = poll_delay_seconds(provider, op.polls)
    if op.expires_at is not None:
        # The last poll falls on the lifetime's end, not a backoff step past it.
        delay = min(delay, max(0.0, (op.expires_at - now).total_seconds()))
    if not_before is not None:
        delay = max(delay, not_before)
    return transitions.operation_wait(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=op.provider_ref,
        poll_in_seconds=delay,
        actor=actor,
        reason=f"job {op.provider_ref}: {why}; next poll in {delay:.2f} s",
    )


def review_alert(op: Operation) -> None:
    hooks.alert_raised.send(
        tenant_id=op.tenant_id, kind="review_needed", ref=op.key, summary=f"operation {op.pk} needs a decision"
    )


def operation_poll(*, op: Operation, provider: Provider, client: httpx.Client, actor: str) -> Operation | None:
    """One poll of a row taken under a poll lease: ask, then apply the answer."""
    with log_context(**attempt_log_fields(op, provider)):
        answer = status_fetch(provider=provider, op=op, client=client)
        recorded = answer_apply(op=op, provider=provider, answer=answer, actor=actor)
        log.info(
            "poll key=%s poll=%s provider=%s job=%s verdict=%s to=%s",
            op.key,
            op.polls,
            provider.slug,
            op.provider_ref,
            answer.verdict.value,
            recorded.status if recorded is not None else "refused",
        )
    return recorded


def _poll_lease_for(*, timeout: float, revision_id: int | None, stable_id: int | None) -> float:
    if revision_id is not None and revision_id != stable_id:
        timeout = revision_get(revision_id).config.get("timeout_seconds", timeout)
    return adapters.poll_lease_seconds(float(timeout))


def operations_poll_take(*, limit: int, actor: str = "worker") -> list[Operation]:
    """Take up to ``limit`` due polls: ``waiting`` rows whose next poll has come, of providers
    neither paused nor throttled nor held back by their caps, each ``waiting → claimed`` under
    a poll lease, in one commit. A poll is a call: a capped provider's polls are admitted and
    spent from its bucket like its sends (``ledger.providers.ratelimit.TakeBudget``), and a poll lease is
    a claimed row, so it counts as in flight. Two workers never take the same row (SKIP LOCKED
    on PostgreSQL; one writer at a time on SQLite)."""
    if limit <= 0:
        return []
    # Read off the work queue's mirror, locking the operation row (ADR 0017).
    due = open_rows_where(status=S.WAITING, next_attempt_at__lte=Now())
    held_back = Provider.objects.filter(
        Q(paused_at__isnull=False) | Q(throttled_until__gt=Now()) | ratelimit.held_back()
    ).values("id")
    taken: list[Operation] = []
    with transaction.atomic():
        rows = list(
            Operation.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(due)
            .exclude(provider_id__in=held_back)
            .order_by("open_row__next_attempt_at", "id")
            .values_list(
                "id",
                "tenant_id",
                "provider__timeout_seconds",
                "adapter_revision_id",
                "provider__revision_id",
                *ratelimit.CAP_COLUMNS,
            )[:limit]
        )
        budget = ratelimit.TakeBudget.reserve(row[5:] for row in rows)
        for op_id, tenant_id, timeout, revision_id, stable_id, provider_id, *_ in rows:
            if not budget.admit(provider_id):
                continue
            op = transitions.operation_poll_take(
                operation_id=op_id,
                tenant_id=tenant_id,
                lease_seconds=_poll_lease_for(timeout=timeout, revision_id=revision_id, stable_id=stable_id),
                actor=actor,
                reason="poll of the provider's job",
            )
            if op is not None:
                taken.append(op)
            else:
                budget.refund(provider_id)
        budget.settle()
    return taken


# --- Webhooks -----------------------------------------------------------------------------------


class WebhookSignatureInvalid(DomainError):
    status, code, title = 401, "webhook_signature_invalid", "Webhook signature invalid"


@dataclass(frozen=True)
class WebhookResult:
    operation: Operation
    # True when the webhook took the row and polled it; False when the row was not waiting
    # (a poll holds it, or it is finished): the note changes nothing.
    applied: bool


def _webhook_take(*, op: Operation, provider: Provider, lease_seconds: float, actor: str) -> Operation | None:
    """The row taken for the webhook's poll on the terms of a worker's poll take: never for a
    paused or throttled provider or one its caps hold back, and a poll the caps admit is spent
    from its bucket (ledger.providers.ratelimit.TakeBudget) — a provider's notes must not become calls
    its pause, Retry-After or rate forbid. Held back, the row stays ``waiting`` and is made due
    now: the workers poll it as soon as the provider may be called again. None: not taken."""
    with transaction.atomic():
        held = (
            Provider.objects.filter(pk=provider.pk, tenant_id=provider.tenant_id)
            .filter(Q(paused_at__isnull=False) | Q(throttled_until__gt=Now()) | ratelimit.held_back())
            .exists()
        )
        taken = None
        if not held:
            budget = ratelimit.TakeBudget.reserve([ratelimit.cap_row(provider)])
            if budget.admit(provider.pk):
                taken = transitions.operation_poll_take(
                    operation_id=op.pk,
                    tenant_id=op.tenant_id,
                    lease_seconds=lease_seconds,
                    actor=actor,
                    reason="the provider's signed webhook",
                )
                if taken is None:
                    budget.refund(provider.pk)
            budget.settle()
        if taken is None:
            # Not a move between states (no event row): only when the next poll is due.
            Operation.objects.filter(
                pk=op.pk, tenant_id=op.tenant_id, status=S.WAITING, next_attempt_at__gt=Now()
            ).update(next_attempt_at=Now())
    return taken


def webhook_receive(
    *, tenant_slug: str, provider_slug: str, body: bytes, signature: str, client: httpx.Client | None = None
) -> WebhookResult:
    """A provider's signed note that a job changed: verified, then the job's row is taken as
    a poll takes it and polled at once (the note names the job; its state and output come
    from the provider's status answer). An unknown tenant or provider, a provider without a
    webhook secret and a wrong or stale signature are one answer: 401."""
    provider = (
        Provider.objects.filter(tenant__slug=tenant_slug, slug=provider_slug, kind=ProviderKind.HTTP)
        .exclude(webhook_secret__isnull=True)
        .first()
    )
    secret = stored_credential_value(provider.webhook_secret)[0] if provider is not None else None
    if not secret or not adapters.verify_signature(secret=secret, body=body, header=signature or ""):
        raise WebhookSignatureInvalid("The webhook's signature does not verify.")
    assert provider is not None
    try:
        document = storable.loads(body)
    except storable.NotStorable:
        raise ValidationFailed("The webhook body must be a JSON document naming the job.") from None
    ref = json_pointer(document, provider.ref_pointer) if isinstance(document, (dict, list)) else None
    if ref in (None, "") or isinstance(ref, (dict, list, bool)):
        raise ValidationFailed("The webhook names no job where the provider's ref pointer says.")
    op = (
        Operation.objects.filter(tenant_id=provider.tenant_id, provider_ref=str(ref)[:255], provider_id=provider.pk)
        .order_by("-id")
        .first()
    )
    if op is None:
        raise OperationNotFound("No operation waits on this job.")
    if op.status != S.WAITING:
        return WebhookResult(op, applied=False)
    view = operation_adapter_view(op, provider)
    actor = f"webhook:{provider.slug}"
    taken = _webhook_take(
        op=op, provider=provider, lease_seconds=adapters.poll_lease_seconds(float(view.timeout_seconds)), actor=actor
    )
    if taken is None:
        return WebhookResult(Operation.objects.get(pk=op.pk), applied=False)
    own = client is None
    http = client if client is not None else adapters.http_client(max_connections=2)
    try:
        recorded = operation_poll(op=taken, provider=view, client=http, actor=actor)
    except LeaseLost:
        recorded = None
    finally:
        if own:
            http.close()
    return WebhookResult(recorded or Operation.objects.get(pk=op.pk), applied=True)
