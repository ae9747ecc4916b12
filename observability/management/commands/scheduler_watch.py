"""Watch the scheduler from outside it: alert when django-q2 or the sweeper goes stale."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections, connections

from observability.scheduler import scheduler_watch


class Command(BaseCommand):
    help = "Alert when the django-q2 cluster or the sweeper is stale (one look, or every --interval seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="look once, print the ages and exit")
        parser.add_argument("--interval", type=float, default=60.0, help="seconds between looks (default 60)")
        parser.add_argument(
            "--grace",
            type=float,
            default=None,
            help="seconds before the first look (default SCHEDULER_STALE_SECONDS): a service started after a"
            " long stop gives its cluster time to run before anything counts as stale",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["once"]:
            ages = scheduler_watch()
            self.stdout.write(
                f"heartbeat_age_seconds={ages.heartbeat_age_seconds:.0f} stale={int(ages.heartbeat_stale)}"
                f" sweeper_age_seconds={ages.sweeper_age_seconds:.0f} stale={int(ages.sweeper_stale)}"
            )
            return
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        grace = options["grace"] if options["grace"] is not None else settings.SCHEDULER_STALE_SECONDS
        stop.wait(max(0.0, grace))
        while not stop.is_set():
            try:
                scheduler_watch()
            except Exception as exc:  # database restarting: look again next time
                self.stderr.write(f"scheduler_watch_error error={type(exc).__name__}")
            close_old_connections()
            stop.wait(max(1.0, options["interval"]))
        # Stopped: nothing is in flight and nothing is left to write. Skip the interpreter's
        # teardown of every loaded module (0.5–2 s on a busy machine), so `make run` stops
        # within seconds of Ctrl-C.
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
