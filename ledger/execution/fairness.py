"""Fair admission at the workers' take (ADR 0021, DESIGN §3 "the take").

The workers used to take due rows in one global order (``next_attempt_at, id``): a tenant that
queued 50,000 jobs held every other tenant's first job behind them. Now each take serves the
tenants with due work in turn:

- **Round-robin with shares.** Each round gives every tenant with due work its *share* of rows
  (``Tenant.take_share``, else ``EXECUTE_TENANT_SHARE``; 1 by default), tenants in turn from
  the one after the tenant the previous take of this process served last (a rotating start:
  with one free thread at a time, consecutive takes serve consecutive tenants).
- **Retries interleaved with first attempts.** Within a tenant's rows, queued and retry_wait
  alternate (oldest first at each step): a burst of retries after a provider's outage does not
  hold back new work, and new work does not starve the retries.
- **In-flight caps.** At most ``EXECUTE_MAX_IN_FLIGHT`` execute-mode rows are claimed at once
  over all tenants, and at most a tenant's cap of its own (``take_max_in_flight``, never above
  ``EXECUTE_TENANT_MAX_IN_FLIGHT``; ``ledger.rules.take_limits``). Counted under one
  transaction-scoped advisory lock on PostgreSQL, taken before any row lock, so two takers
  never both squeeze under a cap (SQLite has one writer at a time anyway).

On PostgreSQL the pick is one named statement (``operations_take_fair_pg``: a skip scan over
the work queue's ``open_exec_tenant_due_idx`` (ADR 0017), per tenant and state its oldest due rows, locked SKIP LOCKED). On
SQLite (the embedded mode: one worker) the same reads run per tenant and :func:`fair_order`
orders them — the definition the statement's ORDER BY follows. The take
(``ledger.execution.attempts.operations_take``) then reads and moves the picked rows with
every guard it had.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models.functions import Now

from ledger.models import OpenOperation, Operation, OperationMode, OperationStatus, Tenant
from ledger.recovery import eligibility
from ledger.rules import take_limits
from ledger.store import statements
from ledger.store.open_rows import open_rows_where

S = OperationStatus

# The take's caps are counted under this transaction-scoped advisory lock (PostgreSQL): takers
# queue here, before any row lock, for the few milliseconds of a take.
TAKE_LOCK_KEY = 0x0F41_7A4E


class Rotation:
    """Where this process's next take starts: after the tenant its last take served last."""

    def __init__(self) -> None:
        self._after = 0
        self._lock = threading.Lock()

    def after(self) -> int:
        with self._lock:
            return self._after

    def served(self, tenant_id: int) -> None:
        with self._lock:
            self._after = tenant_id

    def reset(self) -> None:
        self.served(0)


ROTATION = Rotation()


@dataclass(frozen=True)
class Room:
    """How many more rows a take may claim: in all (None: no cap) and per tenant (a tenant not
    named gets ``default``; None: no cap of its own)."""

    total: int | None
    per_tenant: dict[int, int]
    default: int | None

    def of(self, tenant_id: int) -> int | None:
        return self.per_tenant.get(tenant_id, self.default)


def caps_in_force() -> bool:
    """Whether any in-flight cap applies: the take then counts under its lock."""
    return (
        take_limits.system_max_in_flight() is not None
        or take_limits.tenant_default_max_in_flight() is not None
        or Tenant.objects.filter(take_max_in_flight__isnull=False).exists()
    )


def take_room() -> Room:
    """Count what is in flight, under the take's lock (call in the take's transaction), and
    what room each cap leaves."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TAKE_LOCK_KEY])
    with connection.cursor() as cursor:
        cursor.execute(statements.text("operations_in_flight_by_tenant"), {})
        running = {int(tenant_id): int(n) for tenant_id, n in cursor.fetchall()}
    system = take_limits.system_max_in_flight()
    total = None if system is None else max(0, system - sum(running.values()))
    default_cap = take_limits.take_max_in_flight(None)
    own = dict(Tenant.objects.filter(take_max_in_flight__isnull=False).values_list("id", "take_max_in_flight"))
    per_tenant: dict[int, int] = {}
    for tenant_id in set(running) | set(own):
        cap = take_limits.take_max_in_flight(own.get(tenant_id))
        if cap is not None:
            per_tenant[tenant_id] = max(0, cap - running.get(tenant_id, 0))
    return Room(total=total, per_tenant=per_tenant, default=default_cap)


@dataclass(frozen=True)
class Candidate:
    """A due row read for the pick: its tenant's turn and share, and its place in its state."""

    id: int
    tenant_id: int
    turn: int
    share: int
    nth: int
    next_attempt_at: datetime


def fair_order(candidates: Iterable[Candidate], *, limit: int, room: Room) -> list[Candidate]:
    """The pick's order (``operations_take_fair_pg`` says the same in SQL): a tenant's rows
    alternate between its states (the ``nth`` of each, oldest first at a tie); then round by
    round, a tenant's share per round, tenants in turn order; no tenant past its room; the first
    ``limit``."""
    by_tenant: dict[int, list[Candidate]] = {}
    for c in candidates:
        by_tenant.setdefault(c.tenant_id, []).append(c)
    placed: list[tuple[int, int, int, Candidate]] = []
    for tenant_id, rows in by_tenant.items():
        rows.sort(key=lambda c: (c.nth, c.next_attempt_at, c.id))
        tenant_room = room.of(tenant_id)
        for place, c in enumerate(rows, start=1):
            if tenant_room is not None and place > tenant_room:
                break
            placed.append(((place - 1) // c.share, c.turn, place, c))
    placed.sort(key=lambda p: p[:3])
    return [p[3] for p in placed[:limit]]


def turn_order(tenant_ids: Iterable[int], *, after: int) -> list[int]:
    """Tenants in turn order: those after ``after`` first, then from the start."""
    return sorted(set(tenant_ids), key=lambda t: (t <= after, t))


def quota(*, limit: int, tenants: int) -> int:
    """Rows read per tenant and state (times its share): an even split of the take, at least 1."""
    return max(1, math.ceil(limit / max(1, tenants)))


# Read off the work queue's mirror, whose indexes serve it, and checked on the row (ADR 0017).
DUE = open_rows_where(status__in=(S.QUEUED, S.RETRY_WAIT), mode=OperationMode.EXECUTE)


def due_pick_sqlite(*, limit: int, held_back: Sequence[int], room: Room, after: int) -> list[Candidate]:
    """The embedded mode's pick: the statement's reads, one tenant and state at a time (one
    worker, one writer: nothing to lock), ordered by :func:`fair_order`."""
    tenant_ids = (
        OpenOperation.objects.filter(status__in=(S.QUEUED, S.RETRY_WAIT), mode=OperationMode.EXECUTE)
        .order_by()
        .values_list("tenant_id", flat=True)
        .distinct()
    )
    turns = [t for t in turn_order(tenant_ids, after=after) if (room.of(t) is None or room.of(t) > 0)]
    # Only the first `limit` tenants in turn can be served (as the statement's `turn <= limit`).
    per = quota(limit=limit, tenants=len(turns))
    turns = turns[:limit]
    shares = dict(Tenant.objects.filter(pk__in=turns).values_list("id", "take_share"))
    candidates: list[Candidate] = []
    for turn, tenant_id in enumerate(turns, start=1):
        share = take_limits.take_share(shares.get(tenant_id))
        room_of = room.of(tenant_id)
        count = per * share if room_of is None else min(room_of, per * share)
        for status in (S.QUEUED, S.RETRY_WAIT):
            rows = (
                Operation.objects.filter(
                    DUE, open_rows_where(status=status, next_attempt_at__lte=Now()), tenant_id=tenant_id
                )
                .exclude(provider_id__in=list(held_back))
                .exclude(eligibility.RECHECK_PENDING)
                .order_by("open_row__next_attempt_at", "id")
                .values_list("id", "next_attempt_at")[:count]
            )
            candidates.extend(
                Candidate(id=i, tenant_id=tenant_id, turn=turn, share=share, nth=n, next_attempt_at=at)
                for n, (i, at) in enumerate(rows, start=1)
            )
    return fair_order(candidates, limit=limit, room=room)


def due_pick_pg(*, limit: int, held_back: Sequence[int], room: Room, after: int) -> list[tuple[int, int]]:
    """PostgreSQL's pick: ``operations_take_fair_pg`` (locks the rows it returns, and at most a
    quota more, SKIP LOCKED); (id, tenant id) in take order."""
    tenants_with_room = list(room.per_tenant)
    with connection.cursor() as cursor:
        cursor.execute(
            statements.text("operations_take_fair_pg"),
            {
                "after": after,
                "default_share": take_limits.tenant_default_share(),
                "max_share": take_limits.tenant_max_share(),
                "room_tenants": tenants_with_room,
                "room": [room.per_tenant[t] for t in tenants_with_room],
                "default_room": limit if room.default is None else room.default,
                "held_back": list(held_back),
                "limit": limit,
            },
        )
        return [(int(i), int(t)) for i, t in cursor.fetchall()]


def operations_due_fair(*, limit: int, held_back: Sequence[int]) -> list[int]:
    """The ids the take moves, in order (call in the take's transaction): under the in-flight
    caps, round-robin over the tenants from this process's rotating start. On PostgreSQL the
    rows are locked (SKIP LOCKED) until the take commits."""
    room = take_room() if caps_in_force() else Room(total=None, per_tenant={}, default=None)
    if room.total is not None:
        limit = min(limit, room.total)
    if limit <= 0:
        return []
    after = ROTATION.after()
    if connection.vendor == "postgresql":
        picked = due_pick_pg(limit=limit, held_back=held_back, room=room, after=after)
    else:
        picked = [
            (c.id, c.tenant_id) for c in due_pick_sqlite(limit=limit, held_back=held_back, room=room, after=after)
        ]
    if picked:
        ROTATION.served(picked[-1][1])
    return [i for i, _ in picked]
