"""Fixtures of the console suite (the shared ones live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.protocol import selectors


@pytest.fixture(autouse=True)
def _forget_provider_slugs() -> Iterator[None]:
    # selectors caches provider slugs per process by id; test databases reuse ids.
    selectors._PROVIDER_SLUGS.clear()
    yield
    selectors._PROVIDER_SLUGS.clear()
