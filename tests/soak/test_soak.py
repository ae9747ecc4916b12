"""The 60-second soak (`make soak` shortened): run once per `make test`, in the PostgreSQL pass.

It brings its own private PostgreSQL cluster (initdb into a temporary folder, its own port),
so it never touches the test database or the shared server it runs beside.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_a_sixty_second_soak_with_kills_and_a_database_restart_holds_every_invariant(tmp_path: Path) -> None:
    env = {**os.environ, "SOAK_SECONDS": "60", "SOAK_DRAIN_SECONDS": "180", "SOAK_LOG_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "soak"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = result.stdout[-12000:] + "\n" + result.stderr[-4000:]
    assert result.returncode == 0, report
    assert "soak PASSED" in result.stdout, report
    # Every kind of fault the issue asks for happened at least once.
    for fault in ("worker SIGKILL + restart", "web restart", "postgresql restart", "relay "):
        assert fault in result.stdout, f"no {fault!r} in the run:\n{report}"
