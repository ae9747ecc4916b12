"""The in-process guard beside AWS Lambda Powertools' idempotency on Redis, the tool a Python
team reaches for first: same caller, same request, same keys, interleaved rounds.

    .venv/bin/python -m bench.powertools [--ops 2000] [--rounds 5]

(b) is ``ledger.protocol.guard.run_once`` on PostgreSQL (its own database
``onceguard_bench_powertools``), durable: the claim and the result are rows, a replay reads one.
(p) is Powertools' ``idempotent_function`` with its ``CachePersistenceLayer`` on a private
``redis-server`` on loopback (no persistence: its numbers are a cache's). (r) is the floor of any
durable replay: bare psycopg reading the same finished row by its unique key, one prepared
statement over one connection. All three run in this one process, one operation at a time, over
TCP on 127.0.0.1; each round runs every (scenario, kind) once, starting with another one each
round (a drifting load on a shared machine touches all alike). Before each timed phase the
ledger's tables are analyzed as in the main suite (``bench.common.analyze``: the statistics
autovacuum would keep; the development cluster runs without it).

Reported per (scenario, kind): the median and range of the rounds' ops/s, and CPU ms per
operation per process — this one (the client and, for the guard, the service), the PostgreSQL
backend, redis-server — then the guard's ratio to Powertools per round, beside the target that
the guard's replay is at least as fast (ratio ≥ 1). Bench-only dependency:
aws-lambda-powertools (requirements-dev.txt). Exits 1 when any scenario had an error.
Writes var/bench-powertools.json (``BENCH_POWERTOOLS_JSON``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common, dbsetup, inproc

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = common.suite_db("onceguard_bench_powertools")
TENANT_SLUG = "bench-powertools"
KINDS = ("fresh", "replay")
SCENARIOS = ("(b) guard", "(p) Powertools on Redis", "(r) bare psycopg read")
# The guard's replay against Powertools' replay (issue target: at least as fast).
REPLAY_TARGET = 1.0


class Redis:
    """A private redis-server on a loopback port, no persistence, stopped at the end."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("bench.powertools needs redis-server (apt-get install redis-server)")
        self.folder = tempfile.mkdtemp(prefix="bench-redis-")
        for _ in range(20):
            # A port from bind(0) can be taken again before redis binds it: try another.
            from bench.httpapi import free_port

            self.port = free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                cwd=self.folder,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._answers():
                return
            self.stop()
        raise SystemExit("redis-server did not start on a loopback port")

    def _answers(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _powertools(redis_port: int) -> Callable[[str], dict[str, Any]]:
    """Powertools' idempotent function for one charge, keyed on the whole request (its
    default: the payload's hash), results kept an hour."""
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    layer = CachePersistenceLayer(client=redis.Redis(host="127.0.0.1", port=redis_port))
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "ref": order["key"]}

    def call(key: str) -> dict[str, Any]:
        return charge(order={"key": key, **inproc._request(key)})

    return call


def _bare_read(dsn: str, tenant_id: int) -> tuple[Callable[[str], Any], int]:
    """One prepared statement reading a finished row by (tenant, key): the durable floor."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)

    def read(key: str) -> Any:
        row = conn.execute(
            "SELECT status, response_body FROM ledger_operation WHERE tenant_id = %s AND key = %s", [tenant_id, key]
        ).fetchone()
        if row is None:
            raise RuntimeError(f"no row for {key}")
        return row

    return read, conn.info.backend_pid


def _timed(op: Callable[[str], Any], keys: list[str], pids: dict[str, int]) -> dict[str, Any]:
    errors, first_error = 0, ""
    cpu0 = {name: common.proc_cpu_seconds(pid) for name, pid in pids.items()}
    own0, wall0 = time.process_time(), time.perf_counter()
    for key in keys:
        try:
            op(key)
        except Exception as exc:  # counted, never hidden: any error fails the run
            errors += 1
            first_error = first_error or f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.perf_counter() - wall0
    cpu = {"client": time.process_time() - own0}
    cpu.update({name: common.proc_cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()})
    n = max(len(keys), 1)
    return {
        "ops_per_s": len(keys) / wall if wall > 0 else 0.0,
        "cpu_ms_per_op": {k: round(v * 1000 / n, 4) for k, v in cpu.items()},
        "errors": errors,
        "first_error": first_error,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.powertools")
    parser.add_argument("--ops", type=int, default=int(os.environ.get("BENCH_POWERTOOLS_OPS", "2000")))
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_POWERTOOLS_ROUNDS", "5")))
    parser.add_argument(
        "--json", default=os.environ.get("BENCH_POWERTOOLS_JSON", str(ROOT / "var" / "bench-powertools.json"))
    )
    args = parser.parse_args(argv)
    if common.SMOKE:
        args.ops, args.rounds = min(args.ops, 20), min(args.rounds, 1)
    bench_url = common.bench_database_url(common.server_url(), db=BENCH_DB, suite="bench.powertools")
    dbsetup.database_ready(bench_url)
    dbsetup.setup_django(bench_url)
    # Powertools warns outside Lambda (no remaining-time context) and about its own renames.
    warnings.filterwarnings("ignore", module="aws_lambda_powertools")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*register_lambda_context.*")

    from django.db import connection

    from ledger.models import Tenant
    from ledger.protocol import services

    assert connection.settings_dict["NAME"] == BENCH_DB
    tenant = Tenant.objects.filter(slug=TENANT_SLUG).first() or services.tenant_create(slug=TENANT_SLUG)
    services.provider_upsert(
        tenant=tenant, slug=common.PROVIDER_SLUG, base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    connection.ensure_connection()
    guard_pid = connection.connection.info.backend_pid
    redis = Redis()
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(s, k): [] for s in SCENARIOS for k in KINDS}
    run = f"{int(time.time())}-{os.getpid()}"
    try:
        charge = _powertools(redis.port)
        dsn = common.libpq_dsn(bench_url)
        read, read_pid = _bare_read(dsn, tenant.pk)
        guard = {kind: inproc.guard_factory(tenant, kind)(0) for kind in KINDS}
        pids = {
            "(b) guard": {"postgres": guard_pid},
            "(p) Powertools on Redis": {"redis": redis.proc.pid},
            "(r) bare psycopg read": {"postgres": read_pid},
        }
        ops: dict[tuple[str, str], Callable[[str], Any]] = {
            ("(b) guard", "fresh"): guard["fresh"],
            ("(b) guard", "replay"): guard["replay"],
            ("(p) Powertools on Redis", "fresh"): charge,
            ("(p) Powertools on Redis", "replay"): charge,
            ("(r) bare psycopg read", "replay"): read,
        }
        order = list(ops)
        for r in range(args.rounds):
            # Fresh keys per round: the guard's and Powertools' own, replayed in the same round;
            # the bare read reads the guard's finished rows (a replay's row).
            keys = {
                s: [f"pt-{run}-{r}-{s[1]}-{i}" for i in range(args.ops)]
                for s in ("(b) guard", "(p) Powertools on Redis")
            }
            keys["(r) bare psycopg read"] = keys["(b) guard"]
            shift = r % len(order)
            # A replay needs its fresh run first: rotate the start within that constraint.
            rotated = order[shift:] + order[:shift]
            done: set[str] = set()
            pending = list(rotated)
            while pending:
                for item in list(pending):
                    scenario, kind = item
                    source = "(b) guard" if scenario == "(r) bare psycopg read" else scenario
                    if kind == "replay" and source not in done:
                        continue
                    # Statistics as autovacuum keeps them before every timed phase, as the main
                    # suite takes them (bench.common.analyze; ADR 0010): the development cluster
                    # runs with autovacuum off, and on never-analyzed tables the look-up by key,
                    # prepared while the table was small, keeps a generic plan on the
                    # (tenant_id, id) index — each replay then walks all the tenant's rows, a
                    # state no autovacuumed database stays in. Untimed.
                    common.analyze(dsn)
                    results[item].append(_timed(ops[item], keys[scenario], pids[scenario]))
                    if kind == "fresh":
                        done.add(scenario)
                    pending.remove(item)
    finally:
        redis.stop()

    rows = []
    print(
        f"(b) the in-process guard on PostgreSQL, (p) Powertools' idempotency on Redis, (r) bare psycopg: "
        f"{args.ops} ops × {args.rounds} interleaved rounds, one at a time, loopback TCP"
    )
    print(f"{'scenario':<26}{'kind':<8}{'ops/s':>9}{'range':>17}   CPU ms per op by process")
    for (scenario, kind), rounds in results.items():
        if not rounds:
            continue
        rates = [x["ops_per_s"] for x in rounds]
        cpu = {
            k: round(statistics.median(x["cpu_ms_per_op"][k] for x in rounds), 4) for k in rounds[0]["cpu_ms_per_op"]
        }
        errors = sum(x["errors"] for x in rounds)
        first = next((x["first_error"] for x in rounds if x["first_error"]), "")
        rows.append(
            {
                "scenario": scenario,
                "kind": kind,
                "ops_per_s": round(statistics.median(rates), 1),
                "round_ops_per_s": [round(x, 1) for x in rates],
                "cpu_ms_per_op": cpu,
                "errors": errors,
                "first_error": first,
            }
        )
        spread = f"{min(rates):,.0f}–{max(rates):,.0f}"
        each = ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
        print(f"{scenario:<26}{kind:<8}{statistics.median(rates):>9,.0f}{spread:>17}   {each}")
    ratios = {}
    for kind in KINDS:
        g, p = results[("(b) guard", kind)], results[("(p) Powertools on Redis", kind)]
        per_round = [a["ops_per_s"] / b["ops_per_s"] for a, b in zip(g, p, strict=True) if b["ops_per_s"]]
        if per_round:
            ratios[kind] = {
                "median": round(statistics.median(per_round), 3),
                "rounds": [round(x, 3) for x in per_round],
            }
            mark = ""
            if kind == "replay":
                mark = f"  target ≥ {REPLAY_TARGET:.1f}  {'PASS' if statistics.median(per_round) >= REPLAY_TARGET else 'MISS'}"
            print(
                f"guard / Powertools, {kind:<6}: {statistics.median(per_round):.2f}× "
                f"(rounds {min(per_round):.2f}–{max(per_round):.2f}){mark}"
            )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "ops": args.ops,
                "rounds": args.rounds,
                "loadavg_at_end": os.getloadavg(),
                "results": rows,
                "guard_over_powertools": ratios,
                "replay_target": REPLAY_TARGET,
            },
            indent=2,
        )
    )
    print(f"wrote {args.json}")
    failed = [
        f"{r['scenario']} {r['kind']}: {r['errors']} errors ({r['first_error'][:100]})" for r in rows if r["errors"]
    ]
    for line in failed:
        print(f"ERROR {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
