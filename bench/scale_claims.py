"""Claims on big tables beside small ones, interleaved in one process (issue 16's "within 15 %").

    SCALE_DB=bench_scale .venv/bin/python -m bench.scale_claims

``bench.scale`` measures each database in its own child process, one after the other: on a
machine shared with other work, load that comes and goes lands on one side more than the
other. Here one process alternates between the two databases ``bench.scale`` filled
(``SCALE_DB`` and ``SCALE_DB``_small) in blocks — big, small, small, big, … so neither side
always goes first — reconnecting at each switch (prepared statements and per-process caches
rebuilt in a warm-up that is not timed). Each block times SCALE_PAIRED_OPS fresh claims of the
big tenant (claim → complete) and as many replays of a random finished key; each pair of
blocks gives a ratio big / small of the block medians. Printed: the median ratio, its
interquartile range and extremes over the pairs, and the pooled p50/p95 of each side.
Nothing is left behind: the fresh claims' operations are deleted at the end.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any

from bench import common

BIG_DB = os.environ.get("SCALE_DB", "bench_scale")
SMALL_DB = os.environ.get("SCALE_SMALL_DB", BIG_DB + "_small")
PAIRS = int(os.environ.get("SCALE_PAIRED_BLOCKS", 12))
OPS = int(os.environ.get("SCALE_PAIRED_OPS", 40))
WARM = 8


def _switch(db: str) -> None:
    from django.core.cache import cache
    from django.db import connection

    from ledger import caching, selectors

    connection.close()
    connection.settings_dict["NAME"] = db
    # Per-process caches are keyed by ids, and the two databases reuse ids.
    caching.clear_all()
    selectors._PROVIDER_SLUGS.clear()
    cache.clear()


def _rows_filled() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT rows FROM bench_scale_fill")
        return int(cursor.fetchone()[0])


def _side(db: str, run_id: str, counter: Any, rng: random.Random) -> tuple[list[float], list[float]]:
    from bench.scale import ACTION, BIG, PROVIDER, _big_succeeded, _key
    from ledger import services
    from ledger.models import Provider, Tenant

    _switch(db)
    rows = _rows_filled()
    big = Tenant.objects.get(slug=BIG)
    provider = Provider.objects.get(tenant=big, slug=PROVIDER)

    def fresh() -> None:
        op = services.operation_claim(
            tenant=big, key=f"paired-{run_id}-{next(counter)}", provider=provider, action=ACTION
        ).operation
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_x"
        )

    def replay() -> None:
        result = services.operation_claim(
            tenant=big, key=_key(_big_succeeded(rows, rng)), provider=provider, action=ACTION
        )
        assert result.replayed

    for _ in range(WARM):
        fresh()
        replay()
    out: tuple[list[float], list[float]] = ([], [])
    for call, times in ((fresh, out[0]), (replay, out[1])):
        for _ in range(OPS):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    url = common.bench_database_url(common.server_url(), db=BIG_DB, suite="bench.scale_claims")
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1:9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    import logging

    import django

    django.setup()
    logging.getLogger("onceguard").setLevel(logging.ERROR)
    run_id = f"{int(time.time())}-{os.getpid()}"
    counter = iter(range(10**9))
    rng = random.Random(16)
    pooled: dict[tuple[str, str], list[float]] = {(db, k): [] for db in (BIG_DB, SMALL_DB) for k in ("fresh", "replay")}
    ratios: dict[str, list[float]] = {"fresh": [], "replay": []}
    load = []
    for pair in range(PAIRS):
        order = (BIG_DB, SMALL_DB) if pair % 2 == 0 else (SMALL_DB, BIG_DB)
        medians: dict[tuple[str, str], float] = {}
        for db in order:
            fresh, replay = _side(db, run_id, counter, rng)
            for kind, times in (("fresh", fresh), ("replay", replay)):
                pooled[(db, kind)] += times
                medians[(db, kind)] = statistics.median(times)
        for kind in ratios:
            ratios[kind].append(medians[(BIG_DB, kind)] / medians[(SMALL_DB, kind)])
        load.append(os.getloadavg()[0])
    for db in (BIG_DB, SMALL_DB):
        _switch(db)
        from ledger.models import Operation

        Operation.objects.filter(key__startswith=f"paired-{run_id}-").delete()
    print(
        f"claims big ({BIG_DB}) / small ({SMALL_DB}), {PAIRS} pairs of blocks of {OPS} each, one process;"
        f" load average {min(load):.1f}–{max(load):.1f}"
    )
    for kind, values in ratios.items():
        values.sort()
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        big, small = sorted(pooled[(BIG_DB, kind)]), sorted(pooled[(SMALL_DB, kind)])
        print(
            f"  {kind:<7} ratio of block medians: median {statistics.median(values):.3f},"
            f" IQR {q[0]:.3f}–{q[2]:.3f}, range {values[0]:.3f}–{values[-1]:.3f};"
            f" pooled p50/p95 ms big {common.percentile(big, 50):.2f}/{common.percentile(big, 95):.2f},"
            f" small {common.percentile(small, 50):.2f}/{common.percentile(small, 95):.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
