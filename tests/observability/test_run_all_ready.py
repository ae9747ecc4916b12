"""`make run` says "up" only once /readyz answers 200; otherwise a clear error, bounded."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ledger.management.commands.run_all import Command


class _NotReady(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "unavailable", "checks": {"database": "unreachable: OperationalError"}}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def not_ready_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_a_web_server_that_never_gets_ready_is_reported_within_the_bound(monkeypatch, not_ready_server):
    monkeypatch.setenv("READY_TIMEOUT_SECONDS", "1")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        failed = Command()._wait_until_ready("127.0.0.1", not_ready_server, {"web": sleeper}, lambda: False)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "/readyz did not answer 200 within 1 s" in failed
    assert "503" in failed and "unreachable: OperationalError" in failed


def test_a_child_that_exits_before_ready_is_named():
    crashed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    crashed.wait()
    failed = Command()._wait_until_ready("127.0.0.1", 9, {"web": crashed}, lambda: False)
    assert failed.startswith("web exited with 3 before the service was ready")


def test_ctrl_c_while_waiting_stops_the_wait_without_an_error(not_ready_server):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert Command()._wait_until_ready("0.0.0.0", not_ready_server, {"web": sleeper}, lambda: True) == ""
    finally:
        sleeper.kill()
        sleeper.wait()
