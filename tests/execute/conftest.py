"""Fixtures of the execute-mode suite: real loopback providers (relay.testing) configured as
ledger providers, and helpers that take and execute due operations in the test's thread."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledger.models import IdempotencyClass, Provider, Tenant
from ledger.platform.logs import formatter
from ledger.protocol import selectors
from ledger.protocol.services import provider_upsert
from relay.testing import RunningServer
from tests.execute.support import RenderApi
from tests.support.fixtures import *  # noqa: F403


@pytest.fixture(autouse=True)
def _forget_caches() -> Iterator[None]:
    # Per-process caches keyed by id; test databases reuse ids.
    from ledger.platform import caching

    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()
    yield
    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()


def configure_provider(
    tenant: Tenant, server: RunningServer | str, *, slug: str, enforced: bool, **fields: Any
) -> Provider:
    """A ledger provider pointing at a loopback mock, with test-sized timeouts and delays."""
    url = server.url if isinstance(server, RunningServer) else server
    defaults: dict[str, Any] = dict(
        base_url=url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED if enforced else IdempotencyClass.KEY_ADVISORY,
        lookup_path="/charges?idempotency_key={key}" if enforced else "",
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=1.0,
        lookup_settle_seconds=0,
        max_attempts=3,
        lifetime_seconds=120,
        base_delay_seconds=0.05,
        max_delay_seconds=0.2,
    )
    defaults.update(fields)
    return provider_upsert(tenant=tenant, slug=slug, **defaults)


@pytest.fixture
def enforced(tenant: Tenant, mock_enforced: RunningServer) -> tuple[Provider, RunningServer]:
    return configure_provider(tenant, mock_enforced, slug="charges", enforced=True), mock_enforced


@pytest.fixture
def advisory(tenant: Tenant, mock_advisory: RunningServer) -> tuple[Provider, RunningServer]:
    return configure_provider(tenant, mock_advisory, slug="webhook", enforced=False), mock_advisory


@pytest.fixture
def charge_envelope() -> Callable[..., dict[str, Any]]:
    def make(amount: int = 1000, **extra: Any) -> dict[str, Any]:
        return {"method": "POST", "path": "/charges", "body": {"amount": amount, "currency": "eur", **extra}}

    return make


@pytest.fixture
def render_api() -> Iterator[RenderApi]:
    api = RenderApi()
    yield api
    api.stop()


class Lines(logging.Handler):
    """Log lines as the deployment renders them (ledger.platform.logs' formatter, with the bound context)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.setFormatter(formatter("kv"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    handler = Lines()
    logger = logging.getLogger("onceguard")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
