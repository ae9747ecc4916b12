from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.fixtures import *  # noqa: F403


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """A plain client with a short deadline; no proxy from the environment."""
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        yield client


@pytest.fixture
def wait_for() -> Callable[[Callable[[], bool]], bool]:
    """Poll a condition for up to a second: servers answer on other threads."""

    def wait(condition: Callable[[], bool], timeout: float = 1.0) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    return wait
