"""Running a relay server from a management command until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from relay.server import LoopbackServer, is_loopback


def check_host(host: str, allow_remote: bool) -> None:
    # A fault relay or a mock provider on a public interface is an open door: loopback
    # unless the operator says otherwise (a container network in CI, say).
    if not is_loopback(host) and not allow_remote:
        raise CommandError(f"{host} is not a loopback address; pass --allow-remote to bind it anyway.")


def serve_until_stopped(server: LoopbackServer, stdout: OutputWrapper, label: str) -> None:
    stop = threading.Event()

    def request_stop(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server.serve_in_thread(label)
    # One parseable line: RunningServer reads the real port from it when started with --port 0.
    stdout.write(f"{label} listening on {server.url}")
    stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        stdout.write(f"{label} stopped.")
        stdout.flush()
