"""How the purge works through a tenant: bounded, in batches, a failing row left behind.

A pass has a budget (``PurgeBudget``: batches and seconds, below django-q2's task timeout); rows
are read in keyset batches (``_keyset_batches``: each starts where the previous one stopped), each
batch in its own short transaction (``_each_batch``); a batch that raises is retried row by row
and a row that still raises is left for a later run, counted and recorded on the run
(ledger.platform.passes). ``TenantPurge`` carries one tenant's pass: its run, counts and budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from ledger.platform.passes import failure_text, row_isolated
from review.models import RetentionRun

# The label of this pass's failures (ledger.platform.passes).
JOB = "retention_purge"


@dataclass
class TypeCounts:
    # the policy's id, or "default" (the platform's defaults applied)
    policy: int | str | None = None
    held: bool = False
    redacted: int = 0
    deleted: int = 0
    discarded: int = 0
    skipped_referenced: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PurgeBudget:
    """Bounded work per pass: at most ``max_batches`` batches and ``seconds`` of wall time
    (below django-q2's task timeout); the next pass continues where this one stopped."""

    batch_size: int
    max_batches: int
    seconds: float = 60.0
    used: int = 0
    started: float = field(default_factory=time.monotonic)
    # Wall time between consecutive batches (≈ each batch's transaction), for the bench.
    longest_batch: float = 0.0
    _last: float = 0.0

    def take(self) -> bool:
        now = time.monotonic()
        if self._last:
            self.longest_batch = max(self.longest_batch, now - self._last)
        self._last = now
        if self.used >= self.max_batches or now - self.started > self.seconds:
            return False
        self.used += 1
        return True

    def close(self) -> None:
        if self._last:
            self.longest_batch = max(self.longest_batch, time.monotonic() - self._last)


@dataclass
class TenantPurge:
    run: RetentionRun
    now: datetime
    budget: PurgeBudget
    counts: dict[str, TypeCounts] = field(default_factory=dict)
    exhausted: bool = False
    # Rows (or steps) that raised and were left in place for a later run (ledger.platform.passes).
    failures: int = 0
    failure: str = ""

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.failure = failure_text(JOB, exc)


def _keyset(qs: Any, column: str, last: tuple[Any, int] | None, size: int) -> list[tuple[Any, int]]:
    """The next ``size`` (column, id) pairs after ``last``, in index order: each batch starts
    where the previous one stopped (rows skipped on purpose are never scanned again).

    ``column="pk"`` reads one tenant's rows in id order, ``(tenant_id, id)``: for a table whose
    time column has no index of its own (the operations: ``(tenant, updated_at)`` left the row
    with ADR 0017), so that a batch stops at its ``size``-th match instead of reading and
    sorting every row of the tenant (each batch, 0.5 s for a 111,000-row tenant at 10M)."""
    if column == "pk":
        if last is not None:
            qs = qs.filter(pk__gt=last[1])
        # ORDER BY tenant_id too (one value in ``qs``): the tenant's id index is that order,
        # where ``id`` alone plans on the primary key, a walk of every tenant's rows.
        return list(qs.order_by("tenant_id", "pk").values_list("pk", "pk")[:size])
    if last is not None:
        value, pk = last
        # (column, id) > (value, pk), spelled so that ``column >= value`` is an index range
        # condition: the plain OR of the two cases would scan from the start every batch.
        qs = qs.filter(Q(**{f"{column}__gte": value}) & (Q(**{f"{column}__gt": value}) | Q(pk__gt=pk)))
    return list(qs.order_by(column, "pk").values_list(column, "pk")[:size])


def _keyset_batches(tp: TenantPurge, rows: Any, column: str) -> Iterator[list[int]]:
    """Ids of ``rows`` in keyset batches of the run's size, while its budget lasts (the run
    is marked exhausted when it runs out, so the next run continues). Every batch loop of the
    purge goes through here: a loop that re-reads from the start would spin on a row it
    leaves in place (a busy DLQ entry) until the budget runs out."""
    last = None
    size = tp.budget.batch_size
    while True:
        page = _keyset(rows, column, last, size)
        if not page:
            return
        if not tp.budget.take():
            tp.exhausted = True
            return
        last = page[-1]
        yield [pk for _, pk in page]
        if len(page) < size:
            return


def _each_batch(
    tp: TenantPurge, rows: Any, column: str, counts: TypeCounts, batch: Callable[[list[int]], None]
) -> None:
    """``batch(ids)`` for each keyset batch, each in its own transaction. A batch that raises
    is rolled back (its counts with it) and its rows tried one by one, each in its own
    transaction: a row that still raises is left for a later run — counted, logged and
    recorded on the run (ledger.platform.passes) — and the others are purged all the same."""
    for ids in _keyset_batches(tp, rows, column):
        if _batch_done(tp, counts, batch, ids, isolated=False):
            continue
        for pk in ids:
            _batch_done(tp, counts, batch, [pk], isolated=True)


def _batch_done(
    tp: TenantPurge, counts: TypeCounts, batch: Callable[[list[int]], None], ids: list[int], *, isolated: bool
) -> bool:
    before, created = dict(counts.__dict__), tp.run.tombstones_created
    try:
        if isolated:
            ok = False
            with row_isolated(job=JOB, ref=f"tenant={tp.run.tenant_id} row={ids[0]}", on_failure=tp.failed):
                batch(ids)
                ok = True
        else:
            with transaction.atomic():
                batch(ids)
            ok = True
    except Exception:
        # The whole batch: each row is tried alone next (the caller), which counts and logs.
        ok = False
    if not ok:
        counts.__dict__.update(before)
        tp.run.tombstones_created = created
    return ok
