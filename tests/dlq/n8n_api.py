"""A loopback HTTP server standing in for n8n's public REST API (``GET
/api/v1/executions/{id}``): it serves executions in the shape n8n 1.123 answers with
``includeData=true`` (tests/dlq/examples/n8n-execution-with-data.json, written after n8n
1.123's public API handler and execution format; the same reader meets the real n8n in
tests/n8n/test_leads.py) and, as told, the failures lead capture must survive: a status,
an answer slower than the client's timeout, garbage. It records what it was asked."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.outbound import announce


@dataclass
class Asked:
    path: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class FakeN8nApi:
    def __init__(self) -> None:
        self.executions: dict[str, Any] = {}
        self.asked: list[Asked] = []
        # One answer per request, in order ("ok", an int status, "slow", "garbage"); then "ok".
        self.script: list[Any] = []
        self.slow_seconds = 2.0
        self.lock = threading.Lock()
        self.release = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with api.lock:
                    api.asked.append(Asked(self.path, dict(self.headers.items())))
                    step = api.script.pop(0) if api.script else "ok"
                if step == "slow":
                    # Bounded: the test's client gives up first; the server lets go after this.
                    api.release.wait(timeout=api.slow_seconds)
                    step = "ok"
                if isinstance(step, int):
                    self._answer(step, json.dumps({"message": "no such thing for +61412345678"}).encode())
                    return
                if step == "garbage":
                    self._answer(200, b"<html>n8n is updating</html>")
                    return
                execution_id = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                execution = api.executions.get(execution_id)
                if execution is None:
                    self._answer(404, b'{"message":"Not Found"}')
                    return
                self._answer(200, json.dumps(execution).encode())

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeN8nApi:
        self.thread.start()
        announce(self.url)
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
