"""Helpers for the execute-mode suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

from ledger.execution.attempts import operation_execute, operations_take
from ledger.models import Operation
from ledger.providers import adapters
from ledger.store import sql
from tests.support.loopback import LoopbackServer, QuietHandler
from tests.support.outbound import announce, outbound_env

BASE_DIR = Path(__file__).resolve().parents[2]


def run_due(*, limit: int = 50, rounds: int = 1) -> list[Operation]:
    """Take what is due and execute it, in this thread (the test's own DB connection)."""
    recorded: list[Operation] = []
    with adapters.http_client() as client:
        for _ in range(rounds):
            for op in operations_take(limit=limit, actor="test-worker"):
                result = operation_execute(operation=op, client=client, actor="test-worker")
                if result is not None:
                    recorded.append(result)
    return recorded


def make_due(operation_id: int) -> None:
    """Bring a scheduled retry forward to now (database clock) instead of sleeping."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET next_attempt_at = {sql.now()} WHERE id = %s", [operation_id])


def unthrottle(provider_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_provider SET throttled_until = NULL WHERE id = %s", [provider_id])


def wait_until(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass (bounded, short sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use this test's database."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "config.settings"}
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "postgresql":
        url = os.environ["DATABASE_URL"]
        env["DATABASE_URL"] = url.rsplit("/", 1)[0] + "/" + name
        env.pop("PG_TEST_DB_NAME", None)
    else:
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = name
    # The test's outbound rules (its own servers: tests.support.outbound) reach the child.
    env.update(outbound_env())
    env.update(extra)
    return env


def start_worker(
    *, env: dict[str, str], concurrency: int = 4, extra_args: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """``manage.py worker`` as a real process; its output goes to a file (a pipe nobody reads
    could fill up and stall it), readable while it runs with :func:`worker_output`."""
    log = tempfile.NamedTemporaryFile(prefix="onceguard-worker-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [
            sys.executable,
            str(BASE_DIR / "manage.py"),
            "worker",
            "--concurrency",
            str(concurrency),
            "--poll",
            "0.1",
            *(extra_args or []),
        ],
        cwd=BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()  # the child holds its own descriptor
    process.log_path = log.name  # type: ignore[attr-defined]
    return process


def worker_output(process: subprocess.Popen[bytes]) -> str:
    with open(process.log_path, "rb") as fh:  # type: ignore[attr-defined]
        return fh.read().decode(errors="replace")


def stop_process(process: subprocess.Popen[bytes], *, timeout: float = 15.0) -> str:
    """SIGTERM (graceful), SIGKILL if it does not go; returns the tail of its output."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    text = worker_output(process)
    os.unlink(process.log_path)  # type: ignore[attr-defined]
    return text[-4000:]


def statuses(**filters: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Operation.objects.filter(**filters).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


class CallbackReceiver:
    """A loopback callback endpoint: records each delivery (headers, raw body); answers the
    scripted statuses in order, then 200."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.lock = threading.Lock()
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.deliveries.append(({k: v for k, v in self.headers.items()}, raw))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                body = json.dumps({"received": True}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        announce(self.url)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RenderApi:
    """A loopback provider that keeps every request it receives (method, path, headers, JSON
    body) and answers 200 with a job of its own — or, while ``statuses`` holds any, the next of
    them (a scripted refusal)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with api.lock:
                    api.received.append(
                        {
                            "method": "POST",
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": json.loads(raw) if raw else None,
                        }
                    )
                    number = len(api.received)
                    status = api.statuses.pop(0) if api.statuses else 200
                self.answer(status, json.dumps({"id": f"job_{number}", "status": "succeeded"}).encode())

        self.server = LoopbackServer(Handler).start()
        self.url = self.server.url

    def stop(self) -> None:
        self.server.stop()


class CountingProvider:
    """A provider that holds each request ``hold`` seconds, counting how many it holds at once
    (the most ever, too) and when each arrived; answers the scripted statuses in order, then 200."""

    def __init__(self, *, hold: float = 0.0) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.arrivals: list[float] = []
        self.script: list[tuple[int, dict[str, str]]] = []
        provider = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with provider.lock:
                    provider.arrivals.append(time.monotonic())
                    provider.now += 1
                    provider.most = max(provider.most, provider.now)
                    status, headers = provider.script.pop(0) if provider.script else (200, {})
                try:
                    if provider.hold:
                        server.release.wait(provider.hold)
                    key = self.headers.get("Idempotency-Key", "")
                    self.answer(
                        status, json.dumps({"id": f"ch_{key}", "status": "succeeded"}).encode(), headers=headers
                    )
                finally:
                    with provider.lock:
                        provider.now -= 1

        server = LoopbackServer(Handler)
        self.server = server.start()

    @property
    def url(self) -> str:
        return self.server.url

    def most_in_window(self, seconds: float) -> int:
        """The most arrivals within any window of ``seconds``."""
        times = sorted(self.arrivals)
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= seconds:
                first += 1
            most = max(most, last - first + 1)
        return most

    def stop(self) -> None:
        self.server.stop()
