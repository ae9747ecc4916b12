"""HTTP plumbing shared by the mock providers and the fault relay (standard library only).

Both are real servers on a real socket, so what a caller sees — a status, a reset, a
timeout — is what it would see from a remote provider. Nothing here logs a body, a query
string or a header value: paths and statuses only (DESIGN §7).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("onceguard.relay")

# Bounds: a test server must never grow without limit or hold a thread forever.
MAX_BODY_BYTES = 1024 * 1024
# The relay passes through whatever the code under test sends; Onceguard accepts up to 10 MB.
MAX_RELAY_BODY_BYTES = 16 * 1024 * 1024
MAX_DISCARD_BYTES = 32 * 1024 * 1024
MAX_DELAY_SECONDS = 120.0
MAX_SCRIPT_STEPS = 1000
SOCKET_TIMEOUT_SECONDS = 30.0

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the server recomputes itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class BodyTooLarge(Exception):
    pass


class BadRequestBody(Exception):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackServer(ThreadingHTTPServer):
    """A threading HTTP server whose handler threads never keep the process alive.

    ``stopping`` is set on shutdown so handlers holding a request (scripted delays) wake
    up at once instead of outliving the test that started them.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.stopping = threading.Event()
        super().__init__(address, handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    def serve_in_thread(self, name: str) -> threading.Thread:
        self._serving = True
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopping.set()
        # shutdown() waits for serve_forever to notice; on a server never served it would wait forever.
        if getattr(self, "_serving", False):
            self.shutdown()
        self.server_close()


class JsonRequestHandler(BaseHTTPRequestHandler):
    """Common helpers: bounded body reading, JSON answers, closing without an answer."""

    # HTTP/1.0: one request per connection, so "close without answering" is unambiguous
    # for the caller and no idle keep-alive connection pins a handler thread.
    protocol_version = "HTTP/1.0"
    server_version = "OnceguardRelay/1"
    timeout = SOCKET_TIMEOUT_SECONDS
    server: LoopbackServer

    # --- logging: method, path without query, status; never bodies or header values ---

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.debug("%s %s %s %s", self.server_version, self.command, self.path_only, code)

    def log_error(self, format: str, *args: Any) -> None:
        log.debug("%s error on %s %s", self.server_version, self.command, self.path_only)

    def log_message(self, format: str, *args: Any) -> None:
        # Silences BaseHTTPRequestHandler's stderr lines, which carry the full request line.
        pass

    @property
    def path_only(self) -> str:
        return (getattr(self, "path", "") or "").split("?", 1)[0]

    # --- input ---

    def read_body(self, limit: int = MAX_BODY_BYTES) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(limit)
        length_header = self.headers.get("Content-Length")
        if not length_header:
            return b""
        try:
            length = int(length_header)
        except ValueError as exc:
            raise BadRequestBody("Content-Length is not a number") from exc
        if length < 0:
            raise BadRequestBody("Content-Length is negative")
        if length > limit:
            self._discard(length)
            raise BodyTooLarge
        return self.rfile.read(length)

    def _discard(self, length: int) -> None:
        # Read a moderately oversized body before answering 413: closing on unread bytes
        # makes the kernel send a reset, and the caller would see that instead of the 413.
        if length > MAX_DISCARD_BYTES:
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 64 * 1024))
            if not chunk:
                return
            length -= len(chunk)

    def _read_chunked(self, limit: int) -> bytes:
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise BadRequestBody("bad chunk size") from exc
            if size == 0:
                # Trailer section, up to the empty line.
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            if len(body) + size > limit:
                raise BodyTooLarge
            body += self.rfile.read(size)
            self.rfile.readline(1024)

    def read_json(self) -> Any:
        """The request body as JSON; an empty body is ``{}``."""
        raw = self.read_body()
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequestBody("body is not JSON") from exc

    # --- output ---

    def send_bytes(
        self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None, content_type: str | None = None
    ) -> bool:
        """Write a whole answer; False when the caller had already gone away."""
        try:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            for name, value in headers or []:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            self.close_connection = True
            return False

    def send_json(
        self,
        status: int,
        body: Any,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> bool:
        data = json.dumps(body, separators=(",", ":")).encode()
        return self.send_bytes(status, data, headers, content_type)

    def send_problem(self, status: int, code: str, title: str, detail: str = "") -> bool:
        """RFC 9457 problem details, the shape the rest of Onceguard answers with."""
        problem = {"type": "about:blank", "title": title, "status": status, "code": code}
        if detail:
            problem["detail"] = detail
        return self.send_json(status, problem, content_type="application/problem+json")

    def drop_connection(self, *, reset: bool = False) -> None:
        """Close the client's socket without a single response byte.

        ``reset`` sends a TCP RST (SO_LINGER 0) so the caller sees "connection reset";
        otherwise an orderly FIN, which an HTTP client reports as "server disconnected
        without sending a response". Either way nothing was answered.
        """
        self.close_connection = True
        sock = self.connection
        try:
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            else:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle_body_errors(self, exc: Exception, limit: int = MAX_BODY_BYTES) -> None:
        if isinstance(exc, BodyTooLarge):
            self.send_json(413, {"error": "body_too_large", "limit_bytes": limit})
        else:
            self.send_json(400, {"error": "bad_request_body"})
