"""A database blip (issue 11 item 7), without touching the shared PostgreSQL server: the
worker and the web server under test reach the database through a loopback TCP proxy
(tests/support/tcp_proxy.py) that the test cuts — every connection dropped, new ones
refused — and restores. The test's own connection goes straight to the server.

- A worker holding a provider's answer when the database goes away for 5 s records that
  answer once it is back: no reconciliation, no human review, one effect at the provider.
- The API answers 503 + Retry-After (problem+json `database_unavailable`) while the
  database is unreachable, never 500, and the request after the restore succeeds — on
  connections that failed during the outage and on idle ones the server dropped — with
  no restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import connection

from ledger.execution.submission import operation_submit
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol import services
from tests.execute.conftest import configure_provider
from tests.execute.support import child_env, start_worker, stop_process, wait_until
from tests.support.fixtures import *  # noqa: F403
from tests.support.ports import free_port
from tests.support.tcp_proxy import TcpProxy

S = OperationStatus
ROOT = Path(__file__).resolve().parents[2]
OUTAGE_SECONDS = 5.0

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a database outage through a TCP proxy needs PostgreSQL")


@pytest.fixture
def proxy(transactional_db: Any) -> Iterator[TcpProxy]:
    s = connection.settings_dict
    with TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)) as running:
        yield running


def proxied_database_url(proxy: TcpProxy) -> str:
    """The test database, reached through the proxy."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "") + (f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@127.0.0.1:{proxy.port}/{s['NAME']}"


def test_a_worker_holding_an_answer_records_it_after_a_five_second_outage(tenant, mock_advisory, proxy):
    # Key-advisory: a lost outcome would end in human review, and nothing may be re-sent.
    configure_provider(tenant, mock_advisory, slug="hook", enforced=False, timeout_seconds=3.0)
    # The provider holds the request 1.5 s: the outage starts while the worker waits for it.
    mock_advisory.script([{"delay": 1.5}])
    op = operation_submit(
        tenant=tenant, key="order-7007:notify:v1", provider="hook", request={"method": "POST", "path": "/charges"}
    ).operation
    env = child_env(LOG_LEVEL="INFO", DATABASE_URL=proxied_database_url(proxy))
    worker = start_worker(env=env, concurrency=2)
    try:
        assert wait_until(lambda: mock_advisory.effects()["requests"] == 1, timeout=30), "never sent"
        proxy.cut()
        started = time.monotonic()
        # The answer arrives during the outage; the record step fails on a dead connection.
        assert wait_until(lambda: mock_advisory.effects()["count"] == 1, timeout=5)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))
        assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
        proxy.restore()
        recorded = wait_until(lambda: Operation.objects.get(pk=op.pk).status != S.CLAIMED, timeout=20)
    finally:
        output = stop_process(worker)
    row = Operation.objects.get(pk=op.pk)
    assert recorded and row.status == S.SUCCEEDED, (row.status, output)
    assert row.provider_ref.startswith("ch_") and row.attempts == 1
    reasons = list(row.events.order_by("id").values_list("to_status", flat=True))
    assert reasons == [S.QUEUED, S.CLAIMED, S.SUCCEEDED], reasons
    assert mock_advisory.effects()["requests"] == 1 and mock_advisory.effects()["count"] == 1
    assert "execute_record_retry" in output, output


# --- The API ----------------------------------------------------------------------------------


@pytest.fixture
def web(proxy: TcpProxy, tmp_path: Path) -> Iterator[str]:
    """scripts/web.sh (gunicorn: one process, two threads with persistent connections)
    whose database is behind the proxy; yields its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"PG_TEST_DB_NAME", "PROMETHEUS_MULTIPROC_DIR"}}
    env.update(
        DATABASE_URL=proxied_database_url(proxy),
        DEBUG="0",
        SECURE_COOKIES="0",
        ALLOWED_HOSTS="127.0.0.1",
        HOST="127.0.0.1",
        PORT=str(port),
        WEB_WORKERS="1",
        WEB_THREADS="2",
        PYTHON=sys.executable,
        LOG_LEVEL="WARNING",
    )
    log_path = tmp_path / "web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "web.sh")],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=5, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(ready, timeout=60, interval=0.3), log_path.read_text(errors="replace")[-3000:]
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_the_api_answers_503_while_the_database_is_unreachable_and_recovers_without_restart(tenant, proxy, web):
    services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write"])
    auth = {"Authorization": f"Bearer {secret}"}
    n = iter(range(1000))

    def claim(http: httpx.Client) -> httpx.Response:
        return http.post("/api/v1/claims", json={"key": f"blip:{next(n)}", "provider": "crm", "request": {}})

    with httpx.Client(base_url=web, headers=auth, timeout=15, trust_env=False) as http:
        # Warm both threads' persistent connections.
        assert [claim(http).status_code for _ in range(4)] == [201] * 4
        proxy.cut()
        during = claim(http)
        assert during.status_code == 503, during.text
        assert during.headers["content-type"] == "application/problem+json"
        assert during.json()["code"] == "database_unavailable"
        assert int(during.headers["Retry-After"]) > 0
        # Outside DRF too: a console request whose session must be read from the database.
        console = http.get("/admin/", headers={"Cookie": "sessionid=" + "x" * 32})
        assert console.status_code == 503 and "Retry-After" in console.headers, console.text[:300]
        assert http.get("/readyz").status_code == 503
        assert http.get("/healthz").status_code == 200
        assert {claim(http).status_code for _ in range(4)} == {503}
        proxy.restore()
        assert claim(http).status_code == 201  # the very next request
        assert [claim(http).status_code for _ in range(4)] == [201] * 4

        # An outage nobody noticed: idle persistent connections closed by the server while no
        # request ran are discarded before use, not failed on.
        proxy.cut()
        time.sleep(0.5)
        proxy.restore()
        assert [claim(http).status_code for _ in range(6)] == [201] * 6
