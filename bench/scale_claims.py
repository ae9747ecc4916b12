"""Claims on big tables beside small ones, interleaved in one process (the scale target: "within 15 %").

    SCALE_DB=bench_scale .venv/bin/python -m bench.scale_claims

``bench.scale`` runs this after its two databases' other measures, for its claim rows
(SCALE_CLAIMS_JSON: where the figures are written as JSON).

``bench.scale`` measures each database in its own child process, one after the other: on a
machine shared with other work, load that comes and goes lands on one side more than the
other. Here one process alternates between the two databases ``bench.scale`` filled
(``SCALE_DB`` and ``SCALE_DB``_small) in blocks — big, small, small, big, … so neither side
always goes first — reconnecting at each switch (prepared statements and per-process caches
rebuilt in a warm-up that is not timed). Each block times SCALE_PAIRED_OPS fresh claims of the
big tenant (claim → complete), as many replays of a random finished key and as many fresh
claims of a small tenant; each pair of blocks gives a ratio big / small of the block medians.
Printed: the median ratio, its interquartile range and extremes over the pairs, and the
pooled p50/p95 of each side. Nothing is left behind: the fresh claims' operations are
deleted at the end.

SCALE_FRESH_PAYLOAD=1: fresh claims carry the filled rows' payload (``bench.scale.PAYLOAD``).
Before fill version 10, whether a fresh row fitted in the room the fill left on each page of
operations (fillfactor 90), and so went to an old page instead of the table's end, depended on
its size (bench/results/scale-10M.md, *Claims at scale*); the fill now packs its pages.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench import common

BIG_DB = os.environ.get("SCALE_DB", common.suite_db("bench_scale"))
SMALL_DB = os.environ.get("SCALE_SMALL_DB", BIG_DB + "_small")
PAIRS = int(os.environ.get("SCALE_PAIRED_BLOCKS", 20))
OPS = int(os.environ.get("SCALE_PAIRED_OPS", 50))
WARM = 8
OUT = os.environ.get("SCALE_CLAIMS_JSON", "")
WITH_PAYLOAD = os.environ.get("SCALE_FRESH_PAYLOAD", "0") == "1"


def _switch(db: str) -> None:
    from django.core.cache import cache
    from django.db import connection

    from ledger.platform import caching
    from ledger.protocol import selectors

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


KINDS = ("fresh", "replay", "fresh_small")
# The rows of bench.scale's report these kinds stand for.
MEASURES = {
    "fresh": "claim fresh (big tenant)",
    "replay": "claim replay (big tenant)",
    "fresh_small": "claim fresh (small tenant)",
}


def _side(db: str, run_id: str, counter: Any, rng: random.Random) -> dict[str, list[float]]:
    # bench.scale imports this module for its report: imported here, not at the top.
    from bench.scale import ACTION, BIG, PAYLOAD, PROVIDER, SMALL_TENANT, _big_succeeded, _key
    from ledger.models import Provider, Tenant
    from ledger.protocol import services

    _switch(db)
    rows = _rows_filled()
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=[BIG, SMALL_TENANT])}
    providers = {p.tenant_id: p for p in Provider.objects.filter(slug=PROVIDER, tenant__slug__in=[BIG, SMALL_TENANT])}

    def fresh_of(slug: str) -> Any:
        tenant = tenants[slug]

        def fresh() -> None:
            op = services.operation_claim(
                tenant=tenant,
                key=f"paired-{run_id}-{next(counter)}",
                provider=providers[tenant.pk],
                action=ACTION,
                payload=PAYLOAD if WITH_PAYLOAD else None,
            ).operation
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_x"
            )

        return fresh

    def replay() -> None:
        big = tenants[BIG]
        result = services.operation_claim(
            tenant=big, key=_key(_big_succeeded(rows, rng)), provider=providers[big.pk], action=ACTION
        )
        assert result.replayed

    calls = {"fresh": fresh_of(BIG), "replay": replay, "fresh_small": fresh_of(SMALL_TENANT)}
    for _ in range(WARM):
        for call in calls.values():
            call()
    out: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for kind, call in calls.items():
        for _ in range(OPS):
            t0 = time.perf_counter()
            call()
            out[kind].append((time.perf_counter() - t0) * 1000)
    return out


def summary(ratios: list[float], big: list[float], small: list[float]) -> dict[str, float]:
    """The ratios of block medians over the pairs (median, quartiles, extremes) and each
    side's pooled nearest-rank p50/p95, in ms."""
    values = sorted(ratios)
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    big, small = sorted(big), sorted(small)
    return {
        "ratio_median": statistics.median(values),
        "ratio_q1": q[0],
        "ratio_q3": q[2],
        "ratio_min": values[0],
        "ratio_max": values[-1],
        "big_p50_ms": common.percentile(big, 50),
        "big_p95_ms": common.percentile(big, 95),
        "small_p50_ms": common.percentile(small, 50),
        "small_p95_ms": common.percentile(small, 95),
    }


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
    pooled: dict[tuple[str, str], list[float]] = {(db, k): [] for db in (BIG_DB, SMALL_DB) for k in KINDS}
    ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
    load = []
    started = time.time()
    for pair in range(PAIRS):
        order = (BIG_DB, SMALL_DB) if pair % 2 == 0 else (SMALL_DB, BIG_DB)
        medians: dict[tuple[str, str], float] = {}
        for db in order:
            for kind, times in _side(db, run_id, counter, rng).items():
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
        f"claims big ({BIG_DB}) / small ({SMALL_DB}), {PAIRS} pairs of blocks of {OPS} each, one process,"
        f" {time.time() - started:.0f} s, fresh claims {'with' if WITH_PAYLOAD else 'without'} a payload;"
        f" load average {min(load):.1f}–{max(load):.1f}"
    )
    figures: dict[str, Any] = {"pairs": PAIRS, "ops": OPS, "load_min": min(load), "load_max": max(load)}
    for kind, values in ratios.items():
        s = summary(values, pooled[(BIG_DB, kind)], pooled[(SMALL_DB, kind)])
        figures[MEASURES[kind]] = s
        print(
            f"  {kind:<11} ratio of block medians: median {s['ratio_median']:.3f},"
            f" IQR {s['ratio_q1']:.3f}–{s['ratio_q3']:.3f}, range {s['ratio_min']:.3f}–{s['ratio_max']:.3f};"
            f" pooled p50/p95 ms big {s['big_p50_ms']:.2f}/{s['big_p95_ms']:.2f},"
            f" small {s['small_p50_ms']:.2f}/{s['small_p95_ms']:.2f}"
        )
    if OUT:
        Path(OUT).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
