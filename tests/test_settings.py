"""The settings table (ledger.platform.env): every variable declared once, read through it, checked at
start with a message naming the variable, and the reference page generated from it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.management.commands.settings_reference import REFERENCE
from ledger.platform import env

ROOT = Path(settings.BASE_DIR)
# Out of the table's scope: the tests' and tools' own harness variables, migrations.
HARNESS = ("tests", "bench", "scripts", "soak", ".venv", "node_modules", "var", "staticfiles")
# Modules that may touch the environment directly, and why:
ENVIRONMENT_READERS = {
    # the table itself
    "ledger/platform/env/__init__.py",
    # loads var/local.env into the environment before the table is read
    "ledger/platform/local_env.py",
    # a provider's credential, named by the operator (<prefix><TENANT>_…), not a service setting
    "ledger/providers/credentials.py",
}


def _service_modules() -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in HARNESS
        and not p.relative_to(ROOT).parts[0].startswith(".")
        and "migrations" not in p.parts
    ]


def test_the_reference_page_is_the_tables() -> None:
    # Stale page: `python manage.py settings_reference` writes it from ledger/platform/env/.
    assert REFERENCE.read_text() == env.reference_markdown(), (
        "docs/reference/settings.md is stale: run `python manage.py settings_reference`"
    )


def test_the_check_command_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.management.commands import settings_reference

    stale = tmp_path / "settings.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(settings_reference, "REFERENCE", stale)
    with pytest.raises(CommandError, match="run `python manage.py settings_reference`"):
        call_command("settings_reference", "--check")
    call_command("settings_reference")
    call_command("settings_reference", "--check")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("LEASE_MIN_SECONDS", "five", "accepts a whole number"),
        ("LEASE_MIN_SECONDS", "1.5", "accepts a whole number"),
        ("LEASE_MIN_SECONDS", "0", "below 1"),
        ("RECORD_RETRY_SECONDS", "soon", "accepts a number"),
        ("RECORD_RETRY_SECONDS", "nan", "accepts a number"),
        ("DEBUG", "maybe", "accepts 1/0, true/false, yes/no or on/off"),
        ("TRUSTED_PROXIES", "10.0.0.0/8,proxy.local", "accepts comma-separated IP addresses or networks"),
        ("ERROR_SCRUB_PATTERNS", "CUST-\\d{8}\n([", "accepts regular expressions, one per line"),
        ("OBJECT_STORAGE_OPTIONS", "[1, 2]", "accepts a JSON object"),
        ("OBJECT_STORAGE_OPTIONS", "{bucket: x}", "accepts a JSON object"),
        ("LOG_FORMAT", "xml", "accepts one of kv, json"),
        ("DEFAULT_PHONE_REGION", "Australia", "matching [A-Za-z]{2}"),
    ],
)
def test_a_bad_value_is_refused_with_the_variable_and_what_it_accepts(name: str, value: str, says: str) -> None:
    with pytest.raises(env.SettingError) as refused:
        env.read(name, {name: value})
    message = str(refused.value)
    assert message.startswith(f"{name}={value!r} is not valid")
    assert says in message


def test_a_secrets_bad_value_is_never_shown() -> None:
    secret = env.Setting("SOME_TOKEN", env.INT, 0, "a token", secret=True)
    with pytest.raises(env.SettingError) as refused:
        secret.parse("hunter2-value")
    assert "hunter2" not in str(refused.value)
    assert "SOME_TOKEN=(hidden)" in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("LEASE_MIN_SECONDS", " 7 ", 7),
        ("RECORD_RETRY_SECONDS", "2.5", 2.5),
        ("DEBUG", "Yes", True),
        ("OUTBOUND_ALLOW_PUBLIC", "off", False),
        ("TRUSTED_PROXIES", " 10.0.0.0/8 , ::1 ,", ["10.0.0.0/8", "::1"]),
        ("ERROR_SCRUB_PATTERNS", "a\n\n b+ ", ["a", "b+"]),
        ("OBJECT_STORAGE_OPTIONS", '{"bucket_name": "x"}', {"bucket_name": "x"}),
        ("LOG_LEVEL", "warning", "WARNING"),
        # Unset and empty take the default …
        ("LEASE_MIN_SECONDS", "", 5),
        # … except where the empty value means "none" (as before the table).
        ("UPLOAD_MEDIA_TYPES", "", []),
        ("ALERT_MAX_ATTEMPTS", "7", 7),
    ],
)
def test_good_values_are_read_as_their_type(name: str, value: str, expected: object) -> None:
    assert env.read(name, {name: value}) == expected


def test_a_former_name_is_read_when_the_variable_is_unset() -> None:
    assert env.read("ALERT_MAX_ATTEMPTS", {"DLQ_ALERT_MAX_ATTEMPTS": "9"}) == 9
    assert env.read("ALERT_MAX_ATTEMPTS", {"DLQ_ALERT_MAX_ATTEMPTS": "9", "ALERT_MAX_ATTEMPTS": "4"}) == 4
    assert env.read("ALERT_MAX_ATTEMPTS", {}) == 5


def test_every_declared_default_is_a_value_the_setting_accepts() -> None:
    env.validate({})
    for setting in env.SETTINGS:
        assert setting.meaning and setting.group and setting.read_as, setting.name
        default = setting.default
        if isinstance(default, bool):
            assert setting.parse("1" if default else "0") is default
        elif isinstance(default, int | float) and setting.kind in (env.INT, env.FLOAT):
            assert setting.parse(str(default)) == default, setting.name


def test_validate_names_every_bad_variable_at_once() -> None:
    with pytest.raises(env.SettingError) as refused:
        env.validate({"DEBUG": "maybe", "Q_WORKERS": "many", "DATABASE_URL": "", "LEASE_MAX_SECONDS": "60"})
    lines = str(refused.value).splitlines()
    assert lines[0] == "Bad settings in the environment:"
    assert [line.split("=")[0].strip() for line in lines[1:]] == ["DEBUG", "Q_WORKERS"]


def test_the_service_does_not_start_with_a_bad_value(tmp_path: Path) -> None:
    environ = {
        "PATH": os.environ.get("PATH", ""),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "ONCEGUARD_VAR_DIR": str(tmp_path),
        "SECRET_KEY": "x" * 50,
        "CANARY_MIN_SAMPLE": "twenty",
    }
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "CANARY_MIN_SAMPLE='twenty' is not valid" in started.stderr
    assert "accepts a whole number" in started.stderr


def test_every_environment_driven_setting_group_is_declared() -> None:
    # Code reads settings.ONCEGUARD[X] with no default of its own: each X is in the table
    # (the provider secret prefix keeps its historical variable name).
    renamed = {"PROVIDER_SECRET_PREFIX": "ONCEGUARD_PROVIDER_SECRET_PREFIX"}
    for key in settings.ONCEGUARD:
        assert renamed.get(key, key) in env.BY_NAME, key
    assert settings.ONCEGUARD["RETRY_AFTER_MAX_SECONDS"] == env.read("RETRY_AFTER_MAX_SECONDS")


def _reads_the_environment(node: ast.AST) -> bool:
    """``os.environ.get(…)``, ``os.environ[…]`` (read), ``… in os.environ``, ``os.getenv(…)``."""

    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ" and isinstance(n.value, ast.Name)

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "get" and is_environ(node.func.value):
            return True
        if node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
            return True
    if isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return True
    return isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators)


def test_nothing_but_the_table_reads_the_environment() -> None:
    found = []
    for path in _service_modules():
        relative = path.relative_to(ROOT).as_posix()
        if relative in ENVIRONMENT_READERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
            if _reads_the_environment(node):
                found.append(f"{relative}:{node.lineno}")
    assert found == [], f"read these through ledger.platform.env (declare them there): {found}"


def test_no_module_keeps_a_private_settings_helper() -> None:
    found = []
    for path in _service_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in {"_cfg", "env_int", "env_bool", "_env"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert found == []
