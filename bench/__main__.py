"""``make bench``: one run, every scenario, a table on stdout and var/bench-latest.json."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common, dbsetup, explain, httpapi, inproc, raw
from bench.common import Stats, merge_runs, run_lanes, summarize

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"

TARGETS = [
    # (label, numerator, denominator, kind, target)
    ("(b) guard / (a) 1 conn", "b guard run_once", "a raw 1 conn", "fresh", 0.8),
    ("(b) guard / (a) 1 conn", "b guard run_once", "a raw 1 conn", "replay", 0.5),
    ("(c) HTTP / (a) 4 conns", "c http", "a raw 4 conns", "fresh", 0.3),
    ("(c) HTTP / (a) 4 conns", "c http", "a raw 4 conns", "replay", 0.3),
    # The ledger's HTTP path against the framework under it: same server, middleware,
    # authentication and client, two requests per op (bench/floor.py).
    ("(c) HTTP / (f) framework floor", "c http", "f framework floor", "fresh", 0.6),
]
INFO_RATIOS = [
    ("(b') services / (a) 1 conn", "b services direct", "a raw 1 conn"),
    ("(b) guard / (b') services", "b guard run_once", "b services direct"),
    ("(a') wide / (a) 1 conn", "a' raw ledger-shaped table", "a raw 1 conn"),
    # The ceiling of the ledger's own two statements (six rows, their indexes, foreign keys
    # and state CHECKs) with no Python around them, and how much of it the app keeps.
    ("(a'') ledger SQL / (a) 1 conn", "a'' ledger's SQL, bare psycopg", "a raw 1 conn"),
    ("(b) guard / (a'') ledger SQL", "b guard run_once", "a'' ledger's SQL, bare psycopg"),
]
# A replay is one request; the floor's op is two: (c) replay / (f) is information only.
INFO_CROSS = [("(c) replay / (f) floor", ("c http", "replay"), ("f framework floor", "fresh"))]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--ops", type=int, default=int(os.environ.get("BENCH_OPS", 1500)), help="ops per scenario")
    p.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 200)), help="warm-up ops")
    p.add_argument(
        "--http-configs",
        default=os.environ.get("BENCH_HTTP_CONFIGS", "granian2x4"),
        help="servers for (c) and (f); with several, short trials pick the fastest (granianWxT = granian"
        " workers×blocking threads, WxT = gunicorn gthread workers×threads, syncN = N gunicorn sync workers;"
        " python -m bench.compare measures servers side by side over rounds)",
    )
    p.add_argument(
        "--http-ops",
        type=int,
        default=int(os.environ.get("BENCH_HTTP_OPS", 750)),
        help="ops per HTTP scenario (an HTTP fresh op is two requests; kept lower to stay within ~3 minutes)",
    )
    p.add_argument("--http-trial-ops", type=int, default=250, help="fresh ops per configuration trial")
    p.add_argument(
        "--no-http", action="store_true", default=os.environ.get("BENCH_NO_HTTP") == "1", help="skip (c) and (f)"
    )
    p.add_argument(
        "--cost-ops",
        type=int,
        default=int(os.environ.get("BENCH_COST_OPS", 200)),
        help="fresh pairs (and as many replays) per scenario for the write-cost figures (bench.writecost)",
    )
    p.add_argument(
        "--cost-only",
        action="store_true",
        help="only the write-cost figures (bench.writecost) of (a), (b), (c): no timed groups, no CPU",
    )
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 5)), help="interleaved rounds")
    p.add_argument("--profile", action="store_true", help="profile (b) and (c) in-process instead of measuring")
    p.add_argument(
        "--json",
        default=os.environ.get("BENCH_JSON", str(VAR / "bench-latest.json")),
        help="where to write the results",
    )
    return p.parse_args(argv)


class Keys:
    def __init__(self) -> None:
        self.run = f"{int(time.time()):x}"

    def make(self, scenario: str, n: int, tag: str = "") -> list[str]:
        return [f"bench-{self.run}-{scenario}{tag}-{i:05d}" for i in range(n)]


T0 = time.monotonic()


def say(text: str) -> None:
    print(text, flush=True)


def section(text: str) -> None:
    say(f"{text}   [t+{time.monotonic() - T0:.0f}s, load {os.getloadavg()[0]:.1f}]")


@dataclass
class Spec:
    """One scenario of an interleaved group."""

    label: str
    factory_for: Callable[[str], Any]  # kind ("fresh" | "replay") → lane factory
    slug: str
    ops: int
    lane_kw: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # Warm-up ops per lane in rounds after the first (raw: psycopg prepares on the 6th use).
    rewarm: int = 2
    # The kinds this scenario runs; the framework floor has one (two requests per op).
    kinds: tuple[str, ...] = ("fresh", "replay")


def run_interleaved(specs: list[Spec], keys: Keys, args: argparse.Namespace) -> list[Stats]:
    """Fresh keys (claim→complete), then replays of the same, now finished, keys.

    The scenarios of a group run in ``args.rounds`` short rounds, round-robin with the
    order rotated each round, so the slow drifts of a shared machine (other engineers'
    tests, their WAL fsyncs) fall on every scenario alike and the ratios stay meaningful.
    The first round of each scenario warms up with ``args.warmup`` ops, later rounds with a
    few (``Spec.rewarm`` per lane).
    """
    rounds = max(1, args.rounds)
    out: list[Stats] = []
    for kind in ("fresh", "replay"):
        kind_specs = [s for s in specs if kind in s.kinds]
        runs: dict[str, list[Any]] = {s.label: [] for s in kind_specs}
        for r in range(rounds):
            # Fresh statistics before every round: psycopg prepares the ledger's statements,
            # and a generic plan made from the statistics of an empty table (taken once at the
            # start) is a sequential scan that grows with every insert — the steady state of
            # a live ledger is a table whose statistics know its size.
            common.analyze(args.dsn)
            order = kind_specs[r % len(kind_specs) :] + kind_specs[: r % len(kind_specs)]
            for spec in order:
                factory_for = _planted(spec)
                chunk = keys.make(spec.slug, spec.ops)[r::rounds]
                lanes = max(1, spec.lane_kw.get("procs", 0)) * spec.lane_kw.get("threads", 1)
                warm_n = args.warmup if r == 0 else spec.rewarm * lanes
                warm = keys.make(spec.slug, warm_n, f"w{r}")
                runs[spec.label].append(run_lanes(factory_for(kind), chunk, warmup=warm, **spec.lane_kw))
        for spec in kind_specs:
            stats = summarize(spec.label, kind, merge_runs(runs[spec.label]), **spec.extra)
            say(
                f"  {spec.label:<32} {kind:<6} {stats.ops_per_s:8.0f} ops/s  p50 {stats.p50_ms:6.2f} ms"
                f"  p99 {stats.p99_ms:6.2f} ms"
            )
            out.append(stats)
    return out


def _planted(spec: Spec) -> Callable[[str], Any]:
    """The scenario's lane factories, or, for the scenario BENCH_PLANT_ERROR names by its slug,
    lanes whose every op fails: tests/test_bench_smoke.py proves with it that a scenario's
    errors make ``make bench`` exit non-zero."""
    if os.environ.get("BENCH_PLANT_ERROR") != spec.slug:
        return spec.factory_for

    def factory_for(kind: str) -> Any:
        def factory(_lane: int) -> Any:
            def op(_item: Any) -> None:
                raise RuntimeError("planted error (BENCH_PLANT_ERROR)")

            return op

        return factory

    return factory_for


def single_connection_group(
    seeded: dict[str, Any], bench_dsn: str, keys: Keys, args: argparse.Namespace
) -> list[Stats]:
    """(a) raw at 1 connection, (a') raw on a ledger-shaped table, (b) guard and services."""
    from bench.trace import count_round_trips

    tenant, provider = seeded["tenant"], seeded["provider"]
    raw.create_tables(bench_dsn)
    pg = common.pg_backend_probe(bench_dsn)
    inproc_pg = inproc.backend_probe()
    captured = raw.capture_ledger_statements(tenant, provider)
    specs = [
        Spec(
            "a raw 1 conn",
            lambda kind: raw.lane_factory(bench_dsn, raw.NARROW, kind, tenant.pk),
            "raw1",
            args.ops,
            {"procs": 0, "probe": pg},
            rewarm=10,
        ),
        Spec(
            "a' raw ledger-shaped table",
            lambda kind: raw.lane_factory(bench_dsn, raw.WIDE, kind, tenant.pk),
            "wide1",
            args.ops,
            {"procs": 0, "probe": pg},
            rewarm=10,
        ),
        Spec(
            "a'' ledger's SQL, bare psycopg",
            lambda kind: raw.ledger_lane_factory(bench_dsn, captured, kind),
            "ledgersql",
            args.ops,
            {"procs": 0, "probe": pg},
            rewarm=10,
        ),
        Spec(
            "b guard run_once", lambda kind: inproc.guard_factory(tenant, kind), "guard", args.ops, {"probe": inproc_pg}
        ),
        Spec(
            "b services direct",
            lambda kind: inproc.services_factory(tenant, provider, kind),
            "svc",
            args.ops,
            {"probe": inproc_pg},
        ),
    ]
    results = run_interleaved(specs, keys, args)
    pg.close()  # type: ignore[attr-defined]
    # Round trips per op, counted on a small untimed sample from libpq's trace.
    for stats in results:
        spec = next(s for s in specs if s.label == stats.scenario)
        if stats.scenario.startswith("b "):
            sample = keys.make(spec.slug, 20, "rt")
            if stats.kind == "fresh":
                stats.extra.update(count_round_trips(spec.factory_for("fresh")(0), sample))
            else:
                stats.extra.update(count_round_trips(spec.factory_for("replay")(0), sample))
    return results


def concurrent_group(seeded: dict[str, Any], bench_url: str, keys: Keys, args: argparse.Namespace) -> list[Stats]:
    """Pick the server configuration (short trials, when several are given), then (a) at 4
    connections, (c) HTTP and (f) the framework floor at client concurrency 8, interleaved."""
    bench_dsn = common.libpq_dsn(bench_url)
    tenant_id = seeded["tenant"].pk
    configs = [httpapi.parse_config(c) for c in args.http_configs.split(",") if c]
    log = VAR / "bench-server.log"
    api_key = seeded["api_key"]
    pg = common.pg_backend_probe(bench_dsn)
    trials: list[Stats] = []
    if len(configs) > 1 and not args.no_http:
        for cfg in configs:
            with httpapi.serve(cfg, bench_url, log) as server:
                slug = f"try{cfg.workers}{cfg.threads}{cfg.worker_class[0]}"
                run = run_lanes(
                    httpapi.lane_factory(server.port, api_key, "fresh"),
                    keys.make(slug, args.http_trial_ops),
                    warmup=keys.make(slug, 80, "w"),
                    procs=2,
                    threads=4,
                    probe=common.combine_probes(pg, server.probe()),
                )
                stats = summarize(f"c trial {cfg.label}", "fresh", run, config=cfg.label)
                trials.append(stats)
                say(f"  trial {cfg.label:<16} fresh {stats.ops_per_s:7.0f} ops/s  p50 {stats.p50_ms:6.2f} ms")
    best = max(trials, key=lambda s: s.ops_per_s).extra["config"] if trials else configs[0].label
    cfg = next(c for c in configs if c.label == best)
    raw4 = Spec(
        "a raw 4 conns",
        lambda kind: raw.lane_factory(bench_dsn, raw.NARROW, kind, tenant_id),
        "raw4",
        args.ops,
        {"procs": 4, "threads": 1, "probe": pg},
        rewarm=10,
    )
    if args.no_http:
        results = run_interleaved([raw4], keys, args)
        pg.close()  # type: ignore[attr-defined]
        return results
    say(f"  → {cfg.label}; interleaved with (a) at 4 connections")
    with httpapi.serve(cfg, bench_url, log) as server:
        http_probe = common.combine_probes(pg, server.probe())
        http = Spec(
            "c http",
            lambda kind: httpapi.lane_factory(server.port, api_key, kind),
            "http",
            args.http_ops,
            {"procs": 2, "threads": 4, "probe": http_probe},
            {"config": cfg.label},
        )
        floor = Spec(
            "f framework floor",
            lambda _kind: httpapi.lane_factory(server.port, api_key, "floor"),
            "floor",
            args.http_ops,
            {"procs": 2, "threads": 4, "probe": http_probe},
            {"config": cfg.label},
            kinds=("fresh",),
        )
        results = run_interleaved([raw4, http, floor], keys, args)
    pg.close()  # type: ignore[attr-defined]
    # Round trips per request pair, counted in-process (same Django code path, no socket).
    from bench.profiling import Wsgi, new_handler, wsgi_ops
    from bench.trace import count_round_trips

    ops = wsgi_ops(Wsgi(new_handler(), api_key))
    dbsetup.quiet_logging()
    sample = keys.make("httprt", 20)
    for stats in results:
        if stats.scenario == "c http":
            stats.extra.update(count_round_trips(ops[stats.kind], sample))
    return trials + results


def write_cost_group(seeded: dict[str, Any], bench_dsn: str, keys: Keys, args: argparse.Namespace) -> list[Any]:
    """WAL, index entries, HOT share and statements per op of (a), (b) and (c) (bench.writecost)."""
    import psycopg
    from django.db import connection

    from bench import writecost
    from bench.profiling import Wsgi, new_handler, wsgi_ops

    n = max(1, args.cost_ops)
    tenant = seeded["tenant"]
    monitor = psycopg.connect(bench_dsn, autocommit=True)
    wal = writecost.wal_reader(monitor)
    if wal is None:
        say("  pg_walinspect unavailable (CREATE EXTENSION pg_walinspect needs a superuser): no WAL figures")
    costs = []

    def django_flush() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")

    # (a) the baseline: raw SQL through a counting cursor.
    for kind in ("fresh", "replay"):
        op = raw.lane_factory(bench_dsn, raw.NARROW, kind, tenant.pk, cursor_factory=writecost.CountingCursor)(0)
        costs.append(
            writecost.measure(
                monitor,
                wal,
                "(a) raw SQL",
                kind,
                op,
                keys.make("costraw", n),
                counted=lambda: writecost.CountingCursor.count,
                operation_table=raw.NARROW,
                flush_stats=lambda op=op: op.conn.execute("SELECT pg_stat_force_next_flush()"),  # type: ignore[misc]
            )
        )
        op.conn.close()  # type: ignore[attr-defined]
    # (b) the in-process guard, (c) the HTTP API through the WSGI handler in-process.
    client = Wsgi(new_handler(), seeded["api_key"])
    dbsetup.quiet_logging()
    http_ops = wsgi_ops(client)
    with writecost.django_statement_counter() as counted:
        for label, slug, ops_for in (
            ("(b) guard", "costguard", lambda kind: inproc.guard_factory(tenant, kind)(0)),
            ("(c) HTTP", "costhttp", lambda kind: http_ops[kind]),
        ):
            for kind in ("fresh", "replay"):
                costs.append(
                    writecost.measure(
                        monitor,
                        wal,
                        label,
                        kind,
                        ops_for(kind),
                        keys.make(slug, n),
                        counted=counted,
                        operation_table="ledger_operation",
                        flush_stats=django_flush,
                    )
                )
    monitor.close()
    return costs


COST_CPU_FROM = {"(a) raw SQL": "a raw 1 conn", "(b) guard": "b guard run_once", "(c) HTTP": "c http"}


def scenario_explain(seeded: dict[str, Any], bench_dsn: str, keys: Keys, results: list[Stats]) -> list[dict[str, Any]]:
    from ledger.protocol import services
    from ledger.protocol.guard import run_once

    tenant, provider = seeded["tenant"], seeded["provider"]
    plans = []
    tenant_id = tenant.pk
    plans += explain.explain_raw(bench_dsn, raw.NARROW, tenant_id, keys.make("raw1", 1)[0])
    plans += explain.explain_raw(bench_dsn, raw.WIDE, tenant_id, keys.make("wide1", 1)[0])
    finished = keys.make("svc", 1)[0]
    fresh = "explain-" + keys.run
    req = inproc._request

    def claim(key: str) -> Any:
        return services.operation_claim(
            tenant=tenant,
            key=key,
            provider=provider,
            action="bench",
            request=req(key),
            mark_sent=True,
            actor="guard",
            via_claims=False,
        )

    def fresh_pair() -> None:
        op = claim(fresh).operation
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body={"ok": True}
        )

    from bench.httpapi import claim_body
    from bench.profiling import Wsgi, new_handler

    client = Wsgi(new_handler(), seeded["api_key"])
    dbsetup.quiet_logging()
    plans += explain.explain_selects("HTTP replay claim", lambda: client.post("/api/v1/claims", claim_body(finished)))
    plans += explain.explain_ledger(
        [
            ("ledger fresh claim→complete", fresh_pair),
            ("ledger replay claim", lambda: claim(finished)),
            (
                "run_once replay (adds)",
                lambda: run_once(
                    tenant=tenant,
                    key=finished,
                    fn=inproc._must_not_run,
                    args=(finished,),
                    provider=provider.slug,
                    action="bench",
                    request=req(finished),
                ),
            ),
        ]
    )
    return plans


def fmt_table(results: list[Stats]) -> str:
    head = f"{'scenario':<34}{'kind':<8}{'ops':>6}{'ops/s':>9}{'p50 ms':>9}{'p99 ms':>9}  {'RT/op':>5}  CPU ms/op (client / server / pg)  errors"
    lines = [head, "-" * len(head)]
    for s in results:
        cpu = s.extra.get("cpu_ms_per_op", {})
        cpu_txt = " / ".join(f"{cpu[k]:.3f}" if k in cpu else "  -  " for k in ("client", "app", "pg"))
        rt = s.extra.get("round_trips_per_op")
        label = s.scenario + (f" [{s.extra['config']}]" if "config" in s.extra and "trial" not in s.scenario else "")
        lines.append(
            f"{label:<34}{s.kind:<8}{s.ops:>6}{s.ops_per_s:>9.0f}{s.p50_ms:>9.2f}{s.p99_ms:>9.2f}  "
            f"{rt if rt is not None else '':>5}  {cpu_txt:<29}  {s.errors or ''}{' ' + s.first_error[:70] if s.errors else ''}"
        )
    lines.append(
        "RT/op = PostgreSQL round trips per op from libpq's trace ((c): counted in-process, same code path)."
        " CPU: client = the load loop's processes ((b): the app itself, in-process), server = the WSGI server's"
        " main process +"
        " workers, pg = the bench database's backends; all per op, over the timed region only."
    )
    return "\n".join(lines)


def ratios(results: list[Stats]) -> list[dict[str, Any]]:
    by = {(s.scenario, s.kind): s.ops_per_s for s in results}
    out = []
    for label, num, den, kind, target in TARGETS:
        if (num, kind) in by and (den, kind) in by and by[(den, kind)]:
            r = by[(num, kind)] / by[(den, kind)]
            out.append({"ratio": label, "kind": kind, "value": round(r, 3), "target": target, "pass": r >= target})
    for label, num, den in INFO_RATIOS:
        for kind in ("fresh", "replay"):
            if (num, kind) in by and (den, kind) in by and by[(den, kind)]:
                out.append({"ratio": label, "kind": kind, "value": round(by[(num, kind)] / by[(den, kind)], 3)})
    for label, num_key, den_key in INFO_CROSS:
        if num_key in by and den_key in by and by[den_key]:
            out.append({"ratio": label, "kind": num_key[1], "value": round(by[num_key] / by[den_key], 3)})
    return out


def git_state() -> dict[str, Any]:
    """The tree measured: HEAD and the uncommitted files under ledger/ and config/."""
    import subprocess

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = [line[3:] for line in git("status", "--porcelain", "ledger", "config").splitlines()]
    return {"head": git("rev-parse", "--short", "HEAD"), "dirty": dirty}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    base_url = os.environ.get("DATABASE_URL", "")
    bench_url = common.bench_database_url(base_url)
    bench_dsn = args.dsn = common.libpq_dsn(bench_url)
    VAR.mkdir(exist_ok=True)
    started = time.monotonic()
    say(f"onceguard bench — database {common.BENCH_DB} on {bench_dsn.split('@')[-1].split('/')[0]}")
    dbsetup.ensure_database(base_url)
    dbsetup.migrate(bench_url)
    dbsetup.setup_django(bench_url)
    if args.profile:
        from bench import profiling

        return profiling.main(args)
    seeded = dbsetup.seed()
    keys = Keys()
    if args.cost_only:
        from bench import writecost

        raw.create_tables(bench_dsn)
        costs = write_cost_group(seeded, bench_dsn, keys, args)
        say(writecost.fmt_table(costs, {}, {}))
        say(writecost.fmt_indexes(costs))
        return 1 if any(c.errors for c in costs) else 0
    say(
        f"{args.ops} ops per scenario after {args.warmup} warm-up ops; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )

    section(f"(a) raw SQL at 1 connection + (b) in-process guard, interleaved in {args.rounds} rounds")
    results = single_connection_group(seeded, bench_dsn, keys, args)
    section(
        f"(a) raw SQL at 4 connections + (c) HTTP and (f) the framework floor at client concurrency 8"
        f" (2 processes × 4 threads),"
        f" {args.http_ops} HTTP ops, interleaved"
    )
    results += concurrent_group(seeded, bench_url, keys, args)
    section(f"write cost: {args.cost_ops} fresh pairs and replays each of (a), (b), (c), one at a time, untimed")
    from bench import writecost

    costs = write_cost_group(seeded, bench_dsn, keys, args)
    section("plans")
    common.analyze(bench_dsn)
    plans_error = ""
    try:
        plans = scenario_explain(seeded, bench_dsn, keys, results)
    except Exception as exc:  # the plans explain the figures; they must never lose them
        plans_error = f"{type(exc).__name__}: {str(exc)[:200]}"
        say(f"  plans skipped: {plans_error}")
        plans = []

    say("")
    say(fmt_table(results))
    say("")
    rs = ratios(results)
    for r in rs:
        mark = "" if "target" not in r else f"  target ≥ {r['target']:.1f}  {'PASS' if r['pass'] else 'MISS'}"
        say(f"{r['ratio']:<30}{r['kind']:<7}{r['value']:6.2f}{mark}")
    say("")
    by_stats = {(s.scenario, s.kind): s for s in results}
    cpu = {
        (label, kind): by_stats[(timed, kind)].extra.get("cpu_ms_per_op", {})
        for label, timed in COST_CPU_FROM.items()
        for kind in ("fresh", "replay")
        if (timed, kind) in by_stats
    }
    wire = {
        (label, kind): v
        for label, timed in COST_CPU_FROM.items()
        for kind in ("fresh", "replay")
        if (timed, kind) in by_stats and (v := writecost.round_trips(by_stats[(timed, kind)].extra)) is not None
    }
    say("Write cost per op, beside (a) raw SQL measured in this run:")
    say(writecost.fmt_table(costs, cpu, wire))
    for cost in costs:
        if cost.kind == "fresh" and cost.indexes:
            say(
                f"index entries per fresh pair, {cost.scenario}: "
                + ", ".join(f"{k} {v:g}" for k, v in cost.indexes.items())
            )
    floor = by_stats.get(("f framework floor", "fresh"))
    http = by_stats.get(("c http", "fresh"))
    if floor and http:
        f_app = floor.extra.get("cpu_ms_per_op", {}).get("app")
        c_app = http.extra.get("cpu_ms_per_op", {}).get("app")
        if f_app and c_app:
            say(
                f"server CPU per fresh HTTP op / the framework floor's: {c_app:.3f} / {f_app:.3f} ms = {c_app / f_app:.2f}×"
            )
    say("")
    say("Plans (EXPLAIN ANALYZE, BUFFERS, WAL):")
    say(explain.format_plans(plans))
    elapsed = time.monotonic() - started
    doc = {
        "git": git_state(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "http_ops": args.http_ops,
        "rounds": args.rounds,
        "ops": args.ops,
        "warmup": args.warmup,
        "elapsed_s": round(elapsed, 1),
        "results": [s.as_dict() for s in results],
        "ratios": rs,
        "plans": plans,
        "write_cost": [c.as_dict() for c in costs],
    }
    Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    say(f"\nwrote {args.json} in {elapsed:.0f} s")
    # Any scenario's errors fail the run (the Makefile's loop stops on them): a bench that
    # counts errors and exits 0 rots unnoticed.
    failed = [f"{s.scenario} {s.kind}: {s.errors} errors ({s.first_error[:100]})" for s in results if s.errors]
    failed += [
        f"write cost {c.scenario} {c.kind}: {c.errors} errors ({c.first_error[:100]})" for c in costs if c.errors
    ]
    failed += [f"plans: {plans_error}"] if plans_error else []
    for line in failed:
        say(f"ERROR {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
