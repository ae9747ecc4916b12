"""The production recipe as documented: `check --deploy` is clean with scripts/production.env,
and scripts/web.sh (the README's server command) boots with it, passes /readyz, serves the
console behind the TLS proxy and adds up its workers' metrics."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from cryptography.fernet import Fernet
from django.db import connection

from ledger.models import IdempotencyClass
from ledger.protocol import services
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
PRODUCTION_ENV = ROOT / "scripts" / "production.env"
WEB = ROOT / "scripts" / "web.sh"


def documented_environment() -> dict[str, str]:
    """scripts/production.env as a dict (the names the README tells operators to set)."""
    env = {}
    for line in PRODUCTION_ENV.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def production_environment(tmp_path: Path, database_url: str | None = None) -> dict[str, str]:
    """The documented environment with this machine's secrets, folders and database."""
    documented = documented_environment()
    assert {"SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "SECURE_COOKIES", "DATABASE_URL"} <= documented.keys()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SQLITE_PATH", "DEBUG", "SECURE_COOKIES"}}
    env.update(documented)
    env.update(
        SECRET_KEY=secrets.token_urlsafe(50),
        ONCEGUARD_ENCRYPTION_KEYS=f"key1:{Fernet.generate_key().decode()}",
        METRICS_TOKEN=secrets.token_urlsafe(16),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        ONCEGUARD_VAR_DIR=str(tmp_path / "var"),
    )
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    env = production_environment(tmp_path)
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_would_flag_a_weak_setting(tmp_path):
    env = production_environment(tmp_path) | {"SECURE_COOKIES": "0"}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "security.W012" in done.stderr + done.stdout


def _database_url() -> str | None:
    """The test database as a DATABASE_URL (None on SQLite: SQLITE_PATH is used)."""
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        return None
    auth = quote(s["USER"] or "") + (f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.mark.heavy
def test_the_production_recipe_boots_and_serves_behind_the_tls_proxy(tmp_path, transactional_db):
    env = production_environment(tmp_path, _database_url())
    if connection.vendor != "postgresql":
        env["SQLITE_PATH"] = str(connection.settings_dict["NAME"])
    port = free_port()
    env.update(HOST="127.0.0.1", PORT=str(port), WEB_WORKERS="2", WEB_THREADS="2", PYTHON=sys.executable)
    for step in (["migrate", "--noinput"], ["schedules_install"]):
        subprocess.run([sys.executable, "manage.py", *step], cwd=ROOT, env=env, check=True, timeout=300)
    tenant = services.tenant_create(slug="prod")
    services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    _, key = services.apikey_create(tenant=tenant, scopes=["read", "write"])
    log = (tmp_path / "web.log").open("wb")
    web = subprocess.Popen(
        ["bash", str(WEB)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        ready, deadline = None, time.monotonic() + 60
        with httpx.Client(trust_env=False, timeout=5) as http:
            while time.monotonic() < deadline and web.poll() is None:
                try:
                    ready = http.get(f"{base}/readyz")
                    if ready.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            output = lambda: (tmp_path / "web.log").read_text(errors="replace")[-3000:]  # noqa: E731
            assert ready is not None and ready.status_code == 200, output()
            assert ready.json()["checks"] == {"database": "ok", "migrations": "ok"}
            # The load balancer probes by address over plain http: answered, not redirected.
            assert http.get(f"{base}/healthz", headers={"Host": "10.0.0.7"}).status_code == 200
            proxied = {"Host": "onceguard.example", "X-Forwarded-Proto": "https"}
            assert http.get(f"{base}/admin/login/", headers={"Host": "onceguard.example"}).status_code == 301
            login = http.get(f"{base}/admin/login/", headers=proxied)
            assert login.status_code == 200 and b"Onceguard" in login.content
            assert "Secure" in login.headers.get("set-cookie", "")
            assert "includeSubDomains" in login.headers["strict-transport-security"]
            assert http.get(f"{base}/admin/login/", headers={**proxied, "Host": "evil.example"}).status_code == 400
            # Claims are timed in whichever worker takes them; /metrics reads every worker's file.
            auth = {**proxied, "Authorization": f"Bearer {key}"}
            for i in range(8):
                claim = http.post(
                    f"{base}/api/v1/claims",
                    json={"provider": "crm", "request": {"n": i}},
                    headers={**auth, "Idempotency-Key": f"prod:{i}"},
                )
                assert claim.status_code == 201, claim.text
            assert http.get(f"{base}/metrics", headers=proxied).status_code == 401
            metrics = http.get(
                f"{base}/metrics", headers={**proxied, "Authorization": f"Bearer {env['METRICS_TOKEN']}"}
            )
            assert metrics.status_code == 200
            assert 'onceguard_claim_duration_seconds_count{outcome="created"} 8.0' in metrics.text
            assert list((tmp_path / "prometheus").glob("histogram_*.db"))  # written by the web workers
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait(timeout=10)
        log.close()
    # LOG_FORMAT=json: the access log is one JSON object per line.
    access = [line for line in (tmp_path / "web.log").read_text().splitlines() if '"http_request"' in line]
    assert access and all(json.loads(line)["event"] == "http_request" for line in access)
