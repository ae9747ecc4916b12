"""Shared pieces: settings, statistics, CPU probes and the bounded load harness."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# Appended to every suite's database name: the smoke tests (tests/test_bench_smoke.py) run
# the suites beside a developer's `make bench` without touching its databases.
DB_SUFFIX = os.environ.get("BENCH_DB_SUFFIX", "")
# A smoke run (tiny counts): errors fail it, targets do not — a few hundred rows make other
# plans and timings than a million, so only the code paths are under test.
SMOKE = os.environ.get("BENCH_SMOKE", "") == "1"


def suite_db(name: str) -> str:
    """The database a suite runs in: ``name`` plus ``BENCH_DB_SUFFIX``."""
    return name + DB_SUFFIX


BENCH_DB = os.environ.get("BENCH_DB", suite_db("onceguard_bench"))
TENANT_SLUG = "bench"
PROVIDER_SLUG = "bench-sink"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# An operation: called with one item, raises on any unexpected answer.
Op = Callable[[Any], None]
# Builds one lane's operation (and its connection) inside the process/thread that runs it.
LaneFactory = Callable[[int], Op]


def bench_database_url(base_url: str, *, db: str = BENCH_DB, suite: str = "make bench") -> str:
    """The DATABASE_URL of database ``db`` on the same server as ``base_url``: PostgreSQL,
    on loopback only (every suite's database is named by it)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"{suite} needs PostgreSQL; DATABASE_URL is {parts.scheme or 'unset'}")
    host = parts.hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1", ""):
        raise SystemExit(f"{suite} runs on loopback only; DATABASE_URL points at {host}")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def server_url() -> str:
    """The server every suite uses: DATABASE_URL, or the local test server."""
    return os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/test"


def libpq_dsn(url: str) -> str:
    """psycopg accepts postgresql:// URLs; normalise the postgres:// spelling."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))


# --- Statistics ------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(round(q / 100.0 * len(sorted_values) + 0.5))))
    return sorted_values[rank - 1]


@dataclass
class Stats:
    scenario: str
    kind: str  # "fresh" (claim→complete) or "replay"
    ops: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int = 0
    first_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "kind": self.kind,
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "ops_per_s": round(self.ops_per_s, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "errors": self.errors,
            "first_error": self.first_error,
            **self.extra,
        }


def summarize(scenario: str, kind: str, run: LaneRun, **extra: Any) -> Stats:
    lat = sorted(run.latencies)
    ops = len(lat)
    extra = dict(extra)
    if run.cpu:
        extra["cpu_ms_per_op"] = {k: round(v * 1000.0 / max(ops, 1), 3) for k, v in run.cpu.items()}
    return Stats(
        scenario=scenario,
        kind=kind,
        ops=ops,
        seconds=run.wall,
        ops_per_s=ops / run.wall if run.wall > 0 else 0.0,
        p50_ms=percentile(lat, 50) * 1000.0,
        p99_ms=percentile(lat, 99) * 1000.0,
        errors=run.errors,
        first_error=run.first_error,
        extra=extra,
    )


# --- CPU accounting ----------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, 0 when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def child_pids(pid: int) -> list[int]:
    pids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    return pids


# A probe returns cumulative CPU seconds per component ("pg", "app", ...).
Probe = Callable[[], dict[str, float]]


def pg_backend_probe(monitor_dsn: str, dbname: str = BENCH_DB) -> Probe:
    """CPU of every backend connected to the bench database (the monitor's own excluded)."""
    import psycopg

    conn = psycopg.connect(monitor_dsn, autocommit=True)

    def probe() -> dict[str, float]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [dbname]
        ).fetchall()
        return {"pg": sum(proc_cpu_seconds(r[0]) for r in rows)}

    probe.close = conn.close  # type: ignore[attr-defined]
    return probe


HOT_TABLES = (
    "bench_raw_op",
    "bench_raw_wide",
    "ledger_operation",
    "ledger_attempt",
    "ledger_operationevent",
    "ledger_apikey",
    "ledger_provider",
)


def analyze(dsn: str) -> None:
    """Fresh planner statistics before every timed phase: plans as in a steady state.

    Without it the tables are planned with the statistics of the just-emptied table (see
    the report: the replay lookup then walks the tenant_id index row by row). A table with
    fewer than 1,000 rows is left as autovacuum leaves it (its first ANALYZE waits for as many
    rows, migration ledger.0036): statistics of a nearly empty table plan look-ups by key as
    sequential scans (docs/adr/0010-claim-path-plans-from-statistics.md).
    """
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        have = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        tables = [
            t
            for t in HOT_TABLES
            if t in have and conn.execute(f"SELECT EXISTS (SELECT FROM {t} OFFSET 999)").fetchone()[0]
        ]
        if tables:
            conn.execute(f"ANALYZE {', '.join(tables)}")


def combine_probes(*probes: Probe | None) -> Probe:
    def probe() -> dict[str, float]:
        out: dict[str, float] = {}
        for p in probes:
            if p is not None:
                out.update(p())
        return out

    return probe


# --- The bounded load harness -----------------------------------------------------------


@dataclass
class LaneRun:
    latencies: list[float]
    wall: float
    errors: int
    first_error: str
    cpu: dict[str, float]


def merge_runs(runs: Sequence[LaneRun]) -> LaneRun:
    """Rounds of one scenario as one run: latencies pooled, walls and CPU added up."""
    cpu: dict[str, float] = {}
    for r in runs:
        for k, v in r.cpu.items():
            cpu[k] = cpu.get(k, 0.0) + v
    return LaneRun(
        latencies=[x for r in runs for x in r.latencies],
        wall=sum(r.wall for r in runs),
        errors=sum(r.errors for r in runs),
        first_error=next((r.first_error for r in runs if r.first_error), ""),
        cpu=cpu,
    )


def _split(items: Sequence[Any], lanes: int) -> list[list[Any]]:
    return [list(items[i::lanes]) for i in range(lanes)]


def _run_threads(
    ops: list[Op], batches: list[list[Any]], start: threading.Barrier | None = None
) -> tuple[list[float], float, float, int, str]:
    """Run each op over its batch in its own thread (inline when there is one lane)."""
    results: list[tuple[list[float], float, float, int, str]] = [([], 0.0, 0.0, 0, "")] * len(ops)

    def lane(i: int) -> None:
        op, batch = ops[i], batches[i]
        lat: list[float] = []
        errors, first = 0, ""
        if start is not None:
            start.wait()
        t0 = time.perf_counter()
        for item in batch:
            s = time.perf_counter()
            try:
                op(item)
            except Exception as exc:  # counted and reported, never hidden
                errors += 1
                first = first or f"{type(exc).__name__}: {exc}"[:300]
            lat.append(time.perf_counter() - s)
        results[i] = (lat, t0, time.perf_counter(), errors, first)

    if len(ops) == 1 and start is None:
        lane(0)
    else:
        threads = [threading.Thread(target=lane, args=(i,)) for i in range(len(ops))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lat = [x for r in results for x in r[0]]
    t0 = min(r[1] for r in results)
    t1 = max(r[2] for r in results)
    errors = sum(r[3] for r in results)
    first = next((r[4] for r in results if r[4]), "")
    return lat, t0, t1, errors, first


def _warm(op: Op, items: list[Any]) -> None:
    """Warm-up ops: failures here show again, counted, in the timed run."""
    for item in items:
        try:
            op(item)
        except Exception:
            pass


def _child(
    factory: LaneFactory,
    lane_ids: list[int],
    batches: list[list[Any]],
    warm: list[list[Any]],
    ready: Any,
    go: Any,
    out: Any,
    release: Any,
) -> None:
    try:
        ops = [factory(i) for i in lane_ids]
        for op, w in zip(ops, warm, strict=True):
            _warm(op, w)
        start = threading.Barrier(len(ops) + 1)
        box: list[Any] = []
        runner = threading.Thread(target=lambda: box.append(_run_threads(ops, batches, start)))
        runner.start()
        ready.wait()
        go.wait()
        cpu0 = time.process_time()
        start.wait()
        runner.join()
        cpu1 = time.process_time()
        out.put(("ok", *box[0], cpu1 - cpu0))
    except Exception:
        out.put(("crash", traceback.format_exc()))
        try:
            ready.abort()
        except Exception:
            pass
        return
    release.wait(60)


def run_lanes(
    factory: LaneFactory,
    items: Sequence[Any],
    *,
    procs: int = 0,
    threads: int = 1,
    warmup: Sequence[Any] = (),
    probe: Probe | None = None,
) -> LaneRun:
    """Run ``items`` through ``procs × threads`` lanes (procs=0: in this process).

    Every lane builds its connection and runs its share of ``warmup`` first; the clock
    starts once all lanes are ready and stops when the last lane is done. ``probe`` is
    read right before the start and right after the end (connections still open), so
    its CPU deltas cover exactly the timed region.
    """
    lanes = max(1, procs) * threads
    batches = _split(items, lanes)
    warm = _split(list(warmup), lanes)
    if procs == 0:
        ops = [factory(i) for i in range(lanes)]
        for op, w in zip(ops, warm, strict=True):
            _warm(op, w)
        before = probe() if probe else {}
        cpu0 = time.process_time()
        lat, t0, t1, errors, first = _run_threads(ops, batches)
        cpu = {"client": time.process_time() - cpu0}
        after = probe() if probe else {}
        cpu.update({k: after[k] - before.get(k, 0.0) for k in after})
        return LaneRun(lat, t1 - t0, errors, first, cpu)

    ctx = mp.get_context("fork")
    ready = ctx.Barrier(procs + 1)
    go = ctx.Event()
    release = ctx.Event()
    out = ctx.Queue()
    children = []
    for p in range(procs):
        ids = list(range(p * threads, (p + 1) * threads))
        child = ctx.Process(
            target=_child,
            args=(factory, ids, [batches[i] for i in ids], [warm[i] for i in ids], ready, go, out, release),
            daemon=True,
        )
        child.start()
        children.append(child)
    try:
        ready.wait(120)
    except threading.BrokenBarrierError:
        crash = out.get(timeout=5)
        raise RuntimeError(f"a load process failed to start:\n{crash[-1]}") from None
    before = probe() if probe else {}
    go.set()
    results = [out.get(timeout=600) for _ in children]
    after = probe() if probe else {}
    release.set()
    for child in children:
        child.join(10)
    crashes = [r[1] for r in results if r[0] == "crash"]
    if crashes:
        raise RuntimeError(f"a load process crashed:\n{crashes[0]}")
    lat = [x for r in results for x in r[1]]
    t0 = min(r[2] for r in results)
    t1 = max(r[3] for r in results)
    cpu = {"client": sum(r[6] for r in results)}
    cpu.update({k: after[k] - before.get(k, 0.0) for k in after})
    return LaneRun(
        latencies=lat,
        wall=t1 - t0,
        errors=sum(r[4] for r in results),
        first_error=next((r[5] for r in results if r[5]), ""),
        cpu=cpu,
    )
