"""Fixtures of the ledger suite (the shared ones live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import LiveServerThread, _StaticFilesHandler

from ledger.protocol import selectors
from tests.ledger.support import Sink


class _WideThreadedWSGIServer(ThreadedWSGIServer):
    # Django's default backlog (10) resets some of 32 simultaneous connections.
    request_queue_size = 128


class _WideLiveServerThread(LiveServerThread):
    server_class = _WideThreadedWSGIServer


@pytest.fixture
def sink() -> Iterator[Sink]:
    receiver = Sink()
    yield receiver
    receiver.close()


@pytest.fixture(autouse=True)
def _forget_provider_slugs() -> Iterator[None]:
    # selectors caches provider slugs per process by id; test databases reuse ids.
    selectors._PROVIDER_SLUGS.clear()
    yield
    selectors._PROVIDER_SLUGS.clear()


@pytest.fixture
def http_server(transactional_db: None) -> Iterator[str]:
    """The whole Django app on 127.0.0.1 (threaded, one DB connection per request), as a URL."""
    thread = _WideLiveServerThread("127.0.0.1", _StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait(timeout=30)
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()
