"""Every `make bench` suite, and bench.scale at a small size, runs clean at a tiny count.

A benchmark nobody runs rots: a set-up that a service's new rule refuses, a column whose type
changed, and the suite crashes or counts every operation as an error while its figures still
print. Here each suite runs as `make bench` runs it (``python -m <suite>``, its own process)
with counts small enough for seconds, and must exit 0: any error fails the test. Targets are
not judged at these sizes (``BENCH_SMOKE=1``: tiny tables plan and time otherwise); that
`make bench` does fail on a scenario's errors is proven with one planted.

Each suite's databases get a suffix named after this pass's test database (so two checkouts'
smoke runs, and a developer's `make bench`, never share one) and are copied from a migrated
template (``BENCH_DB_TEMPLATE``) instead of migrated one by one; they are kept for the next pass.

Heavy: real PostgreSQL, worker processes, an HTTP server; the PostgreSQL pass only. The time
each suite took and the total are printed, wall clock and the suites' own CPU (their
processes, PostgreSQL's backends not included): on a machine shared by other work the wall
clock stretches, the CPU does not (`make test`'s budget for them is 3 minutes).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.heavy, pytest.mark.postgres_only]

# Tiny counts for every suite: enough to run each code path once or twice.
TINY = {
    "BENCH_OPS": "20",
    "BENCH_WARMUP": "5",
    "BENCH_HTTP_OPS": "16",
    "BENCH_ROUNDS": "1",
    "BENCH_COST_OPS": "5",
    "BENCH_EXEC_OPS": "12",
    "BENCH_EXEC_WARMUP": "2",
    "BENCH_EXEC_PACED_OPS": "6",
    "BENCH_EXEC_Q_WORKERS": "2",
    "BENCH_EXEC_ROUNDS": "1",
    "BENCH_FAIR_BIG": "25",
    "BENCH_FAIR_SMALL": "3",
    "BENCH_FAIR_WARMUP": "1",
    "BENCH_FAIR_RATE": "50",
    "BENCH_SWEEP_ROWS": "2000",
    "BENCH_DLQ_ROWS": "2000",
    "BENCH_DLQ_REPEAT": "2",
    "BENCH_RET_ROWS": "400",
    "BENCH_RET_REDACT_ROWS": "100",
    "BENCH_RET_BATCH": "150",
    "SCALE_ROWS": "3000",
    "SCALE_SMALL_ROWS": "1000",
    "SCALE_REPEAT": "2",
    "SCALE_MARGINAL": "20",
    "SCALE_PAIRED_BLOCKS": "2",
    "SCALE_PAIRED_OPS": "5",
    "SCALE_WAL_SAMPLES": "5",
}
# Every suite of `make bench` (the Makefile's BENCH_SUITES) but `bench` (its own test below),
# and bench.scale at a small size.
SUITES = (
    "bench.execute",
    "bench.fair",
    "bench.sweeper",
    "bench.dlq",
    "bench.retention",
    "bench.fencing",
    "bench.tracing",
    "bench.powertools",
    "bench.scale",
)
# A suite that hangs fails here instead of holding the pass (each is bounded inside too).
SUITE_TIMEOUT_S = 600

durations: dict[str, tuple[float, float]] = {}  # suite → (wall, CPU of its processes) seconds


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.skip("the benchmarks run on PostgreSQL")
    return url


def _database_exists(server: str, name: str) -> bool:
    import psycopg

    from bench.common import bench_database_url, libpq_dsn

    dsn = libpq_dsn(bench_database_url(server, db="postgres", suite="the bench smoke tests"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


@pytest.fixture(scope="module")
def smoke_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from bench import dbsetup
    from bench.common import bench_database_url

    server = _server_url()
    test_db = connection.settings_dict.get("TEST", {}).get("NAME") or f"test_{connection.settings_dict['NAME']}"
    suffix = f"_smoke_{test_db}"
    template = f"onceguard_smoke_template_{test_db}"
    # Migrated when first made and kept: each suite migrates its own copy, so a template
    # behind the migrations costs only the new ones.
    if not _database_exists(server, template):
        dbsetup.database_ready(bench_database_url(server, db=template, suite="the bench smoke tests"))
    env = {
        **os.environ,
        **TINY,
        "DATABASE_URL": server,
        "BENCH_DB_SUFFIX": suffix,
        "BENCH_DB_TEMPLATE": template,
        "BENCH_SMOKE": "1",
        # A developer's last figures in var/bench-latest.json stay theirs.
        "BENCH_JSON": str(tmp_path_factory.mktemp("bench") / "bench.json"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("BENCH_DB", None)
    env.pop("SCALE_DB", None)
    env.pop("BENCH_PLANT_ERROR", None)
    # The suites' databases are kept too: a later pass migrates only what is new and reuses
    # their fills (dropping one forces a checkpoint, seconds each on a busy server).
    yield env
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and durations:
        each = ", ".join(f"{name} {wall:.0f} s ({cpu:.0f} s CPU)" for name, (wall, cpu) in durations.items())
        wall = sum(w for w, _ in durations.values())
        cpu = sum(c for _, c in durations.values())
        # Past the capture, so it is printed whether the tests passed or not.
        with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            reporter.write_line(f"\nbench smoke tests: {wall:.0f} s in all, {cpu:.0f} s of CPU; {each}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], env: dict[str, str], label: str) -> subprocess.CompletedProcess[str]:
    started, cpu0 = time.monotonic(), _children_cpu()
    try:
        proc = subprocess.run(
            args,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT_S,
            start_new_session=True,
        )
    finally:
        durations[label] = (time.monotonic() - started, _children_cpu() - cpu0)
    return proc


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


@pytest.mark.parametrize("suite", SUITES)
def test_each_bench_suite_runs_without_an_error_at_a_tiny_count(suite: str, smoke_env: dict[str, str]) -> None:
    proc = _run([sys.executable, "-m", suite], smoke_env, suite)

    assert proc.returncode == 0, f"{suite} exited {proc.returncode}:\n{_tail(proc)}"


def test_bench_runs_without_an_error_and_reports_the_write_cost_beside_raw_sql(smoke_env: dict[str, str]) -> None:
    proc = _run([sys.executable, "-m", "bench"], smoke_env, "bench")

    assert proc.returncode == 0, f"bench exited {proc.returncode}:\n{_tail(proc)}"
    assert "Write cost per op, beside (a) raw SQL measured in this run:" in proc.stdout
    doc = json.loads(Path(smoke_env["BENCH_JSON"]).read_text())
    assert not [s for s in doc["results"] if s["errors"]]
    costs = {(c["scenario"], c["kind"]): c for c in doc["write_cost"]}

    assert set(costs) == {(s, k) for s in ("(a) raw SQL", "(b) guard", "(c) HTTP") for k in ("fresh", "replay")}
    for cost in costs.values():
        assert cost["errors"] == 0, cost
        assert cost["statements_per_op"] >= 1
    fresh = costs[("(b) guard", "fresh")]
    # One operation row inserted and updated, its index entries counted, the HOT share read.
    assert fresh["tables_per_op"]["ledger_operation"]["inserts"] == 1
    assert fresh["tables_per_op"]["ledger_operation"]["index_entries"] >= 1
    assert fresh["hot_share"] is not None
    if fresh["wal_per_op"] is not None:  # pg_walinspect present (user postgres may create it)
        assert fresh["wal_per_op"]["commits"] >= 1
        assert fresh["wal_per_op"]["bytes"] > costs[("(a) raw SQL", "fresh")]["wal_per_op"]["bytes"] > 0


def test_make_bench_exits_non_zero_when_a_scenario_has_errors(smoke_env: dict[str, str]) -> None:
    """An error planted in (a) at 1 connection, through the Makefile's own loop (its
    prerequisite, the virtualenv, taken as made: ``-o``)."""
    env = {**smoke_env, "BENCH_PLANT_ERROR": "raw1", "BENCH_NO_HTTP": "1"}
    proc = _run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "bench", "BENCH_SUITES=bench bench.sweeper"],
        env,
        "make bench with a planted error",
    )

    assert proc.returncode != 0, _tail(proc)
    assert "ERROR a raw 1 conn fresh: 20 errors (RuntimeError: planted error" in proc.stdout, _tail(proc)
    # set -e: the loop stopped at the failing suite.
    assert "===== bench.sweeper =====" not in proc.stdout
