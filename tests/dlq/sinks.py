"""A loopback HTTP sink for replay targets and alert channels: records every request and
answers as told (ok, a status, slow, or hanging until the client gave up)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.loopback import LoopbackServer, QuietHandler


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class Sink(LoopbackServer):
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        # "ok" → 200 {"id": "sink-N"}; "status" → self.status; "hang" → hold the request
        # until released (at most 1 s), then 200; "slow" → wait self.delay (≤ 1 s), then 200.
        self.mode = "ok"
        self.status = 200
        self.delay = 0.0
        # Extra headers on every answer (e.g. a Retry-After), and a body instead of the usual.
        self.answer_headers: dict[str, str] = {}
        self.answer_body: bytes | None = None
        # A replay target's lookup (GET): what it answers, and the lookups it received (kept
        # apart from the POSTs, so `received()` stays the deliveries).
        self.lookup_status = 404
        self.lookups: list[Received] = []
        # Called on the server's thread as each POST arrives, before it is answered: a test
        # looks at the caller while it is known to be waiting on this sink.
        self.on_post: Callable[[], None] | None = None
        # A receiver that acknowledges (ADR 0007): each 2xx answers Onceguard-Ack, computed here
        # from the wire format — v1=<hex HMAC-SHA256(secret, "ack." + Onceguard-Replay-Id)> — or
        # ``ack_for`` (an id of its own choosing: an acknowledgement of another replay).
        self.ack_secret: str | None = None
        self.ack_for: str | None = None
        # Whether the lookup (GET) acknowledges too.
        self.ack_lookups = True
        sink = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with sink.lock:
                    sink.requests.append(Received("POST", self.path, dict(self.headers.items()), body))
                    number = len(sink.requests)
                    mode, status, delay = sink.mode, sink.status, sink.delay
                    extra, body_override = dict(sink.answer_headers), sink.answer_body
                if sink.on_post is not None:
                    sink.on_post()
                if mode == "hang":
                    sink.release.wait(timeout=1.0)
                elif mode == "slow":
                    threading.Event().wait(min(delay, 1.0))
                code = status if mode == "status" else 200
                answer = json.dumps({"id": f"sink-{number}", "ok": code < 300}).encode()
                if body_override is not None:
                    answer = body_override
                self.answer(code, answer, headers={**extra, **sink.ack_headers(self.headers, code)})

            def do_GET(self) -> None:
                with sink.lock:
                    sink.lookups.append(Received("GET", self.path, dict(self.headers.items()), b""))
                    status = sink.lookup_status
                self.answer(
                    status,
                    json.dumps({"id": "found-1"} if status < 300 else {}).encode(),
                    headers=sink.ack_headers(self.headers, status) if sink.ack_lookups else {},
                )

        super().__init__(Handler)

    def ack_headers(self, headers: Any, status: int) -> dict[str, str]:
        with self.lock:
            secret, ack_for = self.ack_secret, self.ack_for
        if secret is None or status >= 300:
            return {}
        replay_id = ack_for if ack_for is not None else headers.get("Onceguard-Replay-Id", "")
        digest = hmac.new(secret.encode(), f"ack.{replay_id}".encode(), hashlib.sha256).hexdigest()
        return {"Onceguard-Ack": f"v1={digest}"}

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def bodies_text(self) -> str:
        return "\n".join(r.body.decode("utf-8", errors="replace") for r in self.received())
