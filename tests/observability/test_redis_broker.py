"""django-q2 on Redis (Q_REDIS_URL), for real: a redis-server on a free loopback port, the
cluster as `manage.py qcluster`, the test database shared with it.

- schedules fire through Redis (the sweeper and the alert flush run and are recorded, so the
  scheduler heartbeat and the sweeper's last run are fresh) and an alert raised in a
  transaction is delivered to its channel by a task that went through Redis;
- Redis going away and coming back loses nothing: operations never go through it (an
  execute-mode operation and its callback complete while it is down, guard-mode claims
  answer), an alert raised meanwhile is kept in its table and delivered by the flush
  schedule once Redis is back, and the cluster recovers by itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Schedule, Task

from alerts.models import Alert
from alerts.services import alert_channel_upsert, alert_raise
from ledger.execution.submission import operation_submit
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol import services
from ledger.protocol.callbacks import tenant_callback_secret
from observability.scheduler import SWEEP_FUNC, scheduler_ages
from tests.dlq.sinks import Sink
from tests.observability.support import allow_outbound, current_outbound_rules
from tests.support.fixtures import mock_enforced, mock_provider_factory  # noqa: F401
from tests.support.ports import free_port

pytestmark = [pytest.mark.heavy]
ROOT = Path(__file__).resolve().parent.parent.parent
FLUSH_FUNC = "alerts.tasks.alerts_flush_task"


def redis_server_binary() -> str:
    """redis-server, installed from Debian's package when missing (CI runs as root)."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "redis-server"],
            env=env,
            capture_output=True,
            timeout=600,
        )
        found = shutil.which("redis-server")
        if found:
            return found
    message = "redis-server is missing and Debian's redis-server package could not be installed"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class RedisServer:
    """One redis-server on 127.0.0.1, no persistence; stop() and start() keep the port."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary, self.folder, self.port = binary, folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise AssertionError("redis-server did not answer PING within 20 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        self.process = None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(redis_server_binary(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def on_redis(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> RedisServer:
    """This process enqueues to Redis too (django-q2 reads its configuration at import)."""
    if redis_server.process is None:
        redis_server.start()
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", redis_server.url)
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server


def _environment(redis_url: str) -> dict[str, str]:
    """The test database and Redis, for the processes this test starts."""
    s = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR"}}
    if connection.vendor == "postgresql":
        auth = quote(s["USER"] or "") + (f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else "")
        env["DATABASE_URL"] = f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    else:
        env["SQLITE_PATH"] = str(s["NAME"])
    env.update(Q_REDIS_URL=redis_url, Q_WORKERS="1", LOG_LEVEL="WARNING", OUTBOUND_ALLOW=current_outbound_rules())
    return env


@pytest.fixture
def start_process(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """`manage.py <command>` against the test database, stopped (SIGTERM) before it is flushed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(redis_url: str, *command: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{command[0]}-{len(started)}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "manage.py", *command],
            cwd=ROOT,
            env=_environment(redis_url),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    # SIGTERM to the command itself (qcluster stops its own workers; signalling the whole
    # group at once makes it wait for children that are already gone).
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _wait_for(what: str, check: Callable[[], object], seconds: float, logs: Path) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"{what}: not within {seconds:.0f} s\n{tails}")


def _cluster_running(server: RedisServer, logs: Path) -> None:
    """django-q2 needs its broker while it starts (without it, qcluster exits): wait for its
    heartbeat key, refreshed in Redis every guard cycle."""
    client = redis.Redis.from_url(server.url)
    _wait_for("the django-q2 cluster running", lambda: client.keys(f"{Conf.Q_STAT}:*"), 60, logs)


@pytest.fixture
def sink(settings: Any) -> Iterator[Sink]:
    started = Sink().start()
    allow_outbound(settings, started.url)
    yield started
    started.stop()


def test_schedules_and_alerts_run_through_redis(on_redis, start_process, tenant, sink, tmp_path):
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/alerts")
    call_command("schedules_install")
    Schedule.objects.update(next_run=timezone.now() - timedelta(seconds=1))
    start_process(on_redis.url, "qcluster")
    _cluster_running(on_redis, tmp_path)
    # An alert raised in a transaction: after commit its dispatch goes to Redis, the cluster
    # takes it and calls the channel.
    with transaction.atomic():
        alert_raise(tenant_id=tenant.pk, kind="dlq_new", ref="77", summary="one failed event")
    _wait_for("the alert delivered through a Redis task", lambda: sink.received(), 60, tmp_path)
    # The scheduler fires every due schedule through Redis (its first pass ~30 s after start).
    _wait_for(
        "the sweeper and the alert flush run from their schedules",
        lambda: (
            Task.objects.filter(func=SWEEP_FUNC, success=True).exists()
            and Task.objects.filter(func=FLUSH_FUNC, success=True).exists()
        ),
        90,
        tmp_path,
    )
    ages = scheduler_ages()
    assert not ages.heartbeat_stale and not ages.sweeper_stale
    assert ages.heartbeat_age_seconds < 90 and ages.sweeper_age_seconds < 90
    assert len(sink.received()) == 1
    assert Task.objects.filter(success=False).count() == 0


def test_redis_going_away_and_coming_back_loses_nothing(
    on_redis,
    start_process,
    tenant,
    mock_enforced,  # noqa: F811
    sink,
    tmp_path,
    settings,
):
    allow_outbound(settings, mock_enforced.url)
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/alerts")
    call_command("schedules_install")
    Schedule.objects.update(next_run=timezone.now() + timedelta(days=1))
    start_process(on_redis.url, "qcluster")
    start_process(on_redis.url, "worker")
    _cluster_running(on_redis, tmp_path)
    provider = services.provider_upsert(
        tenant=tenant,
        slug="charges",
        base_url=mock_enforced.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        lookup_path="/charges?idempotency_key={key}",
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=2.0,
        lookup_settle_seconds=0,
    )
    tenant.callback_allow_list = [f"{sink.url}/callbacks/"]
    tenant.save(update_fields=["callback_allow_list"])
    tenant_callback_secret(tenant_id=tenant.pk)

    on_redis.stop()
    # Operations never touch Redis: an execute-mode operation and its callback complete...
    submitted = operation_submit(
        tenant=tenant,
        key="outage:1",
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": 5}},
        callback_url=f"{sink.url}/callbacks/outage",
    )
    # ...guard-mode claims answer...
    claimed = services.operation_claim(tenant=tenant, key="outage:2", provider=provider).operation
    services.operation_complete(
        operation_id=claimed.pk, tenant_id=claimed.tenant_id, lease_token=claimed.lease_token, provider_ref="ch_2"
    )
    # ...and an alert is recorded in its transaction even though its dispatch cannot be queued.
    with transaction.atomic():
        alert_raise(tenant_id=tenant.pk, kind="dlq_new", ref="88", summary="raised while Redis was down")
    assert Alert.objects.filter(ref="88").count() == 1

    def finished() -> bool:
        op = Operation.objects.get(pk=submitted.operation.pk)
        callback = Operation.objects.filter(tenant=tenant, key=f"callback:{op.pk}").first()
        return op.status == OperationStatus.SUCCEEDED and callback is not None and callback.status == "succeeded"

    _wait_for("the execute-mode operation and its callback while Redis is down", finished, 60, tmp_path)
    assert [r.path for r in sink.received()] == ["/callbacks/outage"]

    # Redis comes back (empty: it keeps nothing); the flush schedule delivers what waited.
    on_redis.start()
    Schedule.objects.filter(func=FLUSH_FUNC).update(next_run=timezone.now() - timedelta(seconds=1))
    _wait_for(
        "the alert raised during the outage, delivered once Redis is back",
        lambda: any(r.path == "/alerts" for r in sink.received()),
        120,
        tmp_path,
    )
    assert sorted(r.path for r in sink.received()) == ["/alerts", "/callbacks/outage"]
    assert "88" in sink.bodies_text()
    assert mock_enforced.effects()["by_key"] == {"outage:1": 1}  # the effect happened once
    assert Operation.objects.get(pk=claimed.pk).status == OperationStatus.SUCCEEDED
