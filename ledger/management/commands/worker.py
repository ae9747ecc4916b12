from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ledger.execution.worker import Worker


class Command(BaseCommand):
    help = (
        "Execute due execute-mode operations (the operations table is the queue). Run several per node;"
        " SIGTERM stops taking work and lets in-flight attempts finish."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=8, help="threads sending at once (default 8)")
        parser.add_argument("--poll", type=float, default=0.5, help="longest idle wait between takes, seconds")
        parser.add_argument("--max-idle", type=float, default=None, help="exit after this long with nothing due")
        parser.add_argument("--max-operations", type=int, default=None, help="exit after taking this many")
        parser.add_argument("--name", default=None, help="actor name in events (default worker:<host>:<pid>)")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()

        def on_signal(*_: Any) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        worker = Worker(concurrency=options["concurrency"], poll_seconds=options["poll"], name=options["name"])
        stats = worker.run(stop=stop, max_idle_seconds=options["max_idle"], max_operations=options["max_operations"])
        self.stdout.write(
            f"taken={stats.taken} finished={stats.finished} errors={stats.errors}"
            f" {' '.join(f'{k}={v}' for k, v in sorted(stats.by_status.items()))}"
        )
        if options["max_idle"] is None and options["max_operations"] is None:
            # A long-running worker told to stop: its attempts are recorded, its connections
            # closed (Worker.run). Skip the interpreter's teardown of every loaded module (1–2 s
            # on a busy machine), so `make run` stops within seconds of Ctrl-C.
            self.stdout.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
