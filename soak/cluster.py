"""A private PostgreSQL cluster for the soak: initdb into a temporary folder, its own free
port on 127.0.0.1, restartable (the soak restarts it once mid-run), removed afterwards.

Never the shared server on 5432: other suites use it at the same time, and the soak
restarts its database on purpose. As root, initdb and postgres refuse to run, so they run
as the ``postgres`` user (``runuser``) in a folder that user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

PG_BIN_DIRS = (os.environ.get("PG_BIN_DIR", ""), "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")
START_TIMEOUT_SECONDS = 60


class ClusterError(RuntimeError):
    pass


def _pg_bin(name: str) -> str:
    for folder in PG_BIN_DIRS:
        if folder and (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if found:
        return found
    raise ClusterError(f"{name} not found (looked in {', '.join(d for d in PG_BIN_DIRS if d)} and PATH)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateCluster:
    """``start()`` creates and starts it; ``restart()`` is ``pg_ctl restart -m fast``;
    ``destroy()`` stops it and removes the folder (idempotent)."""

    def __init__(self, *, database: str = "onceguard", max_connections: int = 200) -> None:
        self.database = database
        self.max_connections = max_connections
        self.port = 0
        self.root: Path | None = None
        self._as_postgres = os.geteuid() == 0
        self._started = False

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, argv: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/"
        )
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(argv[:6])}… exited {result.returncode}: {result.stderr.strip()[-800:]}")
        return result

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="onceguard-soak-pg-"))
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.port = free_port()
        self._run(
            [_pg_bin("initdb"), "-D", str(self.data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
        )
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                f"-c max_connections={self.max_connections}",
                # Durability is not what the soak tests: a fast restart must not lose commits
                # (it does not: fast shutdown checkpoints), and fsync only costs time here.
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c shared_buffers=64MB",
            ]
        )
        self._options = options
        self._pg_ctl("start", "-w", "-t", str(START_TIMEOUT_SECONDS), "-o", options)
        self._started = True
        self._wait_ready()
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def _pg_ctl(self, *args: str) -> None:
        self._run(
            [_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.root / "postgres.log"), *args],
            timeout=START_TIMEOUT_SECONDS + 30,
        )

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database} connect_timeout=2"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                psycopg.connect(self._dsn("postgres")).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise ClusterError("the private PostgreSQL did not accept connections in time") from None
                time.sleep(0.2)

    def restart(self) -> float:
        """``pg_ctl restart -m fast``: every connection is cut. Returns the seconds it took."""
        started = time.monotonic()
        self._pg_ctl("restart", "-m", "fast", "-w", "-t", str(START_TIMEOUT_SECONDS), "-o", self._options)
        self._wait_ready()
        return time.monotonic() - started

    def log_tail(self, limit: int = 3000) -> str:
        if self.root is None:
            return ""
        path = self.root / "postgres.log"
        return path.read_text(errors="replace")[-limit:] if path.exists() else ""

    def destroy(self) -> None:
        if self.root is None:
            return
        if self._started:
            try:
                self._pg_ctl("stop", "-m", "immediate", "-w", "-t", "30")
            except (ClusterError, subprocess.TimeoutExpired):
                pass
            self._started = False
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
