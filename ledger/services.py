"""Every write to the ledger. One function per transition, keyword-only and typed.

Each transition is one guarded conditional UPDATE plus its OperationEvent row in the same
transaction; zero rows updated means somebody else moved the row first and raises a named
error, never an overwrite. On PostgreSQL the hot transitions (claim, complete) are a
single statement (data-modifying CTEs), so a claim→complete costs two round trips and two
commits, exactly like the two raw seed statements. On SQLite the same pieces run as
several statements inside one BEGIN IMMEDIATE transaction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger import callbacks, hooks, sql
from ledger.auth import API_KEYS, hash_api_key
from ledger.caching import TtlCache
from ledger.crypto import payload_written, seal_json
from ledger.errors import (
    DomainError,
    IllegalTransition,
    InvalidKey,
    KeyReusedWithDifferentRequest,
    LeaseExpired,
    LeaseLost,
    OperationAlreadyFinished,
    OperationInProgress,
    OperationManagedByService,
    OperationNeedsReconciliation,
    OperationNotFound,
    OperationRetryScheduled,
    UnknownProvider,
    ValidationFailed,
)
from ledger.models import (
    ALLOWED_TRANSITIONS,
    REPORTABLE_STATES,
    TERMINAL_STATES,
    ApiKey,
    AttemptOutcome,
    ErrorClass,
    Operation,
    OperationMode,
    OperationStatus,
    Provider,
    Tenant,
)
from ledger.search import search_values
from ledger.tombstones import tombstone_answer

S = OperationStatus
log = logging.getLogger("onceguard.ledger")

MAX_KEY_LENGTH = 255
MAX_MESSAGE_LENGTH = 500


# --- Inputs -----------------------------------------------------------------------------


def validate_key(key: Any) -> str:
    """1–255 printable characters; the key is logged, so it must not carry personal data."""
    if not isinstance(key, str) or key == "":
        raise InvalidKey("An idempotency key is required (body `key` or header `Idempotency-Key`).")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The idempotency key is longer than {MAX_KEY_LENGTH} characters.")
    if not key.isprintable() or key.strip() != key:
        raise InvalidKey("The idempotency key must be printable characters without leading or trailing blanks.")
    return key


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_fingerprint(*, mode: str, provider: str, action: str, request: Any) -> str:
    """sha256 of the canonical JSON of (mode, provider, action, request) — DESIGN §3."""
    blob = canonical_json([mode, provider, action, request])
    return hashlib.sha256(blob.encode()).hexdigest()


def clamp_lease(seconds: float | None) -> float:
    cfg = settings.ONCEGUARD
    if seconds is None:
        seconds = cfg["LEASE_DEFAULT_SECONDS"]
    return float(min(max(float(seconds), cfg["LEASE_MIN_SECONDS"]), cfg["LEASE_MAX_SECONDS"]))


def sanitize_message(message: str | None) -> str:
    """Error text is stored for operators; keep it short and single-line."""
    text = " ".join((message or "").split())
    return text[:MAX_MESSAGE_LENGTH]


def backoff_seconds(*, attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base · 2^(attempt-1)))."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0, ceiling)


# Providers by (tenant id, slug), for PROVIDER_CACHE_SECONDS; upserts forget their entry.
PROVIDERS: TtlCache[Provider] = TtlCache("PROVIDER_CACHE_SECONDS")


def provider_for(*, tenant: Tenant | int, slug: str | None) -> Provider | None:
    if slug in (None, ""):
        return None
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    provider = PROVIDERS.get((tenant_id, slug), lambda: Provider.objects.filter(tenant_id=tenant_id, slug=slug).first())
    if provider is None:
        raise UnknownProvider(f"No provider named {slug!r} is configured for this tenant.")
    return provider


def new_lease_token() -> str:
    return secrets.token_hex(16)


# --- Results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimResult:
    operation: Operation
    # True when this call created the row or took a new attempt on it (201).
    acquired: bool
    # True when the row was already terminal and its recorded outcome is replayed (200).
    replayed: bool


# --- The generic guarded transition -----------------------------------------------------


def _guard_clause(*, op_id: int, from_states: frozenset[str], token: str | None, extra: str) -> tuple[str, list[Any]]:
    states = sorted(from_states)
    where = f"id = %s AND status IN ({', '.join(['%s'] * len(states))})"
    params: list[Any] = [op_id, *states]
    if token is not None:
        where += " AND lease_token = %s"
        params.append(token)
    if extra:
        where += f" AND {extra}"
    return where, params


@dataclass(frozen=True)
class _TransitionShape:
    """What a guarded transition's SQL text depends on (values are always parameters)."""

    pg: bool
    to: str
    from_states: frozenset[str]
    fenced: bool
    sets: tuple[tuple[str, str], ...]
    extra_where: str
    attempt_update: tuple[tuple[str, str], ...]
    attempt_insert: bool


@dataclass(frozen=True)
class _TransitionSql:
    states: tuple[str, ...]
    # PostgreSQL: one statement. SQLite: select, update, attempt update (or "").
    statement: str
    # PostgreSQL: the SET parameters come before the guard's (a plain UPDATE … WHERE).
    set_first: bool = False
    select: str = ""
    update: str = ""
    attempt_update: str = ""


@functools.lru_cache(maxsize=256)
def _transition_sql(shape: _TransitionShape) -> _TransitionSql:
    """Built once per shape and process: the text of a transition never depends on its
    values, so PostgreSQL prepares it and the hot paths skip building it."""
    for source in shape.from_states:
        if shape.to not in ALLOWED_TRANSITIONS[source]:
            raise IllegalTransition(f"{source} → {shape.to} is not an allowed move.")
    states = tuple(sorted(shape.from_states))
    where, _ = _guard_clause(
        op_id=0, from_states=shape.from_states, token="" if shape.fenced else None, extra=shape.extra_where
    )
    now = sql.now()
    set_sql = ["status = %s", f"updated_at = {now}"]
    if shape.to in TERMINAL_STATES:
        set_sql.append(f"done_at = {now}")
    set_sql += [f"{column} = {expr}" for column, expr in shape.sets]
    att_sql = ", ".join(f"{column} = {expr}" for column, expr in shape.attempt_update)
    if not shape.pg:
        return _TransitionSql(
            states=states,
            statement="",
            select=f"SELECT status FROM ledger_operation WHERE {where}",
            update=f"UPDATE ledger_operation SET {', '.join(set_sql)} WHERE id = %s RETURNING {sql.OP_SELECT}",
            attempt_update=(
                f"UPDATE ledger_attempt SET {att_sql} WHERE operation_id = %s AND number = %s" if att_sql else ""
            ),
        )
    if len(states) == 1:
        # The old state is known: the guard goes straight into the UPDATE (which re-checks
        # it on the newest row version if it has to wait for a concurrent writer).
        parts = [
            f"WITH upd AS (UPDATE ledger_operation SET {', '.join(set_sql)} WHERE {where}"
            f" RETURNING {sql.OP_SELECT}, {sql.state_literal(states[0])}::varchar AS old_status)"
        ]
    else:
        parts = [
            f"WITH old AS (SELECT id AS old_id, status AS old_status FROM ledger_operation WHERE {where} FOR UPDATE)",
            f", upd AS (UPDATE ledger_operation SET {', '.join(set_sql)} FROM old WHERE id = old.old_id"
            f" RETURNING {sql.OP_SELECT}, old.old_status)",
        ]
    if att_sql:
        parts.append(
            f", att AS (UPDATE ledger_attempt SET {att_sql} FROM upd"
            " WHERE ledger_attempt.operation_id = upd.id AND ledger_attempt.number = upd.attempts)"
        )
    if shape.attempt_insert:
        parts.append(f", att_new AS ({new_attempt_sql(source='upd')})")
    parts.append(
        ", ev AS (INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor, reason,"
        " attempt, at) SELECT id, old_status, status, %s, %s, attempts, now() FROM upd)"
    )
    parts.append(f" SELECT {sql.OP_SELECT} FROM upd")
    return _TransitionSql(states=states, statement="".join(parts), set_first=len(states) == 1)


def guarded_transition(
    *,
    op_id: int,
    to: str,
    from_states: frozenset[str],
    actor: str,
    reason: str,
    token: str | None = None,
    sets: list[tuple[str, str, list[Any]]] | None = None,
    extra_where: str = "",
    extra_params: list[Any] | None = None,
    attempt_update: list[tuple[str, str, list[Any]]] | None = None,
    attempt_insert: bool = False,
    likely: str | None = None,
) -> Operation | None:
    """One guarded UPDATE of an operation plus its event row (and its attempt row).

    ``sets`` and ``attempt_update`` are (column, sql expression, params). With
    ``attempt_insert`` a new Attempt numbered ``attempts`` (after the update) is created
    carrying the row's lease. Returns the updated row, or None when the guard matched no
    row (someone else moved it first). Callers raise the named error.

    ``likely`` names the state the row is almost always in (a completion: ``claimed``). On
    PostgreSQL the move is first tried from that state alone — its event's old state is then
    known, so the statement needs no locking read of the row first — and only when that
    matches nothing from all of ``from_states``.
    """
    if likely is not None and likely in from_states and len(from_states) > 1 and sql.is_postgres():
        moved = guarded_transition(
            op_id=op_id,
            to=to,
            from_states=frozenset({likely}),
            actor=actor,
            reason=reason,
            token=token,
            sets=sets,
            extra_where=extra_where,
            extra_params=extra_params,
            attempt_update=attempt_update,
            attempt_insert=attempt_insert,
        )
        if moved is not None:
            return moved
    sets = sets or []
    attempt_update = attempt_update or []
    pg = sql.is_postgres()
    text = _transition_sql(
        _TransitionShape(
            pg=pg,
            to=to,
            from_states=frozenset(from_states),
            fenced=token is not None,
            sets=tuple((column, expr) for column, expr, _ in sets),
            extra_where=extra_where,
            attempt_update=tuple((column, expr) for column, expr, _ in attempt_update),
            attempt_insert=attempt_insert,
        )
    )
    where_params: list[Any] = [op_id, *text.states]
    if token is not None:
        where_params.append(token)
    where_params += extra_params or []
    set_params: list[Any] = [to]
    for _, _, params in sets:
        set_params += params
    att_params: list[Any] = []
    for _, _, params in attempt_update:
        att_params += params

    if pg:
        head = [*set_params, *where_params] if text.set_first else [*where_params, *set_params]
        params = [*head, *att_params, actor[:150], sanitize_message(reason)]
        row = sql.fetch_one(text.statement, params)
        return sql.operation_from_row(row) if row else None

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(text.select, where_params)
            found = cursor.fetchone()
            if found is None:
                return None
            cursor.execute(text.update, [*set_params, op_id])
            op = sql.operation_from_row(cursor.fetchone())
            if text.attempt_update:
                cursor.execute(text.attempt_update, [*att_params, op_id, op.attempts])
            if attempt_insert:
                _insert_attempt(cursor, op)
            _insert_event(cursor, op_id=op_id, old=found[0], new=to, actor=actor, reason=reason, attempt=op.attempts)
    return op


def new_attempt_sql(*, source: str, number: str = "attempts") -> str:
    """INSERT of a pending Attempt for each operation row of ``source`` (a table or a CTE
    with the operation's columns), carrying that row's lease: numbered ``number`` (an SQL
    expression over the row). Every place that opens an attempt uses this one statement."""
    return (
        "INSERT INTO ledger_attempt (operation_id, number, lease_token, started_at, lease_expires_at, sent_at,"
        " outcome, error_class, message, provider_ref, execution_id)"
        f" SELECT id, {number}, lease_token, claimed_at, lease_expires_at, sent_at, '{AttemptOutcome.PENDING.value}',"
        f" '', '', '', execution_id FROM {source}"
    )


def _insert_attempt(cursor: Any, op: Operation) -> None:
    cursor.execute(new_attempt_sql(source="ledger_operation") + " WHERE id = %s", [op.pk])


def _insert_event(cursor: Any, *, op_id: int, old: str, new: str, actor: str, reason: str, attempt: int | None) -> None:
    cursor.execute(
        "INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor, reason, attempt, at)"
        f" VALUES (%s, %s, %s, %s, %s, %s, {sql.now()})",
        [op_id, old, new, actor[:150], sanitize_message(reason), attempt],
    )


def _after_failed(op: Operation) -> None:
    """Every `failed` row has its DLQ entry, written in the same transaction (the DLQ
    connects to ``operation_failed``)."""
    hooks.operation_failed.send(operation=op)


def _after_terminal(op: Operation, *, actor: str) -> None:
    """What follows a terminal move, in the same transaction when the caller holds one: a
    finished execute-mode operation with a callback_url gets its callback operation; then
    ``operation_finished`` (the DLQ settles a replay whose operation this is)."""
    if op.status not in TERMINAL_STATES:
        return
    if op.callback_url:
        callback_enqueue(operation=op)
    hooks.operation_finished.send(operation=op, actor=actor)


def callback_enqueue(*, operation: Operation) -> Operation | None:
    """Queue the callback of a finished operation, in the caller's transaction: a claim of
    the key ``callback:{id}`` (``ledger.callbacks`` says what it is claimed with), so it
    exists once, whoever finishes the operation."""
    arguments = callbacks.callback_claim_arguments(operation=operation)
    if arguments is None:
        return None
    try:
        result = operation_claim(**arguments)
    except DomainError:
        # Already queued or running: the callback exists, which is all we need.
        return None
    log.info("callback_queued key=%s for=%s", result.operation.key, operation.key)
    return result.operation


# --- Claim --------------------------------------------------------------------------------

_INSERT_COLUMNS = (
    "tenant_id, key, mode, status, provider_id, action, fingerprint, request, payload, attempts,"
    " throttled_attempts, max_attempts, claimed_at, lease_expires_at, lease_token, sent_at, uses_sent_marker,"
    " next_attempt_at, deadline, expires_at, last_error, error_class, provider_ref, response_status,"
    " response_body, reconciliation_handle, execution_id, workflow_id, workflow_version, correlation_id,"
    " lookup_failures, created_at, updated_at"
)


@functools.lru_cache(maxsize=64)
def _claim_statement(*, pg: bool, status: str, mark_sent: bool, has_deadline: bool, extra: tuple[str, ...]) -> str:
    """The claim statement for one shape of claim, built once per process.

    Only the shape (dialect, initial state, sent marker, deadline, extra columns) changes the
    text; every value is a parameter, so on PostgreSQL psycopg prepares it after a few uses
    and the planner never sees it again. The parameters are listed in :func:`operation_claim`.
    """
    now = sql.now()
    lease_sql = sql.now_plus_text()
    claimed = status == S.CLAIMED
    tail = [
        now if claimed else "NULL",  # claimed_at
        lease_sql if claimed else "NULL",  # lease_expires_at
        "%s",  # lease_token
        now if (claimed and mark_sent) else "NULL",  # sent_at
        "%s",  # uses_sent_marker
        now if status == S.QUEUED else "NULL",  # next_attempt_at
        lease_sql if has_deadline else "NULL",  # deadline
        lease_sql,  # expires_at
    ]
    json_p = sql.json_param()
    placeholders = "".join(", " + (json_p if c == "search_fields" else "%s") for c in extra)
    insert = (
        f"INSERT INTO ledger_operation ({_INSERT_COLUMNS}{''.join(', ' + c for c in extra)})"
        " SELECT %s, %s, %s, %s, %s, %s, %s,"
        f" {json_p}, {json_p}, %s, 0, %s, {', '.join(tail)}, '', '', '', NULL, NULL,"
        f" %s, %s, %s, %s, %s, 0, {now}, {now}{placeholders}"
        # A key whose operation retention deleted keeps answering from its tombstone and is
        # never created again (DESIGN §6): the guard sits inside the atomic INSERT.
        " WHERE NOT EXISTS (SELECT 1 FROM ledger_tombstone WHERE tenant_id = %s AND key = %s)"
        " ON CONFLICT (tenant_id, key) DO NOTHING"
        f" RETURNING {sql.OP_SELECT}"
    )
    if not pg:
        return insert
    # One statement: insert the row, its first attempt and its event, or return the
    # existing row when the key is taken (the SELECT arm sees the pre-insert snapshot).
    return (
        f"WITH ins AS ({insert})"
        + (f", att AS ({new_attempt_sql(source='ins', number='1')})" if claimed else "")
        + ", ev AS (INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor, reason,"
        " attempt, at) SELECT id, '', status, %s, %s, attempts, now() FROM ins)"
        f" SELECT {sql.OP_SELECT}, true FROM ins"
        f" UNION ALL SELECT {sql.OP_SELECT}, false FROM ledger_operation"
        " WHERE tenant_id = %s AND key = %s AND NOT EXISTS (SELECT 1 FROM ins)"
    )


def operation_claim(
    *,
    tenant: Tenant,
    key: str,
    provider: Provider | None,
    action: str = "",
    request: Any = None,
    payload: Any = None,
    mode: str = OperationMode.GUARD,
    lease_seconds: float | None = None,
    uses_sent_marker: bool = False,
    mark_sent: bool = False,
    deadline_seconds: float | None = None,
    reconciliation_handle: str = "",
    execution_id: str = "",
    workflow_id: str = "",
    workflow_version: str = "",
    correlation_id: str = "",
    actor: str = "api",
    via_claims: bool = True,
    fingerprint: str | None = None,
    extra_columns: dict[str, Any] | None = None,
) -> ClaimResult:
    """Claim ``key`` atomically, or answer for the row that already holds it (DESIGN §5).

    New key → a row in ``claimed`` (guard) or ``queued`` (execute) with its first attempt.
    ``mark_sent`` writes the sent marker in the same commit (in-process guard, workers).
    Raises the named 409/422 errors for rows that cannot be claimed now.
    """
    key = validate_key(key)
    provider_slug = provider.slug if provider else ""
    if fingerprint is None:
        fingerprint = request_fingerprint(mode=mode, provider=provider_slug, action=action, request=request)
    lease = clamp_lease(lease_seconds)
    token = new_lease_token()
    status = S.QUEUED if mode == OperationMode.EXECUTE else S.CLAIMED
    max_attempts = provider.max_attempts if provider else 4
    lifetime = float(provider.lifetime_seconds if provider else 1800)
    if mark_sent:
        uses_sent_marker = True
    # Plain columns only a new execute-mode row sets (request_bytes, cost, callback_url).
    extra = list((extra_columns or {}).items())
    # The configured non-personal paths of the payload (else the request), in plain text.
    searchable = search_values(
        payload if payload is not None else request, settings.ONCEGUARD["OPERATION_SEARCH_PATHS"]
    )
    if searchable:
        extra.append(("search_fields", sql.dumps(searchable)))
    pg = sql.is_postgres()
    statement = _claim_statement(
        pg=pg,
        status=status,
        mark_sent=mark_sent,
        has_deadline=deadline_seconds is not None,
        extra=tuple(c for c, _ in extra),
    )
    attempts = 1 if status == S.CLAIMED else 0
    insert_params = [
        tenant.pk,
        key,
        mode,
        status,
        provider.pk if provider else None,
        action,
        fingerprint,
        sql.dumps(seal_json(request)) if mode == OperationMode.EXECUTE else None,
        sql.dumps(seal_json(payload)),
        attempts,
        max_attempts,
        *(sql.now_plus(lease)[1] if status == S.CLAIMED else ()),
        token,
        uses_sent_marker,
        *(sql.now_plus(deadline_seconds)[1] if deadline_seconds is not None else ()),
        *sql.now_plus(lifetime)[1],
        reconciliation_handle[:255],
        execution_id[:255],
        workflow_id[:255],
        workflow_version[:100],
        correlation_id[:255],
        *(value for _, value in extra),
        tenant.pk,
        key,
    ]
    reason = "claimed, sent" if mark_sent else ("queued" if status == S.QUEUED else "claimed")

    op: Operation | None
    created = False
    if pg:
        row = sql.fetch_one(statement, [*insert_params, actor, reason, tenant.pk, key])
        if row is None:
            # The conflicting row was committed after this statement's snapshot.
            op = _fetch_by_key(tenant_id=tenant.pk, key=key)
        else:
            op, created = sql.operation_from_row(row), bool(row[-1])
    else:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, insert_params)
                row = cursor.fetchone()
                if row is not None:
                    op, created = sql.operation_from_row(row), True
                    if attempts:
                        _insert_attempt(cursor, op)
                    _insert_event(cursor, op_id=op.pk, old="", new=status, actor=actor, reason=reason, attempt=attempts)
                else:
                    op = _fetch_by_key(tenant_id=tenant.pk, key=key)
    if created:
        assert op is not None
        payload_written(
            tenant_id=tenant.pk,
            record_type="operations",
            record_id=op.pk,
            values=[payload, request if mode == OperationMode.EXECUTE else None],
            source=f"{provider_slug}:{action}",
        )
        return ClaimResult(operation=op, acquired=True, replayed=False)
    if op is None:
        stone = tombstone_answer(tenant_id=tenant.pk, key=key, fingerprint=fingerprint)
        return ClaimResult(operation=stone, acquired=False, replayed=True)
    return _answer_existing(
        op=op,
        fingerprint=fingerprint,
        lease=lease,
        mark_sent=mark_sent,
        via_claims=via_claims,
        actor=actor,
        execution_id=execution_id,
    )


def _fetch_by_key(*, tenant_id: int, key: str) -> Operation | None:
    row = sql.fetch_one(
        f"SELECT {sql.OP_SELECT} FROM ledger_operation WHERE tenant_id = %s AND key = %s", [tenant_id, key]
    )
    return sql.operation_from_row(row) if row else None


def _seconds_until(moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, int((moment - timezone.now()).total_seconds() + 0.999))


def _answer_existing(
    *,
    op: Operation,
    fingerprint: str,
    lease: float,
    mark_sent: bool,
    via_claims: bool,
    actor: str,
    execution_id: str,
) -> ClaimResult:
    # Checked before the fingerprint: the fingerprint includes the mode, so a guard claim
    # of an execute-mode key never matches it and would otherwise always answer 422.
    if via_claims and op.mode == OperationMode.EXECUTE:
        raise OperationManagedByService(
            "This key belongs to an operation the service executes; poll it instead.", extra={"operation_id": op.pk}
        )
    if op.fingerprint != fingerprint:
        raise KeyReusedWithDifferentRequest(
            "This key was first used with a different request; use a new key for a different operation.",
            extra={"operation_id": op.pk},
        )
    if op.status in TERMINAL_STATES:
        return ClaimResult(operation=_newest_in_lineage(op), acquired=False, replayed=True)
    if op.status == S.CLAIMED:
        raise OperationInProgress(
            "Another holder has this operation.",
            retry_after=_seconds_until(op.lease_expires_at),
            extra={"operation_id": op.pk},
        )
    if op.status == S.QUEUED:
        raise OperationRetryScheduled("The operation is queued.", retry_after=1, extra={"operation_id": op.pk})
    if op.status in (S.UNCERTAIN, S.REVIEW):
        raise OperationNeedsReconciliation(
            "The outcome of an earlier attempt is unknown and is being reconciled; do not re-send.",
            extra={"operation_id": op.pk, "status": op.status},
        )
    # retry_wait: due rows are re-claimed by the same key in guard mode (a new attempt).
    if op.mode == OperationMode.GUARD:
        retaken = operation_reclaim(
            operation_id=op.pk, lease_seconds=lease, mark_sent=mark_sent, actor=actor, execution_id=execution_id
        )
        if retaken is not None:
            return ClaimResult(operation=retaken, acquired=True, replayed=False)
        current = _fetch_by_key(tenant_id=op.tenant_id, key=op.key)
        assert current is not None
        if current.status == S.RETRY_WAIT and current.expires_at is not None and current.expires_at <= sql.db_now():
            # Old work expires instead of acting after its context changed: fail it now
            # (retry_wait means nothing was sent) and answer the recorded failure.
            try:
                current = operation_transition(
                    operation=current,
                    to=S.FAILED,
                    actor=actor,
                    reason="lifetime ended while waiting for a retry",
                    sets=[("error_class", "%s", [current.error_class or ErrorClass.TRANSIENT])],
                    extra_where=f"expires_at <= {sql.now()}",
                )
            except LeaseLost:
                current = _fetch_by_key(tenant_id=op.tenant_id, key=op.key) or current
        if current.status != S.RETRY_WAIT:
            # Someone else moved it between our read and our update: answer its new state.
            return _answer_existing(
                op=current,
                fingerprint=fingerprint,
                lease=lease,
                mark_sent=mark_sent,
                via_claims=via_claims,
                actor=actor,
                execution_id=execution_id,
            )
        op = current
    raise OperationRetryScheduled(
        "A retry is scheduled.", retry_after=_seconds_until(op.next_attempt_at), extra={"operation_id": op.pk}
    )


def _newest_in_lineage(op: Operation) -> Operation:
    """A failed operation superseded by replays answers with the newest replay's outcome."""
    seen = {op.pk}
    current = op
    while current.superseded_by_id and current.superseded_by_id not in seen:
        nxt = Operation.objects.filter(pk=current.superseded_by_id).first()
        if nxt is None:
            break
        seen.add(nxt.pk)
        current = nxt
    return current


def operation_reclaim(
    *, operation_id: int, lease_seconds: float, mark_sent: bool = False, actor: str, execution_id: str = ""
) -> Operation | None:
    """retry_wait (due) → claimed: a new attempt with a fresh token on the same operation."""
    lease_sql, lease_p = sql.now_plus(lease_seconds)
    sets = [
        ("attempts", "attempts + 1", []),
        ("lease_token", "%s", [new_lease_token()]),
        ("claimed_at", sql.now(), []),
        ("lease_expires_at", lease_sql, lease_p),
        ("sent_at", sql.now() if mark_sent else "NULL", []),
        ("next_attempt_at", "NULL", []),
    ]
    if mark_sent:
        sets.append(("uses_sent_marker", "%s", [True]))
    if execution_id:
        sets.append(("execution_id", "%s", [execution_id[:255]]))
    return guarded_transition(
        op_id=operation_id,
        to=S.CLAIMED,
        from_states=frozenset({S.RETRY_WAIT}),
        actor=actor,
        reason="retry claimed, sent" if mark_sent else "retry claimed",
        sets=sets,
        # Due, and still within the operation's lifetime.
        extra_where=f"next_attempt_at <= {sql.now()} AND (expires_at IS NULL OR expires_at > {sql.now()})",
        attempt_insert=True,
    )


# --- Holder calls: sent, heartbeat, complete, fail -----------------------------------------


def _tenant_clause(tenant_id: int | None) -> tuple[str, list[Any]]:
    return ("tenant_id = %s", [tenant_id]) if tenant_id is not None else ("", [])


def _diagnose_holder_refusal(
    *, op_id: int, token: str, tenant_id: int | None = None, allow_expired: bool = True
) -> Exception:
    """After a guarded update matched nothing: name why, for the caller."""
    rows = Operation.objects.filter(pk=op_id)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    op = rows.only("status", "lease_token", "lease_expires_at").first()
    if op is None:
        return OperationNotFound("No such operation.")
    if op.lease_token != token:
        return LeaseLost("A newer attempt holds this operation; your result was kept as evidence only.")
    if op.status in TERMINAL_STATES:
        return OperationAlreadyFinished(f"The operation is already {op.status}.", extra={"status": op.status})
    if op.status == S.CLAIMED and not allow_expired:
        return LeaseExpired("Your lease has expired; do not perform the effect. Claim again.")
    return LeaseLost(f"The operation is {op.status}; this token can no longer do that.", extra={"status": op.status})


def operation_mark_sent(
    *,
    operation_id: int,
    lease_token: str,
    reconciliation_handle: str = "",
    actor: str = "api",
    tenant_id: int | None = None,
) -> Operation:
    """The marker written before the effect: from now on a crash means "possibly sent".

    Refused once the lease has expired — a holder must not start an effect it may no
    longer own.
    """
    sets = [("sent_at", f"COALESCE(sent_at, {sql.now()})", [])]
    if reconciliation_handle:
        sets.append(("reconciliation_handle", "%s", [reconciliation_handle[:255]]))
    op = _transition_same_state(
        op_id=operation_id,
        state=S.CLAIMED,
        token=lease_token,
        sets=sets,
        extra_where=f"lease_expires_at > {sql.now()}" + (" AND tenant_id = %s" if tenant_id is not None else ""),
        extra_params=[tenant_id] if tenant_id is not None else [],
        attempt_sets=[("sent_at", f"COALESCE(sent_at, {sql.now()})", [])],
        actor=actor,
        reason="sent marker",
    )
    if op is None:
        raise _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id, allow_expired=False)
    return op


def operation_heartbeat(
    *, operation_id: int, lease_token: str, lease_seconds: float | None = None, tenant_id: int | None = None
) -> Operation:
    """Extend a live holder's lease (claimed, same token). No event row: not a transition."""
    lease_sql, lease_p = sql.now_plus(clamp_lease(lease_seconds))
    tenant_sql = " AND tenant_id = %s" if tenant_id is not None else ""
    # One transaction: the attempt's copy of the lease never disagrees with the row's.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_operation SET lease_expires_at = {lease_sql}, updated_at = {sql.now()}"
            f" WHERE id = %s AND status = %s AND lease_token = %s{tenant_sql} RETURNING {sql.OP_SELECT}",
            [*lease_p, operation_id, S.CLAIMED, lease_token, *([tenant_id] if tenant_id is not None else [])],
        )
        row = cursor.fetchone()
        if row is not None:
            # Copy the row's value: the attempt mirrors the lease exactly, not a second clock read.
            cursor.execute(
                "UPDATE ledger_attempt SET lease_expires_at ="
                " (SELECT lease_expires_at FROM ledger_operation WHERE id = %s)"
                " WHERE operation_id = %s AND lease_token = %s",
                [operation_id, operation_id, lease_token],
            )
    if row is None:
        raise _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    return sql.operation_from_row(row)


def _transition_same_state(
    *,
    op_id: int,
    state: str,
    token: str,
    sets: list[tuple[str, str, list[Any]]],
    extra_where: str,
    extra_params: list[Any],
    attempt_sets: list[tuple[str, str, list[Any]]],
    actor: str,
    reason: str,
) -> Operation | None:
    """A guarded in-state update that still leaves an event (the sent marker)."""
    where, where_params = _guard_clause(op_id=op_id, from_states=frozenset({state}), token=token, extra=extra_where)
    where_params += extra_params
    set_sql = ", ".join([f"updated_at = {sql.now()}"] + [f"{c} = {e}" for c, e, _ in sets])
    set_params = [p for _, _, ps in sets for p in ps]
    att_sql = ", ".join(f"{c} = {e}" for c, e, _ in attempt_sets)
    att_params = [p for _, _, ps in attempt_sets for p in ps]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE ledger_operation SET {set_sql} WHERE {where} RETURNING {sql.OP_SELECT}",
                [*set_params, *where_params],
            )
            row = cursor.fetchone()
            if row is None:
                return None
            op = sql.operation_from_row(row)
            cursor.execute(
                f"UPDATE ledger_attempt SET {att_sql} WHERE operation_id = %s AND number = %s",
                [*att_params, op_id, op.attempts],
            )
            _insert_event(cursor, op_id=op_id, old=state, new=state, actor=actor, reason=reason, attempt=op.attempts)
    return op


def _record_fenced_evidence(
    *,
    operation_id: int,
    lease_token: str,
    provider_ref: str = "",
    response_status: int | None = None,
    response_body: Any = None,
    error_class: str = "",
    message: str = "",
) -> None:
    """A superseded holder's late result is kept on its own Attempt, never on the row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_attempt SET outcome = %s, provider_ref = %s, response_status = %s,"
            f" response_body = {sql.json_param()}, error_class = %s, message = %s,"
            f" finished_at = COALESCE(finished_at, {sql.now()})"
            " WHERE operation_id = %s AND lease_token = %s",
            [
                AttemptOutcome.FENCED,
                provider_ref[:255],
                response_status,
                sql.dumps(seal_json(response_body)),
                error_class,
                sanitize_message(message),
                operation_id,
                lease_token,
            ],
        )


def operation_complete(
    *,
    operation_id: int,
    lease_token: str,
    provider_ref: str = "",
    response_status: int | None = 200,
    response_body: Any = None,
    actor: str = "api",
    reason: str = "completed",
    tenant_id: int | None = None,
) -> Operation:
    """claimed|uncertain|review → succeeded, for the latest attempt's token only.

    The latest holder's result is the best evidence there is, so it is accepted even
    after the sweeper moved the row to uncertain or review (DESIGN §3 fencing).
    """
    body = sql.dumps(seal_json(response_body))
    op = guarded_transition(
        op_id=operation_id,
        to=S.SUCCEEDED,
        from_states=REPORTABLE_STATES,
        likely=S.CLAIMED,
        token=lease_token,
        actor=actor,
        reason=reason,
        sets=[
            ("provider_ref", "%s", [provider_ref[:255]]),
            ("response_status", "%s", [response_status]),
            ("response_body", sql.json_param(), [body]),
            ("lease_expires_at", "NULL", []),
            ("error_class", "''", []),
        ],
        extra_where=_tenant_clause(tenant_id)[0],
        extra_params=_tenant_clause(tenant_id)[1],
        attempt_update=[
            ("outcome", "%s", [AttemptOutcome.SUCCEEDED]),
            ("finished_at", sql.now(), []),
            ("provider_ref", "%s", [provider_ref[:255]]),
            ("response_status", "%s", [response_status]),
        ],
    )
    if op is not None:
        _after_terminal(op, actor=actor)
        # DEBUG: a success needs no one's attention and its record is the event row; what
        # does (fenced, failed, uncertain, paused) is logged at INFO or above.
        log.debug("operation_succeeded key=%s attempt=%s provider_ref=%s", op.key, op.attempts, op.provider_ref)
        return op
    error = _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
    if isinstance(error, LeaseLost) and "status" not in error.extra:
        _record_fenced_evidence(
            operation_id=operation_id,
            lease_token=lease_token,
            provider_ref=provider_ref,
            response_status=response_status,
            response_body=response_body,
        )
    elif isinstance(error, OperationAlreadyFinished):
        current = Operation.objects.get(pk=operation_id)
        # The same holder repeating its own successful complete gets the row back.
        if (
            current.status == S.SUCCEEDED
            and current.lease_token == lease_token
            and current.provider_ref == provider_ref[:255]
        ):
            return current
    raise error


@dataclass(frozen=True)
class FailureDecision:
    to: str
    next_attempt_in: float | None
    reason: str
    attempt_outcome: str


def _decide_failure(
    *,
    op: Operation,
    error_class: str,
    throttled: bool,
    retry_after: float | None,
    now: datetime,
    has_unresolved_sent: bool,
) -> FailureDecision:
    """DESIGN §3 failure classes → the next state."""
    if error_class == ErrorClass.AMBIGUOUS:
        return FailureDecision(S.UNCERTAIN, None, "ambiguous outcome", AttemptOutcome.AMBIGUOUS)
    if error_class in (ErrorClass.INVALID_INPUT, ErrorClass.PERMISSION):
        to = S.REVIEW if has_unresolved_sent else S.FAILED
        return FailureDecision(to, None, f"{error_class}: no retry", AttemptOutcome.FAILED)
    # transient: the effect did not happen; retry unless a cap is hit.
    counted = op.attempts - op.throttled_attempts - (1 if throttled else 0)
    provider = Provider.objects.filter(pk=op.provider_id).first() if op.provider_id else None
    base = provider.base_delay_seconds if provider else 1.0
    cap = provider.max_delay_seconds if provider else 300.0
    delay = backoff_seconds(attempt=max(1, counted), base=base, cap=cap)
    if retry_after is not None:
        delay = max(delay, float(retry_after))
    out_of_attempts = not throttled and counted >= op.max_attempts
    out_of_time = op.expires_at is not None and now + timedelta(seconds=delay) > op.expires_at
    past_deadline = op.deadline is not None and now + timedelta(seconds=delay) > op.deadline
    if out_of_attempts or out_of_time or past_deadline:
        why = "attempts exhausted" if out_of_attempts else "lifetime exhausted"
        to = S.REVIEW if has_unresolved_sent else S.FAILED
        return FailureDecision(to, None, f"transient: {why}", AttemptOutcome.TRANSIENT)
    return FailureDecision(S.RETRY_WAIT, delay, "transient: retry scheduled", AttemptOutcome.TRANSIENT)


def decide_unsent_expiry(op: Operation) -> tuple[str, float | None, str]:
    """A lease that expired before anything was sent is a transient failure of that attempt."""
    decision = _decide_failure(
        op=op,
        error_class=ErrorClass.TRANSIENT,
        throttled=False,
        retry_after=None,
        now=sql.db_now(),
        has_unresolved_sent=op.attempt_set.filter(outcome=AttemptOutcome.AMBIGUOUS).exists(),
    )
    if decision.to == S.RETRY_WAIT:
        # Due at once: nothing was sent, so there is no reason to wait.
        return S.RETRY_WAIT, 0.0, "lease expired before the sent marker"
    return decision.to, None, f"lease expired before the sent marker; {decision.reason}"


class _FencedReport(Exception):
    """A superseded holder's refusal, carried out of the transaction that found it."""

    def __init__(self, error: LeaseLost, **evidence: Any):
        super().__init__(str(error))
        self.error = error
        self.evidence = evidence


@contextmanager
def _atomic_keeping_fenced_evidence() -> Iterator[None]:
    """transaction.atomic(), except that a superseded holder's evidence is written after the
    rollback: written inside, it was rolled back together with the refusal."""
    try:
        with transaction.atomic():
            yield
    except _FencedReport as fenced:
        _record_fenced_evidence(**fenced.evidence)
        raise fenced.error from None


def operation_fail(
    *,
    operation_id: int,
    lease_token: str,
    error_class: str,
    message: str = "",
    response_status: int | None = None,
    response_body: Any = None,
    retry_after: float | None = None,
    throttled: bool = False,
    actor: str = "api",
    tenant_id: int | None = None,
) -> Operation:
    """Record a failure reported by the latest holder and apply DESIGN §3's table.

    ``throttled`` (a 429/503 answer) schedules the retry without consuming an attempt. A
    cap hit while an earlier sent attempt is unresolved lands in ``review``, never
    ``failed``: a failed row may be replayed, so "maybe sent" must never land there.
    """
    if error_class not in ErrorClass.values:
        raise ValidationFailed(f"error_class must be one of {', '.join(ErrorClass.values)}.")
    message = sanitize_message(message)
    with _atomic_keeping_fenced_evidence():
        rows = Operation.objects.select_for_update().filter(
            pk=operation_id, lease_token=lease_token, status__in=REPORTABLE_STATES
        )
        if tenant_id is not None:
            rows = rows.filter(tenant_id=tenant_id)
        op = rows.first()
        if op is None:
            error = _diagnose_holder_refusal(op_id=operation_id, token=lease_token, tenant_id=tenant_id)
            if isinstance(error, LeaseLost) and "status" not in error.extra:
                raise _FencedReport(
                    error,
                    operation_id=operation_id,
                    lease_token=lease_token,
                    error_class=error_class,
                    message=message,
                    response_status=response_status,
                    response_body=response_body,
                )
            raise error
        now = sql.db_now()
        unresolved_before = op.attempt_set.filter(outcome=AttemptOutcome.AMBIGUOUS, number__lt=op.attempts).exists()
        decision = _decide_failure(
            op=op,
            error_class=error_class,
            throttled=throttled,
            retry_after=retry_after,
            now=now,
            has_unresolved_sent=unresolved_before,
        )
        attempt_update = [
            ("outcome", "%s", [decision.attempt_outcome]),
            ("finished_at", sql.now(), []),
            ("error_class", "%s", [error_class]),
            ("message", "%s", [message]),
            ("response_status", "%s", [response_status]),
        ]
        if decision.to == op.status:
            # An ambiguous report on a row already uncertain: evidence only.
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE ledger_attempt SET outcome = %s, error_class = %s, message = %s,"
                    f" finished_at = COALESCE(finished_at, {sql.now()}) WHERE operation_id = %s AND number = %s",
                    [decision.attempt_outcome, error_class, message, op.pk, op.attempts],
                )
            return op
        if decision.to not in ALLOWED_TRANSITIONS[op.status]:
            # e.g. review → uncertain: the row already waits for a human; keep the evidence.
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE ledger_attempt SET outcome = %s, error_class = %s, message = %s"
                    " WHERE operation_id = %s AND number = %s",
                    [decision.attempt_outcome, error_class, message, op.pk, op.attempts],
                )
            return op
        sets: list[tuple[str, str, list[Any]]] = [
            ("error_class", "%s", [error_class]),
            ("last_error", "%s", [message]),
            ("lease_expires_at", "NULL", []),
        ]
        if response_status is not None or response_body is not None:
            sets += [
                ("response_status", "%s", [response_status]),
                ("response_body", sql.json_param(), [sql.dumps(seal_json(response_body))]),
            ]
        if throttled:
            sets.append(("throttled_attempts", "throttled_attempts + 1", []))
        if decision.next_attempt_in is not None:
            due_sql, due_p = sql.now_plus(decision.next_attempt_in)
            sets.append(("next_attempt_at", due_sql, due_p))
        updated = guarded_transition(
            op_id=op.pk,
            to=decision.to,
            from_states=frozenset({op.status}),
            token=lease_token,
            actor=actor,
            reason=f"{decision.reason}: {message}" if message else decision.reason,
            sets=sets,
            attempt_update=attempt_update,
        )
        if updated is None:  # pragma: no cover - the row is locked above
            raise LeaseLost("The operation moved while failing.")
        if updated.status == S.FAILED:
            _after_failed(updated)
        _after_terminal(updated, actor=actor)
    log.info(
        "operation_failed key=%s attempt=%s error_class=%s to=%s",
        updated.key,
        updated.attempts,
        error_class,
        updated.status,
    )
    return updated


# --- Service-side moves (sweeper, reviewers) ------------------------------------------------


def operation_transition(
    *,
    operation: Operation,
    to: str,
    actor: str,
    reason: str,
    sets: list[tuple[str, str, list[Any]]] | None = None,
    attempt_update: list[tuple[str, str, list[Any]]] | None = None,
    extra_where: str = "",
    extra_params: list[Any] | None = None,
) -> Operation:
    """Move an operation from the state it was read in; raises if it moved meanwhile."""
    if to not in ALLOWED_TRANSITIONS.get(operation.status, frozenset()):
        raise IllegalTransition(f"{operation.status} → {to} is not an allowed move.")
    with transaction.atomic():
        updated = guarded_transition(
            op_id=operation.pk,
            to=to,
            from_states=frozenset({operation.status}),
            token=operation.lease_token,
            actor=actor,
            reason=reason,
            sets=sets,
            attempt_update=attempt_update,
            extra_where=extra_where,
            extra_params=extra_params,
        )
        if updated is None:
            raise LeaseLost("The operation moved before this change could be applied.")
        if updated.status == S.FAILED:
            _after_failed(updated)
        _after_terminal(updated, actor=actor)
    return updated


def operation_supersede(*, operation_id: int, by_operation_id: int, actor: str, reason: str = "") -> Operation:
    """A failed operation records the replay that supersedes it (DESIGN §4).

    The row stays `failed` (history is never edited); only ``superseded_by`` moves, to a
    newer operation than the one it points at, with an event row. Later claims of its key
    answer with the newest replay's outcome (``_newest_in_lineage``).
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE ledger_operation SET superseded_by_id = %s, updated_at = {sql.now()}"
                " WHERE id = %s AND status = %s AND id <> %s"
                " AND (superseded_by_id IS NULL OR superseded_by_id < %s)"
                f" RETURNING {sql.OP_SELECT}",
                [by_operation_id, operation_id, S.FAILED, by_operation_id, by_operation_id],
            )
            row = cursor.fetchone()
            if row is None:
                raise IllegalTransition("Only a failed operation can be superseded, and only by a newer one.")
            _insert_event(
                cursor,
                op_id=operation_id,
                old=S.FAILED,
                new=S.FAILED,
                actor=actor,
                reason=reason or f"superseded by operation {by_operation_id}",
                attempt=None,
            )
    return sql.operation_from_row(row)


# --- Tenants, keys, providers ----------------------------------------------------------


def tenant_create(*, slug: str, name: str = "") -> Tenant:
    try:
        with transaction.atomic():
            return Tenant.objects.create(slug=slug, name=name or slug)
    except IntegrityError as exc:
        raise ValidationFailed(f"A tenant named {slug!r} exists already.") from exc


def apikey_create(*, tenant: Tenant, scopes: list[str] | None = None, name: str = "") -> tuple[Any, str]:
    """Create an API key; the secret is returned once and only its sha256 is stored."""
    scopes = scopes or ["read", "write"]
    unknown = set(scopes) - set(ApiKey.SCOPES)
    if unknown:
        raise ValidationFailed(f"Unknown scopes: {', '.join(sorted(unknown))}.")
    prefix = secrets.token_hex(4)
    secret = f"og_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, hashed_key=hash_api_key(secret), scopes=scopes
    )
    return api_key, secret


def apikey_revoke(*, api_key_id: int) -> None:
    ApiKey.objects.filter(pk=api_key_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    API_KEYS.forget_where(lambda found: found[1].pk == api_key_id)


def provider_upsert(*, tenant: Tenant, slug: str, **fields: Any) -> Provider:
    provider, _ = Provider.objects.update_or_create(tenant=tenant, slug=slug, defaults=fields)
    PROVIDERS.forget((tenant.pk, slug))
    return provider


# --- Provider throttling and pausing (execute mode) -------------------------------------------


def provider_throttle(*, provider_id: int, seconds: float) -> None:
    """A 429/503 answer: workers take none of this provider's work until ``throttled_until``
    (database clock). Only ever extends, so two workers reporting at once keep the later time."""
    until_sql, until_p = sql.now_plus(max(0.0, seconds))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_provider SET throttled_until = {until_sql}"
            f" WHERE id = %s AND (throttled_until IS NULL OR throttled_until < {until_sql})",
            [*until_p, provider_id, *until_p],
        )
    log.info("provider_throttled provider=%s seconds=%.1f", provider_id, seconds)


def provider_pause(*, provider_id: int, reason: str, actor: str = "worker") -> bool:
    """401/403 from a provider: no worker sends to it until an operator resumes it.

    Returns True when this call paused it (and raised the alert); a provider already paused
    stays paused with its first reason."""
    reason = sanitize_message(reason)[:200]
    with transaction.atomic():
        paused = Provider.objects.filter(pk=provider_id, paused_at__isnull=True).update(
            paused_at=timezone.now(), paused_reason=reason, updated_at=timezone.now()
        )
        if paused:
            provider = Provider.objects.only("id", "tenant_id", "slug").get(pk=provider_id)
            hooks.alert_raised.send(
                tenant_id=provider.tenant_id,
                kind="provider_paused",
                ref=provider.slug,
                summary=f"provider {provider.slug} paused: {reason}",
            )
    if paused:
        log.warning("provider_paused provider=%s actor=%s reason=%s", provider_id, actor, reason)
    return bool(paused)


def provider_resume(*, provider_id: int, actor: str) -> bool:
    """An operator's decision: the provider's queued work flows again."""
    resumed = Provider.objects.filter(pk=provider_id, paused_at__isnull=False).update(
        paused_at=None, paused_reason="", throttled_until=None, updated_at=timezone.now()
    )
    if resumed:
        log.info("provider_resumed provider=%s actor=%s", provider_id, actor)
    return bool(resumed)
