"""Faults at random while the load runs: relay modes switched, provider answers scripted
(throttling, a 500 after committing, a dropped answer, a slow answer, a 403 that pauses the
provider), execute-mode workers SIGKILLed and restarted, the web server restarted (killed or
stopped), and PostgreSQL restarted once (``pg_ctl restart -m fast``).

Each kind happens at least once in any run (the first of each is planned across the run),
then more at random. An operator resumes a paused provider a few seconds after its pause,
as a human answering the alert would.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from soak.cluster import PrivateCluster
from soak.load import Provider, Recorder
from soak.processes import Supervisor

RELAY_FAULTS = (
    "fail-before-forward",
    "fail-before-forward-close",
    "forward-then-drop-response",
    "forward-then-reset",
    "delay-then-respond",
)
# Held answers outlast every timeout (provider 2 s, replay target 3 s) but not the review settle time.
RELAY_DELAY_SECONDS = 4.0
MOCK_STEPS: tuple[dict[str, object], ...] = (
    {"status": 503, "retry_after": 1},
    {"status": 429, "retry_after": 1},
    {"status": 500, "commit": True},
    {"drop": True},
    {"delay": 3.0},
    {"status": 403},
)


@dataclass
class Timing:
    """When, in seconds from the start, the first of each kind is injected."""

    worker_kill: float
    web_restart: float
    postgres_restart: float
    mock_403: float


class Faults:
    def __init__(
        self,
        *,
        supervisor: Supervisor,
        cluster: PrivateCluster,
        relays: dict[str, Provider],
        recorder: Recorder,
        rng: random.Random,
        seconds: float,
        web_ready: Callable[[], bool],
        resume_paused: Callable[..., int],
        workers: list[str],
    ) -> None:
        self.supervisor = supervisor
        self.cluster = cluster
        self.relays = relays
        self.recorder = recorder
        self.rng = rng
        self.seconds = seconds
        self.web_ready = web_ready
        self.resume_paused = resume_paused
        self.workers = workers
        self.timing = Timing(
            worker_kill=seconds * rng.uniform(0.1, 0.25),
            web_restart=seconds * rng.uniform(0.25, 0.4),
            postgres_restart=seconds * rng.uniform(0.45, 0.65),
            mock_403=seconds * rng.uniform(0.05, 0.2),
        )
        self.log: list[str] = []
        self._reverts: list[tuple[float, Provider]] = []
        self._control = httpx.Client(timeout=5.0, trust_env=False)

    def _note(self, started: float, text: str) -> None:
        self.log.append(f"{time.monotonic() - started:7.1f}s  {text}")

    # --- the kinds ---

    def relay_mode(self, started: float) -> None:
        p = self.rng.choice(list(self.relays.values()))
        mode = self.rng.choice(RELAY_FAULTS)
        hold = self.rng.uniform(2.0, 6.0)
        try:
            p.relay.set_mode(mode, delay=RELAY_DELAY_SECONDS)
        except httpx.HTTPError:
            return
        self._reverts.append((time.monotonic() + hold, p))
        self.recorder.fault(f"relay {mode}")
        self._note(started, f"relay {p.name}: {mode} for {hold:.1f}s")

    def mock_script(self, started: float, step: dict[str, object] | None = None) -> None:
        p = self.rng.choice(
            [r for r in self.relays.values() if r.name != "sink"] if step else list(self.relays.values())
        )
        step = step or self.rng.choice([s for s in MOCK_STEPS if s.get("status") != 403])
        try:
            p.mock.script([step])
        except httpx.HTTPError:
            return
        label = ",".join(f"{k}={v}" for k, v in step.items())
        self.recorder.fault(f"provider answer {label}")
        self._note(started, f"provider {p.name}: next answer {label}")

    def kill_worker(self, started: float) -> None:
        name = self.rng.choice(self.workers)
        pause = self.rng.uniform(0.5, 3.0)
        self.supervisor.restart(name, signal.SIGKILL, pause=pause)
        self.recorder.fault("worker SIGKILL + restart")
        self._note(started, f"{name}: SIGKILL, restarted after {pause:.1f}s")

    def restart_web(self, started: float) -> None:
        sig = self.rng.choice([signal.SIGKILL, signal.SIGTERM])
        began = time.monotonic()
        self.supervisor.restart("web", sig)
        ready = self.web_ready()
        down = time.monotonic() - began
        self.recorder.fault(f"web restart ({signal.Signals(sig).name})")
        self._note(started, f"web: {signal.Signals(sig).name}, restarted, ready={ready} after {down:.1f}s")
        if not ready:
            self.recorder.violation(
                f"the web server did not become ready within its bound after a restart ({down:.0f}s)"
            )

    def restart_postgres(self, started: float) -> None:
        took = self.cluster.restart()
        self.recorder.fault("postgresql restart (pg_ctl restart -m fast)")
        self._note(started, f"postgresql: restart -m fast, accepting again after {took:.1f}s")

    # --- the loop ---

    def _revert_due(self, *, everything: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for at, p in self._reverts:
            if everything or at <= now:
                try:
                    p.relay.set_mode("forward-and-respond", delay=0)
                except httpx.HTTPError:
                    keep.append((at, p))
            else:
                keep.append((at, p))
        self._reverts = keep

    def _operator(self, started: float) -> None:
        resumed = self.resume_paused()
        if resumed:
            self.recorder.count("operator resumed a paused provider", resumed)
            self._note(started, f"operator: resumed {resumed} paused provider(s)")

    def run(self, stop: threading.Event) -> None:
        started = time.monotonic()
        planned = {
            "worker": self.timing.worker_kill,
            "web": self.timing.web_restart,
            "postgres": self.timing.postgres_restart,
            "403": self.timing.mock_403,
        }
        last_web = last_worker = -1e9
        while not stop.wait(self.rng.uniform(1.5, 4.0)):
            elapsed = time.monotonic() - started
            self._revert_due()
            self._operator(started)
            for kind, at in list(planned.items()):
                if elapsed >= at:
                    del planned[kind]
                    if kind == "worker":
                        self.kill_worker(started)
                        last_worker = elapsed
                    elif kind == "web":
                        self.restart_web(started)
                        last_web = elapsed
                    elif kind == "postgres":
                        self.restart_postgres(started)
                    else:
                        self.mock_script(started, {"status": 403})
            r = self.rng.random()
            if r < 0.5:
                self.relay_mode(started)
            elif r < 0.72:
                self.mock_script(started)
            elif r < 0.85 and elapsed - last_worker > 10:
                self.kill_worker(started)
                last_worker = elapsed
            elif r < 0.9 and elapsed - last_web > 45 and elapsed < self.seconds - 10:
                self.restart_web(started)
                last_web = elapsed
            elif r < 0.93:
                self.mock_script(started, {"status": 403})

    def calm(self) -> None:
        """Before the drain: every relay forwards, no scripted answers, no paused provider."""
        self._revert_due(everything=True)
        for p in self.relays.values():
            for action in (lambda p=p: p.relay.set_mode("forward-and-respond", delay=0), lambda p=p: p.mock.script([])):
                try:
                    action()
                except httpx.HTTPError:
                    pass
        # A 403 scripted just before the calm may pause its provider a moment later; the
        # drain resumes again every round (soak/run.py), so nothing waits on a paused provider.
        self.resume_paused(after_seconds=0)

    def close(self) -> None:
        self._control.close()
