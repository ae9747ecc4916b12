"""In-process guard: run a function at most once per key, durably.

For Python code in the same deployment (django-q2 tasks, Django views)::

    @idempotent(tenant="acme", key=lambda order: f"order-{order.id}:charge:v1",
                provider="stripe", action="charge")
    def charge(order): ...

or as a call::

    result = run_once(tenant=acme, key="order-1001:export:rev3", fn=export, args=(order,))

It goes through the same services as the HTTP API: claim with the sent marker written in
the same commit (we call the function right after), then complete or fail. A finished key
returns the recorded result without calling again (a recorded failure raises
``OperationFailed``). A key held by someone else raises ``OperationInProgress``; an unknown
outcome raises ``OperationNeedsReconciliation`` — never a silent second call. The function's
return value must be JSON-serializable: it is what later calls replay.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ledger.models import ErrorClass, Operation, OperationStatus, Tenant
from ledger.platform.crypto import open_json
from ledger.platform.errors import DomainError
from ledger.protocol import services, transitions

T = TypeVar("T")
log = logging.getLogger("onceguard.guard")


class GuardedError(Exception):
    """Raise (or subclass) from a guarded function to say what kind of failure it was."""

    error_class: str = ErrorClass.AMBIGUOUS


class TransientError(GuardedError):
    """The effect definitely did not happen; a later call may retry it."""

    error_class = ErrorClass.TRANSIENT


class InvalidInputError(GuardedError):
    """The effect did not happen and never will with this input."""

    error_class = ErrorClass.INVALID_INPUT


class PermissionDeniedError(GuardedError):
    error_class = ErrorClass.PERMISSION


class OperationFailed(DomainError):
    """The key's operation ended in `failed` (or was abandoned); its record is attached."""

    status, code, title = 409, "operation_failed", "Operation failed"

    def __init__(self, operation: Operation):
        super().__init__(f"The operation {operation.key!r} ended {operation.status}: {operation.last_error}")
        self.operation = operation


def default_classify(exc: BaseException) -> str:
    """An exception after the sent marker means we do not know: ambiguous, unless it says."""
    if isinstance(exc, GuardedError):
        return exc.error_class
    return ErrorClass.AMBIGUOUS


def _tenant(tenant: Tenant | str) -> Tenant:
    return tenant if isinstance(tenant, Tenant) else Tenant.objects.get(slug=tenant)


def run_once(
    *,
    tenant: Tenant | str,
    key: str,
    fn: Callable[..., T],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    provider: str | None = None,
    action: str = "",
    request: Any = None,
    lease_seconds: float | None = None,
    classify: Callable[[BaseException], str] = default_classify,
    ref_from: Callable[[Any], str] | None = None,
    actor: str = "guard",
) -> Any:
    """Call ``fn`` once for ``key``; replay its recorded result on every later call."""
    tenant_obj = _tenant(tenant)
    provider_obj = services.provider_for(tenant=tenant_obj, slug=provider)
    result = transitions.operation_claim(
        tenant=tenant_obj,
        key=key,
        provider=provider_obj,
        action=action,
        request=request,
        lease_seconds=lease_seconds,
        mark_sent=True,
        actor=actor,
        via_claims=False,
    )
    op = result.operation
    if result.replayed:
        if op.status == OperationStatus.SUCCEEDED:
            return open_json(op.response_body)
        raise OperationFailed(op)
    started = time.monotonic()
    try:
        value = fn(*args, **(kwargs or {}))
    except BaseException as exc:
        transitions.operation_fail(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            error_class=classify(exc),
            # The exception's class only: its message may carry the function's arguments.
            message=f"{type(exc).__name__} after {int((time.monotonic() - started) * 1000)} ms",
            actor=actor,
        )
        raise
    # The effect has happened: record it even when the value cannot be replayed as JSON.
    try:
        services.canonical_json(value)
        recorded: Any = value
    except (TypeError, ValueError):
        log.warning("guard_result_not_json key=%s type=%s", key, type(value).__name__)
        recorded = {"_not_json": type(value).__name__}
    transitions.operation_complete(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=ref_from(value) if ref_from else "",
        response_body=recorded,
        actor=actor,
    )
    return value


def idempotent(
    *,
    tenant: Tenant | str | Callable[..., Tenant | str],
    key: Callable[..., str],
    provider: str | None = None,
    action: str = "",
    request: Callable[..., Any] | None = None,
    lease_seconds: float | None = None,
    classify: Callable[[BaseException], str] = default_classify,
    ref_from: Callable[[Any], str] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., Any]]:
    """Decorator form of :func:`run_once`; ``key`` (and optionally ``tenant``/``request``)
    are computed from the call's arguments."""

    def decorate(fn: Callable[..., T]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_once(
                tenant=tenant(*args, **kwargs) if callable(tenant) else tenant,
                key=key(*args, **kwargs),
                fn=fn,
                args=args,
                kwargs=kwargs,
                provider=provider,
                action=action or fn.__qualname__,
                request=request(*args, **kwargs) if request else None,
                lease_seconds=lease_seconds,
                classify=classify,
                ref_from=ref_from,
            )

        return wrapper

    return decorate
