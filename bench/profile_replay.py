"""Where a replay of the in-process guard goes: ``python -m bench.profile_replay [--ops 2000]``.

The replay of ``bench.powertools`` (``ledger.protocol.guard.run_once`` on a finished key), run
alone in this process on its own database (``onceguard_bench_profile``): its CPU per op in this
process and in the PostgreSQL backend, the statements it sends (Django's query log), the replay
look-up's EXPLAIN (ANALYZE, BUFFERS), and cProfile's top functions by own and cumulative time
(var/bench-profile-replay.txt). A profiling aid: it measures nothing that ``make bench`` reports.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

from bench import common, dbsetup, inproc

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = common.suite_db("onceguard_bench_profile")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.profile_replay")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    bench_url = common.bench_database_url(common.server_url(), db=BENCH_DB, suite="bench.profile_replay")
    dbsetup.database_ready(bench_url)
    dbsetup.setup_django(bench_url)

    from django.db import connection, reset_queries

    from ledger.models import Tenant
    from ledger.protocol import services
    from ledger.store import statements

    tenant = Tenant.objects.filter(slug="bench-profile").first() or services.tenant_create(slug="bench-profile")
    services.provider_upsert(
        tenant=tenant, slug=common.PROVIDER_SLUG, base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    fresh = inproc.guard_factory(tenant, "fresh")(0)
    replay = inproc.guard_factory(tenant, "replay")(0)
    run = f"{int(time.time())}-{os.getpid()}"
    keys = [f"prof-{run}-{i}" for i in range(args.ops)]
    for key in keys:
        fresh(key)
    # Statistics as in every timed phase of the suites (bench.common.analyze).
    common.analyze(common.libpq_dsn(bench_url))
    for key in keys[:200]:  # warm-up
        replay(key)

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    pg0, own0, wall0 = common.proc_cpu_seconds(pid), time.process_time(), time.perf_counter()
    for key in keys:
        replay(key)
    wall = time.perf_counter() - wall0
    own, pg = time.process_time() - own0, common.proc_cpu_seconds(pid) - pg0
    n = len(keys)
    print(f"replay: {n / wall:,.0f} ops/s; CPU ms per op: client {own * 1000 / n:.3f}, postgres {pg * 1000 / n:.3f}")

    connection.force_debug_cursor = True
    reset_queries()
    replay(keys[0])
    print(f"statements per replay: {len(connection.queries)}")
    for q in connection.queries:
        print(f"  {q['sql'][:160]}")
    connection.force_debug_cursor = False

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + statements.text("operation_by_key"),
            {"tenant_id": tenant.pk, "key": keys[0]},
        )
        print("\n".join(row[0] for row in cursor.fetchall()))

    profile = cProfile.Profile()
    profile.enable()
    for key in keys:
        replay(key)
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    target = ROOT / "var" / "bench-profile-replay.txt"
    target.write_text(out.getvalue())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
