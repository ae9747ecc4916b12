"""The execute-mode worker process (``manage.py worker``).

One loop per process takes due operations in batches no larger than its free threads
(``operations_take``: one guarded UPDATE, SKIP LOCKED on PostgreSQL) and hands each to a
thread that sends it and records the outcome. A row is only taken when a thread is free to
send it at once: its lease starts ticking at the take. Run as many processes on as many
nodes as you like; the database decides who gets which row.

Stopping (SIGTERM/SIGINT) stops taking and lets in-flight attempts finish: each is bounded
by its provider's timeout, plus ``RECORD_RETRY_SECONDS`` when the database is unreachable
as the outcome is recorded (the record step is retried, not dropped). A process killed
outright leaves its rows ``claimed`` with the sent marker; the sweeper handles them once
their lease expires (DESIGN §3).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx
from django.db import close_old_connections, connections

from ledger.execution.attempts import operation_execute, operations_take
from ledger.models import Operation
from ledger.platform.logs import log_context, operation_fields
from ledger.platform.outage import dead_connections_discard
from ledger.providers import adapters

log = logging.getLogger("onceguard.worker")


@dataclass
class WorkerStats:
    taken: int = 0
    finished: int = 0
    errors: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


class Worker:
    """Take due operations and execute them on ``concurrency`` threads."""

    def __init__(
        self,
        *,
        concurrency: int = 8,
        poll_seconds: float = 0.5,
        name: str | None = None,
    ) -> None:
        self.concurrency = max(1, int(concurrency))
        self.poll_seconds = max(0.01, float(poll_seconds))
        self.name = name or f"worker:{socket.gethostname()}:{os.getpid()}"
        self.stats = WorkerStats()
        self._free = self.concurrency
        self._cond = threading.Condition()
        self._local = threading.local()
        self._clients: list[httpx.Client] = []

    # -- per-thread resources --------------------------------------------------------------

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = adapters.http_client()
            self._local.client = client
            with self._cond:
                self._clients.append(client)
        return client

    def _run_one(self, op: Operation, taken_at: float) -> None:
        try:
            # This thread's connection may have idled through a database restart: drop it now
            # rather than fail the record step on it (which would retry, but later).
            dead_connections_discard()
            with log_context(**operation_fields(op)):
                recorded = operation_execute(operation=op, client=self._client(), actor=self.name, taken_at=taken_at)
            with self._cond:
                self.stats.finished += 1
                status = recorded.status if recorded is not None else "refused"
                self.stats.by_status[status] = self.stats.by_status.get(status, 0) + 1
        # The row stays claimed; the sweeper takes over at lease expiry. A database blip only
        # gets here once the record step's retries are spent (execute.record_outcome_retrying).
        except Exception as exc:
            with self._cond:
                self.stats.errors += 1
            # The class only: messages may quote SQL parameters or URLs.
            log.error("worker_execute_error error=%s", type(exc).__name__, extra=operation_fields(op))
            close_old_connections()
        finally:
            with self._cond:
                self._free += 1
                self._cond.notify_all()

    def _warm_up(self, pool: ThreadPoolExecutor, timeout: float = 30.0) -> None:
        """Start every thread and its HTTP client before the first take: a send must start
        within the send window after its take (execute.operation_execute), and a cold thread
        building its TLS context on a loaded machine can take seconds of it. The barrier
        keeps each task on its own thread (an idle thread would otherwise be reused)."""
        barrier = threading.Barrier(self.concurrency)

        def warm() -> None:
            self._client()
            barrier.wait(timeout)

        futures = [pool.submit(warm) for _ in range(self.concurrency)]
        done, _ = wait(futures, timeout=timeout + 1)
        for future in done:
            if future.exception() is not None:  # a broken barrier: the threads just start later
                log.warning("worker_warm_up_incomplete error=%s", type(future.exception()).__name__)
                break

    def _close_pool_connections(self, pool: ThreadPoolExecutor) -> None:
        """Each pool thread holds its own database connection: close every one of them
        (a barrier makes each thread run exactly one of these tasks)."""
        barrier = threading.Barrier(self.concurrency)

        def close() -> None:
            try:
                barrier.wait(timeout=10)
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        for _ in range(self.concurrency):
            pool.submit(close)

    # -- the loop ----------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event,
        max_idle_seconds: float | None = None,
        max_operations: int | None = None,
    ) -> WorkerStats:
        """Work until ``stop`` is set (or idle for ``max_idle_seconds``, or after
        ``max_operations`` takes). Returns what it did."""
        idle_since = time.monotonic()
        idle_wait = 0.005
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="og-worker")
        self._warm_up(pool)
        log.info("worker_started name=%s concurrency=%s", self.name, self.concurrency)
        try:
            while not stop.is_set():
                with self._cond:
                    while self._free == 0 and not stop.is_set():
                        self._cond.wait(timeout=self.poll_seconds)
                    free = self._free
                if stop.is_set():
                    break
                if max_operations is not None:
                    free = min(free, max_operations - self.stats.taken)
                    if free <= 0:
                        break
                # Read before the take: the lease is counted from a database time after it.
                taken_at = time.monotonic()
                try:
                    taken = operations_take(limit=free, actor=self.name)
                except Exception as exc:  # database restarting, network blip: back off, go on
                    log.error("worker_take_error error=%s", type(exc).__name__)
                    close_old_connections()
                    connections["default"].close()
                    stop.wait(min(5.0, self.poll_seconds * 4))
                    continue
                if taken:
                    idle_since = time.monotonic()
                    idle_wait = 0.005
                    with self._cond:
                        self._free -= len(taken)
                        self.stats.taken += len(taken)
                    for op in taken:
                        pool.submit(self._run_one, op, taken_at)
                    continue
                if max_idle_seconds is not None and time.monotonic() - idle_since > max_idle_seconds:
                    with self._cond:
                        busy = self._free < self.concurrency
                    if not busy:
                        break
                # Nothing due (or every due row's tenant or provider at its cap): poll again soon,
                # backing off to poll_seconds while it stays quiet — or at once when a thread
                # finishes, which frees a slot under the in-flight caps (ADR 0021).
                with self._cond:
                    free_before = self._free
                    self._cond.wait_for(
                        lambda before=free_before: self._free > before or stop.is_set(), timeout=idle_wait
                    )
                idle_wait = min(self.poll_seconds, idle_wait * 2)
        finally:
            self._close_pool_connections(pool)
            pool.shutdown(wait=True)
            for client in self._clients:
                client.close()
            connections.close_all()
            log.info(
                "worker_stopped name=%s taken=%s finished=%s errors=%s",
                self.name,
                self.stats.taken,
                self.stats.finished,
                self.stats.errors,
            )
        return self.stats
