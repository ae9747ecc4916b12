"""(c) The HTTP API served on loopback (granian or gunicorn), driven by a bounded client loop,
and (f) the framework floor: an empty DRF APIView behind the same middleware, API-key
authentication, server and client (bench/floor.py; routed only under bench settings).

Fresh = POST /api/v1/claims then POST /api/v1/operations/{id}/complete; replay = POST
/api/v1/claims of a finished key (200 + Idempotent-Replayed); floor = the same two request
bodies POSTed to the empty view. The client keeps one keep-alive connection per lane (raw
http.client: the cheapest Python client there is) and runs in 2 processes × 4 threads, so
client CPU and the GIL stay off the critical path.
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
# The project's settings with the framework-floor view routed (never in production URLs).
BENCH_SETTINGS = "bench.http_settings"
FLOOR_URL = "/api/v1/_bench/floor"


@dataclass(frozen=True)
class ServerConfig:
    """A WSGI server and its size: granian (workers × blocking threads), gunicorn gthread
    (workers × threads) or gunicorn sync (workers)."""

    workers: int
    threads: int
    worker_class: str = "gthread"  # "gthread" | "sync" | "granian"

    @property
    def label(self) -> str:
        if self.worker_class == "sync":
            return f"gunicorn sync w{self.workers}"
        if self.worker_class == "granian":
            return f"granian w{self.workers}×t{self.threads}"
        return f"gunicorn gthread w{self.workers}×t{self.threads}"

    @property
    def server(self) -> str:
        return "granian" if self.worker_class == "granian" else "gunicorn"

    def command(self, port: int) -> list[str]:
        venv_bin = Path(sys.executable).parent
        if self.worker_class == "granian":
            return [
                str(venv_bin / "granian"),
                "--interface",
                "wsgi",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(self.workers),
                "--blocking-threads",
                str(self.threads),
                "--backlog",
                "256",
                "--no-ws",
                "--log-level",
                "warning",
                "config.wsgi:application",
            ]
        cmd = [
            str(venv_bin / "gunicorn"),
            "config.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "--backlog",
            "256",
            "--workers",
            str(self.workers),
            "--worker-class",
            self.worker_class,
        ]
        if self.worker_class == "gthread":
            cmd += ["--threads", str(self.threads), "--keep-alive", "30"]
        return cmd


def parse_config(text: str) -> ServerConfig:
    """``granian2x4`` = granian 2 workers × 4 blocking threads; ``2x4`` = gunicorn gthread 2
    workers × 4 threads; ``sync4`` = gunicorn, 4 sync workers."""
    if text.startswith("sync"):
        return ServerConfig(int(text[4:]), 1, "sync")
    if text.startswith("granian"):
        w, t = text[len("granian") :].split("x")
        return ServerConfig(int(w), int(t), "granian")
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
def serve(config: ServerConfig, database_url: str, log_path: Path, tree: Path = ROOT) -> Iterator[Server]:
    """Start ``config``'s server on a free loopback port for the project in ``tree``, with
    the bench settings (the floor view routed), and stop it on exit."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": BENCH_SETTINGS,
        "PYTHONPATH": str(tree),
    }
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        config.command(port), cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = Server(config, port, proc)
    try:
        _wait_ready(server, log_path)
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _wait_ready(server: Server, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.config.server} exited with {server.proc.returncode}; see {log_path}")
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
    raise RuntimeError(f"{server.config.label} did not come up in time; see {log_path}")


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

        def floor(key: str) -> None:
            status, body, _ = client.post(FLOOR_URL, claim_body(key))
            if status != 200:
                raise RuntimeError(f"floor answered {status}: {body}")
            status, body, _ = client.post(
                FLOOR_URL, {"lease_token": "x" * 43, "provider_ref": "ref-" + key[-12:], "response": {"ok": True}}
            )
            if status != 200:
                raise RuntimeError(f"floor answered {status}: {body}")

        return {"fresh": fresh, "replay": replay, "floor": floor}[kind]

    return factory
