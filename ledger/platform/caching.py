"""The project's one per-process cache with a time limit (do not write a second one): for
the lookups every API request makes (its API key, the provider it names) and the provider
rows a worker re-reads. Misses are never cached, so a key or provider created a moment ago
works at once; a change or revocation reaches other processes within the configured seconds
and this process at once (the services forget their entries). ``clear_all()`` empties every
instance (tests: databases reuse ids between tests)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from django.conf import settings

V = TypeVar("V")

_ALL: list[TtlCache[object]] = []


class TtlCache(Generic[V]):
    """Values by key for ``settings.ONCEGUARD[setting]`` seconds (0 or less: no caching)."""

    def __init__(self, setting: str, max_entries: int = 10_000) -> None:
        self.setting = setting
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}
        _ALL.append(self)  # type: ignore[arg-type]

    def get(self, key: Hashable, load: Callable[[], V | None]) -> V | None:
        """The cached value, or ``load()``'s (kept unless None). ``load`` may raise."""
        ttl = float(settings.ONCEGUARD.get(self.setting, 0))
        if ttl <= 0:
            return load()
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load()
        if value is not None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + ttl, value)
        return value

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def forget_where(self, predicate: Callable[[V], bool]) -> None:
        """Forget the entries whose value matches (a key revoked by id, not by its hash)."""
        for key, (_, value) in list(self._entries.items()):
            if predicate(value):
                self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


def clear_all() -> None:
    """Forget everything (tests: databases reuse ids between tests)."""
    for cache in _ALL:
        cache.clear()
