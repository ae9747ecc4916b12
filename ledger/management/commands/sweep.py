from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from ledger.recovery.sweeper import sweep

log = logging.getLogger("onceguard.sweeper")


class Command(BaseCommand):
    help = (
        "Run one sweeper pass (every rule it can apply) and print what it did. With --every, repeat"
        " every that many seconds until SIGTERM (or --for seconds): django-q2 schedules whole minutes,"
        " a loop sweeps more often (the soak uses it to bound its drain)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=500)
        parser.add_argument("--every", type=float, default=None, help="repeat every this many seconds")
        parser.add_argument("--for", dest="for_seconds", type=float, default=None, help="stop looping after this")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["every"] is None:
            self._report(sweep(batch=options["batch"]).counts)
            return
        stop = threading.Event()

        def on_signal(*_: Any) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        every = max(0.05, options["every"])
        ends = time.monotonic() + options["for_seconds"] if options["for_seconds"] else None
        try:
            while not stop.is_set() and (ends is None or time.monotonic() < ends):
                try:
                    counts = sweep(batch=options["batch"]).counts
                    if counts:
                        log.info("sweep_loop_pass %s", " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
                except Exception as exc:  # database restarting: drop the connection, try again next round
                    log.error("sweep_loop_error error=%s", type(exc).__name__)
                    connections.close_all()
                stop.wait(every)
        finally:
            connections.close_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _report(self, counts: dict[str, int]) -> None:
        if not counts:
            self.stdout.write("nothing to do")
        for name, n in sorted(counts.items()):
            self.stdout.write(f"{name}: {n}")
