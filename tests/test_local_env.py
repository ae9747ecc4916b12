"""The demo's one local configuration (ledger.platform.local_env): `make run` writes var/local.env and
every manage.py process of the checkout reads it — a command started in a clean environment
(not make run's) gets the demo's loopback allowance — but only under the demo settings: with
production's DATABASE_URL or DEBUG=0 the same file is ignored, and a real environment variable
always wins. Also the quiet console: the request log keeps only errors and slow requests, and
the sign-in page shows the demo admin's login only under the demo settings."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

from ledger.platform import local_env

ROOT = Path(__file__).resolve().parent.parent
PROBE = (
    "import os; from django.conf import settings; from ledger.rules.outbound import outbound_refusal;"
    " print(repr(outbound_refusal('http://127.0.0.1:8012/contacts', purpose='probe')));"
    " print(os.environ.get('DEMO_PORT_BASE'))"
)


def manage_py_in_a_clean_environment(var_dir: Path, **extra: str) -> list[str]:
    """`manage.py shell -c PROBE` with only PATH, HOME and the var folder: nothing of make run's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(var_dir), "ONCEGUARD_VAR_DIR": str(var_dir)}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PROBE],
        cwd=ROOT,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-2:]


@pytest.fixture
def demo_var(tmp_path: Path) -> Path:
    (tmp_path / local_env.FILE_NAME).write_text(
        local_env.render({"DEMO_PORT_BASE": "8010", "DEMO_OUTBOUND_ALLOW": "127.0.0.1:8010-8015"})
    )
    return tmp_path


def test_a_command_in_a_clean_shell_reads_the_demo_s_loopback_allowance_from_var_local_env(demo_var):
    refusal, base = manage_py_in_a_clean_environment(demo_var)
    assert (refusal, base) == ("None", "8010")


def test_without_the_file_the_same_command_is_refused_by_the_outbound_policy(tmp_path):
    refusal, base = manage_py_in_a_clean_environment(tmp_path)
    assert "127.0.0.1" in refusal and base == "None"


@pytest.mark.parametrize(
    "production",
    [{"DATABASE_URL": "postgres://onceguard@127.0.0.1:1/onceguard"}, {"DEBUG": "0"}],
    ids=["database_url", "debug_off"],
)
def test_production_settings_ignore_the_file_and_never_widen_the_outbound_policy(demo_var, production):
    refusal, base = manage_py_in_a_clean_environment(demo_var, **production)
    assert "127.0.0.1" in refusal and base == "None"


def test_a_real_environment_variable_wins_over_the_file(demo_var):
    _, base = manage_py_in_a_clean_environment(demo_var, DEMO_PORT_BASE="9100")
    assert base == "9100"


def test_the_file_sets_only_its_documented_names():
    parsed = local_env.parse('DEMO_PORT_BASE="8020"\n# note\nOUTBOUND_ALLOW_PUBLIC=0\nSECRET_KEY=x\n')
    assert parsed == {"DEMO_PORT_BASE": "8020"}
    environ = {"DEBUG": "false"}
    assert not local_env.applies(environ) and local_env.applies({})


@pytest.mark.django_db
def test_the_request_log_keeps_errors_and_slow_requests_only(caplog):
    caplog.set_level(logging.INFO, logger="onceguard.requests")
    with override_settings(REQUEST_LOG_SLOW_MS=60_000):
        client = Client()
        assert client.get("/admin/login/").status_code == 200
        assert client.get("/admin/no-such-page/").status_code in (302, 404)
        client.get("/api/v1/operations")
    lines = [r.getMessage() for r in caplog.records if r.name == "onceguard.requests"]
    assert lines == ["request method=GET path=/api/v1/operations status=401 duration_ms=" + lines[-1].split("=")[-1]]
    caplog.clear()
    with override_settings(REQUEST_LOG_SLOW_MS=0):
        Client().get("/api/v1/operations")
    assert not [r for r in caplog.records if r.name == "onceguard.requests"]


@pytest.mark.django_db
@pytest.mark.parametrize("demo", [True, False], ids=["demo_settings", "production_settings"])
def test_the_sign_in_page_shows_the_demo_login_only_under_the_demo_settings(tmp_path, demo):
    (tmp_path / "credentials.txt").write_text(
        "Onceguard demo credentials (also in var/credentials.txt):\n  console login : admin / pw-Demo-123\n"
    )
    with override_settings(DEMO_SETTINGS=demo, VAR_DIR=tmp_path):
        text = Client().get("/admin/login/").content.decode()
    assert ('data-testid="demo-sign-in"' in text) is demo
    assert ("<code>admin</code>" in text and "<code>pw-Demo-123</code>" in text) is demo
