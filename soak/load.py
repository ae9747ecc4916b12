"""The soak's clients: guard-mode callers, execute-mode submitters, DLQ reporters and
replayers, a payload auditor and a scripted reviewer, all over the real HTTP API.

Every caller behaves as a careful integration would: it claims before the effect, writes the
sent marker before sending, never sends without the marker's ``200``, reports what the
provider answered with DESIGN §3's failure classes, and retries only what may be retried
(a claim or a report whose answer it never saw). What the callers learn is kept in
:class:`Truth`, which the checks compare with the database and the providers' counters.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from relay.testing import RunningServer

# A guard caller's lease; it sends only with at least the provider's timeout + this left.
LEASE_SECONDS = 10.0
SEND_MARGIN_SECONDS = 2.0
# The reviewer decides items untouched for this long: any effect still in flight (the mock's
# scripted delays, the relay's) has landed by then.
REVIEW_SETTLE_SECONDS = 8.0
FLOW_BUDGET_SECONDS = 40.0
FINISHED = ("succeeded", "failed", "abandoned")
VOLATILE_FIELDS = ("updated_at", "superseded_by")


@dataclass
class Answer:
    """One HTTP exchange: status None means no answer was seen (``code`` names why)."""

    status: int | None
    body: Any = None
    code: str = ""
    headers: httpx.Headers | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def unknown(self) -> bool:
        """No answer, or the server failed: the request may or may not have taken effect."""
        return self.status is None or self.status >= 500

    def retry_after(self, default: float = 1.0) -> float:
        try:
            return float((self.headers or {}).get("Retry-After") or default)
        except ValueError:
            return default


class Recorder:
    """Latencies, errors by code, counters, faults and violations seen while running."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.violations: list[str] = []

    def observe(self, endpoint: str, seconds: float, answer: Answer) -> None:
        with self.lock:
            self.latencies[endpoint].append(seconds)
            if not answer.ok:
                self.errors[f"{endpoint} {answer.status or '-'} {answer.code or 'no_code'}"] += 1

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def fault(self, kind: str) -> None:
        with self.lock:
            self.faults[kind] += 1

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


class Api:
    """The service's HTTP API with one API key; one httpx client per thread."""

    def __init__(self, base_url: str, key: str, recorder: Recorder) -> None:
        self.base_url = base_url
        self.key = key
        self.recorder = recorder
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=httpx.Timeout(15.0, connect=3.0),
                trust_env=False,
            )
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def call(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Answer:
        started = time.monotonic()
        try:
            response = self._client().request(method, path, json=json, headers=headers, params=params)
        except httpx.HTTPError as exc:
            answer = Answer(None, code=type(exc).__name__)
        else:
            try:
                body = response.json() if response.content else None
            except ValueError:
                body = None
            code = body.get("code", "") if isinstance(body, dict) and response.status_code >= 400 else ""
            answer = Answer(response.status_code, body, code, response.headers)
        self.recorder.observe(endpoint, time.monotonic() - started, answer)
        return answer

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close()


@dataclass
class Provider:
    """A mock provider behind its fault relay, and the ledger provider pointing at the relay."""

    name: str
    slug: str
    enforced: bool
    mock: RunningServer
    relay: RunningServer
    path: str
    timeout: float


@dataclass
class Ingest:
    """What the reporters know of one failure identity."""

    body: dict[str, Any]
    root: str
    attempted: int = 0
    acked: int = 0
    entry_ids: set[int] = field(default_factory=set)
    n8n_execution: str = ""


class Truth:
    """What the callers know, for the checks: keys used, outcomes seen, failures reported."""

    def __init__(self, recorder: Recorder) -> None:
        self.lock = threading.Lock()
        self.recorder = recorder
        self.keys: dict[str, tuple[str, str, bool]] = {}  # key → (mode, provider name, decline)
        self.finished: dict[str, dict[str, Any]] = {}  # key → the first answer naming its outcome
        self.replayed: dict[str, dict[str, Any]] = {}  # key → the first replay of it (response in clear)
        self.op_ids: list[int] = []
        self.ingests: dict[str, Ingest] = {}
        self.replay_requests = 0

    def remember(self, key: str, mode: str, provider: str, decline: bool) -> None:
        with self.lock:
            self.keys.setdefault(key, (mode, provider, decline))

    def operation_seen(self, op_id: int) -> None:
        with self.lock:
            if len(self.op_ids) < 100_000:
                self.op_ids.append(op_id)

    def answer_seen(self, key: str, body: Any, *, how: str, replay: bool = False) -> None:
        """Every answer naming a finished key repeats its recorded outcome. Replays (a claim or
        submission of a finished key, the recorded response in clear) must equal the first
        replay field for field; every answer, masked ones too (complete, fail), must agree
        with the first on everything but the response body. Not compared: ``updated_at`` and
        ``superseded_by``, which a DLQ replay of a failed key moves on purpose."""
        if not isinstance(body, dict) or body.get("key") != key or body.get("status") not in FINISHED:
            return
        seen = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
        outline = {**seen, "response": (seen.get("response") or {}).get("status")}
        with self.lock:
            first = self.finished.setdefault(key, outline)
            first_replay = self.replayed.setdefault(key, seen) if replay else seen
        for before, now in ((first, outline), (first_replay, seen)):
            if before != now:
                changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
                self.recorder.violation(
                    f"{how} of {key} differs from its recorded outcome in {', '.join(changed)}: "
                    + "; ".join(f"{k}: {before.get(k)!r} → {now.get(k)!r}" for k in changed[:3])
                )
                return


@dataclass
class Effect:
    ok: bool
    error_class: str = ""
    message: str = ""
    ref: str = ""
    status: int | None = None
    body: Any = None
    retry_after: float | None = None


def classify(status: int, body: Any, headers: httpx.Headers) -> Effect:
    """DESIGN §3's failure classes for a provider's answer, as a careful caller reads it."""
    if 200 <= status < 300:
        ref = body.get("id") if isinstance(body, dict) else None
        if not ref:
            return Effect(False, "ambiguous", f"HTTP {status} without a reference", status=status)
        return Effect(True, ref=str(ref), status=status, body=body)
    retry_after = None
    try:
        retry_after = float(headers.get("Retry-After") or 0) or None
    except ValueError:
        pass
    if status in (408, 425, 429, 503) or status == 409:
        return Effect(False, "transient", f"HTTP {status}", status=status, retry_after=retry_after)
    if status in (401, 403):
        return Effect(False, "permission", f"HTTP {status}", status=status)
    if status >= 500:
        return Effect(False, "ambiguous", f"HTTP {status}", status=status)
    return Effect(False, "invalid_input", f"HTTP {status}", status=status)


def amount_for(key: str) -> int:
    """The same key always carries the same request (a retry is the same operation)."""
    return 100 + sum(key.encode()) % 9000


class Load:
    """The mixed load: a bounded pool of client threads fed at a bounded rate."""

    def __init__(
        self,
        *,
        api: Api,
        auditor: Api,
        recorder: Recorder,
        truth: Truth,
        providers: dict[str, Provider],
        rng: random.Random,
        hard_stop: threading.Event,
    ) -> None:
        self.api = api
        self.auditor = auditor
        self.recorder = recorder
        self.truth = truth
        self.providers = providers
        self.rng = rng
        self.rng_lock = threading.Lock()
        self.hard_stop = hard_stop
        self.numbers = itertools.count(1)
        self.number_lock = threading.Lock()
        self._effect_local = threading.local()

    # --- helpers ---

    def _rand(self) -> float:
        with self.rng_lock:
            return self.rng.random()

    def _choice(self, seq: list[Any]) -> Any:
        with self.rng_lock:
            return self.rng.choice(seq)

    def _next(self) -> int:
        with self.number_lock:
            return next(self.numbers)

    def _sleep(self, seconds: float) -> None:
        self.hard_stop.wait(max(0.0, seconds))

    def _effect_client(self) -> httpx.Client:
        client = getattr(self._effect_local, "client", None)
        if client is None:
            client = httpx.Client(trust_env=False)
            self._effect_local.client = client
        return client

    # --- guard mode ---

    def guard_flow(self, key: str, p: Provider, *, decline: bool, uses_marker: bool, heartbeat: bool) -> None:
        """Claim → sent → effect → complete/fail, as a careful caller; retries a due retry."""
        self.truth.remember(key, "guard", p.name, decline)
        request = {"amount": amount_for(key), "currency": "eur", "order_id": key.rsplit(":", 2)[-2]}
        started = time.monotonic()
        for _round in range(6):
            if self.hard_stop.is_set() or time.monotonic() - started > FLOW_BUDGET_SECONDS:
                return
            answer = self.api.call(
                "claim",
                "POST",
                "/api/v1/claims",
                json={
                    "provider": p.slug,
                    "action": "charge",
                    "request": request,
                    "uses_sent_marker": uses_marker,
                    "lease_seconds": LEASE_SECONDS,
                },
                headers={"Idempotency-Key": key},
            )
            if answer.status == 200:
                self.recorder.count("claim replayed")
                self.truth.answer_seen(key, answer.body, how="claim replay", replay=True)
                return
            if answer.status == 409 and answer.code in ("operation_in_progress", "operation_retry_scheduled"):
                self._sleep(min(answer.retry_after(1.0), 3.0) + self._rand())
                continue
            if answer.unknown:
                self._sleep(0.5 + self._rand())
                continue
            if answer.status != 201:
                return
            self.truth.operation_seen(answer.body["id"])
            verdict = self._hold(key, p, answer.body, request, decline=decline, heartbeat=heartbeat)
            if verdict != "retry":
                return
        return

    def _hold(
        self, key: str, p: Provider, op: dict[str, Any], request: dict[str, Any], *, decline: bool, heartbeat: bool
    ) -> str:
        claimed = time.monotonic()
        op_id, token = op["id"], op["lease_token"]
        path = f"/api/v1/operations/{op_id}"
        if heartbeat:
            self.api.call("heartbeat", "POST", f"{path}/heartbeat", json={"lease_token": token})
        sent = self.api.call(
            "sent", "POST", f"{path}/sent", json={"lease_token": token, "reconciliation_handle": f"h:{key}"}
        )
        if sent.status != 200:
            # Never send without the marker's 200 (expired lease, lost answer): the sweeper
            # retries an unmarked expired lease, and reconciles a marked one.
            return "stop"
        if time.monotonic() - claimed > LEASE_SECONDS - p.timeout - SEND_MARGIN_SECONDS:
            effect = Effect(False, "transient", "too little lease left to send")
        else:
            effect = self._effect(key, p, request, decline=decline)
        return self._report(key, op_id, token, effect)

    def _effect(self, key: str, p: Provider, request: dict[str, Any], *, decline: bool) -> Effect:
        headers = {"Idempotency-Key": key}
        if decline:
            headers["X-Mock-Outcome"] = "failed"
        started = time.monotonic()
        try:
            response = self._effect_client().post(
                p.relay.url + p.path, json=request, headers=headers, timeout=p.timeout
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            effect = Effect(False, "transient", f"not delivered: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            effect = Effect(False, "ambiguous", f"sent, no answer: {type(exc).__name__}")
        else:
            try:
                body = response.json()
            except ValueError:
                body = None
            effect = classify(response.status_code, body, response.headers)
        answer = Answer(200 if effect.ok else effect.status, code=effect.error_class)
        self.recorder.observe(f"effect:{p.name}", time.monotonic() - started, answer)
        return effect

    def _report(self, key: str, op_id: int, token: str, effect: Effect) -> str:
        path = f"/api/v1/operations/{op_id}"
        for attempt in range(4):
            if effect.ok:
                answer = self.api.call(
                    "complete",
                    "POST",
                    f"{path}/complete",
                    json={
                        "lease_token": token,
                        "provider_ref": effect.ref,
                        "response": effect.body,
                        "response_status": effect.status,
                    },
                )
            else:
                answer = self.api.call(
                    "fail",
                    "POST",
                    f"{path}/fail",
                    json={
                        "lease_token": token,
                        "error_class": effect.error_class,
                        "message": effect.message,
                        "response_status": effect.status,
                        "retry_after_seconds": effect.retry_after,
                    },
                )
            if not answer.unknown:
                break
            self._sleep(0.5 * 2**attempt)
        else:
            return "stop"
        if answer.status == 200:
            self.truth.answer_seen(key, answer.body, how="complete" if effect.ok else "fail")
        if answer.status == 200 and isinstance(answer.body, dict) and answer.body.get("status") == "retry_wait":
            self._sleep(min(4.0, _seconds_until(answer.body.get("next_attempt_at"))) + 0.1)
            return "retry"
        return "stop"

    # --- execute mode ---

    def submit(self, key: str, p: Provider, *, decline: bool, deadline: float | None) -> None:
        self.truth.remember(key, "execute", p.name, decline)
        request: dict[str, Any] = {
            "method": "POST",
            "path": p.path,
            "body": {"amount": amount_for(key), "currency": "eur"},
        }
        if decline:
            request["headers"] = {"X-Mock-Outcome": "failed"}
        body = {"key": key, "provider": p.slug, "action": "charge", "request": request}
        if deadline:
            body["deadline_seconds"] = deadline
        for attempt in range(4):
            answer = self.api.call("submit", "POST", "/api/v1/operations", json=body)
            if not answer.unknown:
                break
            self._sleep(0.5 * 2**attempt)
        if answer.status in (200, 202) and isinstance(answer.body, dict):
            self.truth.operation_seen(answer.body["id"])
            if answer.status == 200:
                self.truth.answer_seen(key, answer.body, how="submit replay", replay=True)

    # --- DLQ ---

    def ingest_new(self) -> None:
        n = self._next()
        if self._rand() < 0.5:
            identity = f"soak-ev-{n}"
            body: dict[str, Any] = {
                "event_id": identity,
                "idempotency_key": f"soak:dlq:{n}:v1",
                "error": {"message": "CRM answered 429 too many requests", "class": "transient"},
                "payload": {"order_id": n, "action": "crm.create_contact"},
                "source": {"workflow_id": "soak-wf", "execution_id": f"x{n}", "node": "CRM"},
            }
            execution = ""
        else:
            execution = str(100_000 + n)
            identity = f"n8n:77:{execution}"
            body = {
                "execution": {
                    "id": execution,
                    "error": {"message": "The service is receiving too many requests from you [429]"},
                    "lastNodeExecuted": "CRM: Create Contact",
                    "mode": "webhook",
                },
                "workflow": {"id": "77", "name": "soak: lead to CRM"},
            }
        with self.truth.lock:
            self.truth.ingests[identity] = Ingest(body=body, root=identity, n8n_execution=execution)
        self._post_ingest(identity)

    def ingest_again(self) -> None:
        """The same failure reported again (a repost), or an n8n retry of a known execution."""
        with self.truth.lock:
            acked = [i for i, rec in self.truth.ingests.items() if rec.acked and rec.root == i]
        if not acked:
            return
        identity = self._choice(acked)
        root = self.truth.ingests[identity]
        if root.n8n_execution and self._rand() < 0.5:
            execution = str(100_000 + self._next())
            body = dict(root.body)
            body["execution"] = {**root.body["execution"], "id": execution, "retryOf": root.n8n_execution}
            retry_identity = f"n8n:77:{execution}"
            with self.truth.lock:
                self.truth.ingests[retry_identity] = Ingest(body=body, root=identity, n8n_execution=execution)
            self._post_ingest(retry_identity)
        else:
            self._post_ingest(identity)

    def _post_ingest(self, identity: str) -> None:
        record = self.truth.ingests[identity]
        for attempt in range(4):
            with self.truth.lock:
                record.attempted += 1
            answer = self.api.call("dlq ingest", "POST", "/api/v1/dlq/events", json=record.body)
            if not answer.unknown:
                break
            self._sleep(0.5 * 2**attempt)
        if answer.status in (200, 201) and isinstance(answer.body, dict):
            with self.truth.lock:
                record.acked += 1
                record.entry_ids.add(answer.body["id"])

    def replay_some(self) -> None:
        """Replay a pending entry (sometimes two clicks at once), or force a replayed one."""
        force = self._rand() < 0.1
        listing = self.api.call(
            "dlq list",
            "GET",
            "/api/v1/dlq/events",
            params={"status": "replayed" if force else "pending", "page_size": 50},
        )
        if listing.status != 200 or not listing.body.get("results"):
            return
        entry = self._choice(listing.body["results"])
        body = {"force": True, "note": "soak: forced replay"} if force else {}
        with self.truth.lock:
            self.truth.replay_requests += 1

        def one() -> None:
            answer = self.api.call("dlq replay", "POST", f"/api/v1/dlq/events/{entry['id']}/replay", json=body)
            if answer.status == 201:
                self.recorder.count(f"replay outcome {answer.body.get('outcome')}")

        if self._rand() < 0.15:
            # A double click: two replays of one entry at once; the ledger lets one send.
            second = threading.Thread(target=one, name="soak-double-click")
            second.start()
            one()
            second.join(timeout=30)
        else:
            one()

    # --- reads and reveals ---

    def read_some(self) -> None:
        with self.truth.lock:
            ids = self.truth.op_ids[-500:]
        if ids and self._rand() < 0.7:
            self.api.call("get operation", "GET", f"/api/v1/operations/{self._choice(ids)}")
        else:
            self.api.call("list operations", "GET", "/api/v1/operations", params={"status": "review"})

    def reveal_some(self) -> None:
        with self.truth.lock:
            ids = self.truth.op_ids[-500:]
        if ids:
            self.auditor.call(
                "reveal payload",
                "POST",
                f"/api/v1/operations/{self._choice(ids)}/payload",
                json={"reason": "soak: audit of a stored request"},
            )

    # --- the mix ---

    def task(self) -> Callable[[], None]:
        """One unit of load, drawn from the mix."""
        r = self._rand()
        enforced, advisory = self.providers["enforced"], self.providers["advisory"]
        n = self._next()
        if r < 0.28:
            key = f"soak:g:{n}:v1"
            decline = self._rand() < 0.06
            return lambda: self.guard_flow(
                key, enforced, decline=decline, uses_marker=self._rand() < 0.8, heartbeat=self._rand() < 0.15
            )
        if r < 0.40:
            key = f"soak:ga:{n}:v1"
            decline = self._rand() < 0.06
            return lambda: self.guard_flow(
                key, advisory, decline=decline, uses_marker=self._rand() < 0.8, heartbeat=self._rand() < 0.15
            )
        if r < 0.45:
            return lambda: self._concurrent_claims(f"soak:gc:{n}:v1", self._choice([enforced, advisory]))
        if r < 0.50:
            return self._rerun_a_key
        if r < 0.68:
            key = f"soak:x:{n}:v1"
            return lambda: self.submit(
                key, enforced, decline=self._rand() < 0.06, deadline=60.0 if self._rand() < 0.3 else None
            )
        if r < 0.76:
            key = f"soak:xa:{n}:v1"
            return lambda: self.submit(key, advisory, decline=self._rand() < 0.06, deadline=None)
        if r < 0.82:
            return self.ingest_new
        if r < 0.86:
            return self.ingest_again
        if r < 0.92:
            return self.replay_some
        if r < 0.97:
            return self.read_some
        return self.reveal_some

    def _concurrent_claims(self, key: str, p: Provider) -> None:
        """Two or three callers with the same key at the same moment: one effect at most."""
        decline = False
        threads = [
            threading.Thread(
                target=self.guard_flow,
                args=(key, p),
                kwargs={"decline": decline, "uses_marker": True, "heartbeat": False},
                name="soak-same-key",
            )
            for _ in range(2 + (self._rand() < 0.5))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=FLOW_BUDGET_SECONDS + 20)

    def _rerun_a_key(self) -> None:
        """A workflow that runs again with a key used before: the recorded outcome answers."""
        with self.truth.lock:
            if not self.truth.keys:
                return
            key = self._choice(list(self.truth.keys)[-2000:])
            mode, name, decline = self.truth.keys[key]
        p = self.providers[name]
        if mode == "guard":
            self.guard_flow(key, p, decline=decline, uses_marker=True, heartbeat=False)
        else:
            self.submit(key, p, decline=decline, deadline=None)

    def run(self, *, seconds: float, rate: float, clients: int, stop: threading.Event) -> None:
        """Feed tasks at ``rate`` per second to ``clients`` threads for ``seconds`` (or until
        ``stop``); a saturated pool skips ticks instead of queueing without bound."""
        in_flight = threading.Semaphore(clients * 2)
        ends = time.monotonic() + seconds
        with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="soak-client") as pool:
            next_at = time.monotonic()
            try:
                while not stop.is_set() and time.monotonic() < ends:
                    next_at += 1.0 / rate
                    self._sleep(next_at - time.monotonic())
                    if not in_flight.acquire(blocking=False):
                        self.recorder.count("ticks skipped (clients busy)")
                        continue
                    work = self.task()

                    def wrapped(work: Callable[[], None] = work) -> None:
                        try:
                            work()
                        except Exception as exc:  # a harness bug must show, not stop the soak
                            self.recorder.count(f"client exception {type(exc).__name__}")
                        finally:
                            in_flight.release()

                    pool.submit(wrapped)
            except BaseException:
                # Ctrl-C: the callers stop waiting now, so the pool's shutdown does not wait
                # out their retry budgets.
                self.hard_stop.set()
                raise
            self.recorder.count("load seconds", int(seconds))


def _seconds_until(iso: str | None) -> float:
    if not iso:
        return 1.0
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return 1.0
    return max(0.0, moment.timestamp() - time.time())


class Reviewer:
    """A scripted reviewer: decides settled review items by what the provider shows.

    An effect at the provider → ``confirm_succeeded``; none → ``safe_to_retry`` or
    ``abandon`` (only ``abandon`` for a replay's key, which nobody re-claims, and while
    draining). A replay's key is checked at the replay sink under the key it sent.
    """

    def __init__(
        self,
        *,
        api: Api,
        providers: dict[str, Provider],
        sink: RunningServer,
        sent_key_of: Callable[[str], str | None],
        recorder: Recorder,
        rng: random.Random,
    ) -> None:
        self.api = api
        self.by_slug = {p.slug: p for p in providers.values()}
        self.sink = sink
        self.sent_key_of = sent_key_of
        self.recorder = recorder
        self.rng = rng

    def round(self, *, allow_retry: bool) -> int:
        listing = self.api.call(
            "review list",
            "GET",
            "/api/v1/review/items",
            params={"older_than_seconds": REVIEW_SETTLE_SECONDS, "page_size": 100},
        )
        if listing.status != 200 or not listing.body.get("results"):
            return 0
        try:
            effects = {slug: p.mock.effects()["by_key"] for slug, p in self.by_slug.items()}
            sink_effects = self.sink.effects()["by_key"]
        except httpx.HTTPError:
            return 0
        decided = 0
        for item in listing.body["results"]:
            key = item["key"]
            if key.startswith("replay:"):
                sent_key = self.sent_key_of(key)
                if sent_key is None:
                    continue  # not knowable now: decide it next round, never blind
                seen = sink_effects.get(sent_key, 0)
                decision = "confirm_succeeded" if seen else "abandon"
            else:
                seen = effects.get(item.get("provider") or "", {}).get(key, 0)
                if seen:
                    decision = "confirm_succeeded"
                elif allow_retry and self.rng.random() < 0.6:
                    decision = "safe_to_retry"
                else:
                    decision = "abandon"
            answer = self.api.call(
                "review decision",
                "POST",
                f"/api/v1/review/items/{item['id']}/decision",
                json={"decision": decision, "note": f"soak reviewer: the provider shows {seen} effect(s) for the key"},
            )
            if answer.status == 200:
                decided += 1
                self.recorder.count(f"review {decision}")
        return decided

    def run(self, stop: threading.Event, *, every: float = 2.0) -> None:
        while not stop.wait(every):
            try:
                self.round(allow_retry=True)
            except Exception as exc:  # the reviewer keeps working through any one bad round
                self.recorder.count(f"reviewer round failed ({type(exc).__name__})")
