"""Mock providers: a real HTTP server that performs a countable side effect.

Two receivers, the two classes of DESIGN §1:

- ``enforced`` behaves like Stripe's ``Idempotency-Key``: the first request with a key
  creates an object (201); a repeat with the same key and request answers the stored
  object again (200, ``Idempotent-Replayed: true``) without a new effect; the same key
  with another request answers 422 ``idempotency_key_reused``; a repeat while the first
  is still being handled answers 409 ``idempotency_key_in_use``. Objects can be looked
  up (``GET /charges?idempotency_key=K``, ``GET /charges/{ref}``).
- ``advisory`` behaves like a webhook or SMTP: every request is a new effect (201), and
  nothing can be looked up (404).

Effect paths: ``POST /charges`` (and any POST path under ``/charges/``) and ``POST
/contacts`` (and under ``/contacts/``), each also under an API version prefix
(``/v2/charges``: the same collection; a key used under two versions is the same request).
Control paths, both modes:

- ``GET /_effects`` → ``{"count", "by_key", "requests", "requests_by_key",
  "requests_by_version", "failed", "objects", "lookups", "mode"}``. ``count`` is the number
  of effects that happened (objects created with status ``succeeded``), ``by_key`` the same
  per idempotency key sent (advisory providers ignore the key, which is exactly how their
  duplicates show), ``requests`` every effect request seen, whatever was answered, also per
  key and per version prefix ("" without one).
- ``POST /_reset`` forgets everything, the script and the broken versions included.
- ``POST /_broken`` with ``{"v2": 500}`` makes every effect request under that version
  prefix answer that status without an effect (a broken new API version: what an adapter
  revision that changed the provider's request shape meets); ``{}`` mends them all.
- ``POST /_script`` with a JSON list of steps replaces the script; ``GET /_script`` →
  ``{"pending": n}``. One step is consumed per effect request, in arrival order::

      {"status": 429, "retry_after": 1}   answer 429 + Retry-After, no effect
      {"status": 500, "commit": true}     perform the effect, then answer 500
      {"status": 201, "body": {"id": null}}  perform the effect, answer this body
      {"delay": 2.0}                       hold the request 2 s, then handle it normally
      {"drop": true}                       perform the effect, close without answering
      {"outcome": "failed"}                as the X-Mock-Outcome header
      {"headers": {"X-Name": "v"}}         extra answer headers
      {}                                   handle normally

  ``commit`` defaults to true for a 2xx status and for ``drop`` (a success answer means
  the effect happened) and to false otherwise. A 409 ``idempotency_key_in_use`` answer
  consumes no step.

The forced outcome header ``X-Mock-Outcome: failed`` stores the object with status
``failed`` and answers 402 (a decline: no effect, counted under ``failed``); an enforced
provider answers a repeat of that key with the same 402, as Stripe replays declines.
Bodies are stored in memory for lookups and never logged.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from relay.server import (
    MAX_DELAY_SECONDS,
    MAX_SCRIPT_STEPS,
    BadRequestBody,
    BodyTooLarge,
    JsonRequestHandler,
    LoopbackServer,
    log,
)

ENFORCED = "enforced"
ADVISORY = "advisory"
MODES = (ENFORCED, ADVISORY)

OUTCOME_HEADER = "X-Mock-Outcome"
OUTCOMES = ("succeeded", "failed")
MAX_OBJECTS = 50_000

# Collection name → (object type, id prefix). POST /charges/… counts as a charge.
COLLECTIONS = {"charges": ("charge", "ch_"), "contacts": ("contact", "ct_")}
_COLLECTION_PATH = re.compile(r"^(?:/(?P<version>v[0-9]{1,3}))?/(?P<collection>charges|contacts)(?:/(?P<rest>.*))?$")
_VERSION = re.compile(r"^v[0-9]{1,3}$")
# Body fields a caller may use as its own reference (a reconciliation handle).
REFERENCE_FIELDS = ("reconciliation_handle", "reference", "client_reference")
RESERVED_FIELDS = ("id", "object", "status", "idempotency_key", "created")
STEP_FIELDS = frozenset({"status", "retry_after", "commit", "delay", "body", "headers", "outcome", "drop"})


class ScriptError(ValueError):
    pass


def validate_script(steps: Any) -> list[dict[str, Any]]:
    """Check a script before accepting it, so a typo fails the test that wrote it."""
    if not isinstance(steps, list):
        raise ScriptError("a script is a JSON list of steps")
    if len(steps) > MAX_SCRIPT_STEPS:
        raise ScriptError(f"at most {MAX_SCRIPT_STEPS} steps")
    for index, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ScriptError(f"step {index} is not an object")
        unknown = set(step) - STEP_FIELDS
        if unknown:
            raise ScriptError(f"step {index} has unknown fields {sorted(unknown)}")
        status = step.get("status")
        if status is not None and (not isinstance(status, int) or not 100 <= status <= 599):
            raise ScriptError(f"step {index}: status must be an HTTP status")
        delay = step.get("delay", 0)
        if not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY_SECONDS:
            raise ScriptError(f"step {index}: delay must be 0–{MAX_DELAY_SECONDS} seconds")
        if "outcome" in step and step["outcome"] not in OUTCOMES:
            raise ScriptError(f"step {index}: outcome must be one of {OUTCOMES}")
        headers = step.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str | int) for v in headers.values()):
            raise ScriptError(f"step {index}: headers must map names to strings")
    return steps


@dataclass
class KeyRecord:
    object_id: str
    fingerprint: str
    status: int


@dataclass
class Answer:
    status: int
    body: Any
    headers: list[tuple[str, str]]


class MockProviderState:
    """Everything the provider remembers, guarded by one lock."""

    def __init__(self, mode: str, header: str = "Idempotency-Key") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.header = header
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.objects: dict[str, dict[str, Any]] = {}
            self.keys: dict[str, KeyRecord] = {}
            self.in_flight: set[str] = set()
            self.effects = 0
            self.failed = 0
            self.by_key: Counter[str] = Counter()
            self.requests = 0
            self.requests_by_key: Counter[str] = Counter()
            self.requests_by_version: Counter[str] = Counter()
            self.broken: dict[str, int] = {}
            self.lookups = 0
            self.script: deque[dict[str, Any]] = deque()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": self.mode,
                "count": self.effects,
                "by_key": dict(self.by_key),
                "requests": self.requests,
                "requests_by_key": dict(self.requests_by_key),
                "requests_by_version": dict(self.requests_by_version),
                "failed": self.failed,
                "objects": len(self.objects),
                "lookups": self.lookups,
            }

    def set_script(self, steps: list[dict[str, Any]]) -> None:
        with self.lock:
            self.script = deque(steps)

    def pending_steps(self) -> int:
        with self.lock:
            return len(self.script)

    def set_broken(self, broken: Any) -> None:
        """``{"v2": 500}``: requests under these version prefixes fail with that status."""
        if not isinstance(broken, dict) or not all(
            isinstance(k, str) and _VERSION.match(k) and isinstance(v, int) and 100 <= v <= 599
            for k, v in broken.items()
        ):
            raise ScriptError('broken versions map a version prefix ("v2") to an HTTP status')
        with self.lock:
            self.broken = dict(broken)

    # --- effect requests ---

    def begin(self, key: str | None, version: str = "") -> tuple[bool, dict[str, Any]]:
        """Count the request; take the key and the next step. False: the key is in use. A
        request under a broken version takes neither: its step is ``{"broken": status}``."""
        with self.lock:
            self.requests += 1
            self.requests_by_version[version] += 1
            if key is not None:
                self.requests_by_key[key] += 1
            if version in self.broken:
                return True, {"broken": self.broken[version]}
            if self.mode == ENFORCED and key is not None:
                # Stripe answers 409 while a request with the same key is being handled.
                if key in self.in_flight:
                    return False, {}
                self.in_flight.add(key)
            step = self.script.popleft() if self.script else {}
        return True, step

    def end(self, key: str | None) -> None:
        if self.mode == ENFORCED and key is not None:
            with self.lock:
                self.in_flight.discard(key)

    def perform(self, *, collection: str, path: str, body: Any, key: str | None, outcome: str) -> Answer:
        fingerprint = hashlib.sha256(
            json.dumps([path, body], sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        with self.lock:
            if self.mode == ENFORCED and key is not None:
                record = self.keys.get(key)
                if record is not None:
                    if record.fingerprint != fingerprint:
                        return Answer(422, {"error": "idempotency_key_reused"}, [])
                    # Replay the first answer: 201 becomes 200, a decline stays a decline.
                    status = 200 if record.status < 300 else record.status
                    return Answer(status, self.objects[record.object_id], [("Idempotent-Replayed", "true")])
            if len(self.objects) >= MAX_OBJECTS:
                return Answer(507, {"error": "mock_provider_full", "limit": MAX_OBJECTS}, [])
            object_type, prefix = COLLECTIONS[collection]
            obj: dict[str, Any] = dict(body) if isinstance(body, dict) else {"data": body}
            for field in RESERVED_FIELDS:
                obj.pop(field, None)
            obj = {
                "id": prefix + secrets.token_hex(8),
                "object": object_type,
                "status": outcome,
                "idempotency_key": key,
                "created": int(time.time()),
                **obj,
            }
            self.objects[obj["id"]] = obj
            status = 402 if outcome == "failed" else 201
            if outcome == "failed":
                self.failed += 1
            else:
                self.effects += 1
                if key is not None:
                    self.by_key[key] += 1
            if self.mode == ENFORCED and key is not None:
                self.keys[key] = KeyRecord(obj["id"], fingerprint, status)
            return Answer(status, obj, [])

    # --- lookups ---

    def lookup_by_key(self, collection: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            self.lookups += 1
            if self.mode != ENFORCED:
                return None
            record = self.keys.get(key)
            obj = self.objects.get(record.object_id) if record else None
            return obj if obj and obj["object"] == COLLECTIONS[collection][0] else None

    def lookup_by_ref(self, collection: str, ref: str) -> dict[str, Any] | None:
        """By object id, else idempotency key, else a reference field the caller put in the body."""
        with self.lock:
            self.lookups += 1
            if self.mode != ENFORCED:
                return None
            object_type = COLLECTIONS[collection][0]
            obj = self.objects.get(ref)
            if obj is None and ref in self.keys:
                obj = self.objects.get(self.keys[ref].object_id)
            if obj is None:
                obj = next(
                    (o for o in self.objects.values() if any(o.get(f) == ref for f in REFERENCE_FIELDS)),
                    None,
                )
            return obj if obj and obj["object"] == object_type else None


class MockProviderHandler(JsonRequestHandler):
    server_version = "OnceguardMockProvider/1"
    server: MockProviderServer

    @property
    def state(self) -> MockProviderState:
        return self.server.state

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/_effects":
            self.send_json(200, self.state.snapshot())
            return
        if url.path == "/_script":
            self.send_json(200, {"pending": self.state.pending_steps()})
            return
        match = _COLLECTION_PATH.match(url.path)
        if not match:
            self.send_json(404, {"error": "not_found"})
            return
        collection, rest = match["collection"], match["rest"]
        if rest:
            obj = self.state.lookup_by_ref(collection, unquote(rest))
        else:
            keys = parse_qs(url.query).get("idempotency_key")
            if not keys:
                self.send_json(400, {"error": "idempotency_key_query_parameter_required"})
                return
            obj = self.state.lookup_by_key(collection, keys[0])
        if obj is None:
            self.send_json(404, {"error": "not_found"})
        else:
            self.send_json(200, obj)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/_reset":
                self.read_body()
                self.state.reset()
                self.send_json(200, {"reset": True})
                return
            if url.path == "/_script":
                try:
                    steps = validate_script(self.read_json())
                except ScriptError as exc:
                    self.send_json(400, {"error": "invalid_script", "detail": str(exc)})
                    return
                self.state.set_script(steps)
                self.send_json(200, {"pending": len(steps)})
                return
            if url.path == "/_broken":
                try:
                    self.state.set_broken(self.read_json())
                except ScriptError as exc:
                    self.send_json(400, {"error": "invalid_broken_versions", "detail": str(exc)})
                    return
                self.send_json(200, {"broken": True})
                return
            match = _COLLECTION_PATH.match(url.path)
            if not match:
                self.read_body()
                self.send_json(404, {"error": "not_found"})
                return
            body = self.read_json()
        except (BodyTooLarge, BadRequestBody) as exc:
            self.handle_body_errors(exc)
            return
        version = match["version"] or ""
        # Without its version prefix: one request, whichever version it was sent to.
        path = url.path[len(version) + 1 :] if version else url.path
        self.handle_effect(match["collection"], path, body, version)

    def handle_effect(self, collection: str, path: str, body: Any, version: str = "") -> None:
        key = (self.headers.get(self.state.header) or "").strip() or None
        accepted, step = self.state.begin(key, version)
        if not accepted:
            self.send_json(409, {"error": "idempotency_key_in_use"}, [("Retry-After", "1")])
            return
        if "broken" in step:
            self.send_json(step["broken"], {"error": "broken_version", "version": version})
            return
        try:
            answer = self.play(step, collection, path, body, key)
        finally:
            # Released before the first answer byte: a caller that retries the moment it
            # reads the answer must find the key free, not "in use".
            self.state.end(key)
        if answer is None:
            self.drop_connection()
        else:
            self.send_json(answer.status, answer.body, answer.headers)

    def play(self, step: dict[str, Any], collection: str, path: str, body: Any, key: str | None) -> Answer | None:
        """What to answer for this request and step; None means close without answering."""
        if step.get("delay"):
            # Wakes early when the server stops: a stopped server holds no thread and,
            # like a crashed one, performs nothing more and answers nothing.
            if self.server.stopping.wait(float(step["delay"])):
                return None
        headers = [(str(name), str(value)) for name, value in step.get("headers", {}).items()]
        if "retry_after" in step:
            headers.append(("Retry-After", str(step["retry_after"])))
        scripted_status = step.get("status")
        commit = step.get("commit", bool(step.get("drop")) or scripted_status is None or 200 <= scripted_status < 300)
        if not commit:
            return Answer(
                scripted_status or 500,
                step.get("body", {"error": "scripted_failure", "status": scripted_status}),
                headers,
            )
        outcome = step.get("outcome") or (self.headers.get(OUTCOME_HEADER) or "succeeded").strip().lower()
        if outcome not in OUTCOMES:
            return Answer(400, {"error": "unknown_outcome", "allowed": list(OUTCOMES)}, [])
        answer = self.state.perform(collection=collection, path=path, body=body, key=key, outcome=outcome)
        if step.get("drop"):
            return None
        return Answer(
            scripted_status or answer.status, step["body"] if "body" in step else answer.body, answer.headers + headers
        )


class MockProviderServer(LoopbackServer):
    def __init__(self, address: tuple[str, int], state: MockProviderState) -> None:
        self.state = state
        super().__init__(address, MockProviderHandler)


def make_mock_provider(
    mode: str, *, host: str = "127.0.0.1", port: int = 0, header: str = "Idempotency-Key"
) -> MockProviderServer:
    """A bound, not yet serving, mock provider; port 0 picks a free port."""
    server = MockProviderServer((host, port), MockProviderState(mode, header))
    log.info("mock provider (%s) listening on %s", mode, server.url)
    return server
