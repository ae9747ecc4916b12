"""Serve /metrics for a node without a web process (worker-only nodes)."""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from prometheus_client.exposition import ThreadingWSGIServer

from observability.metrics import metrics_wsgi_app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access line per scrape on stderr (the scraper has its own record)."""


class Command(BaseCommand):
    help = (
        "Serve this node's metrics (database figures and the histograms of every process sharing"
        " PROMETHEUS_MULTIPROC_DIR) on --host:--port until stopped, to a scraper sending"
        " Authorization: Bearer <METRICS_TOKEN> (the web app's /metrics rule)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=9464)

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        server = make_server(host, port, metrics_wsgi_app, server_class, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.stdout.write(f"metrics on http://{host}:{port}/metrics")
        if not settings.METRICS_TOKEN:
            self.stderr.write("METRICS_TOKEN is not set: metrics are off, every scrape answers 404.")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        stop.wait()
        server.shutdown()
        thread.join(timeout=5)
