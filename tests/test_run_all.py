"""`make run`'s command starts the whole service on a fresh embedded database and stops
cleanly on Ctrl-C; `schedules_install` installs every app's schedules."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django_q.models import Schedule

from tests.conftest import on_postgres
from tests.support.run_all import run_all

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_schedules_install_installs_every_apps_schedules_idempotently():
    call_command("schedules_install")
    call_command("schedules_install")
    names = set(Schedule.objects.values_list("name", flat=True))
    assert "ledger.sweep" in names and "review.retention_purge" in names and "ledger.objects_sweep" in names
    assert any(n.startswith("dlq") for n in names)
    assert Schedule.objects.filter(name="ledger.sweep").count() == 1


def test_run_all_serves_the_console_and_api_and_stops_on_ctrl_c(tmp_path, db):
    if on_postgres():
        pytest.skip("the embedded mode is SQLite")
    with run_all(tmp_path) as service:
        port, proc = service.port, service.process
        deadline = time.monotonic() + 60
        answered = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        output = (tmp_path / "run.log").read_text(errors="replace")
        assert answered == 200, output[-3000:]
        key = next(line.split(":", 1)[1].strip() for line in output.splitlines() if "API key" in line)
        claim = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/claims",
            json={"provider": "demo-charges", "request": {"amount": 1}},
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "smoke:1"},
            timeout=10,
        )
        assert claim.status_code == 201, claim.text
        assert "console login : admin /" in output
        # Execute mode end to end: the worker sends through the demo relay to the demo mock.
        auth = {"Authorization": f"Bearer {key}"}
        submitted = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/operations",
            json={
                "key": "smoke:2",
                "provider": "demo-charges",
                "request": {"method": "POST", "path": "/charges", "body": {"amount": 1}},
            },
            headers=auth,
            timeout=10,
        )
        assert submitted.status_code == 202, submitted.text
        body: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and body.get("status") != "succeeded":
            time.sleep(0.3)
            location = f"http://127.0.0.1:{port}{submitted.headers['Location']}"
            body = httpx.get(location, headers=auth, timeout=5).json()
        log_lines = [
            line for line in (tmp_path / "run.log").read_text(errors="replace").splitlines() if "GET /api" not in line
        ]
        assert body.get("status") == "succeeded", (body.get("last_error"), log_lines[-20:])
        # The demo's metrics: behind the token make run made, and it says where that is.
        token_file = tmp_path / "metrics_token"
        metrics = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(metrics, timeout=10).status_code == 401
        scraped = httpx.get(metrics, headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}, timeout=10)
        assert scraped.status_code == 200 and "onceguard_active_leases" in scraped.text
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "Metrics: curl" not in service.output():
            time.sleep(0.3)
        assert f'Bearer $(cat {token_file})" {metrics}' in service.output()
        # The sign-in page shows the demo's admin login (make run's scrollback is no longer needed).
        login = httpx.get(f"http://127.0.0.1:{port}/admin/login/", timeout=10).text
        assert 'data-testid="demo-sign-in"' in login and "<code>admin</code>" in login
        # A README block in a second terminal: a clean environment, not make run's, reads the
        # demo's loopback allowance from var/local.env (ledger.platform.local_env).
        base = int(service.env["DEMO_PORT_BASE"])
        local = (tmp_path / "local.env").read_text()
        assert f"\nDEMO_OUTBOUND_ALLOW=127.0.0.1:{base}-{base + 5}\n" in local
        assert f"\nDEMO_PORT_BASE={base}\n" in local and "\nREQUEST_LOG_SLOW_MS=1000\n" in local
        # The demo admin signs in with its password alone even where CONSOLE_REQUIRE_MFA is on (ADR 0014).
        assert "\nCONSOLE_MFA_EXEMPT_USERS=admin\n" in local
        clean = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "ONCEGUARD_VAR_DIR": str(tmp_path),
        }
        upsert = subprocess.run(
            [sys.executable, "manage.py", "replaytarget_upsert", "--tenant", "demo", "--slug", "n8n-retry"]
            + ["--url", f"http://127.0.0.1:{base + 2}/contacts", "--idempotency-class", "key_advisory"],
            cwd=ROOT,
            env=clean,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upsert.returncode == 0, upsert.stderr[-2000:]
        # The demo lead replays to the demo's own mock CRM (its default target) out of the box.
        stuck = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/dlq/events?status=pending&workflow=17", headers=auth, timeout=10
        ).json()["results"][0]["id"]
        replayed = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/dlq/events/{stuck}/replay", json={}, headers=auth, timeout=30
        ).json()
        assert replayed["outcome"] == "succeeded", replayed
        effects = httpx.get(f"http://127.0.0.1:{base}/_effects", timeout=10).json()
        assert effects["by_key"].get("demo:call_7f3c2a9e41b04d6f:crm-contact:v1") == 1, effects
        # A quiet console: no line for the requests that answered quickly and well.
        assert "path=/api/v1/operations/" not in service.output() and "GET /admin/login/" not in service.output()
    assert proc.returncode == 0, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
