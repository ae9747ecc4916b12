"""Tombstones: how a key whose operation retention deleted keeps its answer (DESIGN §6).

One mapping between an operation and its tombstone, used both ways: retention writes a
tombstone from a row (``TOMBSTONE_FROM_OPERATION``, ``tombstone_from_operation``) and a
claim of the key rebuilds the recorded outcome from it (``tombstone_answer``).
"""

from __future__ import annotations

from datetime import datetime

from ledger.errors import KeyReusedWithDifferentRequest, OperationNotFound
from ledger.models import Operation, Tombstone

TOMBSTONE_NOTE = "record deleted by retention; outcome kept"

# Tombstone column ← the operation's column, for the fields kept as they are. The retention
# purge writes them with one INSERT … SELECT (no row travels to Python) and
# ``tombstone_from_operation`` copies them attribute by attribute; ``tombstone_answer``
# maps them back. The other columns (provider_slug, deleted_at, keep_until, and the
# operation's id) are computed by whoever writes the tombstone.
TOMBSTONE_FROM_OPERATION: dict[str, str] = {
    "tenant_id": "tenant_id",
    "key": "key",
    "mode": "mode",
    "action": "action",
    "fingerprint": "fingerprint",
    "final_status": "status",
    "provider_ref": "provider_ref",
    "response_status": "response_status",
    "created_at": "created_at",
    "done_at": "done_at",
}
# What a superseded operation's tombstone takes from its newest replay instead.
OUTCOME_FIELDS = ("final_status", "provider_ref", "response_status")


def tombstone_from_operation(
    op: Operation, *, provider_slug: str, deleted_at: datetime, keep_until: datetime, answer: Operation | None = None
) -> Tombstone:
    """The tombstone of ``op``. ``answer`` is the operation whose outcome the key keeps
    answering with (a superseded operation answers with its newest replay's)."""
    fields = {stone: getattr(op, column) for stone, column in TOMBSTONE_FROM_OPERATION.items()}
    if answer is not None:
        fields.update({stone: getattr(answer, TOMBSTONE_FROM_OPERATION[stone]) for stone in OUTCOME_FIELDS})
    return Tombstone(
        operation_id=op.pk, provider_slug=provider_slug, deleted_at=deleted_at, keep_until=keep_until, **fields
    )


def tombstone_answer(*, tenant_id: int, key: str, fingerprint: str) -> Operation:
    """What a claim of a deleted key gets: the recorded outcome, rebuilt from the tombstone
    as an unsaved Operation (answered 200 + Idempotent-Replayed), or 422 when the request
    differs."""
    stone = Tombstone.objects.filter(tenant_id=tenant_id, key=key).first()
    if stone is None:
        # Neither a row nor a tombstone, yet the INSERT did nothing: a concurrent purge
        # removed the tombstone between the two reads. Asking again is safe.
        raise OperationNotFound("The key's record is being purged; retry the claim.")
    if stone.fingerprint != fingerprint:
        raise KeyReusedWithDifferentRequest(
            "This key was first used with a different request; use a new key for a different operation.",
            extra={"operation_id": stone.operation_id},
        )
    fields = {column: getattr(stone, field) for field, column in TOMBSTONE_FROM_OPERATION.items()}
    return Operation(
        id=stone.operation_id,
        response_body=None,
        last_error=TOMBSTONE_NOTE,
        updated_at=stone.deleted_at,
        **fields,
    )
