"""Start mock providers and fault relays from tests and demos.

    provider = start_mock_provider("enforced")
    relay = start_relay(provider, mode="forward-then-drop-response")
    ...                      # point the code under test at relay.url
    provider.effects()       # {"count": 1, "by_key": {...}, "requests": 1, ...}
    relay.journal()          # [{"seq": 1, "forwarded": True, "dropped": True, ...}]
    relay.stop(); provider.stop()

By default the server runs on daemon threads of the calling process. ``process=True``
runs it as a separate ``manage.py mockprovider``/``manage.py relay`` process instead, for
crash tests that must kill one side (``.kill()`` sends SIGKILL). Every server binds
127.0.0.1 on a free port; every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from ledger.platform import env
from relay.fault_relay import make_relay
from relay.mock_images import make_mock_image_provider
from relay.mock_providers import make_mock_provider
from relay.server import LoopbackServer

BASE_DIR = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
CONTROL_TIMEOUT_SECONDS = 5.0
PROCESS_START_TIMEOUT_SECONDS = 30.0
PROCESS_STOP_TIMEOUT_SECONDS = 5.0
_READY_LINE = re.compile(r"listening on (?P<url>http://\S+)")


class ServerStartError(RuntimeError):
    pass


# Called with the URL of every server started here. The test suite registers one that adds
# the server's host and port to the test's outbound allow-list (the service refuses loopback
# destinations unless the deployment allows them: ledger.rules.outbound).
started_hooks: list[Callable[[str], None]] = []
# Called with the URL of every such server once it is stopped or killed: its port may be
# handed to another listener afterwards, which the allow-list must not cover.
stopped_hooks: list[Callable[[str], None]] = []


def _announce(running: RunningServer) -> RunningServer:
    for hook in started_hooks:
        hook(running.url)
    return running


class RunningServer:
    """A running mock provider or relay, in this process or another; stop it when done."""

    def __init__(
        self,
        *,
        kind: str,
        url: str,
        server: LoopbackServer | None = None,
        process: subprocess.Popen[bytes] | None = None,
        log_file: IO[bytes] | None = None,
    ) -> None:
        self.kind = kind
        self.url = url
        self._server = server
        self._process = process
        self._log_file = log_file
        self._stopped = False
        # trust_env=False: an HTTP(S)_PROXY in the environment must not intercept loopback calls.
        self._control = httpx.Client(base_url=url, timeout=CONTROL_TIMEOUT_SECONDS, trust_env=False)

    def __repr__(self) -> str:
        where = f"pid {self._process.pid}" if self._process else "in-process"
        return f"<RunningServer {self.kind} {self.url} {where}>"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def server(self) -> LoopbackServer | None:
        """The server itself when it runs in this process (None in a child process)."""
        return self._server

    # --- control endpoints ---

    def _call(self, method: str, path: str, json: Any = None) -> Any:
        response = self._control.request(method, path, json=json)
        response.raise_for_status()
        return response.json()

    def effects(self) -> dict[str, Any]:
        """A mock provider's ``/_effects``: count, by_key, requests, failed, objects, lookups
        (the image API's: renders, by_key, jobs, submits, polls, fetches, lookups, failed)."""
        self._require("mock", "images")
        return self._call("GET", "/_effects")

    def journal(self) -> list[dict[str, Any]]:
        """A relay's journal: what it forwarded and dropped, oldest first."""
        self._require("relay")
        return self._call("GET", "/_relay/journal")

    def script(self, steps: list[Any]) -> None:
        """Replace the script: mock steps (``{"status": 503}``…), the image API's switch sets
        (``{"wrong_size": true}``…, one per submission) or relay steps (mode names)."""
        self._call("POST", "/_relay/script" if self.kind == "relay" else "/_script", json=steps)

    def set_switches(self, **switches: Any) -> None:
        """The image API's switches for every later job (``delay``, ``fail``, ``wrong_size``,
        ``wrong_type``, ``status``/``retry_after``); none: back to normal jobs."""
        self._require("images")
        self._call("POST", "/_switches", json=switches)

    def break_versions(self, broken: dict[str, int]) -> None:
        """A mock provider's ``/_broken``: ``{"v2": 500}`` fails every request under ``/v2``."""
        self._require("mock")
        self._call("POST", "/_broken", json=broken)

    def set_mode(self, mode: str, delay: float | None = None) -> None:
        """A relay's mode for requests without an ``X-Relay-Mode`` header or a script step."""
        self._require("relay")
        self._call("POST", "/_relay/mode", json={"mode": mode, **({"delay": delay} if delay is not None else {})})

    def release(self) -> int:
        """The image API: every job still rendering is done at its next look."""
        self._require("images")
        return int(self._call("POST", "/_release")["released"])

    def reset(self) -> None:
        self._call("POST", "/_relay/reset" if self.kind == "relay" else "/_reset")

    def _require(self, *kinds: str) -> None:
        if self.kind not in kinds:
            raise TypeError(f"{self.kind} server has no such endpoint (only a {' or '.join(kinds)} has)")

    # --- lifecycle ---

    def is_running(self) -> bool:
        if self._stopped:
            return False
        return self._process.poll() is None if self._process else True

    def stop(self) -> None:
        """Stop and wait (bounded); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._control.close()
        if self._server is not None:
            self._server.stop()
        if self._process is not None:
            _terminate(self._process)
        if self._log_file is not None:
            self._log_file.close()
        for hook in stopped_hooks:
            hook(self.url)

    def kill(self) -> None:
        """SIGKILL a process server (a crash: nothing is flushed); stop an in-process one."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=PROCESS_STOP_TIMEOUT_SECONDS)
        self.stop()

    def log_tail(self, limit: int = 4000) -> str:
        """The end of a process server's stderr (never bodies: the servers log none)."""
        if self._log_file is None or self._log_file.closed:
            return ""
        self._log_file.flush()
        with open(self._log_file.name, "rb") as fh:
            return fh.read()[-limit:].decode(errors="replace")

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=PROCESS_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=PROCESS_STOP_TIMEOUT_SECONDS)


def _start_in_thread(kind: str, server: LoopbackServer) -> RunningServer:
    server.serve_in_thread(f"onceguard-{kind}-{server.server_address[1]}")
    return _announce(RunningServer(kind=kind, url=server.url, server=server))


def _start_process(kind: str, argv: list[str], ready_path: str) -> RunningServer:
    """Run ``manage.py <argv> --port 0``; read the bound URL from its first line; wait until it answers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    log_file = tempfile.NamedTemporaryFile(prefix=f"onceguard-{kind}-", suffix=".log")
    process = subprocess.Popen(
        [sys.executable, str(BASE_DIR / "manage.py"), *argv, "--host", LOOPBACK, "--port", "0"],
        cwd=BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log_file,
    )
    deadline = time.monotonic() + PROCESS_START_TIMEOUT_SECONDS
    lines: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        # Drains stdout for the process's whole life, so it can never block on a full pipe.
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                lines.put(line)
        lines.put(b"")

    threading.Thread(target=pump, name=f"onceguard-{kind}-stdout", daemon=True).start()
    url = None
    try:
        while url is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ServerStartError(f"{kind} process did not report its port in time") from None
            if line == b"":
                raise ServerStartError(f"{kind} process exited before listening")
            match = _READY_LINE.search(line.decode(errors="replace"))
            url = match["url"] if match else None
        running = RunningServer(kind=kind, url=url, process=process, log_file=log_file)
        _wait_until_answers(running, ready_path, deadline)
        return _announce(running)
    except BaseException as exc:
        _terminate(process)
        log_file.flush()
        with open(log_file.name, "rb") as fh:
            tail = fh.read()[-2000:].decode(errors="replace")
        log_file.close()
        if isinstance(exc, ServerStartError):
            raise ServerStartError(f"{exc}; stderr tail:\n{tail}") from None
        raise


def _wait_until_answers(running: RunningServer, path: str, deadline: float) -> None:
    with httpx.Client(base_url=running.url, timeout=1.0, trust_env=False) as client:
        while True:
            try:
                if client.get(path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if not running.is_running():
                raise ServerStartError(f"{running.kind} process exited before answering")
            if time.monotonic() > deadline:
                raise ServerStartError(f"{running.kind} process did not answer in time")
            time.sleep(0.05)


def start_mock_provider(mode: str, header: str = "Idempotency-Key", *, process: bool = False) -> RunningServer:
    """A mock provider (``enforced`` or ``advisory``) on 127.0.0.1, a free port."""
    if process:
        return _start_process("mock", ["mockprovider", "--mode", mode, "--header", header], "/_effects")
    return _start_in_thread("mock", make_mock_provider(mode, host=LOOPBACK, port=0, header=header))


def start_mock_image_provider(*, process: bool = False) -> RunningServer:
    """The mock image API (relay.mock_images: submit → job id → poll → PNG) on 127.0.0.1, a free port."""
    if process:
        return _start_process("images", ["mockimages"], "/_effects")
    return _start_in_thread("images", make_mock_image_provider(host=LOOPBACK, port=0))


def start_relay(
    upstream: str | RunningServer,
    mode: str | None = None,
    *,
    delay: float = 0.0,
    header: str = "Idempotency-Key",
    upstream_timeout: float = 30.0,
    process: bool = False,
) -> RunningServer:
    """A fault relay on 127.0.0.1, a free port, in front of ``upstream`` (a URL or a RunningServer).

    ``mode`` None means what the command does: ``RELAY_MODE``, else forward-and-respond.
    """
    upstream_url = upstream.url if isinstance(upstream, RunningServer) else upstream
    if process:
        argv = [
            "relay",
            "--upstream",
            upstream_url,
            *(["--mode", mode] if mode else []),
            "--delay",
            str(delay),
            "--header",
            header,
            "--upstream-timeout",
            str(upstream_timeout),
        ]
        return _start_process("relay", argv, "/_relay/health")
    server = make_relay(
        upstream_url,
        mode=mode or env.read("RELAY_MODE"),
        delay=delay,
        host=LOOPBACK,
        port=0,
        header=header,
        upstream_timeout=upstream_timeout,
    )
    return _start_in_thread("relay", server)
