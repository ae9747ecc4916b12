"""A loopback HTTP server standing in for n8n's public REST API (``GET
/api/v1/executions/{id}``, ``DELETE`` of one, ``GET /api/v1/workflows`` by pages): it serves
executions in the shape n8n 1.123 answers with ``includeData=true`` (tests/dlq/examples/n8n-execution-with-data.json, written after n8n
1.123's public API handler and execution format; the same reader meets the real n8n in
tests/n8n/test_leads.py) and, as told, the failures lead capture must survive: a status,
an answer slower than the client's timeout, garbage. It records what it was asked."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.loopback import LoopbackServer, QuietHandler


@dataclass
class Asked:
    path: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class FakeN8nApi(LoopbackServer):
    def __init__(self) -> None:
        self.executions: dict[str, Any] = {}
        # Served by GET /api/v1/workflows, ``page_size`` per page with n8n's cursor.
        self.workflows: list[dict[str, Any]] = []
        self.page_size = 2
        self.asked: list[Asked] = []
        # (method, path) of every request, in order.
        self.calls: list[tuple[str, str]] = []
        # One answer per request, in order ("ok", an int status, "slow", "garbage"); then "ok".
        self.script: list[Any] = []
        self.slow_seconds = 2.0
        # Slow answers given so far (their hold ended before the server was stopped).
        self.slow_answered = 0
        self.lock = threading.Lock()
        api = self

        class Handler(QuietHandler):
            def do_DELETE(self) -> None:
                # n8n 1.123: 200 with the deleted execution, 404 for one it does not have.
                with api.lock:
                    api.asked.append(Asked(self.path, dict(self.headers.items())))
                    api.calls.append(("DELETE", self.path))
                    step = api.script.pop(0) if api.script else "ok"
                    execution_id = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                    execution = api.executions.pop(execution_id, None) if step == "ok" else None
                if step == "slow":
                    api.release.wait(timeout=api.slow_seconds)
                    self.answer(204, b"")
                elif isinstance(step, int):
                    self.answer(step, b'{"message":"Forbidden"}')
                elif execution is None:
                    self.answer(404, b'{"message":"Not Found"}')
                else:
                    self.answer(200, json.dumps(execution).encode())

            def _workflows(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                start = int(query.get("cursor", ["0"])[0])
                page = api.workflows[start : start + api.page_size]
                following = start + api.page_size
                cursor = str(following) if following < len(api.workflows) else None
                self.answer(200, json.dumps({"data": page, "nextCursor": cursor}).encode())

            def do_GET(self) -> None:
                with api.lock:
                    api.asked.append(Asked(self.path, dict(self.headers.items())))
                    api.calls.append(("GET", self.path))
                    step = api.script.pop(0) if api.script else "ok"
                if step == "ok" and self.path.startswith("/api/v1/workflows"):
                    self._workflows()
                    return
                if step == "slow":
                    # Bounded: the test's client gives up first; the server lets go after this.
                    if not api.release.wait(timeout=api.slow_seconds):
                        with api.lock:
                            api.slow_answered += 1
                    step = "ok"
                if isinstance(step, int):
                    self.answer(step, json.dumps({"message": "no such thing for +61412345678"}).encode())
                    return
                if step == "garbage":
                    self.answer(200, b"<html>n8n is updating</html>")
                    return
                execution_id = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                execution = api.executions.get(execution_id)
                if execution is None:
                    self.answer(404, b'{"message":"Not Found"}')
                    return
                self.answer(200, json.dumps(execution).encode())

        super().__init__(Handler)
