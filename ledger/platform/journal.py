"""The fence journal (ADR 0012): an append-only record, outside the database, of the keys whose
effect may have happened, with the epoch marks the ledger writes as it advances its epoch.

One small interface, two stores:

- :class:`LocalJournal` — a folder of append-only files, one per UTC day, under the ledger's
  identity (``<dir>/<ledger id>/<YYYYMMDD>.journal``). Every process of the node appends with
  ``O_APPEND`` (one ``write`` per entry, so lines never interleave); optionally fsynced.
- :class:`RedisJournal` — one Redis stream per ledger identity (``onceguard:fence:<id>``), which
  every node appends to; its entry ids give the order across nodes.

An entry is ``k``, the tenant, the provider (0: none), the state and the key; a mark is ``m`` and
an epoch. Order is the journal's, not a clock's: "after the mark of epoch E" means written after
it. Keys carry no personal data (keys derived from it are HMACs, ``ledger.rules.key_derivation``),
so the journal holds them as they are; it is the platform room's: no database, no models.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol


class JournalStoreError(Exception):
    """The store refused or could not be reached (a Redis error, wrapped: callers need not
    import the client)."""


@dataclass(frozen=True)
class Entry:
    tenant_id: int
    provider_id: int | None
    state: str
    key: str


class Journal(Protocol):
    def append(self, entry: Entry) -> None: ...

    def mark(self, epoch: int) -> None: ...

    def highest_mark(self) -> int: ...

    def entries_since_mark(self, epoch: int) -> Iterator[Entry]:
        """Entries written after the first mark of ``epoch`` or of a later one (all entries when
        there is none that old: a journal younger than the database's epoch)."""
        ...

    def prune(self, *, older_than: datetime) -> int: ...


def _entry_line(entry: Entry) -> str:
    # A key never holds a tab or a line break (ledger.protocol.inputs.claim_key_check); the
    # replace keeps a line one entry whatever it is handed.
    key = entry.key.replace("\t", " ").replace("\n", " ")
    return f"k\t{entry.tenant_id}\t{entry.provider_id or 0}\t{entry.state}\t{key}\n"


def _parse(line: str) -> Entry | int | None:
    parts = line.rstrip("\n").split("\t")
    if parts[0] == "m" and len(parts) == 2:
        return int(parts[1])
    if parts[0] == "k" and len(parts) == 5:
        return Entry(int(parts[1]), int(parts[2]) or None, parts[3], parts[4])
    # A torn last line (a crash mid-write) is skipped.
    return None


def _since(lines: Iterator[str], epoch: int) -> Iterator[Entry]:
    started = False
    buffered: list[Entry] = []
    for line in lines:
        item = _parse(line)
        if isinstance(item, int):
            if not started and item >= epoch:
                started = True
                buffered.clear()
            continue
        if item is None:
            continue
        if started:
            yield item
        else:
            buffered.append(item)
    if not started:
        # No mark that old: the journal is younger than the database's epoch (a pruned journal, or
        # a mark lost in a crash) — everything it holds may be after the backup.
        yield from buffered


class LocalJournal:
    def __init__(self, folder: str | Path, ledger_id: str, *, fsync: bool = False):
        self.folder = Path(folder) / ledger_id
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._day = ""

    def _file(self) -> int:
        day = datetime.now(UTC).strftime("%Y%m%d")
        if self._fd is None or day != self._day:
            self.folder.mkdir(parents=True, exist_ok=True)
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.folder / f"{day}.journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._day = day
        return self._fd

    def _write(self, line: str) -> None:
        data = line.encode()
        with self._lock:
            fd = self._file()
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)

    def append(self, entry: Entry) -> None:
        self._write(_entry_line(entry))

    def mark(self, epoch: int) -> None:
        self._write(f"m\t{epoch}\n")

    def _lines(self) -> Iterator[str]:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("*.journal")):
            with path.open(encoding="utf-8", errors="replace") as handle:
                yield from handle

    def highest_mark(self) -> int:
        best = 0
        for line in self._lines():
            item = _parse(line) if line.startswith("m") else None
            if isinstance(item, int):
                best = max(best, item)
        return best

    def entries_since_mark(self, epoch: int) -> Iterator[Entry]:
        return _since(self._lines(), epoch)

    def prune(self, *, older_than: datetime) -> int:
        """Delete the day files older than ``older_than`` (whole days; today's never)."""
        if not self.folder.is_dir():
            return 0
        cutoff = older_than.astimezone(UTC).strftime("%Y%m%d")
        today = datetime.now(UTC).strftime("%Y%m%d")
        removed = 0
        for path in self.folder.glob("*.journal"):
            if path.stem < cutoff and path.stem != today:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class RedisJournal:
    # Read in pages: a scan never holds a whole journal in memory.
    PAGE = 1000

    def __init__(self, url: str, ledger_id: str):
        import redis  # Only a Redis journal needs the client.

        # Bounded: a Redis that hangs fails the move (503) instead of holding its transaction.
        self.client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.stream = f"onceguard:fence:{ledger_id}"

    def append(self, entry: Entry) -> None:
        import redis  # Only a Redis journal needs the client.

        try:
            self.client.xadd(self.stream, {"l": _entry_line(entry)})
        except redis.RedisError as exc:
            raise JournalStoreError(type(exc).__name__) from exc

    def mark(self, epoch: int) -> None:
        self.client.xadd(self.stream, {"l": f"m\t{epoch}\n"})
        # The highest mark also kept on its own, so a start reads one value.
        self.client.eval(
            "local c = tonumber(redis.call('GET', KEYS[1]) or '0') "
            "if tonumber(ARGV[1]) > c then redis.call('SET', KEYS[1], ARGV[1]) end return 1",
            1,
            self.stream + ":epoch",
            str(epoch),
        )

    def highest_mark(self) -> int:
        value = self.client.get(self.stream + ":epoch")
        return int(value) if value else 0

    def _lines(self) -> Iterator[str]:
        start = "-"
        while True:
            page = self.client.xrange(self.stream, min=start, max="+", count=self.PAGE)
            if not page:
                return
            for _entry_id, fields in page:
                yield fields[b"l"].decode()
            last = page[-1][0].decode()
            start = "(" + last
            if len(page) < self.PAGE:
                return

    def entries_since_mark(self, epoch: int) -> Iterator[Entry]:
        return _since(self._lines(), epoch)

    def prune(self, *, older_than: datetime) -> int:
        """Trim the entries older than ``older_than`` (stream ids are milliseconds)."""
        min_id = f"{int(older_than.timestamp() * 1000)}-0"
        return int(self.client.xtrim(self.stream, minid=min_id))


def retention_cutoff(days: int, *, now: datetime | None = None) -> datetime:
    return (now or datetime.now(UTC)) - timedelta(days=days)
