"""Fixtures of the n8n suite: the pinned n8n (installed once per machine), the node package
built from integrations/n8n, a migrated n8n user folder with the credentials, and the
Onceguard side (the live server, an API key n8n's credential holds, mock providers).

The n8n suite is heavy: tests/conftest.py runs it only in the PostgreSQL pass.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.models import ApiKey, Tenant
from ledger.tenants.auth import hash_api_key
from tests.n8n.support import (
    CALLER_CREDENTIAL_ID,
    CALLER_HEADER,
    CALLER_TOKEN,
    HEADER_CREDENTIAL_ID,
    ONCEGUARD_CREDENTIAL_ID,
    N8n,
    build_node_package,
    install_n8n,
)

# One API key secret for the whole run: n8n's credentials are imported once, and each test
# stores this secret's hash for its own tenant (test databases are emptied between tests).
API_SECRET = f"og_n8ntest_{secrets.token_urlsafe(24)}"
TIMINGS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        parts = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in TIMINGS.items())
        terminalreporter.write_line(f"n8n suite timings: {parts}")


@pytest.fixture(scope="session")
def n8n_binary() -> Path:
    binary, seconds = install_n8n()
    TIMINGS["install check"] = seconds
    return binary


@pytest.fixture(scope="session")
def node_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.monotonic()
    package = build_node_package(tmp_path_factory.mktemp("n8n-package"))
    TIMINGS["node build"] = time.monotonic() - started
    return package


@pytest.fixture(scope="session")
def onceguard_url(live_server: Any) -> str:
    # pytest-django's live server binds the IPv4 loopback; name it so n8n never tries ::1.
    return live_server.url.replace("localhost", "127.0.0.1")


def credentials(onceguard_url: str) -> list[dict[str, Any]]:
    return [
        {
            "id": ONCEGUARD_CREDENTIAL_ID,
            "name": "Onceguard API",
            "type": "onceguardApi",
            "data": {"baseUrl": onceguard_url, "apiKey": API_SECRET},
        },
        {
            "id": HEADER_CREDENTIAL_ID,
            "name": "Onceguard API key (header)",
            "type": "httpHeaderAuth",
            "data": {"name": "Authorization", "value": f"Bearer {API_SECRET}"},
        },
        {
            "id": CALLER_CREDENTIAL_ID,
            "name": "Webhook callers (header)",
            "type": "httpHeaderAuth",
            "data": {"name": CALLER_HEADER, "value": CALLER_TOKEN},
        },
    ]


@pytest.fixture(scope="session")
def n8n_base(n8n_binary: Path, node_package: Path, onceguard_url: str, tmp_path_factory: pytest.TempPathFactory) -> N8n:
    """A user folder whose database is migrated and holds the two credentials; instances copy it."""
    started = time.monotonic()
    base = N8n(n8n_binary, tmp_path_factory.mktemp("n8n-base"))
    base.install_package(node_package)
    base.import_credentials(credentials(onceguard_url))
    TIMINGS["n8n base folder"] = time.monotonic() - started
    return base


@pytest.fixture
def api_key(tenant: Tenant) -> str:
    """The test tenant's API key: the secret n8n's credentials hold."""
    prefix = API_SECRET.split("_")[1][:16]
    ApiKey.objects.create(
        tenant=tenant, name="n8n", prefix=prefix, hashed_key=hash_api_key(API_SECRET), scopes=["read", "write"]
    )
    return API_SECRET
