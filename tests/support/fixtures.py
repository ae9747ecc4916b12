"""Reusable fixtures for real loopback providers and fault relays.

Use them from any conftest with::

    from tests.support.fixtures import *  # noqa: F403

- ``mock_enforced`` / ``mock_advisory``: a running mock provider (relay.mock_providers),
  fresh per test.
- ``mock_provider_factory(mode, header="Idempotency-Key", process=False)``: more of them.
- ``mock_images``: the mock image API (relay.mock_images), fresh per test.
- ``relay_factory(upstream, mode=None, delay=0.0, process=False, ...)``: fault relays in
  front of a provider (a RunningServer or a URL).

Everything binds 127.0.0.1 on a free port and is stopped at teardown, even when the test
fails. Each server started is allowed by the test's outbound policy (its host and port
only: relay.testing announces it to tests.support.outbound), since the code under test
sends to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relay.testing import RunningServer, start_mock_image_provider, start_mock_provider, start_relay

__all__ = ["mock_advisory", "mock_enforced", "mock_images", "mock_provider_factory", "relay_factory"]


@pytest.fixture
def mock_provider_factory() -> Iterator[Callable[..., RunningServer]]:
    started: list[RunningServer] = []

    def start(mode: str, header: str = "Idempotency-Key", *, process: bool = False) -> RunningServer:
        server = start_mock_provider(mode, header, process=process)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def mock_enforced(mock_provider_factory: Callable[..., RunningServer]) -> RunningServer:
    return mock_provider_factory("enforced")


@pytest.fixture
def mock_advisory(mock_provider_factory: Callable[..., RunningServer]) -> RunningServer:
    return mock_provider_factory("advisory")


@pytest.fixture
def mock_images() -> Iterator[RunningServer]:
    server = start_mock_image_provider()
    yield server
    server.stop()


@pytest.fixture
def relay_factory() -> Iterator[Callable[..., RunningServer]]:
    started: list[RunningServer] = []

    def start(upstream: str | RunningServer, mode: str | None = None, **options: Any) -> RunningServer:
        server = start_relay(upstream, mode, **options)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()
