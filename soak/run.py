"""`make soak`: the whole service under mixed load and random faults, then the invariants.

    SOAK_SECONDS=600 (load), SOAK_RATE=12 (tasks/s), SOAK_CLIENTS=12, SOAK_DRAIN_SECONDS=180,
    SOAK_SEED (random), SOAK_LOG_DIR (var/soak: process logs and the report)

Order: a private PostgreSQL cluster (initdb, own port) → migrations → a tenant, API keys,
three mock providers (key-enforced, key-advisory, a replay sink) each behind a fault relay →
the real processes (web via scripts/web.sh, two `manage.py worker`, `manage.py qcluster` with
its schedules, `manage.py sweep --every 2`) → load and faults for SOAK_SECONDS → calm (relays
forward, no scripted answers) and drain (bounded) → the checks (soak/checks.py) → figures.
Exit status 0 only when every invariant held. Everything started is stopped and the cluster
removed at the end, also on failure or Ctrl-C.

This module never imports Django: everything that does lives in soak/service.py, imported
once the private cluster exists and ``django.setup()`` has run.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
from cryptography.fernet import Fernet

from relay.testing import RunningServer, start_mock_provider, start_relay
from soak.cluster import PrivateCluster, free_port
from soak.faults import Faults
from soak.load import Api, Load, Provider, Recorder, Reviewer, Truth
from soak.processes import Supervisor, wait_until_ready

BASE_DIR = Path(__file__).resolve().parent.parent
SWEEP_EVERY_SECONDS = 2.0
PROVIDER_TIMEOUT_SECONDS = 2.0
SINK_TIMEOUT_SECONDS = 3.0
SHOW = 8


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _django() -> ModuleType:
    """Django set up for the private cluster (its URL is in the environment by now), and the
    soak's Django side. Imported here, not at the top: Django's settings read DATABASE_URL
    when first imported, and the cluster's address exists only at run time."""
    import django

    django.setup()
    from soak import service

    return service


class Soak:
    def __init__(self) -> None:
        self.seconds = _env_number("SOAK_SECONDS", 600)
        self.rate = _env_number("SOAK_RATE", 12)
        self.clients = int(_env_number("SOAK_CLIENTS", 12))
        self.drain_seconds = _env_number("SOAK_DRAIN_SECONDS", 180)
        self.seed = int(os.environ.get("SOAK_SEED") or secrets.randbelow(1_000_000))
        self.rng = random.Random(self.seed)
        self.log_dir = Path(os.environ.get("SOAK_LOG_DIR") or BASE_DIR / "var" / "soak")
        self.work = Path(tempfile.mkdtemp(prefix="onceguard-soak-"))
        self.out: list[str] = []
        self.started = time.monotonic()
        self.service: Any = None
        # /metrics answers only a scraper with the deployment's token.
        self.metrics_token = secrets.token_urlsafe(24)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.out.append(text)

    def stamp(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.started:6.1f}s] {text}")

    # --- set-up ---

    def environment(self, database_url: str, web_port: int) -> dict[str, str]:
        var = self.work / "var"
        metrics = self.work / "prometheus"
        var.mkdir(exist_ok=True)
        metrics.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "ONCEGUARD_VAR_DIR": str(var),
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ONCEGUARD_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "HOST": "127.0.0.1",
            "PORT": str(web_port),
            "WEB_WORKERS": "2",
            "WEB_THREADS": "4",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
            "METRICS_TOKEN": self.metrics_token,
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": os.environ.get("SOAK_LOG_LEVEL", "WARNING"),
            # The soak's receivers are on loopback: the deployment allows it, as `make run` does.
            "OUTBOUND_ALLOW": "127.0.0.1",
            # A sweeper pass cut by the database restart holds its rows this long, not a minute.
            "RECONCILE_LEASE_SECONDS": "10",
            "DLQ_REPLAYING_STALE_SECONDS": "20",
            "API_KEY_CACHE_SECONDS": "30",
        }
        env.pop("PG_TEST_DB_NAME", None)
        return env

    def migrate(self, env: dict[str, str]) -> None:
        result = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            raise RuntimeError(f"migrate failed: {result.stderr[-2000:]}")

    def start_providers(self, servers: list[RunningServer]) -> dict[str, Provider]:
        """Three mock providers, each behind its own fault relay (separate processes)."""
        providers: dict[str, Provider] = {}
        for name, mode, slug, path in (
            ("enforced", "enforced", "soak-charges", "/charges"),
            ("advisory", "advisory", "soak-mailer", "/contacts"),
            ("sink", "enforced", "soak-sink", "/contacts"),
        ):
            mock = start_mock_provider(mode, process=True)
            servers.append(mock)
            relay = start_relay(mock, process=True, upstream_timeout=10.0)
            servers.append(relay)
            providers[name] = Provider(
                name=name,
                slug=slug,
                enforced=mode == "enforced",
                mock=mock,
                relay=relay,
                path=path,
                timeout=SINK_TIMEOUT_SECONDS if name == "sink" else PROVIDER_TIMEOUT_SECONDS,
            )
        return providers

    def start_service(self, env: dict[str, str]) -> Supervisor:
        """The service's own processes, as `make run` and a deployment run them."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for old in self.log_dir.glob("*.log"):
            old.unlink()
        supervisor = Supervisor(cwd=BASE_DIR, log_dir=self.log_dir)
        py = sys.executable
        bound = str(int(self.seconds + self.drain_seconds + 300))
        supervisor.add("web", ["bash", "scripts/web.sh"], env)
        for n in (1, 2):
            supervisor.add(f"worker-{n}", [py, "manage.py", "worker", "--concurrency", "4"], env)
        supervisor.add("qcluster", [py, "manage.py", "qcluster"], env)
        supervisor.add("sweeper", [py, "manage.py", "sweep", "--every", str(SWEEP_EVERY_SECONDS), "--for", bound], env)
        for name in supervisor.procs:
            supervisor.start(name)
        return supervisor

    # --- the run ---

    def main(self) -> int:
        cluster = PrivateCluster()
        servers: list[RunningServer] = []
        supervisor: Supervisor | None = None
        stop = threading.Event()
        hard_stop = threading.Event()

        def interrupted(*_: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, interrupted)
        try:
            self.say(
                f"== Onceguard soak: {self.seconds:.0f} s of load at {self.rate:g} tasks/s on {self.clients} clients,"
                f" drain ≤ {self.drain_seconds:.0f} s, seed {self.seed} =="
            )
            cluster.start()
            web_port = free_port()
            env = self.environment(cluster.url, web_port)
            os.environ.update(env)
            self.stamp(f"private PostgreSQL on 127.0.0.1:{cluster.port} ({cluster.data_dir})")
            self.migrate(env)
            self.stamp("migrations applied")
            self.service = _django()
            providers = self.start_providers(servers)
            tenant, api_key, auditor_key = self.service.configure(
                providers, provider_timeout=PROVIDER_TIMEOUT_SECONDS, sink_timeout=SINK_TIMEOUT_SECONDS
            )
            self.service.install_schedules(base_dir=BASE_DIR, env=env)
            self.stamp("tenant, providers, replay sink, API keys and schedules in place")
            supervisor = self.start_service(env)
            base_url = f"http://127.0.0.1:{web_port}"
            running = supervisor

            def web_ready() -> bool:
                return wait_until_ready(f"{base_url}/readyz", timeout=90, alive=lambda: running.pid("web") is not None)

            if not web_ready():
                raise RuntimeError(f"the web server did not become ready:\n{supervisor.log_tail('web')}")
            unexpected: Counter[str] = Counter()

            def on_exit(name: str, code: int) -> None:
                unexpected[f"{name} exited {code}"] += 1

            supervisor.watch(on_exit)
            self.stamp(f"web {base_url} (scripts/web.sh, 2 workers × 4 threads), 2 workers, qcluster, sweeper up")
            return self._run(
                tenant=tenant,
                providers=providers,
                supervisor=supervisor,
                cluster=cluster,
                env=env,
                base_url=base_url,
                api_key=api_key,
                auditor_key=auditor_key,
                web_ready=web_ready,
                unexpected=unexpected,
                stop=stop,
                hard_stop=hard_stop,
            )
        except KeyboardInterrupt:
            self.say("interrupted: stopping everything")
            return 130
        finally:
            stop.set()
            hard_stop.set()
            if supervisor is not None:
                supervisor.stop_all()
            for server in servers:
                server.stop()
            if self.service is not None:
                self.service.close_all()
            cluster.destroy()
            shutil.rmtree(self.work, ignore_errors=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / "report.txt").write_text("\n".join(self.out) + "\n")

    def _run(
        self,
        *,
        tenant: Any,
        providers: dict[str, Provider],
        supervisor: Supervisor,
        cluster: PrivateCluster,
        env: dict[str, str],
        base_url: str,
        api_key: str,
        auditor_key: str,
        web_ready: Any,
        unexpected: Counter[str],
        stop: threading.Event,
        hard_stop: threading.Event,
    ) -> int:
        service = self.service
        recorder = Recorder()
        truth = Truth(recorder)
        api = Api(base_url, api_key, recorder)
        auditor = Api(base_url, auditor_key, recorder)
        load = Load(
            api=api,
            auditor=auditor,
            recorder=recorder,
            truth=truth,
            providers=providers,
            rng=random.Random(self.rng.random()),
            hard_stop=hard_stop,
        )
        reviewer = Reviewer(
            api=api,
            providers={k: v for k, v in providers.items() if k != "sink"},
            sink=providers["sink"].mock,
            sent_key_of=lambda ledger_key: service.sent_key_of(tenant, ledger_key),
            recorder=recorder,
            rng=random.Random(self.rng.random()),
        )
        faults = Faults(
            supervisor=supervisor,
            cluster=cluster,
            relays=providers,
            recorder=recorder,
            rng=random.Random(self.rng.random()),
            seconds=self.seconds,
            web_ready=web_ready,
            resume_paused=service.resume_paused,
            workers=["worker-1", "worker-2"],
        )
        threads = [
            threading.Thread(target=faults.run, args=(stop,), name="soak-faults", daemon=True),
            threading.Thread(target=reviewer.run, args=(stop,), name="soak-reviewer", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.stamp(f"load and faults for {self.seconds:.0f} s")
        load.run(seconds=self.seconds, rate=self.rate, clients=self.clients, stop=hard_stop)
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        self.stamp("load stopped; calming the relays and draining")
        faults.calm()
        drained, remaining, took = self._drain(tenant=tenant, providers=providers, load=load, reviewer=reviewer)
        self.stamp(
            f"drain {'complete' if drained else 'TIMED OUT'} after {took:.0f} s"
            + ("" if drained else f"; still open: {remaining}")
        )
        # The service's processes stop first, so nothing moves while the checks read.
        metrics_text = self._metrics(base_url)
        supervisor.stop_all()
        hard_stop.set()
        results, histograms = service.run_checks(
            tenant=tenant,
            providers=providers,
            truth=truth,
            recorder=recorder,
            base_dir=BASE_DIR,
            env=env,
            lease_grace=timedelta(seconds=SWEEP_EVERY_SECONDS + 60),
        )
        api.close()
        auditor.close()
        faults.close()
        return self._report(
            tenant=tenant,
            results=results,
            recorder=recorder,
            faults=faults,
            histograms=histograms,
            unexpected=unexpected,
            truth=truth,
            metrics_text=metrics_text,
            drained=drained,
        )

    def _drain(
        self, *, tenant: Any, providers: dict[str, Provider], load: Load, reviewer: Reviewer
    ) -> tuple[bool, dict[str, int], float]:
        """Until nothing is open but review (bounded): callers come back for their due
        retries and the reviewer keeps deciding (no more retries from it: it settles)."""
        started = time.monotonic()
        deadline = started + self.drain_seconds
        by_slug = {p.slug: p for p in providers.values()}
        remaining: dict[str, int] = {}
        while time.monotonic() < deadline:
            counts = self.service.still_open(tenant)
            if counts is None:
                self.stamp("drain: the database could not be read; again")
                time.sleep(SWEEP_EVERY_SECONDS)
                continue
            remaining = counts
            if not remaining:
                return True, {}, time.monotonic() - started
            # The operator keeps answering provider_paused alerts through the drain: a worker
            # holding a scripted 403 from the last seconds of load pauses its provider after
            # the calm, and execute-mode retries would otherwise wait on it forever.
            self.service.resume_paused(after_seconds=0)
            callers = [
                threading.Thread(
                    target=load.guard_flow,
                    args=(key, by_slug[slug]),
                    kwargs={
                        "decline": load.truth.keys.get(key, ("", "", False))[2],
                        "uses_marker": True,
                        "heartbeat": False,
                    },
                    daemon=True,
                )
                for key, slug in self.service.due_guard_retries(tenant, limit=40)
            ]
            for caller in callers:
                caller.start()
            try:
                reviewer.round(allow_retry=False)
            except Exception as exc:  # a bad round is retried next time round
                self.stamp(f"drain: a review round failed ({type(exc).__name__})")
            for caller in callers:
                caller.join(timeout=60)
            time.sleep(SWEEP_EVERY_SECONDS)
        return False, remaining, time.monotonic() - started

    def _metrics(self, base_url: str) -> str:
        try:
            headers = {"Authorization": f"Bearer {self.metrics_token}"}
            return httpx.get(f"{base_url}/metrics", headers=headers, timeout=10, trust_env=False).text
        except httpx.HTTPError:
            return ""

    def _report(
        self,
        *,
        tenant: Any,
        results: list[Any],
        recorder: Recorder,
        faults: Faults,
        histograms: dict[str, Counter[int]],
        unexpected: Counter[str],
        truth: Truth,
        metrics_text: str,
        drained: bool,
    ) -> int:
        self.say()
        self.say("operations by final state")
        statuses = ["succeeded", "failed", "abandoned", "review", "other"]
        self.say(f"  {'mode':8} {'provider':14} " + " ".join(f"{s:>10}" for s in statuses) + f" {'total':>7}")
        grand: Counter[str] = Counter()
        for mode, name, counts in self.service.states_table(tenant):
            row = Counter({s: counts.get(s, 0) for s in statuses[:-1]})
            row["other"] = sum(n for s, n in counts.items() if s not in statuses)
            grand.update(row)
            self.say(
                f"  {mode:8} {name:14} " + " ".join(f"{row[s]:>10}" for s in statuses) + f" {sum(counts.values()):>7}"
            )
        self.say(f"  {'all':8} {'':14} " + " ".join(f"{grand[s]:>10}" for s in statuses) + f" {sum(grand.values()):>7}")

        self.say()
        self.say(f"faults injected ({sum(recorder.faults.values())})")
        for kind, n in sorted(recorder.faults.items()):
            self.say(f"  {n:5}  {kind}")
        for kind, n in sorted(unexpected.items()):
            self.say(f"  {n:5}  unasked exit: {kind} (restarted)")
        # Every process-level fault; the many relay and provider-answer ones only at first.
        major = ("web:", "postgresql:", "worker-", "operator:")
        shown = [line for n, line in enumerate(faults.log) if n < 30 or any(m in line for m in major)]
        self.say(f"  timeline ({len(shown)} of {len(faults.log)}: the first 30, then the process-level ones):")
        for line in shown:
            self.say(f"    {line}")

        self.say()
        self.say("effects per key, from the providers' own counters (effects → keys)")
        for name, histogram in histograms.items():
            parts = ", ".join(f"{k} effect{'s' if k != 1 else ''}: {v}" for k, v in sorted(histogram.items()))
            self.say(f"  {name:28} {parts or 'none'}")

        self.say()
        self.say(f"requests ({sum(len(v) for v in recorder.latencies.values())}): count, p50, p99")
        for endpoint, values in sorted(recorder.latencies.items()):
            self.say(
                f"  {endpoint:22} {len(values):7}  p50 {_percentile(values, 0.5) * 1000:7.1f} ms"
                f"  p99 {_percentile(values, 0.99) * 1000:8.1f} ms"
            )

        self.say()
        self.say("errors by code (endpoint, status, code)")
        for name, n in sorted(recorder.errors.items(), key=lambda item: -item[1])[:40]:
            self.say(f"  {n:6}  {name}")
        self.say()
        self.say("callers and reviewer")
        for name, n in sorted(recorder.counts.items()):
            self.say(f"  {n:6}  {name}")
        acked = sum(1 for r in truth.ingests.values() if r.acked)
        self.say(f"  {len(truth.keys):6}  keys used; {acked} failures reported and acknowledged")
        claims = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics_text.splitlines()
            if line.startswith("onceguard_claim_duration_seconds_count")
        )
        if metrics_text:
            self.say(f"  /metrics at the end of the load: onceguard_claim_duration_seconds_count {claims:.0f}")

        self.say()
        self.say("invariants")
        failed = 0
        for check in results:
            mark = "ok  " if check.ok else "FAIL"
            self.say(f"  [{mark}] {check.name} ({check.looked_at} checked)")
            for problem in check.problems[:SHOW]:
                self.say(f"           {problem}")
            if len(check.problems) > SHOW:
                self.say(f"           … and {len(check.problems) - SHOW} more")
            failed += not check.ok
        total = time.monotonic() - self.started
        verdict = "PASSED" if not failed else f"FAILED ({failed} invariant(s) violated)"
        self.say()
        self.say(f"soak {verdict} in {total:.0f} s; seed {self.seed}; logs in {self.log_dir}")
        return 0 if not failed and drained else 1


def main() -> int:
    return Soak().main()
