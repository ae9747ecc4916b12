"""A monotonic clock a test moves by hand, for code that measures time with the ``time``
module: a test puts it in place of that module's ``time`` (``monkeypatch.setattr(module,
"time", clock)``), so the code's pauses take no wall-clock time and the test asserts what the
code measured instead of how long it ran on a busy machine."""

from __future__ import annotations


class FakeClock:
    """Stands in for a module's ``time``: ``sleep`` moves the clock, nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class TickingClock(FakeClock):
    """A clock that moves ``step`` seconds each time it is read: for code that checks the time
    once per unit of work (a chunk read), it is as if each unit took ``step`` seconds."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now
