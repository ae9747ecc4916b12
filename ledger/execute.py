"""Execute mode (DESIGN §3): the service performs the effect.

- :func:`operation_submit` validates the provider-neutral envelope, runs admission for a new
  key, and writes the row ``queued`` in the request's transaction: the operations table is
  the work queue, so nothing is lost between the web and the workers.
- :func:`operations_take` is the workers' one guarded UPDATE: due rows of providers that are
  neither paused nor throttled, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, writing the lease,
  a new Attempt, the event and the ``sent`` marker in the same commit (workers send right
  after, so a fresh operation costs two commits: take and record).
- :func:`operation_execute` sends one taken operation through the adapter and records the
  classified outcome through the fenced services (complete/fail).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction

from ledger import adapters, admission, callbacks, services, sql
from ledger.crypto import open_json
from ledger.errors import AdmissionRefused, DomainError, UnknownProvider, ValidationFailed
from ledger.models import (
    ErrorClass,
    Operation,
    OperationMode,
    OperationStatus,
    Provider,
    ProviderKind,
    Tenant,
)

S = OperationStatus
log = logging.getLogger("onceguard.execute")

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Never accepted from a caller, whatever a provider's allow-list says: credentials, hop-by-hop
# and framing headers are ours to set.
FORBIDDEN_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
    }
)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
MAX_PATH_LENGTH = 2000


def _cfg(name: str, default: Any) -> Any:
    return settings.ONCEGUARD.get(name, default)


class RequestTooLarge(ValidationFailed):
    code, title = "request_too_large", "Request envelope too large"


# --- Submit ---------------------------------------------------------------------------------


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and value != value)


def normalize_envelope(*, request: Any, provider: Provider) -> dict[str, Any]:
    """The stored form of a submitted ``request`` (method/path/query/headers/body), or a 400."""
    if not isinstance(request, dict):
        raise ValidationFailed("`request` must be an object with method, path, query, headers, body.")
    unknown = set(request) - {"method", "path", "query", "headers", "body"}
    if unknown:
        raise ValidationFailed(f"Unknown request fields: {', '.join(sorted(unknown))}.")
    method = request.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValidationFailed(f"request.method must be one of {', '.join(METHODS)}.")
    path = request.get("path", "/")
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or path.startswith("//")
        or len(path) > MAX_PATH_LENGTH
        or not path.isprintable()
        or " " in path
        or "?" in path
        or "#" in path
        or any(segment in ("..", ".") for segment in path.split("/"))
    ):
        # A path relative to the provider's base URL: it can never name another host.
        raise ValidationFailed("request.path must be an absolute path below the provider's base URL (no query).")
    query = request.get("query") or {}
    if not isinstance(query, dict) or not all(
        isinstance(k, str) and (_scalar(v) or (isinstance(v, list) and all(_scalar(i) for i in v)))
        for k, v in query.items()
    ):
        raise ValidationFailed("request.query must map names to strings, numbers, booleans or lists of them.")
    headers = request.get("headers") or {}
    if not isinstance(headers, dict):
        raise ValidationFailed("request.headers must map names to strings.")
    allowed = {h.lower() for h in provider.forward_headers or []}
    reserved = {provider.idempotency_header.lower()} | (
        {provider.auth_header.lower()} if provider.auth_header else set()
    )
    clean_headers: dict[str, str] = {}
    for name, value in headers.items():
        lname = name.lower() if isinstance(name, str) else ""
        if not _HEADER_NAME.match(lname or "-") or not lname:
            raise ValidationFailed("request.headers has a header name that is not valid.")
        if lname in FORBIDDEN_HEADERS or lname in reserved or lname not in allowed:
            raise ValidationFailed(
                f"Header {name!r} is not allowed for this provider.",
                extra={"allowed_headers": sorted(allowed - FORBIDDEN_HEADERS - reserved)},
            )
        if not isinstance(value, str) or not value.isprintable() or len(value) > 1000:
            raise ValidationFailed(f"Header {name!r} must be a printable string of at most 1000 characters.")
        clean_headers[lname] = value
    envelope: dict[str, Any] = {"method": method.upper(), "path": path}
    if query:
        envelope["query"] = query
    if clean_headers:
        envelope["headers"] = clean_headers
    if "body" in request and request["body"] is not None:
        envelope["body"] = request["body"]
    return envelope


@dataclass(frozen=True)
class SubmitResult:
    operation: Operation
    created: bool
    replayed: bool


def execute_provider_for(*, tenant: Tenant, slug: str) -> Provider:
    provider = services.provider_for(tenant=tenant, slug=slug)
    if provider is None or provider.kind != ProviderKind.HTTP:
        raise UnknownProvider(f"No provider named {slug!r} is configured for this tenant.")
    if not provider.base_url:
        raise UnknownProvider(f"Provider {slug!r} has no base URL; it cannot be used in execute mode.")
    return provider


def operation_submit(
    *,
    tenant: Tenant,
    key: str,
    provider: str,
    action: str = "",
    request: Any,
    payload: Any = None,
    deadline_seconds: float | None = None,
    callback_url: str = "",
    reconciliation_handle: str = "",
    execution_id: str = "",
    workflow_id: str = "",
    workflow_version: str = "",
    correlation_id: str = "",
    actor: str = "api",
) -> SubmitResult:
    """Accept an operation for the workers, or answer for the key's existing row (DESIGN §5).

    Validation and admission raise before anything is written, so a corrected retry can
    succeed. Admission runs only for a key that is new: a replay is never refused.
    """
    key = services.validate_key(key)
    provider_obj = execute_provider_for(tenant=tenant, slug=provider)
    envelope = normalize_envelope(request=request, provider=provider_obj)
    size = len(services.canonical_json(envelope).encode())
    limit = int(_cfg("EXECUTE_MAX_REQUEST_BYTES", 256 * 1024))
    if size > limit:
        raise RequestTooLarge(f"The request envelope is {size} bytes; the limit is {limit}.", extra={"limit": limit})
    if deadline_seconds is not None and not 0 < float(deadline_seconds) <= 366 * 86400:
        raise ValidationFailed("deadline_seconds must be positive (at most a year).")
    if callback_url:
        callbacks.callback_url_check(tenant=tenant, url=callback_url)
    fingerprint = services.request_fingerprint(
        mode=OperationMode.EXECUTE, provider=provider_obj.slug, action=action, request=envelope
    )
    cost = Decimal(provider_obj.unit_price or 0)
    claim_kwargs: dict[str, Any] = dict(
        key=key,
        provider=provider_obj,
        action=action,
        request=envelope,
        payload=payload,
        mode=OperationMode.EXECUTE,
        deadline_seconds=deadline_seconds,
        reconciliation_handle=reconciliation_handle,
        execution_id=execution_id,
        workflow_id=workflow_id,
        workflow_version=workflow_version,
        correlation_id=correlation_id,
        actor=actor,
        via_claims=False,
        fingerprint=fingerprint,
        extra_columns={"request_bytes": size, "cost": str(cost), "callback_url": callback_url},
    )
    if callback_url and not tenant.callback_secret:
        # The secret exists before the first callback could be signed.
        callbacks.tenant_callback_secret(tenant_id=tenant.pk)
    if not admission.tenant_has_limits(tenant):
        result = services.operation_claim(tenant=tenant, **claim_kwargs)
        return SubmitResult(result.operation, created=result.acquired, replayed=result.replayed)
    try:
        with transaction.atomic():
            locked = admission.lock_tenant(tenant)
            # Under the tenant lock: a key inserted by a racing submission is visible now.
            if not Operation.objects.filter(tenant_id=tenant.pk, key=key).exists():
                admission.admission_check(tenant=locked, request_bytes=size, cost=cost)
            result = services.operation_claim(tenant=tenant, **claim_kwargs)
    except AdmissionRefused as refusal:
        admission.admission_refusal_record(tenant_id=tenant.pk, reason=refusal.code)
        raise
    return SubmitResult(result.operation, created=result.acquired, replayed=result.replayed)


# --- Take -----------------------------------------------------------------------------------


# Declared states and mode, as the SQL literals the due index's predicate matches.
DUE = sql.states_in(S.QUEUED, S.RETRY_WAIT)
CLAIMED = sql.state_literal(S.CLAIMED)
EXECUTE = f"'{OperationMode.EXECUTE}'"


def _lease_margin() -> float:
    return float(_cfg("WORKER_LEASE_MARGIN_SECONDS", 5.0))


def _take_postgres(*, limit: int, actor: str) -> list[Operation]:
    cols = ", ".join(f"o.{c}" for c in sql.OP_COLUMNS)
    expired = (
        "((o.deadline IS NOT NULL AND o.deadline <= now()) OR (o.expires_at IS NOT NULL AND o.expires_at <= now()))"
    )
    statement = f"""
WITH due AS (
    SELECT o.id, o.status AS old_status FROM ledger_operation o
    WHERE o.status IN {DUE} AND o.mode = {EXECUTE} AND o.next_attempt_at <= now()
      AND o.provider_id NOT IN (
          SELECT p.id FROM ledger_provider p WHERE p.paused_at IS NOT NULL OR p.throttled_until > now())
    ORDER BY o.next_attempt_at, o.id
    LIMIT %s
    FOR UPDATE OF o SKIP LOCKED
), upd AS (
    UPDATE ledger_operation o SET
        status = {CLAIMED},
        attempts = o.attempts + 1,
        lease_token = replace(gen_random_uuid()::text, '-', ''),
        claimed_at = now(),
        lease_expires_at = now() + ((2 * p.timeout_seconds + %s) * interval '1 second'),
        sent_at = CASE WHEN {expired} THEN NULL ELSE now() END,
        uses_sent_marker = true,
        next_attempt_at = NULL,
        updated_at = now()
    FROM due, ledger_provider p
    WHERE o.id = due.id AND p.id = o.provider_id
    RETURNING {cols}, due.old_status
), att AS (
    {services.new_attempt_sql(source="upd")}
), ev AS (
    INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor, reason, attempt, at)
    SELECT id, old_status, {CLAIMED}, %s,
        CASE WHEN sent_at IS NULL THEN 'taken past its deadline' ELSE 'taken, sent' END, attempts, now()
    FROM upd
)
SELECT * FROM upd ORDER BY id
"""
    with connection.cursor() as cursor:
        cursor.execute(statement, [limit, _lease_margin(), actor[:150]])
        rows = cursor.fetchall()
    return [sql.operation_from_row(row) for row in rows]


def _take_sqlite(*, limit: int, actor: str) -> list[Operation]:
    taken: list[Operation] = []
    now = sql.now()
    with transaction.atomic():  # BEGIN IMMEDIATE: the one writer until commit
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT o.id, o.status, p.timeout_seconds,"
                f" (o.deadline IS NOT NULL AND o.deadline <= {now}) OR (o.expires_at IS NOT NULL AND o.expires_at <= {now})"
                " FROM ledger_operation o JOIN ledger_provider p ON p.id = o.provider_id"
                f" WHERE o.status IN {DUE} AND o.mode = {EXECUTE} AND o.next_attempt_at <= {now}"
                f" AND p.paused_at IS NULL AND (p.throttled_until IS NULL OR p.throttled_until <= {now})"
                " ORDER BY o.next_attempt_at, o.id LIMIT %s",
                [limit],
            )
            due = cursor.fetchall()
        for op_id, old_status, timeout, expired in due:
            lease_sql, lease_p = sql.now_plus(2 * float(timeout) + _lease_margin())
            op = services.guarded_transition(
                op_id=op_id,
                to=S.CLAIMED,
                from_states=frozenset({old_status}),
                actor=actor,
                reason="taken past its deadline" if expired else "taken, sent",
                sets=[
                    ("attempts", "attempts + 1", []),
                    ("lease_token", "%s", [services.new_lease_token()]),
                    ("claimed_at", now, []),
                    ("lease_expires_at", lease_sql, lease_p),
                    ("sent_at", "NULL" if expired else now, []),
                    ("uses_sent_marker", "%s", [True]),
                    ("next_attempt_at", "NULL", []),
                ],
                attempt_insert=True,
            )
            if op is not None:
                taken.append(op)
    return taken


def operations_take(*, limit: int, actor: str = "worker") -> list[Operation]:
    """Take up to ``limit`` due operations: queued→claimed or retry_wait→claimed, each with a
    new Attempt, its event and the ``sent`` marker, all in one commit. Two workers never take
    the same row (SKIP LOCKED on PostgreSQL; one writer at a time on SQLite).

    A row taken after its deadline or lifetime gets no ``sent`` marker: it is failed, not sent.
    """
    if limit <= 0:
        return []
    if sql.is_postgres():
        return _take_postgres(limit=limit, actor=actor)
    return _take_sqlite(limit=limit, actor=actor)


# --- Execute one taken operation --------------------------------------------------------------


class ProviderCache:
    """Provider rows by id, re-read after ``ttl`` seconds (config changes reach workers
    quickly; paused/throttled state is enforced by the take itself)."""

    def __init__(self, ttl: float = 2.0) -> None:
        self.ttl = ttl
        self._rows: dict[int, tuple[float, Provider]] = {}

    def get(self, provider_id: int) -> Provider:
        hit = self._rows.get(provider_id)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        provider = Provider.objects.get(pk=provider_id)
        self._rows[provider_id] = (now, provider)
        return provider


_default_cache = ProviderCache()


def _send(*, op: Operation, provider: Provider, client: httpx.Client) -> adapters.Outcome:
    if provider.kind == ProviderKind.CALLBACK:
        url = str((open_json(op.request) or {}).get("url") or "")
        tenant = Tenant.objects.only("id", "callback_allow_list").get(pk=op.tenant_id)
        if not callbacks.callback_url_allowed(allow_list=tenant.callback_allow_list, url=url):
            return adapters.Outcome(ErrorClass.INVALID_INPUT, message="callback URL no longer allowed", sent=False)
        body = callbacks.callback_body(callback_operation=op)
        secret = callbacks.tenant_callback_secret(tenant_id=op.tenant_id)
        # Signed per attempt: the signature covers the time of sending (receivers bound its age).
        signature = {adapters.SIGNATURE_HEADER: adapters.sign(secret=secret, body=body)}
        return adapters.send(
            provider=provider, operation=op, client=client, callback_body=body, extra_headers=signature
        )
    return adapters.send(provider=provider, operation=op, client=client)


def record_outcome(*, op: Operation, provider: Provider, outcome: adapters.Outcome, actor: str) -> Operation:
    """Record an attempt's classified outcome through the fenced services."""
    if outcome.succeeded:
        # With a callback the terminal move and the callback row share one transaction.
        with transaction.atomic() if op.callback_url else contextlib.nullcontext():
            return services.operation_complete(
                operation_id=op.pk,
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
    if outcome.error_class == ErrorClass.PERMISSION and shared:
        services.provider_pause(provider_id=provider.pk, reason=outcome.message or "permission denied", actor=actor)
    return services.operation_fail(
        operation_id=op.pk,
        lease_token=op.lease_token,
        error_class=outcome.error_class,
        message=f"{outcome.message} ({outcome.duration_ms} ms)",
        response_status=outcome.status,
        response_body=outcome.body if outcome.error_class == ErrorClass.INVALID_INPUT else None,
        retry_after=outcome.retry_after,
        throttled=outcome.throttled,
        actor=actor,
    )


def operation_execute(
    *, operation: Operation, client: httpx.Client, actor: str = "worker", cache: ProviderCache | None = None
) -> Operation | None:
    """Send one taken operation and record its outcome. Returns the recorded row, or None
    when the row moved meanwhile (the sweeper or a reviewer; the result was kept as evidence)."""
    op = operation
    provider = (cache or _default_cache).get(op.provider_id)
    if op.sent_at is None:
        # Taken after its deadline or lifetime: old work expires instead of acting.
        outcome = adapters.Outcome(
            ErrorClass.TRANSIENT, message="deadline or lifetime passed before sending", sent=False
        )
    else:
        outcome = _send(op=op, provider=provider, client=client)
    try:
        recorded = record_outcome(op=op, provider=provider, outcome=outcome, actor=actor)
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
        " correlation_id=%s workflow_version=%s to=%s",
        op.key,
        op.attempts,
        provider.slug,
        outcome.error_class or "succeeded",
        outcome.status,
        outcome.provider_ref,
        outcome.duration_ms,
        op.correlation_id,
        op.workflow_version,
        recorded.status,
    )
    return recorded
