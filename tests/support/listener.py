"""A loopback HTTP listener that records every connection it accepts and every request (path,
headers, body): the "attacker's" endpoint of the trust-boundary tests. Unlike the test
sinks it does not announce itself to the outbound policy unless asked (``allow=True``):
whether the service may reach it is what those tests are about."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.outbound import announce


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return (
            "\n".join([self.method, self.path, *(f"{k}: {v}" for k, v in self.headers.items())])
            + "\n"
            + (self.body.decode(errors="replace"))
        )


class Listener:
    def __init__(
        self, *, status: int = 200, body: bytes = b'{"id": "ch_1", "status": "succeeded"}', allow: bool = False
    ):
        self.lock = threading.Lock()
        self.connections = 0
        self.seen: list[Seen] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                with listener.lock:
                    listener.connections += 1
                super().setup()

            def _record(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with listener.lock:
                    listener.seen.append(Seen(self.command, self.path, dict(self.headers.items()), raw))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _record

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        if allow:
            announce(self.url)

    def everything(self) -> str:
        """All it ever received, as text: what a leak would be found in."""
        with self.lock:
            return "\n".join(s.text() for s in self.seen)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
