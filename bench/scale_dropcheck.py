"""The partition-drop check at scale: how long retention decides that a month may be dropped.

    SCALE_DB=bench_scale .venv/bin/python -m bench.scale_dropcheck

``review.retention.partitions.retention_drop_partitions`` drops a month of attempts or events only when
``_partition_keeps_something`` finds no row of an operation the purge would keep. A month that
keeps something is answered at its first kept row; a droppable one only after every operation
of its id range has been read, while the retention policies are locked (SHARE) — the case
measured here. ``bench.scale``'s fill puts every row in the legacy partition, so a month is
stood for by that partition with the id range of one month of the fill (the operations from a
third to a half of the ids: 120 to 90 days old), every tenant on a 30-day record TTL and no
hold, the range's open operations set finished; all of it in a transaction rolled back.

Printed per partitioned table: the check as it is (``NEW``) beside the check before it was
reshaped (``OLD``: the tenants' cutoffs as a joined ``VALUES`` list and the superseded-version
reference probed per operation), alternating, SCALE_DROPCHECK_ROUNDS rounds each, and the
ratio of their medians.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

from bench import common

BIG_DB = os.environ.get("SCALE_DB", common.suite_db("bench_scale"))
ROUNDS = int(os.environ.get("SCALE_DROPCHECK_ROUNDS", 3))


def _old_check(part_name: str, cutoffs: dict, bounds: tuple[int, int], states: list[str]) -> bool:
    """The query ``_partition_keeps_something`` ran before (kept here as the baseline)."""
    from django.db import connection

    rules = ", ".join(["(%s::bigint, %s::timestamptz)"] * len(cutoffs)) or "(NULL::bigint, NULL::timestamptz)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM ledger_operation o LEFT JOIN (VALUES {rules}) AS r (tenant_id, cutoff)"
            " ON r.tenant_id = o.tenant_id"
            " WHERE o.id BETWEEN %s AND %s"
            " AND (r.cutoff IS NULL OR o.updated_at >= r.cutoff OR o.done_at IS NULL OR o.done_at >= r.cutoff"
            f" OR o.status NOT IN ({', '.join(['%s'] * len(states))})"
            " OR EXISTS (SELECT 1 FROM dlq_failedevent f WHERE f.operation_id = o.id)"
            " OR EXISTS (SELECT 1 FROM ledger_operation s WHERE s.superseded_by_id = o.id))"
            f" AND EXISTS (SELECT 1 FROM {part_name} p WHERE p.operation_id = o.id)"
            " ORDER BY o.id DESC LIMIT 1",
            [*[v for item in cutoffs.items() for v in item], *bounds, *states],
        )
        return cursor.fetchone() is not None


def main() -> int:
    os.environ["DATABASE_URL"] = common.bench_database_url(
        common.server_url(), db=BIG_DB, suite="bench.scale_dropcheck"
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    import django

    django.setup()
    from django.db import connection, transaction

    from ledger.models import TERMINAL_STATES, Tenant
    from ledger.platform import partitions
    from ledger.store import sql
    from review.retention.partitions import _partition_keeps_something

    now = sql.db_now()
    states = sorted(TERMINAL_STATES)
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM ledger_operation")
        first, last = cursor.fetchone()
    span = last - first + 1
    bounds = (first + span // 3, first + span // 2)
    cutoffs = {pk: now - timedelta(days=30) for pk in Tenant.objects.values_list("pk", flat=True)}
    print(
        f"partition-drop check on {BIG_DB}: operations {bounds[0]:,}–{bounds[1]:,}"
        f" ({bounds[1] - bounds[0] + 1:,}) as one droppable month, {len(cutoffs)} tenants on a 30-day TTL;"
        f" {ROUNDS} rounds, old and new alternating; load average {os.getloadavg()[0]:.1f}"
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE ledger_operation SET status = 'succeeded', done_at = %s, updated_at = %s"
                f" WHERE id BETWEEN %s AND %s AND status NOT IN ({', '.join(['%s'] * len(states))})",
                [now - timedelta(days=100), now - timedelta(days=100), *bounds, *states],
            )
            opened = cursor.rowcount
        print(f"  ({opened:,} open operations of the range set finished, rolled back at the end)")
        for table in partitions.PARTITIONED:
            legacy = next(p for p in partitions.partitions(table) if p.lower is None)
            times: dict[str, list[float]] = {"old": [], "new": []}
            answers: dict[str, set[bool]] = {"old": set(), "new": set()}
            for n in range(ROUNDS):
                for kind in ("old", "new") if n % 2 == 0 else ("new", "old"):
                    t0 = time.perf_counter()
                    if kind == "old":
                        kept = _old_check(legacy.name, cutoffs, bounds, states)
                    else:
                        kept = _partition_keeps_something(legacy, cutoffs, bounds=bounds)
                    times[kind].append(time.perf_counter() - t0)
                    answers[kind].add(kept)
            old, new = statistics.median(times["old"]), statistics.median(times["new"])
            print(
                f"  {table:<24} old {old:7.2f} s  new {new:7.2f} s  new/old {new / old:.2f}"
                f"  (runs old {', '.join(f'{t:.2f}' for t in times['old'])};"
                f" new {', '.join(f'{t:.2f}' for t in times['new'])}; keeps something: old {answers['old']},"
                f" new {answers['new']})"
            )
        transaction.set_rollback(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
