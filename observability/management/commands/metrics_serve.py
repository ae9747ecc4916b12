"""Serve /metrics for a node without a web process (worker-only nodes)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections
from prometheus_client import start_http_server

from observability.metrics import metrics_registry


class Command(BaseCommand):
    help = (
        "Serve this node's metrics (database figures and the histograms of every process sharing"
        " PROMETHEUS_MULTIPROC_DIR) on --host:--port until stopped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=9464)

    def handle(self, *args: Any, **options: Any) -> None:
        server, thread = start_http_server(options["port"], addr=options["host"], registry=_PerScrape())
        self.stdout.write(f"metrics on http://{options['host']}:{options['port']}/metrics")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        stop.wait()
        server.shutdown()
        thread.join(timeout=5)


class _PerScrape:
    """A fresh registry per scrape, like the web endpoint (no METRICS_TOKEN here: bind it to
    an address only the scraper reaches)."""

    def collect(self) -> Any:
        close_old_connections()  # a connection broken by a database restart is replaced
        return metrics_registry().collect()
