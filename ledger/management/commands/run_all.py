from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run the whole service: web (gunicorn) + django-q2 cluster (schedules). Ctrl-C stops all."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument(
            "--exec-workers", type=int, default=int(os.environ.get("EXEC_WORKERS", "1")), help="execute-mode workers"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("bootstrap_demo")
        if os.environ.get("DEMO", "1") != "0":
            call_command("demo_seed")
        call_command("schedules_install")
        host, port = options["host"], options["port"]
        python = sys.executable
        commands = {
            "web": [
                python,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"{host}:{port}",
                "--workers",
                str(options["web_workers"]),
                "--threads",
                "4",
                "--access-logfile",
                "-",
                "--access-logformat",
                '%(h)s "%(m)s %(U)s" %(s)s %(M)sms',
            ],
            "schedules": [python, "manage.py", "qcluster"],
        }
        # Execute mode: workers take due operations from the operations table.
        for n in range(options["exec_workers"]):
            commands[f"worker-{n + 1}"] = [python, "manage.py", "worker"]
        if os.environ.get("DEMO", "1") != "0":
            # Demo receivers on loopback: a key-enforced and a key-advisory mock provider,
            # each behind a fault relay, so the crash window can be reproduced with curl.
            base = int(os.environ.get("DEMO_PORT_BASE", "8010"))
            for name, mode, port_ in (("enforced", "enforced", base), ("advisory", "advisory", base + 2)):
                commands[f"mock-{name}"] = [python, "manage.py", "mockprovider", "--port", str(port_), "--mode", mode]
                commands[f"relay-{name}"] = [
                    python,
                    "manage.py",
                    "relay",
                    "--port",
                    str(port_ + 1),
                    "--upstream",
                    f"http://127.0.0.1:{port_}",
                ]
        children: dict[str, subprocess.Popen[bytes]] = {}
        for name, cmd in commands.items():
            children[name] = subprocess.Popen(cmd, start_new_session=True)
        self.stdout.write(
            self.style.SUCCESS(
                f"\nOnceguard is up: console http://{host}:{port}/admin/ · API http://{host}:{port}/api/v1/ · docs http://{host}:{port}/api/docs/\n"
            )
        )

        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, child in children.items():
                    if child.poll() is not None:
                        self.stderr.write(f"{name} exited with {child.returncode}; stopping everything.")
                        stopping = True
                time.sleep(0.5)
        finally:
            for child in children.values():
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for child in children.values():
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
            self.stdout.write("stopped.")
