"""/metrics speaks Prometheus text (through prometheus-client) and reflects the ledger, the
DLQ, the scheduler and the latency histograms of every process sharing the metrics folder;
on every port it is served on it answers only a scraper with the configured bearer token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from django_q.models import Task
from prometheus_client.parser import text_string_to_metric_families

from ledger.models import IdempotencyClass
from ledger.protocol import services
from observability.metrics import metrics_wsgi_app
from tests.execute.support import child_env
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "scraper-token-0123456789abcdef"
BEARER = f"Bearer {TOKEN}"


@pytest.fixture(autouse=True)
def metrics_token(settings: Any) -> str:
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


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
    response = Client().get("/metrics", HTTP_AUTHORIZATION=BEARER, **headers)
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


def _claimed_for_two_tenants(tenant: Any, other_tenant: Any) -> None:
    """Open operations of both tenants: an exposition would name them in its labels."""
    for t in (tenant, other_tenant):
        p = services.provider_upsert(
            tenant=t, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
        )
        services.operation_claim(tenant=t, key="t:1", provider=p)


def _assert_refused(status: int, content_type: str, body: bytes, expected: int) -> None:
    assert status == expected and content_type == "application/problem+json"
    problem = json.loads(body)
    assert problem["status"] == expected and problem["code"] == ("unauthenticated" if expected == 401 else "not_found")
    assert b"acme" not in body and b"globex" not in body and b"onceguard_" not in body


def test_an_anonymous_scrape_gets_401_problem_json_naming_no_tenant(tenant, other_tenant):
    _claimed_for_two_tenants(tenant, other_tenant)
    assert 'tenant="globex"' in _scrape()  # what the token protects
    response = Client().get("/metrics")
    _assert_refused(response.status_code, response["Content-Type"], response.content, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Basic {TOKEN}", TOKEN, f"Token {TOKEN}"],
    ids=["longer", "shorter", "empty", "basic scheme", "no scheme", "token scheme"],
)
def test_a_wrong_token_or_another_scheme_gets_401(authorization, tenant, other_tenant):
    _claimed_for_two_tenants(tenant, other_tenant)
    response = Client().get("/metrics", HTTP_AUTHORIZATION=authorization)
    _assert_refused(response.status_code, response["Content-Type"], response.content, 401)


def test_the_scheme_is_case_insensitive_and_the_right_token_gets_the_exposition(tenant, other_tenant):
    _claimed_for_two_tenants(tenant, other_tenant)
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert _value(response.content.decode(), "onceguard_open_operations", tenant="acme", status="claimed") == 1


def test_metrics_are_off_with_404_when_no_token_is_configured(settings, tenant, other_tenant):
    _claimed_for_two_tenants(tenant, other_tenant)
    settings.METRICS_TOKEN = ""
    for headers in ({}, {"HTTP_AUTHORIZATION": BEARER}, {"HTTP_AUTHORIZATION": "Bearer "}):
        response = Client().get("/metrics", **headers)
        _assert_refused(response.status_code, response["Content-Type"], response.content, 404)


def test_the_metrics_serve_app_is_off_with_404_when_no_token_is_configured(settings):
    settings.METRICS_TOKEN = ""
    answered: list[Any] = []
    body = b"".join(
        metrics_wsgi_app(
            {"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": BEARER}, lambda status, headers: answered.append(headers)
        )
    )
    assert dict(answered[0])["Content-Type"] == "application/problem+json"
    _assert_refused(json.loads(body)["status"], "application/problem+json", body, 404)


def test_a_short_metrics_token_stops_the_start(tmp_path):
    env = {**os.environ, "METRICS_TOKEN": "s3cret", "ONCEGUARD_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "at least 16 characters" in done.stderr


def test_the_token_can_come_from_a_file_as_prometheus_reads_it(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    code = "from django.conf import settings; print(settings.METRICS_TOKEN)"
    env = {**os.environ, "METRICS_TOKEN_FILE": str(tmp_path / "token"), "ONCEGUARD_VAR_DIR": str(tmp_path)}
    env.pop("METRICS_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == TOKEN


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
        "from ledger.platform.telemetry import observe_claim, observe_provider_call\n"
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
    # A call without an intent has empty render labels (preset_version, aspect_class: ADR 0016).
    assert (
        _value(
            text,
            "onceguard_provider_call_duration_seconds_count",
            provider="crm",
            outcome="succeeded",
            revision="",
            preset_version="",
            aspect_class="",
        )
        == 2
    )
    assert _value(text, "onceguard_active_leases") == 0  # the database's figures are still there


def test_provider_labels_per_process_are_bounded():
    from ledger.platform.telemetry import OTHER, BoundedLabel

    label = BoundedLabel(2)
    assert [label(v) for v in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]


def test_metrics_serve_exposes_a_worker_only_nodes_metrics_to_the_token_only(tmp_path, transactional_db, tenant):
    """`manage.py metrics_serve`: the same exposition without a web server, per scrape, behind
    the same token as the web app's /metrics."""
    services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    port = free_port()
    folder = tmp_path / "prom"
    folder.mkdir()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(folder), METRICS_TOKEN=TOKEN)
    env.pop("METRICS_TOKEN_FILE", None)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from ledger.platform.telemetry import observe_provider_call as o; o(provider='crm', seconds=1.5, outcome='transient')",
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
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        anonymous, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline and anonymous is None:
            try:
                anonymous = httpx.get(url, timeout=5, trust_env=False)
            except httpx.HTTPError:
                time.sleep(0.3)
        assert anonymous is not None
        _assert_refused(anonymous.status_code, anonymous.headers["Content-Type"], anonymous.content, 401)
        assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
        wrong = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}x"}, timeout=5, trust_env=False)
        _assert_refused(wrong.status_code, wrong.headers["Content-Type"], wrong.content, 401)
        elsewhere = httpx.get(
            f"http://127.0.0.1:{port}/", headers={"Authorization": BEARER}, timeout=5, trust_env=False
        )
        _assert_refused(elsewhere.status_code, elsewhere.headers["Content-Type"], elsewhere.content, 404)
        scraped = httpx.get(url, headers={"Authorization": BEARER}, timeout=5, trust_env=False)
        assert scraped.status_code == 200
        text = scraped.text
        assert (
            _value(
                text,
                "onceguard_provider_call_duration_seconds_count",
                provider="crm",
                outcome="transient",
                revision="",
                preset_version="",
                aspect_class="",
            )
            == 1
        )
        assert _value(text, "onceguard_active_leases") == 0
    finally:
        server.terminate()
        server.wait(timeout=20)
