"""The search rows of operations written before them (ADR 0018), filled while the service runs.

``search_rows_backfill`` walks ``ledger_operation`` by id range, oldest first, one batch per
short transaction (a ``lock_timeout`` on PostgreSQL: a batch that would wait is retried, never
queued behind), with the two named statements ``operation_search_fill_identifiers`` and
``operation_search_fill_refs``. Both skip what is there already, so a pass resumed from any id
— or run twice — writes every row once; each batch reports the id it reached, which is where
``manage.py operation_search_backfill --after`` resumes. When a pass has reached the last id,
``old_search_indexes_drop`` drops the operation row's old search indexes ``CONCURRENTLY``
(migration 0043 did both itself on a small table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import OperationalError, connection, transaction

from ledger.models import SEARCH_SEPARATOR
from ledger.store import statements

log = logging.getLogger("onceguard.ledger")

# The operation row's indexes the search rows replace (migration 0028's trigram, the provider
# reference's pattern-ops B-tree).
OLD_SEARCH_INDEXES = ("op_search_trgm", "op_ref_idx")


@dataclass(frozen=True)
class BackfillBatch:
    after: int
    upto: int
    written: int
    last_id: int


def search_rows_backfill(
    *, after: int = 0, batch: int = 5_000, lock_timeout_ms: int = 2_000, retries: int = 20
) -> Iterator[BackfillBatch]:
    """Fill the search rows of operations with ids above ``after``, ``batch`` ids at a time,
    up to the largest id when the pass started (later operations wrote their own)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM ledger_operation")
        last_id = int(cursor.fetchone()[0])
    while after < last_id:
        upto = min(after + batch, last_id)
        written = _fill_batch(after=after, upto=upto, lock_timeout_ms=lock_timeout_ms, retries=retries)
        yield BackfillBatch(after=after, upto=upto, written=written, last_id=last_id)
        after = upto


def _fill_batch(*, after: int, upto: int, lock_timeout_ms: int, retries: int) -> int:
    params = {"after": after, "upto": upto, "sep": SEARCH_SEPARATOR}
    for attempt in range(retries):
        try:
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{lock_timeout_ms}ms"])
                written = statements.execute("operation_search_fill_identifiers", params)
                return written + statements.execute("operation_search_fill_refs", params)
        except OperationalError:
            # A lock wait past the timeout: let the writers through, then try the batch again.
            if attempt == retries - 1:
                raise
            log.info("search_backfill_retry after=%s upto=%s attempt=%s", after, upto, attempt + 1)
            time.sleep(min(5.0, 0.2 * (attempt + 1)))
    return 0


def old_search_indexes_drop() -> list[str]:
    """Drop the operation row's old search indexes (PostgreSQL, ``CONCURRENTLY``: no lock on
    writes; outside any transaction). Only once every operation has its search rows."""
    if connection.vendor != "postgresql":
        return []
    dropped = []
    with connection.cursor() as cursor:
        for name in OLD_SEARCH_INDEXES:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
            if cursor.fetchone()[0]:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                dropped.append(name)
    return dropped
