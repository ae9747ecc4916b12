"""Eligibility rechecks (DESIGN §3, versions): "is this still wanted?" before an old retry.

Old work should expire or be re-checked, not act after its context changed. A provider may
declare ``recheck_after`` (seconds). A retry of one of its operations that is older than that —
since the operation was created, or since the tenant last said yes — is not attempted (the
workers' take skips it with :data:`RECHECK_PENDING`; a guard-mode claim answers ``409
operation_retry_scheduled`` with ``waiting_for: eligibility``) until the tenant's eligibility
webhook (``Tenant.eligibility_url``) has answered. :func:`eligibility_recheck`, a pass of the
sweep, asks for each such row once it is due:

- ``{"wanted": true}`` — ``eligibility_confirmed_at`` is set; the retry goes ahead and the
  question is asked again only after another ``recheck_after``;
- ``{"wanted": false, "reason": "…"}`` — ``retry_wait → abandoned`` with the answer as reason
  (masked like every error text: ``sanitize_message``);
- anything else — no URL configured, refused by the outbound policy, no connection, a timeout,
  a non-2xx status, a body that says neither — is no answer: the row keeps waiting, visible
  (``last_error`` and an event say why), and is asked again after
  ``ELIGIBILITY_ASK_INTERVAL_SECONDS``. Its lifetime still ends it (the sweeper, the claim).

The question is a POST of JSON signed like callbacks (``Onceguard-Signature`` with the tenant's
callback secret, ``ledger.providers.adapters.sign``) with the operation's key in ``Idempotency-Key``. It
names the operation (id, key, record, action, version, run, step, provider, attempts, age) and
never carries its payload, request or error text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import httpx
from django.conf import settings
from django.db.models import DurationField, ExpressionWrapper, F, IntegerField, Q, Value
from django.db.models.functions import Now

from ledger.models import Operation, OperationStatus, Tenant
from ledger.platform.errors import LeaseLost
from ledger.platform.passes import failure_text, row_isolated
from ledger.protocol import callbacks, services, transitions
from ledger.protocol.selectors import provider_slug, run_of
from ledger.providers import adapters
from ledger.rules.key_rules import key_header_value
from ledger.rules.outbound import OutboundBlocked, outbound_client, outbound_refusal
from ledger.store.open_rows import open_rows_where

S = OperationStatus
log = logging.getLogger("onceguard.eligibility")

ACTOR = "eligibility"
# The label of this pass's failures (ledger.platform.passes).
JOB = "eligibility_recheck"
# The most of an answer that is read: it is a yes or no and a short reason.
MAX_ANSWER_BYTES = 16 * 1024

_RECHECK_AFTER = ExpressionWrapper(
    # Cast first: SQLite's duration arithmetic accepts integer fields by their plain type only.
    ExpressionWrapper(F("provider__recheck_after"), output_field=IntegerField())
    * Value(timedelta(seconds=1), output_field=DurationField()),
    output_field=DurationField(),
)
# The rows whose retry must ask first: the same rule as transitions.eligibility_recheck_due, in
# SQL (database clock). Rows of providers without recheck_after never match.
RECHECK_PENDING = Q(status=S.RETRY_WAIT, provider__recheck_after__isnull=False) & (
    Q(eligibility_confirmed_at__isnull=True, created_at__lte=Now() - _RECHECK_AFTER)
    | Q(eligibility_confirmed_at__lte=Now() - _RECHECK_AFTER)
)


@dataclass(frozen=True)
class Answer:
    # True: still wanted; False: not wanted; None: no answer.
    wanted: bool | None
    reason: str


def question_body(op: Operation) -> bytes:
    """What the tenant is asked: which operation, never what it carries."""
    document = {
        "type": "operation.eligibility",
        "question": "Is this operation still wanted?",
        "operation": {
            "id": op.pk,
            "key": op.key,
            "provider": provider_slug(op.provider_id),
            "action": op.action,
            "record": op.record,
            "version": op.version,
            "run": run_of(run=op.run, correlation_id=op.correlation_id),
            "step": op.step,
            "attempts": op.attempts,
            "created_at": op.created_at.isoformat(),
            "eligibility_confirmed_at": op.eligibility_confirmed_at.isoformat()
            if op.eligibility_confirmed_at
            else None,
        },
        "answer_with": {"wanted": "true or false", "reason": "why not (recorded, at most 500 characters)"},
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _read(response: httpx.Response) -> bytes:
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > MAX_ANSWER_BYTES:
            break
    return data[:MAX_ANSWER_BYTES]


def eligibility_ask(*, op: Operation, tenant: Tenant, client: httpx.Client | None = None) -> Answer:
    """Ask the tenant's eligibility webhook about ``op``; never raises for network trouble."""
    url = tenant.eligibility_url
    if not url:
        return Answer(None, "no eligibility webhook is configured for the tenant")
    purpose = "eligibility webhook"
    refused = outbound_refusal(url, purpose=purpose)
    if refused:
        return Answer(None, f"not asked: {refused}")
    body = question_body(op)
    # Signed as callbacks are: during a secret rotation's overlap under the new and the old one.
    secrets_now = callbacks.callback_signing_secrets(tenant_id=tenant.pk)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Onceguard-eligibility",
        "Idempotency-Key": key_header_value(op.key),
        adapters.SIGNATURE_HEADER: adapters.sign(secret=secrets_now, body=body),
    }
    timeout = float(settings.ONCEGUARD["ELIGIBILITY_TIMEOUT_SECONDS"])
    own = client is None
    http = client or outbound_client(purpose=purpose, timeout=timeout)
    try:
        with http.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
            status = response.status_code
            raw = _read(response)
    except OutboundBlocked as exc:
        return Answer(None, f"not asked: {exc}")
    except httpx.HTTPError as exc:
        return Answer(None, f"no answer ({type(exc).__name__})")
    finally:
        if own:
            http.close()
    if not 200 <= status < 300:
        return Answer(None, f"no answer (HTTP {status})")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return Answer(None, "no answer (the body is not JSON)")
    wanted = data.get("wanted") if isinstance(data, dict) else None
    if not isinstance(wanted, bool):
        return Answer(None, "no answer (the body says neither wanted true nor false)")
    reason = data.get("reason") if isinstance(data.get("reason"), str) else ""
    return Answer(wanted, services.sanitize_message(reason))


def eligibility_record(*, op: Operation, answer: Answer) -> str:
    """Apply an answer to a row still waiting as it was read (status and lease token); a row
    that moved meanwhile (a claim took it, a cancel) is left alone. Returns what happened:
    ``confirmed``, ``abandoned``, ``unanswered`` or ``moved``."""
    if answer.wanted is False:
        why = answer.reason or "no reason given"
        try:
            transitions.operation_not_wanted(operation=op, actor=ACTOR, why=why)
        except LeaseLost:
            return "moved"
        return "abandoned"
    if answer.wanted:
        if not transitions.operation_still_wanted(operation=op, actor=ACTOR):
            return "moved"
        return "confirmed"
    if not transitions.operation_eligibility_unanswered(operation=op, actor=ACTOR, why=answer.reason):
        return "moved"
    return "unanswered"


def eligibility_recheck(*, batch: int = 100, client: httpx.Client | None = None) -> dict[str, int]:
    """Ask about every due retry that must ask first (at most ``batch``), oldest due first.
    One HTTP call per row, outside any transaction; each answer recorded by a guarded update."""
    counts: dict[str, int] = {}
    rows = list(
        # Due retries off the work queue's mirror (ADR 0017).
        Operation.objects.filter(
            RECHECK_PENDING, open_rows_where(status=S.RETRY_WAIT, next_attempt_at__lte=Now())
        ).order_by("open_row__next_attempt_at", "id")[:batch]
    )
    tenants: dict[int, Tenant] = {}
    for op in rows:
        tenant = tenants.get(op.tenant_id)
        if tenant is None:
            tenant = tenants[op.tenant_id] = Tenant.objects.get(pk=op.tenant_id)
        # One HTTP call: no transaction held across it (atomic=False); a row that raises
        # waits one ask interval, as an unanswered question does.
        with row_isolated(job=JOB, ref=f"operation={op.pk}", on_failure=_ask_later(op), atomic=False):
            answer = eligibility_ask(op=op, tenant=tenant, client=client)
            outcome = eligibility_record(op=op, answer=answer)
            counts[outcome] = counts.get(outcome, 0) + 1
            # Ids and the outcome only: a reason is the tenant's text.
            log.info("eligibility_checked operation=%s key=%s outcome=%s", op.pk, op.key, outcome)
    return counts


def _ask_later(op: Operation) -> Callable[[BaseException], None]:
    def record(exc: BaseException) -> None:
        Operation.objects.filter(pk=op.pk, status=S.RETRY_WAIT, lease_token=op.lease_token).update(
            next_attempt_at=Now() + timedelta(seconds=transitions.eligibility_ask_interval()),
            last_error=failure_text(JOB, exc),
            updated_at=Now(),
        )

    return record
