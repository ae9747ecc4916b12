"""Fair admission between tenants (ADR 0021): a small tenant's queue wait beside a big tenant's
backlog, against the same tenant on an idle system, measured in the same run
(``python -m bench.fair``).

Two tenants, each with its own key-enforced provider on the same loopback mock (its own
process), and ``--workers`` real worker processes (``manage.py worker``):

- **idle**: tenant B alone submits ``--small`` jobs at ``--rate`` per second (Poisson arrivals,
  seeded);
- **loaded**: tenant A first queues ``--big`` jobs (50× B's by default), then B submits the
  same jobs on the same schedule while the workers drain A's backlog. A's backlog must outlast
  B's last take, or the run says so and counts it as an error.

Queue wait = due → taken: the operation's ``created_at`` (a new job is due at once) to its
first attempt's ``started_at``, both on the database's clock. An idle system's wait is set by
the worker's idle poll: a worker with nothing due backs off from 5 ms to ``--poll`` (the
default 0.05 s here as in bench.execute), so a job arriving into quiet waits for the next
poll; a busy worker takes again as soon as a thread frees. A finishing thread wakes its worker's
loop at once (ledger.execution.worker). The deployment caps each tenant at three quarters of
the threads (``--tenant-cap``), so A's backlog never holds every thread: B's job waits for the
next take, not for a send of A's to end. Both phases run the same workers, with the same poll
and caps, fresh, warmed up the same way, so the ratio compares like with like.
Target: B's loaded p95 within 2× of its idle p95. Runs on a dedicated database
``onceguard_bench_fair``; loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import common, dbsetup
from bench.execute import child_env, pct, setup_django, stop, wait_for

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
BENCH_DB = common.suite_db("onceguard_bench_fair")
TARGET_RATIO = 2.0


def reset_tables() -> None:
    from django.db import connection

    assert connection.settings_dict["NAME"] == BENCH_DB
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_attempt, ledger_operationevent RESTART IDENTITY CASCADE"
        )
        cursor.execute("ANALYZE")


def seed(mock_url: str) -> dict[str, Any]:
    from ledger.models import IdempotencyClass, Tenant
    from ledger.protocol import services

    tenants = {}
    for slug in ("bench-fair-a", "bench-fair-b"):
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug)
        provider = services.provider_upsert(
            tenant=tenant,
            slug="mock",
            base_url=mock_url,
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
            ref_pointer="/id",
            status_pointer="/status",
            success_values=["succeeded"],
            timeout_seconds=5.0,
        )
        services.provider_resume(provider_id=provider.pk, actor="bench")
        tenants[slug[-1]] = tenant
    return tenants


def tenant_cap(args: argparse.Namespace) -> int:
    """The deployment's per-tenant in-flight cap for the run: three quarters of the threads, so
    a tenant's backlog never holds every thread and another tenant's job finds one free."""
    return args.tenant_cap or max(1, args.workers * args.concurrency * 3 // 4)


def start_workers(url: str, args: argparse.Namespace) -> list[Any]:
    import subprocess

    return [
        subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--concurrency", str(args.concurrency), "--poll", str(args.poll)],
            cwd=ROOT,
            env=child_env(url, EXECUTE_TENANT_MAX_IN_FLIGHT=str(tenant_cap(args))),
            stdout=subprocess.DEVNULL,
            stderr=open(VAR / "bench-fair-workers.log", "ab"),
            start_new_session=True,
        )
        for _ in range(args.workers)
    ]


def schedule(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrival offsets (seconds): the same for both phases, unsynchronised with any poll."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(n):
        out.append(at)
        at += rng.expovariate(rate)
    return out


def run_phase(url: str, mock_url: str, args: argparse.Namespace, *, loaded: bool, run: str) -> dict[str, Any]:
    from django.db import connection

    from ledger.execution.submission import operation_submit
    from ledger.models import Operation

    reset_tables()
    tenants = seed(mock_url)
    body = {"method": "POST", "path": "/charges", "body": {"amount": 1}}

    # When each of B's submissions returned (its commit: the row visible to a take), wall clock.
    committed: dict[str, float] = {}
    submit_ms: list[float] = []

    def submit(tenant: str, tag: str, i: int) -> None:
        key = f"{run}-{tag}-{i:06d}"
        began = time.time()
        operation_submit(tenant=tenants[tenant], key=key, provider="mock", request=body)
        if tag == "b":
            committed[key] = time.time()
            submit_ms.append((committed[key] - began) * 1000)

    def count(tag: str, *statuses: str) -> int:
        return Operation.objects.filter(key__startswith=f"{run}-{tag}-", status__in=statuses).count()

    if loaded:
        # A's backlog, committed before the workers start: every B job arrives behind all of it.
        for i in range(args.big):
            submit("a", "a", i)
    workers = start_workers(url, args)
    errors: list[str] = []
    a_left_after_b = None
    try:
        # Warm-up, the same in both phases: the workers have taken and finished work.
        for i in range(args.warmup):
            submit("b", "w", i)
        if not wait_for(lambda: count("w", "succeeded"), args.warmup, 120):
            raise SystemExit("bench.fair warm-up did not finish; see var/bench-fair-workers.log")
        start = time.monotonic()
        for i, offset in enumerate(schedule(args.small, args.rate, args.seed)):
            pause = start + offset - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            submit("b", "b", i)
        if not wait_for(lambda: count("b", "succeeded", "failed"), args.small, 120):
            errors.append(f"{args.small - count('b', 'succeeded')} of B's jobs not finished after 120 s")
        if loaded:
            # Still queued or waiting to retry when B's last job was done: the load outlasted B.
            a_left_after_b = count("a", "queued", "retry_wait")
            if a_left_after_b == 0 and not common.SMOKE:
                errors.append("A's backlog drained before B's last job: raise --big or --rate")
    finally:
        stop(workers)
    failed = count("b", "failed")
    if failed:
        errors.append(f"{failed} of B's jobs failed")

    def waits(tag: str) -> list[tuple[str, float, float]]:
        """(key, due → taken ms, taken epoch seconds) of each first attempt."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT o.key, EXTRACT(EPOCH FROM (a.started_at - o.created_at)) * 1000,"
                " EXTRACT(EPOCH FROM a.started_at) FROM ledger_operation o"
                " JOIN ledger_attempt a ON a.operation_id = o.id AND a.number = 1 WHERE o.key LIKE %s",
                [f"{run}-{tag}-%"],
            )
            return [(k, float(w), float(t)) for k, w, t in cursor.fetchall()]

    b_rows = waits("b")
    b = [w for _, w, _ in b_rows]
    # From the submission's commit (wall clock, same host) to the take's start: the wait without
    # the submission's own transaction, which a loaded machine stretches too. Never below 0: a
    # take that began before the commit and saw the row took it as soon as it could.
    visible = [max(0.0, (t - committed[k]) * 1000) for k, _, t in b_rows if k in committed]
    a = [w for _, w, _ in waits("a")] if loaded else []
    return {
        "phase": "loaded" if loaded else "idle",
        "b_jobs": len(b),
        "b_wait_p50_ms": pct(b, 50),
        "b_wait_p95_ms": pct(b, 95),
        "b_wait_max_ms": max(b) if b else float("nan"),
        "b_committed_to_taken_p95_ms": pct(visible, 95),
        "b_submit_p95_ms": pct(submit_ms, 95),
        "a_jobs": args.big if loaded else 0,
        "a_taken": len(a),
        "a_wait_p95_ms": pct(a, 95) if a else None,
        "a_left_after_b": a_left_after_b,
        "errors": errors,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fair", description=__doc__.split("\n")[0])
    p.add_argument("--big", type=int, default=int(os.environ.get("BENCH_FAIR_BIG", 5000)), help="tenant A's jobs")
    p.add_argument("--small", type=int, default=int(os.environ.get("BENCH_FAIR_SMALL", 100)), help="tenant B's jobs")
    p.add_argument("--rate", type=float, default=float(os.environ.get("BENCH_FAIR_RATE", 20)), help="B's jobs per s")
    p.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_FAIR_WARMUP", 10)))
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--concurrency", type=int, default=8, help="threads per worker process")
    p.add_argument("--poll", type=float, default=0.05, help="the workers' longest idle wait, seconds")
    p.add_argument(
        "--tenant-cap", type=int, default=0, help="EXECUTE_TENANT_MAX_IN_FLIGHT (0: three quarters of the threads)"
    )
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--json", default=str(VAR / "bench-fair.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    url = common.bench_database_url(common.server_url(), db=BENCH_DB, suite="bench.fair")
    VAR.mkdir(exist_ok=True)
    dbsetup.database_ready(url)
    setup_django(url)
    from relay.testing import start_mock_provider

    mock = start_mock_provider("enforced", process=True)
    print(
        f"bench.fair: {BENCH_DB}, mock provider {mock.url} (own process), {args.workers} workers x"
        f" {args.concurrency} threads, poll {args.poll} s, {tenant_cap(args)} in flight per tenant;"
        f" A {args.big} jobs, B {args.small} at {args.rate}/s",
        flush=True,
    )
    results = []
    try:
        for loaded in (False, True):
            mock.reset()
            res = run_phase(url, mock.url, args, loaded=loaded, run=f"f{int(loaded)}-{int(time.time())}")
            results.append(res)
            a_part = (
                f"  A: {res['a_taken']} of {res['a_jobs']} taken by then, {res['a_left_after_b']} still queued"
                if loaded
                else ""
            )
            print(
                f"  {res['phase']:<7} B queue wait (due → taken) p50 {res['b_wait_p50_ms']:7.1f} ms"
                f"  p95 {res['b_wait_p95_ms']:7.1f} ms  max {res['b_wait_max_ms']:7.1f} ms"
                f" (commit → taken p95 {res['b_committed_to_taken_p95_ms']:.1f} ms; B's submit p95"
                f" {res['b_submit_p95_ms']:.1f} ms){a_part}",
                flush=True,
            )
            for error in res["errors"]:
                print(f"  ERROR {res['phase']}: {error}", flush=True)
    finally:
        mock.stop()
    idle, loaded_res = results
    ratio = loaded_res["b_wait_p95_ms"] / max(idle["b_wait_p95_ms"], 1e-9)
    visible_ratio = loaded_res["b_committed_to_taken_p95_ms"] / max(idle["b_committed_to_taken_p95_ms"], 1e-9)
    print(f"  commit → taken p95 ratio {visible_ratio:.2f}x (load average {os.getloadavg()[0]:.1f})", flush=True)
    met = ratio <= TARGET_RATIO
    verdict = "not judged (smoke)" if common.SMOKE else ("met" if met else "MISSED")
    print(
        f"B's queue wait p95 beside A's {args.big}-job backlog: {loaded_res['b_wait_p95_ms']:.1f} ms vs idle"
        f" {idle['b_wait_p95_ms']:.1f} ms = {ratio:.2f}x (target <= {TARGET_RATIO:g}x: {verdict})",
        flush=True,
    )
    Path(args.json).write_text(
        json.dumps(
            {
                "at": datetime.now().isoformat(timespec="seconds"),
                "cpus": os.cpu_count(),
                "args": vars(args),
                "results": results,
                "ratio_p95": ratio,
                "ratio_committed_to_taken_p95": visible_ratio,
                "load_average": os.getloadavg()[0],
                "target_ratio": TARGET_RATIO,
                "target_met": met,
            },
            indent=2,
        )
    )
    print(f"written {args.json}", flush=True)
    # Errors fail the run (make bench stops); a missed target is reported, not an error.
    return 1 if any(res["errors"] for res in results) else 0


if __name__ == "__main__":
    sys.exit(main())
