"""What every move of an operation shares: its event row, the check against the declared
table (``ledger.models.ALLOWED_TRANSITIONS``), the parameters its named statement takes, the
named error for a guard that matched nothing, and a superseded holder's evidence.

The bottom of ``ledger.protocol.transitions``: it imports no sibling.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models.functions import Coalesce, Now

from ledger.models import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    Operation,
    OperationStatus,
)
from ledger.platform import hooks
from ledger.platform.crypto import seal_json
from ledger.platform.errors import (
    IllegalTransition,
    LeaseExpired,
    LeaseLost,
    OperationAlreadyFinished,
    OperationNotFound,
)
from ledger.protocol import fencing
from ledger.protocol.inputs import sanitize_message
from ledger.store import statements

S = OperationStatus
log = logging.getLogger("onceguard.ledger")


def event_text(*, actor: str, reason: str) -> dict[str, str]:
    """An event row's actor and reason as stored (cut to the column, reason scrubbed)."""
    return {"actor": actor[:150], "reason": sanitize_message(reason)}


def event_row(*, op: Operation, old: str, actor: str, reason: str) -> None:
    """The move's event row — and, for a move after which the effect may have happened (the
    sent marker, a finish), the key's fence journal entry, before the transaction commits
    (ADR 0012). Every move writes its event here, which makes this the one place; the two
    one-statement PostgreSQL moves journal beside their statement (``journal_move`` callers)."""
    if op.status in TERMINAL_STATES or (op.sent_at is not None and op.status == S.CLAIMED):
        journal_move(op)
    statements.execute(
        "event_insert",
        {
            "tenant_id": op.tenant_id,
            "operation_id": op.pk,
            "from_status": old,
            "to_status": op.status,
            "attempt": op.attempts,
            **event_text(actor=actor, reason=reason),
        },
    )


def search_append(*, op: Operation, text: str, ref: bool = False) -> None:
    """An identifier of ``op`` that became known after its claim, as a search row appended in
    the move's transaction (ADR 0018): a provider reference (``ref``), a reconciliation handle,
    an execution id. Nothing for an empty text or one the operation already has."""
    if text:
        statements.execute(
            "operation_search_append",
            {"operation_id": op.pk, "tenant_id": op.tenant_id, "ref": ref, "text": text},
        )


def journal_move(op: Operation) -> None:
    """The key of ``op`` into the fence journal as possibly performed (ledger.protocol.fencing)."""
    fencing.journal_move(tenant_id=op.tenant_id, key=op.key, provider_id=op.provider_id, state=op.status)


def check_moves(from_states: tuple[str, ...], to: str) -> None:
    for source in from_states:
        if to not in ALLOWED_TRANSITIONS[source]:
            raise IllegalTransition(f"{source} → {to} is not an allowed move.")


def seconds_param(value: float | None) -> float | None:
    """Seconds for ``ledger_now_plus``, in milliseconds (SQLite spells them as text)."""
    return None if value is None else round(float(value), 3)


def sealed_param(value: Any) -> Any:
    # A named statement's JSON parameter: ledger.store.statements passes it in its stored form.
    return seal_json(value)


def after_failed(op: Operation) -> None:
    """Every `failed` row has its DLQ entry, written in the same transaction (the DLQ
    connects to ``operation_failed``)."""
    hooks.operation_failed.send(operation=op)


def holder_refusal(*, op_id: int, token: str, tenant_id: int, allow_expired: bool = True) -> Exception:
    """After a guarded update matched nothing: name why, for the caller."""
    op = (
        Operation.objects.filter(pk=op_id, tenant_id=tenant_id)
        .only("status", "lease_token", "lease_expires_at")
        .first()
    )
    if op is None:
        return OperationNotFound("No such operation.")
    if op.lease_token != token:
        return LeaseLost("A newer attempt holds this operation; your result was kept as evidence only.")
    if op.status in TERMINAL_STATES:
        return OperationAlreadyFinished(f"The operation is already {op.status}.", extra={"status": op.status})
    if op.status == S.CLAIMED and not allow_expired:
        return LeaseExpired("Your lease has expired; do not perform the effect. Claim again.")
    return LeaseLost(f"The operation is {op.status}; this token can no longer do that.", extra={"status": op.status})


def fenced_evidence_record(
    *,
    operation_id: int,
    tenant_id: int,
    lease_token: str,
    provider_ref: str = "",
    response_status: int | None = None,
    response_body: Any = None,
    error_class: str = "",
    message: str = "",
) -> None:
    """A superseded holder's late result is kept on its own Attempt, never on the row."""
    Attempt.objects.filter(tenant_id=tenant_id, operation_id=operation_id, lease_token=lease_token).update(
        outcome=AttemptOutcome.FENCED,
        provider_ref=provider_ref[:255],
        response_status=response_status,
        response_body=seal_json(response_body),
        error_class=error_class,
        message=sanitize_message(message),
        finished_at=Coalesce("finished_at", Now()),
    )
