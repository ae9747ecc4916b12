"""The per-process TTL cache: hits within the limit, reloads after it, never caches a miss,
is off at 0 seconds, forgets on demand, and clear_all() empties every instance."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.platform import caching
from ledger.platform.caching import TtlCache

SETTING = "TEST_CACHE_SECONDS"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(caching.time, "monotonic", clock)
    return clock


@pytest.fixture
def seconds(settings: Any) -> Any:
    def set_to(value: float) -> None:
        settings.ONCEGUARD = {**settings.ONCEGUARD, SETTING: value}

    set_to(5)
    return set_to


class Loader:
    def __init__(self, value: Any) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


def test_a_value_is_loaded_once_within_the_limit_and_again_after_it(clock, seconds):
    cache: TtlCache[str] = TtlCache(SETTING)
    load = Loader("v1")

    assert cache.get("k", load) == "v1"
    clock.now += 4.9
    assert cache.get("k", load) == "v1" and load.calls == 1
    clock.now += 0.2
    load.value = "v2"
    assert cache.get("k", load) == "v2" and load.calls == 2


def test_a_miss_is_never_cached_so_a_row_created_a_moment_later_is_found_at_once(clock, seconds):
    cache: TtlCache[str] = TtlCache(SETTING)
    load = Loader(None)

    assert cache.get("k", load) is None
    load.value = "created"
    assert cache.get("k", load) == "created" and load.calls == 2


def test_zero_seconds_turns_caching_off(clock, seconds):
    seconds(0)
    cache: TtlCache[str] = TtlCache(SETTING)
    load = Loader("v")

    cache.get("k", load)
    cache.get("k", load)

    assert load.calls == 2


def test_forget_and_forget_where_drop_entries_at_once(clock, seconds):
    cache: TtlCache[tuple[int, str]] = TtlCache(SETTING)
    cache.get("a", lambda: (1, "a"))
    cache.get("b", lambda: (2, "b"))

    cache.forget("a")
    cache.forget_where(lambda value: value[0] == 2)

    assert cache.get("a", lambda: (1, "fresh"))[1] == "fresh"
    assert cache.get("b", lambda: (2, "fresh"))[1] == "fresh"


def test_a_full_cache_starts_over_instead_of_growing(clock, seconds):
    cache: TtlCache[int] = TtlCache(SETTING, max_entries=2)
    for n in range(3):
        cache.get(n, lambda n=n: n)

    load = Loader(0)
    assert cache.get(0, load) == 0 and load.calls == 1  # dropped when the third came in


def test_clear_all_empties_every_instance(clock, seconds):
    first: TtlCache[str] = TtlCache(SETTING)
    second: TtlCache[str] = TtlCache(SETTING)
    first.get("k", lambda: "old")
    second.get("k", lambda: "old")

    caching.clear_all()

    assert first.get("k", lambda: "new") == "new" and second.get("k", lambda: "new") == "new"
