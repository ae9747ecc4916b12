"""Tombstones: how a key whose operation retention deleted keeps its answer (DESIGN §6).

One mapping between an operation and its tombstone (``TOMBSTONE_FROM_OPERATION``), used
both ways: ``tombstones_create`` writes the tombstones of operations about to be deleted
(the retention purge decides which), and ``tombstone_answer`` rebuilds a deleted key's
recorded outcome for a claim. A tombstone is kept for the longest of 24 h and the provider's
key TTL (``tombstone_keep_until``), so a retried request is answered at least as long as the
provider itself would recognise its key.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection

from ledger.models import Operation, Provider, Tombstone
from ledger.platform.errors import KeyReusedWithDifferentRequest, OperationNotFound
from ledger.protocol.selectors import operation_newest_in_lineage

TOMBSTONE_FLOOR = timedelta(hours=24)
TOMBSTONE_NOTE = "record deleted by retention; outcome kept"

# Tombstone column ← the operation's column, for the fields kept as they are. The other
# columns are computed by the writer: operation_id (the row's id), provider_slug,
# deleted_at and keep_until.
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

_COLUMNS = [*TOMBSTONE_FROM_OPERATION, "operation_id", "provider_slug", "deleted_at", "keep_until"]

# -- tombstones_from_rows --: the tombstones of plain (never superseded) operations, built in
# the database from their rows, no row travelling to Python. Parameters: deleted_at (twice),
# the floor in seconds, then the operation ids. One text per database for keep_until.
_KEEP_UNTIL = {
    "postgresql": "%s::timestamptz + make_interval(secs => GREATEST(%s, COALESCE(p.key_ttl_seconds, 0)))",
    "sqlite": "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '+' || MAX(%s, COALESCE(p.key_ttl_seconds, 0)) || ' seconds')",
}
_FROM_ROWS = (
    f"INSERT INTO ledger_tombstone ({', '.join(_COLUMNS)})"
    f" SELECT {', '.join(f'o.{column}' for column in TOMBSTONE_FROM_OPERATION.values())},"
    " o.id, COALESCE(p.slug, ''), %s, {keep_until}"
    " FROM ledger_operation o LEFT JOIN ledger_provider p ON p.id = o.provider_id"
    " WHERE o.id IN ({ids}) ON CONFLICT (tenant_id, key) DO NOTHING"
)
# -- tombstones_insert --: tombstones built in Python, one multi-row statement per chunk.
_INSERT = (
    f"INSERT INTO ledger_tombstone ({', '.join(_COLUMNS)}) VALUES ({', '.join(['%s'] * len(_COLUMNS))})"
    " ON CONFLICT (tenant_id, key) DO NOTHING"
)


def tombstone_keep_until(*, deleted_at: datetime, key_ttl_seconds: int | None) -> datetime:
    return deleted_at + max(TOMBSTONE_FLOOR, timedelta(seconds=key_ttl_seconds or 0))


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


def tombstones_create(*, plain_ids: list[int], superseded_ids: list[int], deleted_at: datetime) -> int:
    """The tombstones of operations about to be deleted, in the caller's transaction (which
    holds their rows locked). ``superseded_ids`` are operations replays superseded: their
    key answers with the newest replay's outcome. Returns how many were written (a key that
    already has one keeps it)."""
    return _tombstones_from_rows(plain_ids, deleted_at=deleted_at) + _tombstones_for_superseded(
        superseded_ids, deleted_at=deleted_at
    )


def _tombstones_from_rows(ids: list[int], *, deleted_at: datetime) -> int:
    if not ids:
        return 0
    at = connection.ops.adapt_datetimefield_value(deleted_at)
    statement = _FROM_ROWS.format(keep_until=_KEEP_UNTIL[connection.vendor], ids=", ".join(["%s"] * len(ids)))
    with connection.cursor() as cursor:
        cursor.execute(statement, [at, at, int(TOMBSTONE_FLOOR.total_seconds()), *ids])
        return cursor.rowcount


def _tombstones_for_superseded(ids: list[int], *, deleted_at: datetime) -> int:
    if not ids:
        return 0
    ops = list(Operation.objects.filter(pk__in=ids))
    providers = {
        pk: (slug, ttl)
        for pk, slug, ttl in Provider.objects.filter(pk__in={op.provider_id for op in ops}).values_list(
            "pk", "slug", "key_ttl_seconds"
        )
    }
    stones = []
    for op in ops:
        slug, ttl = providers.get(op.provider_id, ("", 0))
        stones.append(
            tombstone_from_operation(
                op,
                provider_slug=slug,
                deleted_at=deleted_at,
                keep_until=tombstone_keep_until(deleted_at=deleted_at, key_ttl_seconds=ttl),
                answer=operation_newest_in_lineage(op),
            )
        )
    _insert(stones)
    return len(stones)


def _insert(stones: list[Tombstone]) -> None:
    # Each value in its stored form (timestamps adapted, the fingerprint's hex as bytes).
    fields = [Tombstone._meta.get_field(c) for c in _COLUMNS]
    rows = [[f.get_db_prep_save(getattr(t, f.attname), connection) for f in fields] for t in stones]
    with connection.cursor() as cursor:
        # executemany: psycopg pipelines it; SQLite runs it in one call.
        cursor.executemany(_INSERT, rows)


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
