"""DLQ fixtures: loopback sinks, a default replay target, API clients, captured task enqueues."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from dlq.models import ReplayTarget
from dlq.targets import services as dlq_targets
from ledger.models import Tenant
from tests.dlq.sinks import Sink

EXAMPLES = Path(__file__).parent / "examples"


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


def example_bytes(name: str) -> bytes:
    return (EXAMPLES / name).read_bytes()


@pytest.fixture
def sink_factory() -> Iterator[Callable[[], Sink]]:
    started: list[Sink] = []

    def make() -> Sink:
        sink = Sink().start()
        started.append(sink)
        return sink

    yield make
    for sink in started:
        sink.stop()


@pytest.fixture
def sink(sink_factory: Callable[[], Sink]) -> Sink:
    return sink_factory()


@pytest.fixture
def target(tenant: Tenant, sink: Sink) -> ReplayTarget:
    return dlq_targets.replay_target_upsert(
        tenant=tenant, slug="n8n-rerun", url=f"{sink.url}/webhook/rerun", timeout_seconds=2.0, is_default=True
    )


@pytest.fixture
def client(tenant: Tenant, make_client: Callable[..., APIClient]) -> APIClient:
    return make_client(tenant)


@pytest.fixture(autouse=True)
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Task enqueues are captured instead of reaching django-q2; tests run tasks themselves."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr("ledger.platform.tasks.enqueue", lambda func, *args: calls.append((func, *args)))
    return calls


def post_raw(client: APIClient, body: bytes | str, **extra: Any) -> Any:
    data = body.encode() if isinstance(body, str) else body
    return client.generic("POST", "/api/v1/dlq/events", data, content_type="application/json", **extra)
