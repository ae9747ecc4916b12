"""`make run`'s command (``manage.py run_all``) started for a test: a fresh SQLite file in a
temporary folder, free loopback ports for the web server and the demo receivers, stopped with
Ctrl-C (SIGINT to its process group) at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port_block

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunAll:
    process: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def run_all(tmp_path: Path, *, stop_timeout: float = 30) -> Iterator[RunAll]:
    """Migrate a fresh embedded database under ``tmp_path`` and start ``run_all`` on it; the
    environment (PORT, DEMO_PORT_BASE, ONCEGUARD_VAR_DIR) is the one its README commands use."""
    # The web port and the demo receivers' six (DEMO_PORT_BASE .. +5) in one block.
    base = free_port_block(7)
    port = base + 6
    env = {
        **os.environ,
        "ONCEGUARD_VAR_DIR": str(tmp_path),
        "PORT": str(port),
        "DEMO_PORT_BASE": str(base),
        "EXEC_WORKERS": "1",
    }
    env.pop("DATABASE_URL", None)
    env.pop("SQLITE_PATH", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=300)
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_all", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield RunAll(process=process, port=port, env=env, log_path=log_path)
        finally:
            # Already gone (it failed to start) is left alone: the test's own assertion says why.
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=stop_timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    raise
