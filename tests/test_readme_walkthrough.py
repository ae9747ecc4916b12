"""Every shell block of the README and of the docs' tutorials runs as written, in a fresh shell.

The service is `make run`'s, started by this test on free loopback ports in a fresh copy of the
checkout (its own `var/`: an empty embedded SQLite database, its own keys and `var/local.env`),
the way a newcomer's clone would be. Each document's blocks then run in order, in one
`bash -e -o pipefail` started with `env -i`: only PATH and HOME, plus the PORT and
DEMO_PORT_BASE the pages tell a reader to export when they moved them. Nothing of the
service's own environment reaches the shell — the demo's loopback allowance and metrics token
come from `var/local.env`, as in a second terminal (ledger/platform/local_env.py).

A block that must not run here (`make run` itself, an n8n installation) is preceded in the
markdown by ``<!-- not-run: reason -->``; tests/test_docs.py keeps those few.

Heavy: it starts the whole service; it runs once, in the PostgreSQL pass (the service itself
is always the embedded SQLite mode, whatever the pass's test database).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port_block

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs" / "tutorials").glob("*.md"))]
# What a login shell on this machine has: no virtualenv on the PATH, nothing of make run's.
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
BLOCK = re.compile(r"(?:<!--\s*not-run:(?P<reason>[^>]*)-->\s*\n)?```(?:sh|bash|shell)\n(?P<code>.*?)```", re.S)


@dataclass(frozen=True)
class ShellBlock:
    code: str
    not_run: str | None  # the reason given in the markdown, when the block is not to run


def shell_blocks(document: Path) -> list[ShellBlock]:
    return [
        ShellBlock(code=m["code"], not_run=None if m["reason"] is None else m["reason"].strip())
        for m in BLOCK.finditer(document.read_text())
    ]


@dataclass
class Service:
    checkout: Path
    home: Path
    port: int
    demo_port_base: int
    log: Path

    def shell_env(self) -> dict[str, str]:
        return {
            "PATH": CLEAN_PATH,
            "HOME": str(self.home),
            "PORT": str(self.port),
            "DEMO_PORT_BASE": str(self.demo_port_base),
        }


def fresh_checkout(target: Path) -> Path:
    """The checkout's files (tracked, and new ones not ignored) copied as a clone would have
    them — no var/, no database — with the shared virtualenv linked in as .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    for name in filter(None, (raw.decode() for raw in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to((ROOT / ".venv").resolve())
    return target


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    checkout = fresh_checkout(tmp_path_factory.mktemp("checkout"))
    home = tmp_path_factory.mktemp("home")
    # The demo receivers' six ports (DEMO_PORT_BASE .. +5) and the web port, in one free block.
    base = free_port_block(7)
    service = Service(checkout, home, port=base + 6, demo_port_base=base, log=checkout / "run.log")
    # `PORT=… DEMO_PORT_BASE=… make run`, without make's set-up (the virtualenv is the shared one).
    # Unbuffered as on a terminal: its "Onceguard is up" line reaches the log when it is printed.
    env = {**service.shell_env(), "PYTHONUNBUFFERED": "1"}
    python = str(checkout / ".venv" / "bin" / "python")
    for command in (["migrate", "--noinput", "-v0"], ["accesslog_key"]):
        subprocess.run([python, "manage.py", *command], cwd=checkout, env=env, check=True, timeout=600)
    with service.log.open("wb") as log:
        process = subprocess.Popen(
            [python, "manage.py", "run_all", "--port", str(service.port)],
            cwd=checkout,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while b"is up" not in service.log.read_bytes():
            assert process.poll() is None, service.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, service.log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{service.port}/readyz", timeout=10).status_code == 200
        yield service
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def run_document(service: Service, document: Path) -> subprocess.CompletedProcess[str]:
    script = "\n".join(block.code for block in shell_blocks(document) if block.not_run is None)
    env = service.shell_env()
    return subprocess.run(
        [
            "env",
            "-i",
            *(f"{name}={value}" for name, value in env.items()),
            "bash",
            "-e",
            "-o",
            "pipefail",
            "-c",
            script,
        ],
        cwd=service.checkout,
        capture_output=True,
        text=True,
        timeout=420,
    )


@pytest.mark.heavy
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shell_block_runs_as_written_in_a_fresh_shell(service: Service, document: Path) -> None:
    done = run_document(service, document)
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-3000:], service.log.read_text(errors="replace")[-2000:])
    # What the blocks say they print, beyond a zero exit.
    compact = out.replace(" ", "")
    if document.name == "README.md":
        assert '"status":"claimed"' in compact and "lease_token" in out, out
        assert out.lower().count("idempotent-replayed: true") == 1, out
        assert re.search(r"/api/v1/operations/\d+: succeeded", out), out
        # The run's own entry heads the pending list (not the demo's "demo:n8n:17:4812"), and closes.
        assert re.search(r"(?m)^n8n:17:\d{10}$", out) and out.rstrip().endswith("resolved"), out[-500:]
    if document.name == "first-guarded-workflow.md":
        # The crash window: one effect, refused retry, settled by the sweeper, still one effect.
        assert "uncertain" in out and "operation_needs_reconciliation" in out, out
        assert re.search(r"operation \d+: succeeded", out), out
        # The render: waited on the image API, published a checked 256×192 PNG, rendered once.
        assert re.search(r"render \d+: succeeded", out), out
        assert '"media_type":"image/png","width":256,"height":192' in compact, out
        assert "200 image/png" in out and out.lower().count("idempotent-replayed: true") == 2, out
    if document.name == "n8n-lead-capture.md":
        assert "replay_needs_force" in out and out.rstrip().endswith("replayed"), out
    assert "lease_lost" not in out and "problem" not in out, out
