"""Stand-ins for the ``stopping`` event of the in-process loopback servers (relay.server):
their scripted delays wait on it (``stopping.wait(delay)``), so a test that puts one of these
in its place sees each hold the server makes, or decides itself when a hold ends, instead of
asserting how long an answer took on the wall clock."""

from __future__ import annotations

import threading

# A hold the test forgets to open still ends: no test waits on these longer than this.
HOLD_LIMIT_SECONDS = 30.0


class HoldsRecorded(threading.Event):
    """Records every hold (its seconds) and holds as the real event would."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


class HoldsUntilOpened(threading.Event):
    """Holds every scripted delay until the test calls ``open()`` (or the server stops),
    whatever its seconds: the answer comes after what the test did meanwhile, not after a
    guess at how long that takes."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = threading.Event()
        self.holding = 0

    def open(self) -> None:
        self.opened.set()

    def set(self) -> None:
        super().set()
        self.opened.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.holding += 1
        self.opened.wait(HOLD_LIMIT_SECONDS)
        return self.is_set()
