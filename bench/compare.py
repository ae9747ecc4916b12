"""``python -m bench.compare``: the same scenarios on several trees and/or servers, interleaved.

Every variant (a project tree × a WSGI server) runs, in each of ``--rounds`` rounds and in
an order rotated every round, over HTTP: (c) fresh claim→complete, (c) replay and (f) the
framework floor, each on a freshly started server; and, once per tree and round, (b) the
in-process guard. A shared 2-core machine drifts by ±30 % between minutes, so what counts
is the per-round ratio of each variant to the first one (both measured minutes apart),
reported as median and range over the rounds, next to each variant's own medians.

    # servers side by side on this tree
    python -m bench.compare --servers granian2x4,granian2x8,2x4,sync4
    # an old commit against this tree, on one server
    git archive <old> | tar -x -C /tmp/wt-old
    python -m bench.compare --tree old=/tmp/wt-old --tree new=. --servers granian2x4

Each tree gets its own database (``onceguard_bench_<name>``), migrated by its own code, so
trees with different migrations can be compared; test databases are never touched. A tree
other than this one gets this tree's ``bench/`` copied over its own (same client, same
harness; the app code is the tree's). Only loopback; every loop is bounded by ``--http-ops``
and ``--inproc-ops``. Results: a table on stdout and var/bench-compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import common, httpapi
from bench.common import run_lanes, summarize

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
HTTP_SCENARIOS = ("c fresh", "c replay", "f floor")


@dataclass(frozen=True)
class Tree:
    name: str
    path: Path
    database: str

    def url(self, base_url: str) -> str:
        parts = urlsplit(base_url)
        return urlunsplit((parts.scheme, parts.netloc, f"/{self.database}", parts.query, ""))


@dataclass(frozen=True)
class Variant:
    tree: Tree
    server: httpapi.ServerConfig

    @property
    def label(self) -> str:
        return f"{self.tree.name} · {self.server.label}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], help="NAME=PATH (repeatable; default: this tree)")
    p.add_argument("--servers", default=os.environ.get("BENCH_SERVERS", "granian2x4"), help="see bench.httpapi")
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 5)))
    p.add_argument("--http-ops", type=int, default=300, help="ops per HTTP scenario per round")
    p.add_argument("--inproc-ops", type=int, default=400, help="(b) ops per kind per round")
    p.add_argument("--no-inproc", action="store_true", help="skip (b)")
    p.add_argument("--wsgi-ops", type=int, default=200, help="ops per kind per round, WSGI in-process CPU")
    p.add_argument("--json", default=str(VAR / "bench-compare.json"))
    # Internal: one (b) run inside a tree (a subprocess of the harness).
    p.add_argument("--inproc-lane", choices=["fresh", "replay"], help=argparse.SUPPRESS)
    p.add_argument("--wsgi-lane", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--api-key", help=argparse.SUPPRESS)
    p.add_argument("--keys", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def say(text: str) -> None:
    print(text, flush=True)


def _python(tree: Tree, base_url: str, *args: str, timeout: float = 600) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": tree.url(base_url),
        "BENCH_DB": tree.database,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "0",
        "PYTHONPATH": str(tree.path),
    }
    proc = subprocess.run(
        [sys.executable, *args], cwd=tree.path, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree.name}: {' '.join(args)[:80]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def prepare(tree: Tree, base_url: str) -> dict[str, Any]:
    """This tree's bench/ in place, its database created, migrated and seeded."""
    import psycopg

    if tree.path.resolve() != ROOT:
        shutil.copytree(ROOT / "bench", tree.path / "bench", dirs_exist_ok=True)
    with psycopg.connect(common.libpq_dsn(base_url), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [tree.database]).fetchone():
            conn.execute(f'CREATE DATABASE "{tree.database}"')
    _python(tree, base_url, "manage.py", "migrate", "--noinput")
    seeded = _python(
        tree,
        base_url,
        "-c",
        "import json, os; from bench import dbsetup; dbsetup.setup_django(os.environ['DATABASE_URL']);"
        " s = dbsetup.seed(); print(json.dumps({'api_key': s['api_key']}))",
    )
    return json.loads(seeded.strip().splitlines()[-1])


def inproc_lane(args: argparse.Namespace) -> int:
    """Inside a tree: (b) run_once over the given keys; one JSON line on stdout."""
    from bench import dbsetup, inproc

    dbsetup.setup_django(os.environ["DATABASE_URL"])
    from ledger.models import Tenant

    tenant = Tenant.objects.get(slug=common.TENANT_SLUG)
    keys = args.keys.split(",")
    warm = [f"{keys[0]}-w{i}" for i in range(20)] if args.inproc_lane == "fresh" else keys[:20]
    run = run_lanes(inproc.guard_factory(tenant, args.inproc_lane), keys, warmup=warm, probe=inproc.backend_probe())
    stats = summarize("b guard run_once", args.inproc_lane, run)
    print(json.dumps(stats.as_dict()))
    return 0


def wsgi_lane(args: argparse.Namespace) -> int:
    """Inside a tree: the HTTP scenarios through the WSGI handler in-process, one thread, no
    socket; the app's own CPU per op (thread time: PostgreSQL's work is not in it), which a
    busy machine disturbs far less than throughput. One JSON line on stdout."""
    os.environ["DJANGO_SETTINGS_MODULE"] = httpapi.BENCH_SETTINGS
    from bench import dbsetup

    dbsetup.setup_django(os.environ["DATABASE_URL"])
    from bench.profiling import Wsgi, new_handler, wsgi_ops

    client = Wsgi(new_handler(), args.api_key)
    ops = wsgi_ops(client)

    def floor(key: str) -> None:
        for body in (httpapi.claim_body(key), {"lease_token": "x" * 43, "provider_ref": "r", "response": {"ok": 1}}):
            status, answer, _ = client.post(httpapi.FLOOR_URL, body)
            if status != 200:
                raise RuntimeError(f"floor answered {status}: {answer}")

    ops["floor"] = floor
    keys = args.keys.split(",")
    out: dict[str, float] = {}
    for kind in ("fresh", "replay", "floor"):
        for key in keys[:10]:
            ops[kind](f"{key}-w" if kind == "fresh" else key)
        t0 = time.thread_time()
        for key in keys:
            ops[kind](key)
        out[kind] = (time.thread_time() - t0) * 1000.0 / len(keys)
    print(json.dumps(out))
    return 0


def http_round(variant: Variant, base_url: str, api_key: str, keys: list[str]) -> dict[str, dict[str, Any]]:
    """One server start: warm-up, then fresh, replay (of the same keys) and floor, timed."""
    tree = variant.tree
    pg = common.pg_backend_probe(common.libpq_dsn(tree.url(base_url)), tree.database)
    out: dict[str, dict[str, Any]] = {}
    log = VAR / f"bench-compare-{variant.server.server}.log"
    try:
        with httpapi.serve(variant.server, tree.url(base_url), log, tree.path) as server:
            probe = common.combine_probes(pg, server.probe())
            for kind, scenario in (("fresh", "c fresh"), ("replay", "c replay"), ("floor", "f floor")):
                warm = [f"{k}-w{kind}" for k in keys[:40]] if kind != "replay" else keys[:16]
                run = run_lanes(
                    httpapi.lane_factory(server.port, api_key, kind),
                    keys,
                    warmup=warm,
                    procs=2,
                    threads=4,
                    probe=probe,
                )
                out[scenario] = summarize(scenario, kind, run).as_dict()
    finally:
        pg.close()  # type: ignore[attr-defined]
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def fmt(s: dict[str, float], digits: int = 0) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.inproc_lane:
        return inproc_lane(args)
    if args.wsgi_lane:
        return wsgi_lane(args)
    base_url = common.server_url()
    common.bench_database_url(base_url)  # PostgreSQL on loopback, or exit
    VAR.mkdir(exist_ok=True)
    specs = args.tree or [f"this={ROOT}"]
    trees = []
    for spec in specs:
        name, _, path = spec.partition("=")
        trees.append(Tree(name, Path(path).resolve(), f"{common.BENCH_DB}_{name}"))
    servers = [httpapi.parse_config(c) for c in args.servers.split(",") if c]
    variants = [Variant(t, s) for t in trees for s in servers]
    run_id = f"{int(time.time()):x}"
    say(f"bench.compare — {len(variants)} variants × {args.rounds} rounds; {os.cpu_count()} CPUs")
    seeds = {}
    for tree in trees:
        say(f"  preparing {tree.name} ({tree.path}) in database {tree.database}")
        seeds[tree.name] = prepare(tree, base_url)

    http: dict[str, dict[str, list[dict[str, Any]]]] = {v.label: {s: [] for s in HTTP_SCENARIOS} for v in variants}
    inproc: dict[str, dict[str, list[dict[str, Any]]]] = {t.name: {"fresh": [], "replay": []} for t in trees}
    wsgi: dict[str, list[dict[str, float]]] = {t.name: [] for t in trees}
    started = time.monotonic()
    for r in range(args.rounds):
        say(f"round {r + 1}/{args.rounds}   [t+{time.monotonic() - started:.0f}s, load {os.getloadavg()[0]:.1f}]")
        for tree in trees:
            common.analyze(common.libpq_dsn(tree.url(base_url)))
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            cfg = variant.server
            slug = f"{variant.tree.name}-{cfg.worker_class}{cfg.workers}x{cfg.threads}"  # unique per variant
            keys = [f"cmp-{run_id}-{slug}-r{r}-{i:05d}" for i in range(args.http_ops)]
            result = http_round(variant, base_url, seeds[variant.tree.name]["api_key"], keys)
            for scenario, stats in result.items():
                http[variant.label][scenario].append(stats)
            say(
                f"  {variant.label:<42}"
                + "  ".join(f"{s} {result[s]['ops_per_s']:6.0f}/s ({result[s]['errors']} err)" for s in HTTP_SCENARIOS)
            )
        tree_order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for tree in tree_order:
            keys = ",".join(f"cmpw-{run_id}-{tree.name}-r{r}-{i:05d}" for i in range(args.wsgi_ops))
            api_key = seeds[tree.name]["api_key"]
            out = _python(tree, base_url, "-m", "bench.compare", "--wsgi-lane", "--keys", keys, "--api-key", api_key)
            cpu = json.loads(out.strip().splitlines()[-1])
            wsgi[tree.name].append(cpu)
            say(f"  {tree.name:<12} app CPU in-process, ms/op: " + "  ".join(f"{k} {v:.3f}" for k, v in cpu.items()))
        if not args.no_inproc:
            for tree in tree_order:
                keys = ",".join(f"cmpb-{run_id}-{tree.name}-r{r}-{i:05d}" for i in range(args.inproc_ops))
                for kind in ("fresh", "replay"):
                    out = _python(tree, base_url, "-m", "bench.compare", "--inproc-lane", kind, "--keys", keys)
                    stats = json.loads(out.strip().splitlines()[-1])
                    inproc[tree.name][kind].append(stats)
                    say(f"  {tree.name:<12} (b) {kind:<6} {stats['ops_per_s']:6.0f}/s ({stats['errors']} err)")

    report = summarise(variants, trees, http, inproc, args)
    report["wsgi_cpu_ms"] = {}
    say("")
    say(
        f"app CPU per op in-process (WSGI handler, one thread, no socket), ms, median [min–max]; ratio to {trees[0].name}"
    )
    for tree in trees:
        entry = {}
        for kind in ("fresh", "replay", "floor"):
            values = spread([c[kind] for c in wsgi[tree.name]])
            ratio = spread([a[kind] / b[kind] for a, b in zip(wsgi[tree.name], wsgi[trees[0].name], strict=True)])
            entry[kind] = {"cpu_ms": values, "ratio_to_first": ratio}
            say(f"  {tree.name:<12}{kind:<8}{fmt(values, 3):>24}{fmt(ratio, 2):>22}")
        report["wsgi_cpu_ms"][tree.name] = entry
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "http_ops": args.http_ops,
        "inproc_ops": args.inproc_ops,
        "trees": {t.name: str(t.path) for t in trees},
        "summary": report,
        "http": http,
        "inproc": inproc,
        "wsgi": wsgi,
    }
    Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    say(f"\nwrote {args.json} in {time.monotonic() - started:.0f} s")
    return 0


def summarise(
    variants: list[Variant],
    trees: list[Tree],
    http: dict[str, dict[str, list[dict[str, Any]]]],
    inproc: dict[str, dict[str, list[dict[str, Any]]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Medians and ranges per variant; per-round ratios against the first variant."""
    report: dict[str, Any] = {"http": {}, "inproc": {}}
    base = variants[0].label
    say("")
    say(f"ops/s, median [min–max] over {args.rounds} rounds; server CPU ms/op (median); ratio to {base} per round")
    say(f"{'variant':<44}{'scenario':<10}{'ops/s':>20}{'srv CPU':>9}{'pg CPU':>8}{'ratio':>24}")
    for v in variants:
        entry: dict[str, Any] = {}
        for scenario in HTTP_SCENARIOS:
            runs = http[v.label][scenario]
            rate = spread([s["ops_per_s"] for s in runs])
            srv = spread([s.get("cpu_ms_per_op", {}).get("app", 0.0) for s in runs])
            pgc = spread([s.get("cpu_ms_per_op", {}).get("pg", 0.0) for s in runs])
            ratio = spread([a["ops_per_s"] / b["ops_per_s"] for a, b in zip(runs, http[base][scenario], strict=True)])
            errors = sum(s["errors"] for s in runs)
            entry[scenario] = {
                "ops_per_s": rate,
                "server_cpu_ms": srv,
                "pg_cpu_ms": pgc,
                "ratio_to_first": ratio,
                "errors": errors,
            }
            say(
                f"{v.label:<44}{scenario:<10}{fmt(rate):>20}{srv['median']:>9.2f}{pgc['median']:>8.2f}"
                f"{fmt(ratio, 2):>24}" + (f"  {errors} ERRORS: not comparable" if errors else "")
            )
        cf = spread(
            [
                c["ops_per_s"] / f["ops_per_s"]
                for c, f in zip(http[v.label]["c fresh"], http[v.label]["f floor"], strict=True)
            ]
        )
        entry["(c)/(f) fresh"] = cf
        say(f"{v.label:<44}{'(c)/(f)':<10}{fmt(cf, 2):>20}   fresh claim→complete pairs / floor pairs, per round")
        report["http"][v.label] = entry
    if not args.no_inproc:
        first = trees[0].name
        for tree in trees:
            entry = {}
            for kind in ("fresh", "replay"):
                runs = inproc[tree.name][kind]
                rate = spread([s["ops_per_s"] for s in runs])
                ratio = spread(
                    [a["ops_per_s"] / b["ops_per_s"] for a, b in zip(runs, inproc[first][kind], strict=True)]
                )
                entry[kind] = {"ops_per_s": rate, "ratio_to_first": ratio}
                say(f"{tree.name + ' (b) guard':<44}{kind:<10}{fmt(rate):>20}{'':>17}{fmt(ratio, 2):>24}")
            report["inproc"][tree.name] = entry
    return report


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
