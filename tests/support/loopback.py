"""A test's own HTTP server on loopback: a ThreadingHTTPServer on a free 127.0.0.1 port in a
daemon thread, announced to the outbound policy (tests.support.outbound) so the service may
call it. Subclasses build their handler (usually from :class:`QuietHandler`) and pass it in."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from tests.support.outbound import announce


class QuietHandler(BaseHTTPRequestHandler):
    """Answers without access-log lines, and shrugs off a client that already gave up."""

    def answer(
        self, status: int, body: bytes, *, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        # Set by stop(): lets go of requests a test holds open.
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Self:
        self.thread.start()
        announce(self.url)
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
