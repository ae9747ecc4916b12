"""Files holding secrets are born mode 600 and complete (issue 11 item 9): var/secret_key,
var/encryption.key, var/credentials.txt, var/demo-users.txt. Today's code wrote them with the
process umask (often 644) and chmod-ed afterwards: a reader in between — or a crash in
between, played here by a chmod that fails — left the secret world-readable."""

from __future__ import annotations

import os
import stat
import threading
from io import StringIO
from pathlib import Path

import pytest

from ledger.platform.secret_files import read_or_create_secret_file, write_secret_file


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.fixture
def chmod_crashes(monkeypatch):
    def crash(self, *args, **kwargs):
        raise OSError("crashed before chmod")

    monkeypatch.setattr(Path, "chmod", crash)


def test_a_secret_file_is_600_even_under_an_open_umask(tmp_path, open_umask):
    path = tmp_path / "k"
    assert write_secret_file(path, "s3cret")
    assert _mode(path) == 0o600 and path.read_text() == "s3cret"
    assert not write_secret_file(path, "other")  # kept
    assert write_secret_file(path, "other", replace=True)
    assert _mode(path) == 0o600 and path.read_text() == "other"
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no temporary file left behind


def test_racing_creators_agree_on_one_complete_value(tmp_path):
    path = tmp_path / "secret_key"
    seen: list[str] = []
    barrier = threading.Barrier(8)

    def create(n: int) -> None:
        barrier.wait(timeout=5)
        seen.append(read_or_create_secret_file(path, f"value-{n}" * 10))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1 and seen[0].startswith("value-")


def test_the_django_secret_key_file_is_born_600(tmp_path, monkeypatch, open_umask, chmod_crashes):
    from config import settings as config_settings

    monkeypatch.delenv("SECRET_KEY", raising=False)
    monkeypatch.setattr(config_settings, "VAR_DIR", tmp_path)
    key = config_settings._secret_key()
    assert len(key) > 40 and _mode(tmp_path / "secret_key") == 0o600


def test_the_encryption_key_file_is_born_600(tmp_path, settings, monkeypatch, open_umask, chmod_crashes):
    from ledger.platform import crypto

    monkeypatch.delenv(crypto.KEYS_ENV, raising=False)
    settings.VAR_DIR = tmp_path
    crypto._cache.clear()
    try:
        crypto.keyring()
        assert _mode(tmp_path / "encryption.key") == 0o600
    finally:
        crypto._cache.clear()


@pytest.mark.django_db
def test_the_demo_credentials_file_is_born_600(tmp_path, monkeypatch, open_umask, chmod_crashes, outbound_allow):
    from django.core.management import call_command

    from ledger.management.commands import bootstrap_demo

    monkeypatch.setattr(bootstrap_demo, "CREDENTIALS", tmp_path / "credentials.txt")
    call_command("bootstrap_demo", "--port-base", "18010", stdout=StringIO())
    assert _mode(tmp_path / "credentials.txt") == 0o600
    assert "API key" in (tmp_path / "credentials.txt").read_text()
