"""One bad row never stops a periodic pass (docs/adr/0002-per-row-isolation.md).

The sweeper, the eligibility recheck, retention's purge, automatic replay, the alert digest
and partition maintenance each handle many rows (or tenants, or partitions) per pass. Each
unit runs inside :func:`row_isolated`: an exception is caught there, counted in
``onceguard_pass_row_failures_total{job}``, logged once (the job, a reference the caller
chooses — an id, never a key, which may carry personal data — and the exception's class,
never its text, which may quote the key), recorded on the row when the model has somewhere
to record it (``on_failure``), and the pass goes on with the next unit.

Transactions: the unit's work runs in its own savepoint (or transaction), so a failure rolls
back only its own writes and — on PostgreSQL — never leaves the caller's transaction aborted.
Work that makes an HTTP call and commits its own writes as it goes (the sweeper's lookups)
passes ``atomic=False``: outside a transaction it runs as is; inside one it still gets its
savepoint.

This module imports no app but the ledger's telemetry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from django.db import connection, transaction
from prometheus_client import Counter

log = logging.getLogger("onceguard.passes")

# The jobs that isolate their rows: the metric's label values (a fixed set).
JOBS = frozenset(
    {
        "sweeper",
        "eligibility_recheck",
        "retention_purge",
        "dlq_auto_replay",
        "alert_digest",
        "alert_clearing",
        "partition_maintenance",
    }
)

PASS_ROW_FAILURES = Counter(
    "onceguard_pass_row_failures_total",
    "Rows (or tenants, partitions) a periodic pass could not handle, by job; the pass went on"
    " with the rest and the row recorded the error where it has a place for it.",
    ["job"],
)
# Every job's series exists from the start, at 0, so a rate or increase alert sees its first failure.
for _job in JOBS:
    PASS_ROW_FAILURES.labels(job=_job)


def failure_text(job: str, exc: BaseException) -> str:
    """What a row records about its failure: the job and the exception's class (its text may
    quote a key or a payload)."""
    return f"{job} failed on this row: {type(exc).__name__}"


@contextmanager
def row_isolated(
    *,
    job: str,
    ref: str,
    on_failure: Callable[[BaseException], None] | None = None,
    atomic: bool = True,
) -> Iterator[None]:
    """Run one unit of ``job``'s pass; an exception stops only this unit (see the module).

    ``ref`` names the unit in the log line (``operation=12``, ``tenant=3``). ``on_failure``
    records the failure on the row (its error text, its next try later); it runs in its own
    savepoint, and a failure there is logged, never raised."""
    assert job in JOBS, job
    failed: BaseException | None = None
    savepoint = atomic or connection.in_atomic_block
    try:
        with transaction.atomic() if savepoint else nullcontext():
            yield
    except Exception as exc:
        failed = exc
    if failed is None:
        return
    PASS_ROW_FAILURES.labels(job=job).inc()
    log.warning("pass_row_failed job=%s %s error=%s", job, ref, type(failed).__name__)
    if on_failure is None:
        return
    try:
        with transaction.atomic():
            on_failure(failed)
    except Exception as exc:
        log.warning("pass_row_failure_not_recorded job=%s %s error=%s", job, ref, type(exc).__name__)
