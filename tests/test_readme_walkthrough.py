"""The README's walkthrough works verbatim: its shell blocks (between the walkthrough markers)
run as written, in bash, against `make run`'s command with its demo — on a free port (the
walkthrough follows PORT and DEMO_PORT_BASE) and a fresh SQLite file in a temporary folder."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import on_postgres
from tests.support.run_all import run_all

ROOT = Path(__file__).resolve().parent.parent


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    part = text.split("<!-- walkthrough:start -->", 1)[1].split("<!-- walkthrough:end -->", 1)[0]
    return "\n".join(re.findall(r"```sh\n(.*?)```", part, flags=re.S))


def test_the_readme_walkthrough_runs_as_written_against_make_runs_demo(tmp_path):
    if on_postgres():
        pytest.skip("make run is the embedded (SQLite) mode")
    with run_all(tmp_path, stop_timeout=60) as service:
        port, server, env = service.port, service.process, service.env
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and b"is up" not in (tmp_path / "run.log").read_bytes():
            assert server.poll() is None, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", walkthrough()],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        out = done.stdout
        assert done.returncode == 0, (out[-3000:], done.stderr[-3000:])
        assert '"status":"claimed"' in out.replace(" ", "") and "lease_token" in out
        assert "idempotent-replayed: true" in out.lower()
        assert re.search(r"/api/v1/operations/\d+: succeeded", out), out
        # The render: waited on the image API, published a checked 256×192 PNG, rendered once.
        assert re.search(r"render \d+: succeeded", out), out
        compact = out.replace(" ", "")
        assert '"media_type":"image/png","width":256,"height":192' in compact, out
        assert "200 image/png" in out and out.lower().count("idempotent-replayed: true") == 2
        assert "n8n:17:4812" in out and out.rstrip().endswith("resolved"), out[-500:]
        assert "lease_lost" not in out and "problem" not in out
