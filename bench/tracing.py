"""What tracing costs per operation (ADR 0015): the API's claim → complete pair, in process
through Django's whole middleware chain (no socket), with tracing ``baseline`` (the tracing
calls replaced by empty functions: the code as if it had none), ``off`` (the default: no
endpoint set) and ``on`` (every request a server span, exported over OTLP/HTTP to a receiver
in another process), in interleaved rounds, on PostgreSQL in its own database
``onceguard_bench_trace``.

    .venv/bin/python -m bench.tracing [--ops 500] [--rounds 5]

Reported per pair: the median of the rounds' CPU µs of this process (``time.process_time``:
the export thread's work counts, the receiver's and PostgreSQL's do not), its difference to
``baseline`` measured in the same run, and the wall µs. Then the off path alone: every tracing
call one executed operation makes (the claim's and completion's, the worker's attempt and
provider call, the outgoing request's hook), timed in a loop with tracing off. Writes
var/bench-tracing.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = common.suite_db("onceguard_bench_trace")
CONFIGS = ("baseline", "off", "on")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# The OTLP receiver: answers every POST 200 with an empty protobuf answer, in its own process
# so its CPU is not the service's.
SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def _without_tracing(tracing: Any) -> Any:
    """The tracing module's calls as empty functions: the baseline the off path is held to."""

    @contextlib.contextmanager
    def nothing(*args: Any, **kwargs: Any) -> Any:
        yield None

    names = {
        "operation_annotate": lambda *a, **k: None,
        "stored_context": lambda: "",
        "operation_span": nothing,
        "client_span": nothing,
        "attributes_set": lambda *a, **k: None,
    }
    saved = {name: getattr(tracing, name) for name in names}
    for name, fn in names.items():
        setattr(tracing, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(tracing, name, fn)


def _calls_cpu_us(tracing: Any, operation: Any, count: int) -> float:
    """CPU µs of every tracing call of one executed operation (with tracing on: their spans
    built and exported, the export thread's work included)."""

    class Request:
        headers: dict[str, str] = {}

    request = Request()
    started = time.process_time()
    incoming = {"traceparent": TRACEPARENT}
    for _ in range(count):
        # The claim's server span (off: the middleware is not even in the chain; counted anyway).
        with tracing.server_span(name="POST /api/v1/claims", headers=incoming):
            tracing.stored_context()
            tracing.operation_annotate(operation)
        with tracing.operation_span("onceguard.attempt", operation=operation, attributes={"onceguard.attempt": 1}):
            with tracing.client_span("onceguard.provider_call", operation=operation):
                request.headers = {}
                tracing.request_hook(request)
                tracing.attributes_set({"onceguard.outcome": "succeeded"})
        with tracing.server_span(name="POST /api/v1/operations/<int:operation_id>/complete", headers=incoming):
            tracing.operation_annotate(operation)
    tracing.flush()
    return (time.process_time() - started) / count * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.tracing")
    parser.add_argument("--ops", type=int, default=int(os.environ.get("BENCH_TRACE_OPS", "500")))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100000, help="off-path calls timed alone")
    parser.add_argument("--json", default=os.environ.get("BENCH_TRACE_JSON", str(ROOT / "var" / "bench-tracing.json")))
    args = parser.parse_args(argv)
    if common.SMOKE:
        args.ops, args.rounds, args.calls = min(args.ops, 20), min(args.rounds, 1), min(args.calls, 200)
    bench_url = common.bench_database_url(common.server_url(), db=BENCH_DB, suite="bench.tracing")
    dbsetup.database_ready(bench_url)
    # Off at the start, whatever the caller's environment says: each configuration sets its own.
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    dbsetup.setup_django(bench_url)

    from django.db import connection
    from rest_framework.test import APIClient

    from ledger.models import Tenant
    from ledger.platform import tracing
    from ledger.protocol import services

    assert connection.settings_dict["NAME"] == BENCH_DB
    with connection.cursor() as cursor:
        # Only ever in onceguard_bench_trace: every run starts from empty tables.
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_attempt, ledger_operationevent CASCADE"
        )
    tenant = Tenant.objects.filter(slug="bench-trace").first() or services.tenant_create(slug="bench-trace")
    services.provider_upsert(
        tenant=tenant, slug=common.PROVIDER_SLUG, base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write"])

    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    endpoint = f"http://127.0.0.1:{sink.stdout.readline().strip()}"

    def pair(client: APIClient, key: str) -> None:
        claimed = client.post(
            "/api/v1/claims",
            {"key": key, "provider": common.PROVIDER_SLUG, "action": "bench", "request": {"amount": 1000}},
            format="json",
            HTTP_TRACEPARENT=TRACEPARENT,
            HTTP_HOST="127.0.0.1",
        )
        if claimed.status_code != 201:
            raise RuntimeError(f"claim answered {claimed.status_code}")
        body = claimed.json()
        done = client.post(
            f"/api/v1/operations/{body['id']}/complete",
            {"lease_token": body["lease_token"], "provider_ref": key[-12:], "response": {"ok": True}},
            format="json",
            HTTP_TRACEPARENT=TRACEPARENT,
            HTTP_HOST="127.0.0.1",
        )
        if done.status_code != 200:
            raise RuntimeError(f"complete answered {done.status_code}")

    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
    run = f"{int(time.time())}"
    try:
        for r in range(args.rounds):
            # Each round starts with another configuration (a drifting load on a shared machine).
            for config in CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]:
                tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if config == "on" else {})
                # A new client loads the middleware chain again: with the trace middleware only when on.
                client = APIClient()
                client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
                keys = [f"trace-{run}-{config}-{r}-{i}" for i in range(args.ops)]
                pair(client, f"warm-{run}-{config}-{r}")
                with _without_tracing(tracing) if config == "baseline" else contextlib.nullcontext():
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    for key in keys:
                        pair(client, key)
                    # What the export thread still holds is part of the cost of these pairs.
                    tracing.flush()
                    cpu[config].append((time.process_time() - cpu0) / len(keys) * 1e6)
                    wall[config].append((time.perf_counter() - wall0) / len(keys) * 1e6)
        # The calls alone, free of the noise of a request (the pairs above vary by more than
        # the off path costs between rounds): off, then on with the spans exported.
        from ledger.models import Operation

        operation = Operation(pk=1, tenant_id=tenant.pk, key="order-1001:charge:v1")
        tracing.configure({})
        off_us = _calls_cpu_us(tracing, operation, args.calls)
        tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
        on_us = _calls_cpu_us(tracing, operation, max(1, args.calls // 20))
        tracing.configure({})
    finally:
        sink.terminate()
        sink.wait(timeout=10)

    base = statistics.median(cpu["baseline"])
    rows = []
    print(f"API claim → complete, in process, {args.ops} pairs × {args.rounds} interleaved rounds")
    print(f"{'tracing':<10}{'CPU µs/pair':>13}{'Δ vs baseline':>15}{'wall µs/pair':>14}")
    for config in CONFIGS:
        median = statistics.median(cpu[config])
        rows.append(
            {
                "tracing": config,
                "cpu_us_per_pair": round(median, 1),
                "cpu_us_vs_baseline": round(median - base, 1),
                "wall_us_per_pair": round(statistics.median(wall[config]), 1),
                "round_cpu_us": [round(m, 1) for m in cpu[config]],
            }
        )
        print(f"{config:<10}{median:>13.1f}{median - base:>+15.1f}{statistics.median(wall[config]):>14.1f}")
    print("every tracing call of one executed operation (claim, attempt, provider call, completion), alone:")
    print(f"  off: {off_us:.2f} µs CPU; on: {on_us:.1f} µs CPU (four spans built and exported)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "ops": args.ops,
                "rounds": args.rounds,
                "results": rows,
                "calls_alone_cpu_us_per_operation": {"off": round(off_us, 3), "on": round(on_us, 1)},
            },
            indent=2,
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
