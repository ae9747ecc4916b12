"""Execute-mode throughput and queue latency, beside a bare django-q2 ORM-broker queue
doing the same HTTP call, measured in the same run (``python -m bench.execute``).

Both sides call the same loopback key-enforced mock provider (its own process) with one
POST per item:

- **execute**: ``operation_submit`` (the row written ``queued``), ``N`` worker processes
  (``manage.py worker``) taking due rows with SKIP LOCKED, calling the provider through the
  adapter and recording the outcome (take + complete: two commits, attempt and event rows).
- **django-q2**: ``async_task`` on the ORM broker, a ``qcluster`` whose task does the same
  POST; django-q2 stores each success (its default behaviour).

Per side and round: a **burst** of ``--ops`` items committed while nothing consumes them
(also the crash-between-commit-and-execution case), then the consumers start: throughput =
items / (last finished − first picked up). Then a warm-up and a **paced** run at ``--rate``
items/s for queue latency (submitted → picked up by a worker) p50/p99 and end to end.
Timings come from the database rows (created/claimed/done, django-q's started/stopped).
Runs on a dedicated database ``onceguard_bench_execute``; loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
BENCH_DB = common.suite_db("onceguard_bench_execute")
TENANT = "bench-exec"
PROVIDER = "bench-mock"

_client: Any = None


def baseline_task(url: str, key: str) -> float:
    """The django-q2 task: the same POST the execute-mode worker makes. Returns when it was
    picked up (django-q2's own ``started`` is the enqueue time), stored as its result."""
    global _client
    import httpx

    picked = time.time()
    if _client is None:
        _client = httpx.Client(trust_env=False, timeout=5.0)
    response = _client.post(f"{url}/charges", json={"amount": 1}, headers={"Idempotency-Key": key})
    if response.status_code >= 300:
        raise RuntimeError(f"provider answered {response.status_code}")
    return picked


# --- set-up ----------------------------------------------------------------------------------


def bench_url(base_url: str) -> str:
    return common.bench_database_url(base_url, db=BENCH_DB, suite="bench.execute")


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1")  # every bench address is loopback
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["LOG_LEVEL"] = "WARNING"
    import django

    django.setup()


def reset_tables() -> None:
    from django.db import connection

    assert connection.settings_dict["NAME"] == BENCH_DB
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_attempt, ledger_operationevent, django_q_ormq, django_q_task"
            " RESTART IDENTITY CASCADE"
        )
        cursor.execute("ANALYZE")


def seed(mock_url: str) -> Any:
    from ledger.models import IdempotencyClass, Tenant
    from ledger.protocol import services

    tenant = Tenant.objects.filter(slug=TENANT).first() or services.tenant_create(slug=TENANT)
    provider = services.provider_upsert(
        tenant=tenant,
        slug=PROVIDER,
        base_url=mock_url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=5.0,
    )
    # A pause left by an earlier run is an operator's to lift, not configuration.
    services.provider_resume(provider_id=provider.pk, actor="bench")
    return tenant


def child_env(url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1", **extra}


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for p in processes:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def wait_for(count: Any, target: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count() >= target:
            return True
        time.sleep(0.02)
    return count() >= target


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(round(q / 100.0 * len(ordered) + 0.5))))
    return ordered[rank - 1]


def paced(submit: Any, n: int, rate: float) -> None:
    """Submit n items at ``rate``/s (open loop: a late item doesn't delay the schedule)."""
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        submit(i)


# --- execute mode ------------------------------------------------------------------------------


def run_execute(url: str, mock_url: str, args: argparse.Namespace, run: str) -> dict[str, Any]:
    from django.db import connection

    from ledger.execution.submission import operation_submit
    from ledger.models import Operation

    reset_tables()
    tenant = seed(mock_url)
    body = {"method": "POST", "path": "/charges", "body": {"amount": 1}}

    def submit(tag: str, i: int) -> None:
        operation_submit(tenant=tenant, key=f"{run}-{tag}-{i:06d}", provider=PROVIDER, request=body)

    def succeeded(tag: str) -> int:
        return Operation.objects.filter(key__startswith=f"{run}-{tag}-", status="succeeded").count()

    # The burst is a backlog committed while no worker runs (the crash-between-commit-and-
    # execution case, too); throughput is how fast the workers drain it.
    started = time.monotonic()
    for i in range(args.ops):
        submit("b", i)
    submit_rate = args.ops / (time.monotonic() - started)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "worker",
                "--concurrency",
                str(args.concurrency),
                "--poll",
                str(args.poll),
            ],
            cwd=ROOT,
            env=child_env(url),
            stdout=subprocess.DEVNULL,
            stderr=open(VAR / "bench-execute-workers.log", "ab"),
            start_new_session=True,
        )
        for _ in range(args.workers)
    ]
    try:
        if not wait_for(lambda: succeeded("b"), args.ops, 300):
            raise SystemExit("execute burst did not finish; see var/bench-execute-workers.log")
        for i in range(args.warmup):
            submit("w", i)
        if not wait_for(lambda: succeeded("w"), args.warmup, 60):
            raise SystemExit("execute warm-up did not finish")
        paced(lambda i: submit("p", i), args.paced_ops, args.rate)
        if not wait_for(lambda: succeeded("p"), args.paced_ops, 120):
            raise SystemExit("execute paced run did not finish")
    finally:
        stop(workers)

    def timings(tag: str) -> tuple[list[float], list[float], float]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM o.created_at), EXTRACT(EPOCH FROM a.started_at),"
                " EXTRACT(EPOCH FROM o.done_at) FROM ledger_operation o"
                " JOIN ledger_attempt a ON a.operation_id = o.id AND a.number = 1 WHERE o.key LIKE %s",
                [f"{run}-{tag}-%"],
            )
            rows = [(float(c), float(s), float(d)) for c, s, d in cursor.fetchall()]
        queue = [(s - c) * 1000 for c, s, _ in rows]
        total = [(d - c) * 1000 for c, _, d in rows]
        # From the first pickup to the last finish: the workers' drain rate.
        span = max(d for _, _, d in rows) - min(s for _, s, _ in rows)
        return queue, total, span

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT operation_id) FROM ledger_attempt")
        attempts, ops_with_attempts = cursor.fetchone()
    b_queue, b_total, b_span = timings("b")
    p_queue, p_total, _ = timings("p")
    return {
        "side": "execute",
        "config": f"{args.workers} worker procs x {args.concurrency} threads",
        "ops": args.ops,
        "submit_per_s": submit_rate,
        "throughput_per_s": args.ops / b_span,
        "burst_queue_p50_ms": pct(b_queue, 50),
        "burst_queue_p99_ms": pct(b_queue, 99),
        "paced_rate": args.rate,
        "queue_p50_ms": pct(p_queue, 50),
        "queue_p99_ms": pct(p_queue, 99),
        "end_to_end_p50_ms": pct(p_total, 50),
        "end_to_end_p99_ms": pct(p_total, 99),
        "attempts_per_op": attempts / max(1, ops_with_attempts),
    }


# --- bare django-q2 ------------------------------------------------------------------------------


def run_django_q(url: str, mock_url: str, args: argparse.Namespace, run: str, q_workers: int) -> dict[str, Any]:
    from django.db import connection
    from django_q.models import Success
    from django_q.tasks import async_task

    reset_tables()
    enqueued: dict[str, float] = {}

    def submit(tag: str, i: int) -> None:
        name = f"{run}-{tag}-{i:06d}"
        enqueued[name] = time.time()
        async_task("bench.execute.baseline_task", mock_url, name, task_name=name, group=f"{run}-{tag}")

    def done(tag: str) -> int:
        return Success.objects.filter(group=f"{run}-{tag}").count()

    started = time.monotonic()
    for i in range(args.ops):
        submit("b", i)
    submit_rate = args.ops / (time.monotonic() - started)
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=child_env(
            url,
            DJANGO_SETTINGS_MODULE="bench.execute_settings",
            BENCH_Q_WORKERS=str(q_workers),
            BENCH_Q_POLL=str(args.poll),
        ),
        stdout=subprocess.DEVNULL,
        stderr=open(VAR / "bench-execute-qcluster.log", "ab"),
        start_new_session=True,
    )
    try:
        if not wait_for(lambda: done("b"), args.ops, 300):
            raise SystemExit("django-q burst did not finish; see var/bench-execute-qcluster.log")
        for i in range(args.warmup):
            submit("w", i)
        if not wait_for(lambda: done("w"), args.warmup, 120):
            raise SystemExit("django-q warm-up did not finish")
        paced(lambda i: submit("p", i), args.paced_ops, args.rate)
        if not wait_for(lambda: done("p"), args.paced_ops, 120):
            raise SystemExit("django-q paced run did not finish")
    finally:
        stop([cluster])

    def timings(tag: str) -> tuple[list[float], list[float], float]:
        rows = [
            (name, float(picked), stopped.timestamp())
            for name, picked, stopped in Success.objects.filter(group=f"{run}-{tag}").values_list(
                "name", "result", "stopped"
            )
        ]
        queue = [(p - enqueued[n]) * 1000 for n, p, _ in rows]
        total = [(e - enqueued[n]) * 1000 for n, _, e in rows]
        span = max(e for _, _, e in rows) - min(p for _, p, _ in rows)
        return queue, total, span

    b_queue, b_total, b_span = timings("b")
    p_queue, p_total, _ = timings("p")
    connection.close()
    return {
        "side": "django-q2",
        "config": f"qcluster ORM broker, {q_workers} workers",
        "ops": args.ops,
        "submit_per_s": submit_rate,
        "throughput_per_s": args.ops / b_span,
        "burst_queue_p50_ms": pct(b_queue, 50),
        "burst_queue_p99_ms": pct(b_queue, 99),
        "paced_rate": args.rate,
        "queue_p50_ms": pct(p_queue, 50),
        "queue_p99_ms": pct(p_queue, 99),
        "end_to_end_p50_ms": pct(p_total, 50),
        "end_to_end_p99_ms": pct(p_total, 99),
    }


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.execute", description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, default=int(os.environ.get("BENCH_EXEC_OPS", 2000)), help="burst size")
    p.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_EXEC_WARMUP", 100)))
    p.add_argument("--paced-ops", type=int, default=int(os.environ.get("BENCH_EXEC_PACED_OPS", 300)))
    p.add_argument("--rate", type=float, default=100.0, help="paced submissions per second")
    p.add_argument("--workers", type=int, default=2, help="execute-mode worker processes")
    p.add_argument("--concurrency", type=int, default=8, help="threads per worker process")
    p.add_argument(
        "--q-workers",
        default=os.environ.get("BENCH_EXEC_Q_WORKERS", "2,4,8"),
        help="django-q2 cluster sizes to measure (best is reported)",
    )
    p.add_argument("--poll", type=float, default=0.05, help="idle poll interval of both queues, seconds")
    p.add_argument(
        "--rounds",
        type=int,
        default=int(os.environ.get("BENCH_EXEC_ROUNDS", 2)),
        help="alternate the two sides this many times",
    )
    p.add_argument("--json", default=str(VAR / "bench-execute.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    url = bench_url(common.server_url())
    VAR.mkdir(exist_ok=True)
    dbsetup.database_ready(url)
    setup_django(url)
    from relay.testing import start_mock_provider

    mock = start_mock_provider("enforced", process=True)
    print(f"bench.execute: {BENCH_DB}, mock provider {mock.url} (own process), {os.cpu_count()} CPUs", flush=True)
    results: list[dict[str, Any]] = []
    q_sizes = [int(x) for x in args.q_workers.split(",") if x]
    try:
        for r in range(args.rounds):
            for q in q_sizes:
                mock.reset()
                res = run_django_q(url, mock.url, args, f"q{r}{q}-{int(time.time())}", q)
                res["round"] = r
                results.append(res)
                print(_line(res), flush=True)
            mock.reset()
            res = run_execute(url, mock.url, args, f"x{r}-{int(time.time())}")
            res["round"] = r
            results.append(res)
            print(_line(res), flush=True)
            effects = mock.effects()
            assert effects["count"] == args.warmup + args.ops + args.paced_ops, effects
    finally:
        mock.stop()
    summary = _summary(results)
    print(_table(summary), flush=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "at": datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "args": vars(args),
                "results": results,
                "summary": summary,
            },
            indent=2,
        )
    )
    print(f"written {args.json}", flush=True)


def _line(res: dict[str, Any]) -> str:
    return (
        f"  round {res['round']} {res['side']:<10} {res['config']:<34} {res['throughput_per_s']:7.0f}/s"
        f"  paced@{res['paced_rate']:.0f}/s queue p50 {res['queue_p50_ms']:6.1f} ms p99 {res['queue_p99_ms']:7.1f} ms"
    )


def _summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: the median over rounds of each figure."""
    by: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        by.setdefault(f"{res['side']} | {res['config']}", []).append(res)
    out = []
    for name, group in by.items():
        row: dict[str, Any] = {"name": name, "rounds": len(group)}
        for field in (
            "submit_per_s",
            "throughput_per_s",
            "burst_queue_p50_ms",
            "burst_queue_p99_ms",
            "queue_p50_ms",
            "queue_p99_ms",
            "end_to_end_p50_ms",
            "end_to_end_p99_ms",
        ):
            row[field] = statistics.median(g[field] for g in group)
        out.append(row)
    best_q = max(
        (r for r in out if r["name"].startswith("django-q2")), key=lambda r: r["throughput_per_s"], default=None
    )
    for row in out:
        if best_q and row["name"].startswith("execute"):
            row["vs_best_django_q"] = row["throughput_per_s"] / best_q["throughput_per_s"]
    return out


def _table(summary: list[dict[str, Any]]) -> str:
    head = (
        f"{'side | config':<58}{'submit/s':>9}{'ops/s':>8}{'queue p50':>11}{'queue p99':>11}{'e2e p50':>10}{'e2e p99':>10}"
        f"{'vs best q':>11}"
    )
    lines = [
        "",
        "medians over rounds: ops/s = drain rate of the burst backlog; queue/e2e latency (ms) at the paced rate",
        head,
        "-" * len(head),
    ]
    for r in summary:
        ratio = f"{r['vs_best_django_q']:.2f}x" if "vs_best_django_q" in r else ""
        lines.append(
            f"{r['name']:<58}{r['submit_per_s']:>9.0f}{r['throughput_per_s']:>8.0f}{r['queue_p50_ms']:>11.1f}{r['queue_p99_ms']:>11.1f}"
            f"{r['end_to_end_p50_ms']:>10.1f}{r['end_to_end_p99_ms']:>10.1f}{ratio:>11}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
