"""The service's real processes under the soak: started, killed and restarted on purpose,
and always stopped at the end (also on failure or Ctrl-C).

Each process runs in its own session (process group), so a kill reaches gunicorn's workers
too; its output goes to a log file of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

STOP_TIMEOUT_SECONDS = 10.0


@dataclass
class Managed:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    # Kills we caused: an exit after one of these is expected.
    expected_exit: bool = False
    starts: int = 0
    unexpected_exits: list[int] = field(default_factory=list)


class Supervisor:
    """Start, kill, restart and stop named processes; restart any that dies unasked."""

    def __init__(self, *, cwd: Path, log_dir: Path) -> None:
        self.cwd = cwd
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Managed] = {}
        self.lock = threading.RLock()
        self._watching = threading.Event()
        self._watch_thread: threading.Thread | None = None

    def add(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.procs[name] = Managed(name=name, argv=argv, env=env, log_path=self.log_dir / f"{name}.log")

    def start(self, name: str) -> None:
        with self.lock:
            managed = self.procs[name]
            if managed.process is not None and managed.process.poll() is None:
                return
            if managed.log_file is None:
                managed.log_file = open(managed.log_path, "ab")  # closed in stop_all
            managed.log_file.write(f"\n===== start #{managed.starts + 1} at {time.strftime('%X')} =====\n".encode())
            managed.log_file.flush()
            managed.process = subprocess.Popen(
                managed.argv,
                cwd=self.cwd,
                env=managed.env,
                stdin=subprocess.DEVNULL,
                stdout=managed.log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            managed.expected_exit = False
            managed.starts += 1

    def pid(self, name: str) -> int | None:
        process = self.procs[name].process
        return process.pid if process is not None and process.poll() is None else None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process group and wait for it to end (SIGKILL after a bound)."""
        with self.lock:
            managed = self.procs[name]
            managed.expected_exit = True
            process = managed.process
        if process is None or process.poll() is not None:
            return
        _signal_group(process, sig)
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        # gunicorn's workers may outlive a SIGKILLed master for a moment: the group goes too.
        _signal_group(process, signal.SIGKILL)

    def restart(self, name: str, sig: int = signal.SIGKILL, pause: float = 0.0) -> None:
        self.kill(name, sig)
        if pause:
            time.sleep(pause)
        self.start(name)

    # --- watching for unasked exits ---

    def watch(self, on_exit: Callable[[str, int], None] | None = None) -> None:
        """Restart any process that exits without being asked (a crash under the soak's faults
        is itself a finding: it is counted and reported)."""

        def loop() -> None:
            while self._watching.wait(0.5):
                with self.lock:
                    for managed in self.procs.values():
                        process = managed.process
                        if process is None or process.poll() is None or managed.expected_exit:
                            continue
                        managed.unexpected_exits.append(process.returncode)
                        if on_exit is not None:
                            on_exit(managed.name, process.returncode)
                        self.start(managed.name)

        self._watching.set()
        self._watch_thread = threading.Thread(target=loop, name="soak-supervisor", daemon=True)
        self._watch_thread.start()

    def stop_watching(self) -> None:
        self._watching.clear()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=5)

    def stop_all(self) -> None:
        """SIGTERM every group, wait (bounded), SIGKILL what is left; close the logs."""
        self.stop_watching()
        with self.lock:
            running = [m for m in self.procs.values() if m.process is not None and m.process.poll() is None]
            for managed in running:
                managed.expected_exit = True
                assert managed.process is not None
                _signal_group(managed.process, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            for managed in running:
                assert managed.process is not None
                try:
                    managed.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for managed in self.procs.values():
                if managed.process is not None:
                    _signal_group(managed.process, signal.SIGKILL)
                    try:
                        managed.process.wait(timeout=STOP_TIMEOUT_SECONDS)
                    except subprocess.TimeoutExpired:
                        pass
                if managed.log_file is not None:
                    managed.log_file.close()
                    managed.log_file = None

    def log_tail(self, name: str, limit: int = 2500) -> str:
        path = self.procs[name].log_path
        return path.read_bytes()[-limit:].decode(errors="replace") if path.exists() else ""


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until_ready(url: str, *, timeout: float = 60.0, alive: Callable[[], bool] | None = None) -> bool:
    """Poll ``url`` until it answers 200 (bounded)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if alive is not None and not alive():
                return False
            time.sleep(0.25)
    return False
