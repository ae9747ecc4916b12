from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.management.commands.bootstrap_demo import demo_outbound_rules
from ledger.platform import env, local_env
from ledger.platform.secret_files import read_or_create_secret_file


class Command(BaseCommand):
    help = "Run the whole service: web (granian) + django-q2 cluster (schedules). Ctrl-C stops all."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=env.read("PORT"))
        parser.add_argument("--host", default=env.read("HOST"))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--exec-workers", type=int, default=env.read("EXEC_WORKERS"), help="execute-mode workers")

    def handle(self, *args: Any, **options: Any) -> None:
        demo = env.read("DEMO")
        # The demo's settings come from this start's environment, never from the previous
        # run's var/local.env (ledger.platform.local_env): this run writes that file afresh below.
        base = int(_from_environment("DEMO_PORT_BASE") or "8010")
        os.environ["DEMO_PORT_BASE"] = str(base)
        call_command("bootstrap_demo")
        if demo:
            call_command("demo_seed")
        call_command("schedules_install")
        host, port = options["host"], options["port"]
        python = sys.executable
        commands = {
            # granian: the WSGI server that served the API fastest on the bench (README).
            "web": [
                python,
                "-m",
                "granian",
                "--interface",
                "wsgi",
                "config.wsgi:application",
                "--host",
                host,
                "--port",
                str(port),
                "--no-ws",
                "--workers",
                str(options["web_workers"]),
                "--blocking-threads",
                "4",
            ],
            "schedules": [python, "manage.py", "qcluster"],
            # Alerts when the schedules (django-q2) or the sweeper go stale: watched from outside.
            "scheduler-watch": [python, "manage.py", "scheduler_watch"],
        }
        # Execute mode: workers take due operations from the operations table.
        for n in range(options["exec_workers"]):
            commands[f"worker-{n + 1}"] = [python, "manage.py", "worker"]
        # No access log line per request (it scrolled the sign-in away): the web app logs only
        # error answers and slow requests (config.middleware.QuietRequestLogMiddleware).
        slow_ms = int(_from_environment("REQUEST_LOG_SLOW_MS") or "1000")
        os.environ["REQUEST_LOG_SLOW_MS"] = str(slow_ms)
        local: dict[str, str] = {}
        # The demo admin bootstrap_demo makes ("admin", its password printed above) keeps
        # signing in with its password alone even where CONSOLE_REQUIRE_MFA is on (ADR 0014):
        # a first look at the console needs no authenticator app. Other accounts are asked.
        exempt = [u for u in (_from_environment("CONSOLE_MFA_EXEMPT_USERS") or "").split(",") if u.strip()]
        os.environ["CONSOLE_MFA_EXEMPT_USERS"] = local["CONSOLE_MFA_EXEMPT_USERS"] = ",".join(
            dict.fromkeys([*exempt, "admin"])
        )
        if demo:
            # Demo receivers on loopback: a key-enforced and a key-advisory mock provider and the
            # mock image API, each behind a fault relay, so the crash window can be reproduced
            # with curl.
            local["DEMO_PORT_BASE"] = str(base)
            # The workers may reach exactly these loopback ports, besides what the
            # deployment's own OUTBOUND_ALLOW says (ledger.rules.outbound refuses loopback otherwise).
            os.environ["DEMO_OUTBOUND_ALLOW"] = local["DEMO_OUTBOUND_ALLOW"] = ",".join(demo_outbound_rules(base))
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
            # The asynchronous image API (renders: submit → job → poll → PNG), behind its relay.
            commands["mock-images"] = [python, "manage.py", "mockimages", "--port", str(base + 4)]
            commands["relay-images"] = [
                python,
                "manage.py",
                "relay",
                "--port",
                str(base + 5),
                "--upstream",
                f"http://127.0.0.1:{base + 4}",
            ]
        # Web and worker processes add up their metrics through one folder, emptied first
        # (files of processes from an earlier run would be counted again).
        metrics_dir = Path(env.read("PROMETHEUS_MULTIPROC_DIR") or Path(settings.VAR_DIR) / "prometheus")
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for stale in metrics_dir.glob("*.db"):
            stale.unlink()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        # /metrics answers only a scraper with the token (observability.metrics): unless the
        # deployment set one, the demo gets its own, made once under var/ with mode 600.
        if not (env.read("METRICS_TOKEN") or _from_environment("METRICS_TOKEN_FILE")):
            token_file = Path(settings.VAR_DIR) / "metrics_token"
            read_or_create_secret_file(token_file, secrets.token_urlsafe(32))
            os.environ["METRICS_TOKEN_FILE"] = local["METRICS_TOKEN_FILE"] = str(token_file)
        local["REQUEST_LOG_SLOW_MS"] = str(slow_ms)
        # What an earlier run's file put into this environment and this run does not set (the
        # demo's allowance under DEMO=0) is not passed on to the children.
        for name in settings.LOCAL_ENV_FROM_FILE - local.keys():
            os.environ.pop(name, None)
        # Every manage.py command of this checkout reads these (ledger.platform.local_env), so a README
        # block in a second terminal works without this process's environment.
        (Path(settings.VAR_DIR) / local_env.FILE_NAME).write_text(local_env.render(local))
        # Where the token is, never the token itself (the terminal's scrollback is kept).
        bearer = (
            "$METRICS_TOKEN" if env.read("METRICS_TOKEN") else f"$(cat {shlex.quote(env.read('METRICS_TOKEN_FILE'))})"
        )

        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        children: dict[str, subprocess.Popen[bytes]] = {}
        failed = ""
        try:
            for name, cmd in commands.items():
                children[name] = subprocess.Popen(cmd, start_new_session=True)
            failed = self._wait_until_ready(host, port, children, lambda: stopping)
            if failed:
                self.stderr.write(self.style.ERROR(failed))
                stopping = True
            elif not stopping:
                self.stdout.write(
                    self.style.SUCCESS(
                        f"\nOnceguard is up: console http://{host}:{port}/admin/ · API http://{host}:{port}/api/v1/"
                        f" · docs http://{host}:{port}/api/docs/ · ready http://{host}:{port}/readyz\n"
                        f'Metrics: curl -H "Authorization: Bearer {bearer}" http://{host}:{port}/metrics\n'
                    )
                )
            while not stopping:
                for name, child in children.items():
                    if child.poll() is not None:
                        self.stderr.write(f"{name} exited with {child.returncode}; stopping everything.")
                        stopping = True
                time.sleep(0.1)
        finally:
            self._stop_children(children)
        if failed:
            raise CommandError(failed)
        # Everything is stopped and written: skip the interpreter's teardown of every loaded
        # module (about a second on a busy machine), so the prompt is back within 3 s of Ctrl-C.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _stop_children(self, children: dict[str, subprocess.Popen[bytes]]) -> None:
        """Stop every child at once and wait only as long as each needs (measured: idle, all
        gone within ~2.5 s of Ctrl-C).

        * django-q2's cluster gets SIGINT on its main process only: a SIGTERM to its whole
          process group reaches its worker processes under the sentinel, which then waits for
          them forever. Its tasks (schedules, alert dispatch) are at-least-once — a task not
          acknowledged is handed out again by the broker — so after QCLUSTER_STOP_SECONDS (2)
          it is killed rather than waited for.
        * Execute-mode workers stop taking at once and finish their in-flight attempts, each
          bounded by its provider's timeout and the record step: they are waited for
          (WORKER_STOP_SECONDS, default 120 — longer than any lease) and never cut short
          before, so no attempt is left half-recorded by a stop.
        * The web server and the watch get SIGTERM and 3 s; the demo receivers the same once
          the workers are gone.
        """
        started = time.monotonic()
        qcluster_grace = env.read("QCLUSTER_STOP_SECONDS")
        worker_grace = env.read("WORKER_STOP_SECONDS")
        # The demo receivers stay up until the workers are gone: an attempt in flight to them
        # must get its answer, not a reset from a receiver stopped under it.
        receivers = {name for name in children if name.startswith(("mock-", "relay-"))}
        limits: dict[str, float] = {}

        def signal_child(name: str, child: subprocess.Popen[bytes], at: float) -> None:
            with contextlib.suppress(ProcessLookupError):
                if name == "schedules":
                    os.kill(child.pid, signal.SIGINT)
                    limits[name] = at + qcluster_grace
                else:
                    os.killpg(child.pid, signal.SIGTERM)
                    limits[name] = at + (worker_grace if name.startswith("worker-") else 3.0)

        for name, child in children.items():
            if child.poll() is None and name not in receivers:
                signal_child(name, child, 0.0)
        told = False
        took: dict[str, float] = {}
        while True:
            running = {name: child for name, child in children.items() if child.poll() is None}
            elapsed = time.monotonic() - started
            for name in children.keys() - running.keys() - took.keys():
                took[name] = elapsed
            if not running:
                break
            if not any(name.startswith("worker-") for name in running):
                for name in receivers & running.keys() - limits.keys():
                    signal_child(name, running[name], elapsed)
            for name, child in running.items():
                if name in limits and elapsed >= limits[name]:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)
            if not told and elapsed > 3 and any(name.startswith("worker-") for name in running):
                self.stdout.write("waiting for in-flight attempts to finish…")
                told = True
            time.sleep(0.05)
        slowest = max(took, key=took.__getitem__, default="")
        self.stdout.write(
            f"stopped in {time.monotonic() - started:.1f} s"
            + (f" (last: {slowest}, {took[slowest]:.1f} s)." if slowest else ".")
        )

    def _wait_until_ready(
        self, host: str, port: int, children: dict[str, subprocess.Popen[bytes]], stopping: Callable[[], bool]
    ) -> str:
        """Poll /readyz until it answers 200 (bounded by READY_TIMEOUT_SECONDS, default 60).
        Returns "" when ready (or asked to stop), else what went wrong."""
        probe_host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)
        url = f"http://{probe_host}:{port}/readyz"
        timeout = env.read("READY_TIMEOUT_SECONDS")
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline and not stopping():
            for name, child in children.items():
                if child.poll() is not None:
                    return f"{name} exited with {child.returncode} before the service was ready; stopping everything."
            try:
                answer = httpx.get(url, timeout=2, trust_env=False)
                if answer.status_code == 200:
                    return ""
                last = f"{answer.status_code} {answer.text[:200]}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.25)
        if stopping():
            return ""
        return f"{url} did not answer 200 within {timeout:.0f} s (last: {last}); stopping everything."


def _from_environment(name: str) -> str:
    """``name`` as this start's own environment says, ignoring what settings took from an
    earlier run's var/local.env (its text as set: settings checked it at start)."""
    return "" if name in settings.LOCAL_ENV_FROM_FILE else env.raw(name)
