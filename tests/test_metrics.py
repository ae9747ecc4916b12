"""/metrics speaks Prometheus text (through prometheus-client) and reflects the ledger, the
DLQ, the scheduler and the latency histograms of every process sharing the metrics folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from django_q.models import Task
from prometheus_client.parser import text_string_to_metric_families

from ledger import services
from ledger.models import IdempotencyClass
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition by (name, sorted labels): also proves it parses."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(text: str, name: str, **labels: str) -> float:
    return _samples(text)[(name, tuple(sorted(labels.items())))]


def _scrape(**headers: str) -> str:
    response = Client().get("/metrics", **headers)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def test_metrics_show_leases_review_backlog_and_dlq_by_status(tenant):
    provider = services.provider_upsert(
        tenant=tenant, slug="mail", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )
    held = services.operation_claim(tenant=tenant, key="m:1", provider=provider, mark_sent=True).operation
    failed = services.operation_claim(tenant=tenant, key="m:2", provider=provider).operation
    services.operation_fail(
        operation_id=failed.pk, tenant_id=failed.tenant_id, lease_token=failed.lease_token, error_class="invalid_input"
    )
    text = _scrape()
    assert _value(text, "onceguard_active_leases") == 1
    assert _value(text, "onceguard_review_backlog") == 0
    assert _value(text, "onceguard_dlq_entries", status="pending") == 1
    assert _value(text, "onceguard_dlq_pending_entries", tenant="acme") == 1
    assert _value(text, "onceguard_open_operations", tenant="acme", status="claimed") == 1
    assert "# TYPE onceguard_attempts_total counter" in text
    assert _value(text, "onceguard_attempts_total", outcome="pending") == 1
    assert "m:1" not in text and held.key not in text  # no keys or payloads


def test_metrics_token_is_required_when_configured(monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", "s3cret")
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_claims_through_the_api_land_in_the_claim_latency_histogram_by_outcome(api):
    def count(outcome: str) -> float:
        return _samples(_scrape()).get(("onceguard_claim_duration_seconds_count", (("outcome", outcome),)), 0.0)

    before = {o: count(o) for o in ("created", "replayed", "operation_in_progress")}
    body = {"provider": "stripe", "request": {"amount": 1}}
    assert api.post("/api/v1/claims", body, format="json", HTTP_IDEMPOTENCY_KEY="h:1").status_code == 201
    assert api.post("/api/v1/claims", body, format="json", HTTP_IDEMPOTENCY_KEY="h:1").status_code == 409
    assert count("created") == before["created"] + 1
    assert count("operation_in_progress") == before["operation_in_progress"] + 1
    assert count("replayed") == before["replayed"]


def test_tenant_labels_are_bounded_the_smaller_tenants_are_summed_as_other(settings, tenant, other_tenant):
    settings.METRICS_TENANT_LABELS = 1
    for t, n in ((tenant, 2), (other_tenant, 1)):
        p = services.provider_upsert(
            tenant=t, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
        )
        for i in range(n):
            services.operation_claim(tenant=t, key=f"b:{i}", provider=p)
    text = _scrape()
    assert _value(text, "onceguard_open_operations", tenant="acme", status="claimed") == 2
    assert _value(text, "onceguard_open_operations", tenant="_other", status="claimed") == 1
    assert "globex" not in text


def test_a_paused_or_throttled_provider_is_listed_and_only_those(tenant, provider):
    services.provider_upsert(
        tenant=tenant, slug="quiet", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    services.provider_pause(provider_id=provider.pk, actor="test", reason="401")
    text = _scrape()
    assert _value(text, "onceguard_provider_held_back", tenant="acme", provider="stripe", reason="paused") == 1
    assert 'provider="quiet"' not in text


def test_scheduler_heartbeat_and_sweeper_age_come_from_finished_tasks_and_go_stale(settings):
    settings.SCHEDULER_STALE_SECONDS = 300
    settings.SWEEPER_STALE_SECONDS = 600
    now = timezone.now()

    def task(name: str, func: str, minutes_ago: float) -> None:
        at = now - timedelta(minutes=minutes_ago)
        Task.objects.create(id=name, name=name, func=func, started=at, stopped=at, success=True)

    task("t1", "ledger.schedules.sweep_task", 20)
    task("t2", "dlq.tasks.alerts_flush_task", 1)
    text = _scrape()
    assert 55 <= _value(text, "onceguard_scheduler_heartbeat_age_seconds") <= 120
    assert _value(text, "onceguard_scheduler_stale") == 0
    assert 1195 <= _value(text, "onceguard_sweeper_last_run_age_seconds") <= 1260
    assert _value(text, "onceguard_sweeper_stale") == 1


def test_histograms_of_several_processes_are_added_up(tmp_path, monkeypatch):
    """Two processes record claims into one multi-process folder; /metrics sums them."""
    folder = tmp_path / "prom"
    folder.mkdir()
    code = (
        "from ledger.telemetry import observe_claim, observe_provider_call\n"
        "for _ in range(3): observe_claim(seconds=0.004, outcome='created')\n"
        "observe_provider_call(provider='crm', seconds=0.2, outcome='succeeded')\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)
    assert len(list(folder.glob("*.db"))) >= 2  # one file per process
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    text = _scrape()
    assert _value(text, "onceguard_claim_duration_seconds_count", outcome="created") == 6
    assert _value(text, "onceguard_claim_duration_seconds_bucket", outcome="created", le="0.005") == 6
    assert _value(text, "onceguard_claim_duration_seconds_bucket", outcome="created", le="0.0025") == 0
    assert (
        _value(text, "onceguard_provider_call_duration_seconds_count", provider="crm", outcome="succeeded", revision="")
        == 2
    )
    assert _value(text, "onceguard_active_leases") == 0  # the database's figures are still there


def test_provider_labels_per_process_are_bounded():
    from ledger.telemetry import OTHER, BoundedLabel

    label = BoundedLabel(2)
    assert [label(v) for v in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]


def test_metrics_serve_exposes_a_worker_only_nodes_metrics(tmp_path, transactional_db):
    """`manage.py metrics_serve`: the same exposition without a web server, per scrape."""
    if connection.vendor != "sqlite":
        pytest.skip("reads the SQLite test database directly; the exposition is the same on PostgreSQL")
    port = free_port()
    folder = tmp_path / "prom"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "SQLITE_PATH": str(connection.settings_dict["NAME"])}
    env.pop("DATABASE_URL", None)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from ledger.telemetry import observe_provider_call as o; o(provider='crm', seconds=1.5, outcome='transient')",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
    )
    server = subprocess.Popen(
        [sys.executable, "manage.py", "metrics_serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        text, deadline = "", time.monotonic() + 30
        while time.monotonic() < deadline and not text:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
            except httpx.HTTPError:
                time.sleep(0.3)
        assert (
            _value(
                text, "onceguard_provider_call_duration_seconds_count", provider="crm", outcome="transient", revision=""
            )
            == 1
        )
        assert _value(text, "onceguard_active_leases") == 0
    finally:
        server.terminate()
        server.wait(timeout=20)
