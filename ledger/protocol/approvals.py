"""Four-eyes approval of re-sends (ADR 0013): the one place an ``ApprovalRequest`` moves.

A tenant or provider that requires approval (``resend_approval_required``, platform-owned)
turns every re-send — a DLQ replay, bulk replay, corrected replay, re-run as new, forced
re-issue, run resume, the decisions "safe to resend" and "safe to retry" — into a pending
request. The service that would have sent calls :func:`approval_gate` first: it stores the
request and raises :class:`ApprovalPending`, which the API answers with 202 and the console
with a message. A second person approves (:func:`approval_request_approve`): the guarded
``pending → approved`` UPDATE lets exactly one approver through, and the re-send then runs in
the approver's name through the same service the direct path uses, registered here by the app
that owns it (:func:`approval_executor_register`, connected in ``AppConfig.ready()``: the
ledger imports nothing of the DLQ or review). While it runs the gate lets that service through
(:func:`approval_executing`); the outcome is recorded (``executed`` or ``failed``).

Every move writes a ``ConfigChange`` row (the trail the console's history shows) in its
transaction: who asked and why, who decided and why, what came of it.

May import: ``ledger.providers`` and every room below it (``ledger.protocol``'s room).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from ledger.models import (
    APPROVAL_MOVES,
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
    ConfigChangeAction,
    Provider,
    Tenant,
)
from ledger.platform import crypto
from ledger.platform.errors import (
    ApprovalBySameActor,
    ApprovalNotFound,
    ApprovalNotPending,
    ApprovalRequired,
    DomainError,
    ValidationFailed,
)
from ledger.protocol.inputs import sanitize_message
from ledger.tenants.config_changes import config_change_record

log = logging.getLogger("onceguard.approvals")

A = ApprovalStatus
MAX_REASON = 500
# An approved request whose re-send never reported back (the process died mid-send) is
# failed by the expiry pass after this long; the replay's own recovery settles the send.
STALE_APPROVED = timedelta(hours=1)

# (request, approver) → what came of the re-send, in words. Raises a DomainError when the
# service refuses (the entry moved meanwhile): the request is then ``failed`` with its detail.
Executor = Callable[[ApprovalRequest, str], str]
_EXECUTORS: dict[str, Executor] = {}
_executing: ContextVar[ApprovalRequest | None] = ContextVar("approval_executing", default=None)


class ApprovalPending(Exception):
    """The re-send was not made: it waits for a second person as ``request``."""

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__(f"approval request {request.pk} waits for a second person")
        self.request = request


def approval_executor_register(kind: str, executor: Executor) -> Executor:
    """The service that runs an approved request of ``kind`` (the DLQ's and review's apps
    connect theirs in ``ready()``). Registering a kind again replaces it (a reload)."""
    if kind not in ApprovalKind.values:
        raise ValueError(f"unknown approval kind {kind!r}")
    _EXECUTORS[kind] = executor
    return executor


def approval_ttl() -> timedelta:
    return timedelta(seconds=int(settings.ONCEGUARD.get("APPROVAL_TTL_SECONDS") or 86400))


def approval_required(*, tenant_id: int, provider_id: int | None = None, provider_ids: Sequence[int] = ()) -> bool:
    """Whether a re-send for this tenant (and its providers, if any) needs a second person:
    either setting requires it. One indexed read, never cached: a switch takes effect at the
    next click."""
    wanted = sorted({p for p in (provider_id, *provider_ids) if p is not None})
    flag = Q(resend_approval_required=True)
    if wanted:
        flag |= Q(providers__pk__in=wanted, providers__resend_approval_required=True)
    return Tenant.objects.filter(flag, pk=tenant_id).exists()


def approval_provider(*, tenant_id: int, provider_ids: Sequence[int | None]) -> int | None:
    """The first of these providers that requires approval itself (None: none does)."""
    wanted = sorted({p for p in provider_ids if p is not None})
    if not wanted:
        return None
    return (
        Provider.objects.filter(pk__in=wanted, tenant_id=tenant_id, resend_approval_required=True)
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )


@contextmanager
def approval_executing(request: ApprovalRequest) -> Iterator[None]:
    """Inside: the services gated for ``request``'s tenant send (the approved re-send runs)."""
    token = _executing.set(request)
    try:
        yield
    finally:
        _executing.reset(token)


def approval_in_progress(tenant_id: int) -> ApprovalRequest | None:
    """The approved request being executed for this tenant in this context, if any."""
    current = _executing.get()
    return current if current is not None and current.tenant_id == tenant_id else None


def approval_gate(
    *,
    tenant_id: int,
    provider_id: int | None,
    kind: str,
    actor: str,
    reason: str,
    target_ids: list[int] | None = None,
    target_ref: str = "",
    params: dict[str, Any] | None = None,
    provider_ids: Sequence[int] = (),
) -> None:
    """Called by a re-sending service before it sends. Nothing when approval is not required
    (or an approved request of this tenant is being executed); otherwise the request is stored
    and :class:`ApprovalPending` raised — nothing is sent."""
    if approval_in_progress(tenant_id) is not None:
        return
    if not approval_required(tenant_id=tenant_id, provider_id=provider_id, provider_ids=provider_ids):
        return
    request = approval_request_create(
        tenant_id=tenant_id,
        provider_id=approval_provider(tenant_id=tenant_id, provider_ids=[provider_id, *provider_ids]) or provider_id,
        kind=kind,
        actor=actor,
        reason=reason,
        target_ids=target_ids or [],
        target_ref=target_ref,
        params=params or {},
    )
    raise ApprovalPending(request)


def approval_guard(
    *,
    tenant_id: int,
    provider_id: int | None,
    provider_ids: Sequence[int] = (),
    approved_otherwise: Callable[[], bool] | None = None,
) -> None:
    """The last check on the sending path itself: a re-send that needs approval and runs
    outside an approved request is refused (``approval_required``), whichever caller forgot to
    ask. ``approved_otherwise``: asked only when approval is required — whether the caller
    proved it another way (a bulk run whose confirm was approved)."""
    if approval_in_progress(tenant_id) is not None:
        return
    if not approval_required(tenant_id=tenant_id, provider_id=provider_id, provider_ids=provider_ids):
        return
    if approved_otherwise is not None and approved_otherwise():
        return
    raise ApprovalRequired("This tenant or provider requires a second person's approval for re-sends.")


def approval_granted_for(*, tenant_id: int, kind: str, target_ref: str) -> bool:
    """Whether an approved (or executed) request of ``kind`` names ``target_ref``: how a bulk
    replay's runner, a task of its own, knows its confirm was approved."""
    return ApprovalRequest.objects.filter(
        tenant_id=tenant_id, kind=kind, target_ref=target_ref, status__in=(A.APPROVED, A.EXECUTED)
    ).exists()


def _clean_reason(reason: str | None, *, what: str) -> str:
    text = sanitize_message(reason)[:MAX_REASON]
    if not text:
        raise ValidationFailed(f"{what} needs a reason (four-eyes: the other person reads it).")
    return text


def _snapshot(request: ApprovalRequest) -> dict[str, Any]:
    """What the trail shows of a request. Never the parameters: they may hold a payload's values."""
    return {
        "status": request.status,
        "kind": request.kind,
        "target_ids": request.target_ids[:50],
        "target_ref": request.target_ref,
        "requested_by": request.requested_by,
        "decided_by": request.decided_by,
        "outcome": request.outcome,
    }


def _trail(request: ApprovalRequest, *, actor: str, before: dict[str, Any] | None, reason: str) -> None:
    """The move in the configuration trail (the console's history), in the move's transaction."""
    config_change_record(
        tenant_id=request.tenant_id,
        actor=actor,
        action=ConfigChangeAction.CREATE if before is None else ConfigChangeAction.UPDATE,
        object_type=ApprovalRequest._meta.label_lower,
        object_id=request.pk,
        object_repr=str(request),
        before=before,
        after=_snapshot(request),
        reason=reason,
    )


def approval_request_create(
    *,
    tenant_id: int,
    provider_id: int | None,
    kind: str,
    actor: str,
    reason: str,
    target_ids: list[int],
    target_ref: str = "",
    params: dict[str, Any],
) -> ApprovalRequest:
    """A pending request (its parameters sealed like payloads), and its trail row."""
    if kind not in ApprovalKind.values:
        raise ValidationFailed(f"Unknown re-send kind {kind!r}.")
    reason = _clean_reason(reason, what="A re-send that needs approval")
    now = timezone.now()
    with transaction.atomic():
        request = ApprovalRequest.objects.create(
            tenant_id=tenant_id,
            provider_id=provider_id,
            kind=kind,
            status=A.PENDING,
            target_ids=[int(i) for i in target_ids],
            target_ref=target_ref[:255],
            params=crypto.seal_json(params),
            requested_by=actor[:150],
            request_reason=reason,
            requested_at=now,
            expires_at=now + approval_ttl(),
        )
        _trail(request, actor=actor, before=None, reason=reason)
    log.info("approval_requested id=%s tenant=%s kind=%s", request.pk, tenant_id, kind)
    return request


def approval_params(request: ApprovalRequest) -> dict[str, Any]:
    """The request's parameters, opened (for its executor only: never shown, never logged)."""
    value = crypto.open_json(request.params)
    return value if isinstance(value, dict) else {}


def approval_request_get(*, tenant_id: int, request_id: int) -> ApprovalRequest:
    request = ApprovalRequest.objects.filter(pk=request_id, tenant_id=tenant_id).first()
    if request is None:
        raise ApprovalNotFound("No such approval request.")
    return request


def approval_requests_of(*, tenant_ids: list[int] | None) -> QuerySet[ApprovalRequest]:
    """The requests these tenants see (None: every tenant, a superuser), pending first."""
    rows = ApprovalRequest.objects.all()
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    # Pending first (what waits for someone), newest first within each group.
    pending_first = Case(When(status=A.PENDING, then=Value(0)), default=Value(1), output_field=IntegerField())
    return rows.order_by(pending_first, "-requested_at", "-id")


def _decide(*, tenant_id: int, request_id: int, actor: str, reason: str, to: str, what: str) -> ApprovalRequest:
    """The guarded ``pending → to`` move of a second person. Zero rows moved means another
    approver (or the clock) was first: ``approval_not_pending``."""
    assert to in APPROVAL_MOVES[A.PENDING], to
    reason = _clean_reason(reason, what=what)
    request = approval_request_get(tenant_id=tenant_id, request_id=request_id)
    if request.requested_by == actor[:150]:
        raise ApprovalBySameActor(
            "You asked for this re-send: another person with the right to approve decides it.",
            extra={"approval": request.pk},
        )
    now = timezone.now()
    with transaction.atomic():
        # The requester is excluded in the statement too (and by the table's CHECK): the
        # check above is the readable answer, these are the ones that hold.
        moved = (
            ApprovalRequest.objects.filter(pk=request.pk, tenant_id=tenant_id, status=A.PENDING, expires_at__gt=now)
            .exclude(requested_by=actor[:150])
            .update(status=to, decided_by=actor[:150], decision_reason=reason, decided_at=now)
        )
        if moved:
            before = _snapshot(request)
            request.refresh_from_db()
            _trail(request, actor=actor, before=before, reason=reason)
    if not moved:
        approval_requests_expire(tenant_id=tenant_id)
        request.refresh_from_db()
        raise ApprovalNotPending(
            f"This request is {request.get_status_display()}.", extra={"approval": request.pk, "status": request.status}
        )
    return request


def approval_request_approve(*, tenant_id: int, request_id: int, actor: str, reason: str) -> ApprovalRequest:
    """A second person approves: exactly one approver moves it (guarded UPDATE), then the
    re-send runs in the approver's name through the service the direct path uses, after that
    commit (a replay is three short commits around an HTTP call, never one transaction held
    across it). The outcome — ``executed`` or ``failed`` with the service's refusal — is
    recorded and returned."""
    request = _decide(
        tenant_id=tenant_id, request_id=request_id, actor=actor, reason=reason, to=A.APPROVED, what="An approval"
    )
    executor = _EXECUTORS.get(request.kind)
    if executor is None:
        return approval_request_settle(request=request, ok=False, outcome="no service runs this kind of re-send")
    try:
        with approval_executing(request):
            outcome = executor(request, actor)
    except DomainError as exc:
        log.info("approval_failed id=%s code=%s", request.pk, exc.code)
        return approval_request_settle(request=request, ok=False, outcome=f"{exc.code}: {exc.detail}")
    except BaseException:
        # Not a refusal: the send itself broke. Recorded, then raised on (the replay's own
        # recovery settles a send left half-way).
        approval_request_settle(request=request, ok=False, outcome="the re-send raised an unexpected error")
        raise
    return approval_request_settle(request=request, ok=True, outcome=outcome)


def approval_request_settle(*, request: ApprovalRequest, ok: bool, outcome: str) -> ApprovalRequest:
    """approved → executed | failed, with what came of it, in words (guarded)."""
    to = A.EXECUTED if ok else A.FAILED
    outcome = sanitize_message(outcome)[:500]
    with transaction.atomic():
        moved = ApprovalRequest.objects.filter(pk=request.pk, tenant_id=request.tenant_id, status=A.APPROVED).update(
            status=to, outcome=outcome, settled_at=timezone.now()
        )
        before = _snapshot(request)
        request.refresh_from_db()
        if moved:
            _trail(request, actor=request.decided_by, before=before, reason=outcome or to)
    log.info("approval_settled id=%s status=%s", request.pk, request.status)
    return request


def approval_request_reject(*, tenant_id: int, request_id: int, actor: str, reason: str) -> ApprovalRequest:
    """A second person rejects: nothing is sent; the reason is in the trail."""
    request = _decide(
        tenant_id=tenant_id, request_id=request_id, actor=actor, reason=reason, to=A.REJECTED, what="A rejection"
    )
    log.info("approval_rejected id=%s", request.pk)
    return request


def approval_requests_expire(*, tenant_id: int | None = None) -> dict[str, int]:
    """pending past ``expires_at`` → expired (nothing sent), and an approved request whose
    re-send never reported back → failed. Run by the sweeper's schedule; each row its trail."""
    now = timezone.now()
    counts = {"expired": 0, "interrupted": 0}
    rows = ApprovalRequest.objects.filter(status=A.PENDING, expires_at__lte=now)
    stale = ApprovalRequest.objects.filter(status=A.APPROVED, decided_at__lte=now - STALE_APPROVED)
    if tenant_id is not None:
        rows, stale = rows.filter(tenant_id=tenant_id), stale.filter(tenant_id=tenant_id)
    for pk in list(rows.order_by("pk").values_list("pk", flat=True)[:1000]):
        with transaction.atomic():
            request = ApprovalRequest.objects.get(pk=pk)
            if ApprovalRequest.objects.filter(
                pk=pk, tenant_id=request.tenant_id, status=A.PENDING, expires_at__lte=now
            ).update(status=A.EXPIRED):
                request.refresh_from_db()
                _trail(request, actor="system", before={**_snapshot(request), "status": A.PENDING}, reason="expired")
                counts["expired"] += 1
    for pk in list(stale.order_by("pk").values_list("pk", flat=True)[:1000]):
        request = ApprovalRequest.objects.get(pk=pk)
        approval_request_settle(request=request, ok=False, outcome="interrupted: the re-send did not report back")
        counts["interrupted"] += 1
    return counts
