"""What restore fencing costs per operation (ADR 0012): the in-process claim (with the sent
marker) → complete pair, fencing off beside each journal, in interleaved rounds (each starting with another configuration), on PostgreSQL
in its own database ``onceguard_bench_fence``.

    .venv/bin/python -m bench.fencing [--ops 2000] [--rounds 5]

Configurations: ``off`` (the baseline), ``local`` (the append-only folder, no fsync),
``local+fsync`` (FENCE_JOURNAL_FSYNC=1), ``redis`` (the local redis-server), and ``held`` — a
local journal while one unreleased hold exists, so every new key's claim also reads the fence
table. Reported per pair: the median of the rounds' mean µs, the difference to ``off`` measured
in the same run, the journal's bytes (the folder's growth, or the stream's MEMORY USAGE growth)
and the database statements. Writes var/bench-fencing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = common.suite_db("onceguard_bench_fence")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
CONFIGS = ("off", "local", "local+fsync", "redis", "held")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.journal")) if folder.exists() else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.fencing")
    parser.add_argument("--ops", type=int, default=int(os.environ.get("BENCH_FENCE_OPS", "500")))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--appends", type=int, default=20000, help="journal writes timed alone, per store")
    parser.add_argument("--json", default=os.environ.get("BENCH_FENCE_JSON", str(ROOT / "var" / "bench-fencing.json")))
    args = parser.parse_args(argv)
    if common.SMOKE:
        args.ops, args.rounds, args.appends = min(args.ops, 20), min(args.rounds, 1), min(args.appends, 50)
    bench_url = common.bench_database_url(common.server_url(), db=BENCH_DB, suite="bench.fencing")
    dbsetup.database_ready(bench_url)
    dbsetup.setup_django(bench_url)

    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from bench.inproc import services_factory
    from bench.writecost import django_statement_counter
    from ledger.models import FenceHold, Tenant
    from ledger.platform.journal import Entry, LocalJournal, RedisJournal
    from ledger.protocol import fencing, services

    assert connection.settings_dict["NAME"] == BENCH_DB
    with connection.cursor() as cursor:
        # Only ever in onceguard_bench_fence: every run starts from empty tables.
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_attempt, ledger_operationevent, ledger_fencehold CASCADE"
        )
    tenant = Tenant.objects.filter(slug="bench-fence").first() or services.tenant_create(slug="bench-fence")
    provider = services.provider_upsert(
        tenant=tenant, slug=common.PROVIDER_SLUG, base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    pair = services_factory(tenant, provider, "fresh")(0)
    folder = Path(tempfile.mkdtemp(prefix="onceguard-bench-fence-"))
    base = dict(settings.ONCEGUARD)
    overrides = {
        "off": {"FENCE_JOURNAL": "off"},
        "local": {"FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(folder / "local")},
        "local+fsync": {
            "FENCE_JOURNAL": "local",
            "FENCE_JOURNAL_DIR": str(folder / "fsync"),
            "FENCE_JOURNAL_FSYNC": True,
        },
        "redis": {"FENCE_JOURNAL": "redis", "FENCE_REDIS_URL": REDIS_URL},
        "held": {"FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(folder / "held")},
    }
    ledger_id = fencing.identity().ledger_id
    redis_book = RedisJournal(REDIS_URL, ledger_id)
    redis_book.client.delete(redis_book.stream, redis_book.stream + ":epoch")
    means: dict[str, list[float]] = {c: [] for c in CONFIGS}
    journal_bytes: dict[str, int] = dict.fromkeys(CONFIGS, 0)
    statements: dict[str, float] = {}
    done = dict.fromkeys(CONFIGS, 0)
    run = f"{int(time.time())}"
    for r in range(args.rounds):
        # Each round starts with another configuration: a load that drifts during a round
        # (a shared machine) does not always land on the same one.
        for config in CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]:
            settings.ONCEGUARD = {**base, **overrides[config]}
            fencing.view_reset()
            if config == "held":
                FenceHold.objects.get_or_create(
                    tenant=tenant,
                    key="bench-held-key",
                    defaults={"journaled_state": "succeeded", "epoch": 0, "found_at": timezone.now()},
                )
            fencing.view_load()
            before_local = _folder_bytes(folder)
            before_redis = (
                (redis_book.client.memory_usage(redis_book.stream, samples=0) or 0) if config == "redis" else 0
            )
            keys = [f"fence-{run}-{config}-{r}-{i}" for i in range(args.ops)]
            with django_statement_counter() as counted:
                start_count = counted()
                started = time.perf_counter()
                for key in keys:
                    pair(key)
                elapsed = time.perf_counter() - started
                statements[config] = (counted() - start_count) / len(keys)
            means[config].append(elapsed / len(keys) * 1e6)
            done[config] += len(keys)
            if config == "redis":
                journal_bytes[config] += (
                    redis_book.client.memory_usage(redis_book.stream, samples=0) or 0
                ) - before_redis
            else:
                journal_bytes[config] += _folder_bytes(folder) - before_local
            if config == "held":
                FenceHold.objects.filter(key="bench-held-key").delete()
    settings.ONCEGUARD = base
    fencing.view_reset()
    redis_book.client.delete(redis_book.stream, redis_book.stream + ":epoch")
    off = statistics.median(means["off"])
    rows = []
    print(f"claim (sent marker) → complete, in process, {args.ops} pairs × {args.rounds} interleaved rounds")
    print(f"{'journal':<13}{'µs/pair':>10}{'Δ vs off':>10}{'bytes/pair':>12}{'stmts/pair':>12}")
    for config in CONFIGS:
        median = statistics.median(means[config])
        per_op_bytes = journal_bytes[config] / done[config] if done[config] else 0.0
        rows.append(
            {
                "journal": config,
                "us_per_pair": round(median, 1),
                "us_vs_off": round(median - off, 1),
                "round_means_us": [round(m, 1) for m in means[config]],
                "journal_bytes_per_pair": round(per_op_bytes, 1),
                "statements_per_pair": round(statements[config], 2),
            }
        )
        print(f"{config:<13}{median:>10.1f}{median - off:>+10.1f}{per_op_bytes:>12.1f}{statements[config]:>12.2f}")
    print("(a pair journals twice: the claim's sent marker and the completion)")
    # The journal write alone, without the database's noise: what each entry adds to a move.
    entry = Entry(tenant_id=tenant.pk, provider_id=provider.pk, state="succeeded", key="order-1001:charge:v1")
    stores = {
        "local": LocalJournal(folder / "alone", "bench"),
        "local+fsync": LocalJournal(folder / "alone-fsync", "bench", fsync=True),
        "redis": RedisJournal(REDIS_URL, f"bench-alone-{run}"),
    }
    appends = []
    print(f"one journal write, {args.appends} in a row (fsync: a tenth of them)")
    for name, book in stores.items():
        count = max(1, args.appends // 10) if name == "local+fsync" else args.appends
        started = time.perf_counter()
        for _ in range(count):
            book.append(entry)
        per = (time.perf_counter() - started) / count * 1e6
        appends.append({"journal": name, "us_per_write": round(per, 2), "writes": count})
        print(f"{name:<13}{per:>10.2f} µs")
        if isinstance(book, RedisJournal):
            book.client.delete(book.stream)
        else:
            book.close()
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "ops": args.ops,
                "rounds": args.rounds,
                "results": rows,
                "journal_write_alone": appends,
            },
            indent=2,
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
