"""(c) The HTTP API served by gunicorn on loopback, driven by a bounded client loop.

Fresh = POST /api/v1/claims then POST /api/v1/operations/{id}/complete; replay = POST
/api/v1/claims of a finished key (200 + Idempotent-Replayed). The client keeps one
keep-alive connection per lane (raw http.client: the cheapest Python client there is)
and runs in 2 processes × 4 threads, so client CPU and the GIL stay off the critical path.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import PROVIDER_SLUG, Op, Probe, child_pids, proc_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ServerConfig:
    workers: int
    threads: int
    worker_class: str = "gthread"

    @property
    def label(self) -> str:
        if self.worker_class == "sync":
            return f"sync w{self.workers}"
        return f"{self.worker_class} w{self.workers}×t{self.threads}"

    def args(self) -> list[str]:
        out = ["--workers", str(self.workers), "--worker-class", self.worker_class]
        if self.worker_class == "gthread":
            out += ["--threads", str(self.threads), "--keep-alive", "30"]
        return out


def parse_config(text: str) -> ServerConfig:
    """``2x4`` = gthread 2 workers × 4 threads; ``sync4`` = 4 sync workers."""
    if text.startswith("sync"):
        return ServerConfig(int(text[4:]), 1, "sync")
    w, t = text.split("x")
    return ServerConfig(int(w), int(t))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    config: ServerConfig
    port: int
    proc: subprocess.Popen[bytes]

    def workers(self) -> list[int]:
        return child_pids(self.proc.pid)

    def probe(self) -> Probe:
        def probe() -> dict[str, float]:
            pids = [self.proc.pid, *self.workers()]
            return {"app": sum(proc_cpu_seconds(p) for p in pids)}

        return probe


@contextmanager
def gunicorn(config: ServerConfig, bench_url: str, log_path: Path) -> Iterator[Server]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": bench_url, "DEBUG": "0", "DJANGO_SETTINGS_MODULE": "config.settings"}
    cmd = [
        str(Path(sys.executable).with_name("gunicorn")),
        "config.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "--backlog",
        "256",
        *config.args(),
    ]
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(config, port, proc)
    try:
        _wait_ready(server)
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _wait_ready(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.proc.returncode}; see var/bench-gunicorn.log")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/api/v1/operations")
            conn.getresponse().read()
            conn.close()
            if len(server.workers()) >= server.config.workers:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("gunicorn did not come up in time")


class Client:
    """One keep-alive connection; reconnects when the server closes it (sync workers)."""

    def __init__(self, port: int, api_key: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], http.client.HTTPResponse]:
        data = json.dumps(body, separators=(",", ":")).encode()
        for attempt in (1, 2):
            try:
                self.conn.request("POST", path, data, self.headers)
                resp = self.conn.getresponse()
                payload = resp.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # An idle keep-alive connection the server closed before this request.
                self.conn.close()
                if attempt == 2:
                    raise
        return resp.status, json.loads(payload) if payload else {}, resp


def claim_body(key: str) -> dict[str, Any]:
    return {"key": key, "provider": PROVIDER_SLUG, "action": "bench", "request": {"amount": 1000, "ref": key[-12:]}}


def lane_factory(port: int, api_key: str, kind: str) -> Any:
    def factory(_lane: int) -> Op:
        client = Client(port, api_key)

        def fresh(key: str) -> None:
            status, body, _ = client.post("/api/v1/claims", claim_body(key))
            if status != 201:
                raise RuntimeError(f"claim answered {status}: {body}")
            status, done, _ = client.post(
                f"/api/v1/operations/{body['id']}/complete",
                {"lease_token": body["lease_token"], "provider_ref": "ref-" + key[-12:], "response": {"ok": True}},
            )
            if status != 200 or done.get("status") != "succeeded":
                raise RuntimeError(f"complete answered {status}: {done}")

        def replay(key: str) -> None:
            status, body, resp = client.post("/api/v1/claims", claim_body(key))
            if status != 200 or resp.getheader("Idempotent-Replayed") != "true":
                raise RuntimeError(f"replay answered {status}: {body}")

        return fresh if kind == "fresh" else replay

    return factory
