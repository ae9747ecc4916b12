"""A mock image API with an asynchronous shape: submit → job id → poll → output.

A real HTTP server on loopback, like the other mock providers, standing in for an image
generation API that answers *later*. It is key-enforced: the ``Idempotency-Key`` header is
required, and a key always names the same job — a repeat never renders again.

- ``POST /v1/renders`` with ``{"width", "height", "prompt"?}`` (sides 1–4096, at most 16.7 M
  pixels) → ``202 {"id": "job_…", "status": "queued", …}``. The same key with the same body →
  ``200`` + ``Idempotent-Replayed: true`` with that job as it is now; with another body →
  ``422 idempotency_key_reused``; without a key → ``400 idempotency_key_required``.
- ``GET /v1/renders/{id}`` → the job: ``status`` is ``queued`` until its render time has come
  (``delay``), then ``succeeded`` with ``output`` (``url``, ``media_type``, ``width``,
  ``height``, ``sha256``, ``size``) or ``failed`` with ``error``.
- ``GET /v1/renders?idempotency_key=K`` → the job of a key (reconciliation), or 404.
- ``GET /v1/renders/{id}/output`` → the image's bytes (``Content-Type`` as ``output`` says),
  ``404 not_ready`` before.

The render happens once per job — the first time the job is looked at after its render
time — and is counted; it draws a real PNG with Pillow, the same pixels for the same key and
size. **Switches** change what a job does, fixed when it is submitted: ``delay`` (seconds
before it is done: slow), ``fail`` (it ends ``failed``, no output), ``wrong_size`` (the image
is one pixel wider and taller than asked, while ``output`` claims the asked size),
``wrong_type`` (the bytes are a JPEG, while ``output`` and ``Content-Type`` say PNG), and a
submit-time ``status`` (with ``retry_after``: answer 429/503/500 without creating a job).
``POST /_switches`` sets the defaults for later jobs; ``POST /_script`` queues one switch set
per submission (consumed in arrival order, before the defaults apply). ``POST /_release``
ends every job's wait at once (its render happens at its next look): tests of a slow job do
not wait on a clock.

Control: ``GET /_effects`` → ``{"mode": "images", "renders", "failed", "jobs", "submits",
"by_key", "polls", "fetches", "lookups"}`` (``renders``: images drawn; ``by_key``: renders per
key — never more than 1), ``POST /_reset``. Prompts are kept in memory only and never logged.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from PIL import Image, ImageDraw

from relay.server import (
    MAX_DELAY_SECONDS,
    MAX_SCRIPT_STEPS,
    BadRequestBody,
    BodyTooLarge,
    JsonRequestHandler,
    LoopbackServer,
    log,
)

IMAGES = "images"
MAX_SIDE = 4096
MAX_PIXELS = 16_777_216
MAX_JOBS = 10_000
MAX_PROMPT = 4000
KEY_HEADER = "Idempotency-Key"
SWITCH_FIELDS = frozenset({"delay", "fail", "wrong_size", "wrong_type", "status", "retry_after"})
_JOB_PATH = re.compile(r"^/v1/renders/(?P<id>job_[0-9a-f]{16})(?P<output>/output)?$")


class SwitchError(ValueError):
    pass


def validate_switches(switches: Any, where: str = "switches") -> dict[str, Any]:
    """Check one switch set, so a typo fails the test that wrote it."""
    if not isinstance(switches, dict):
        raise SwitchError(f"{where} must be an object")
    unknown = set(switches) - SWITCH_FIELDS
    if unknown:
        raise SwitchError(f"{where} has unknown fields {sorted(unknown)}")
    delay = switches.get("delay", 0)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay <= MAX_DELAY_SECONDS:
        raise SwitchError(f"{where}: delay must be 0–{MAX_DELAY_SECONDS} seconds")
    for flag in ("fail", "wrong_size", "wrong_type"):
        if not isinstance(switches.get(flag, False), bool):
            raise SwitchError(f"{where}: {flag} must be true or false")
    status = switches.get("status")
    if status is not None and (not isinstance(status, int) or not 400 <= status <= 599):
        raise SwitchError(f"{where}: status must be an HTTP error status")
    retry_after = switches.get("retry_after")
    if retry_after is not None and (not isinstance(retry_after, int) or not 0 <= retry_after <= 3600):
        raise SwitchError(f"{where}: retry_after must be 0–3600 seconds")
    return dict(switches)


def validate_script(steps: Any) -> list[dict[str, Any]]:
    if not isinstance(steps, list):
        raise SwitchError("a script is a JSON list of switch sets")
    if len(steps) > MAX_SCRIPT_STEPS:
        raise SwitchError(f"at most {MAX_SCRIPT_STEPS} steps")
    return [validate_switches(step, f"step {i}") for i, step in enumerate(steps)]


def render_png(*, key: str, width: int, height: int) -> bytes:
    """A real PNG: a background and a diagonal band whose colours come from the key, so the
    same key and size always give the same pixels."""
    seed = hashlib.sha256(key.encode()).digest()
    image = Image.new("RGB", (width, height), (seed[0], seed[1], seed[2]))
    draw = ImageDraw.Draw(image)
    band = max(1, min(width, height) // 4)
    draw.line([(0, 0), (width - 1, height - 1)], fill=(seed[3], seed[4], seed[5]), width=band)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def render_jpeg(*, key: str, width: int, height: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (seed[0], seed[1], seed[2])).save(buffer, format="JPEG")
    return buffer.getvalue()


@dataclass
class Job:
    id: str
    key: str
    fingerprint: str
    width: int
    height: int
    switches: dict[str, Any]
    created: float
    ready_at: float
    status: str = "queued"
    output: bytes | None = None
    output_type: str = "image/png"
    error: dict[str, str] | None = None
    events: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "render",
            "status": self.status,
            "idempotency_key": self.key,
            "width": self.width,
            "height": self.height,
            "created": int(self.created),
            "output": None,
            "error": self.error,
        }
        if self.status == "succeeded" and self.output is not None:
            body["output"] = {
                "url": f"/v1/renders/{self.id}/output",
                # What the provider *claims*: the wrong_type and wrong_size switches make it lie.
                "media_type": "image/png",
                "width": self.width,
                "height": self.height,
                "size": len(self.output),
                "sha256": hashlib.sha256(self.output).hexdigest(),
            }
        return body


class MockImageState:
    """Everything the image API remembers, guarded by one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.defaults: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.jobs: dict[str, Job] = {}
            self.by_key: dict[str, str] = {}
            self.renders: Counter[str] = Counter()
            self.failed = 0
            self.submits = 0
            self.polls = 0
            self.fetches = 0
            self.lookups = 0
            self.script: deque[dict[str, Any]] = deque()
            self.defaults = {}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": IMAGES,
                "renders": sum(self.renders.values()),
                "failed": self.failed,
                "jobs": len(self.jobs),
                "submits": self.submits,
                "by_key": dict(self.renders),
                "polls": self.polls,
                "fetches": self.fetches,
                "lookups": self.lookups,
            }

    def set_script(self, steps: list[dict[str, Any]]) -> None:
        with self.lock:
            self.script = deque(steps)

    def release(self) -> int:
        """Every job still rendering is done at its next look (tests: no waiting on a clock)."""
        with self.lock:
            now = time.monotonic()
            queued = [job for job in self.jobs.values() if job.status == "queued"]
            for job in queued:
                job.ready_at = min(job.ready_at, now)
            return len(queued)

    def set_defaults(self, switches: dict[str, Any]) -> None:
        with self.lock:
            self.defaults = switches

    def pending_steps(self) -> int:
        with self.lock:
            return len(self.script)

    def submit(self, *, key: str, width: int, height: int, prompt: str) -> tuple[int, Any, list[tuple[str, str]]]:
        fingerprint = hashlib.sha256(json.dumps([width, height, prompt], separators=(",", ":")).encode()).hexdigest()
        with self.lock:
            self.submits += 1
            known = self.jobs.get(self.by_key.get(key, ""))
            if known is not None:
                if known.fingerprint != fingerprint:
                    return 422, {"error": "idempotency_key_reused"}, []
                self._advance(known)
                return 200, known.as_json(), [("Idempotent-Replayed", "true")]
            switches = self.script.popleft() if self.script else dict(self.defaults)
            if switches.get("status"):
                headers = [("Retry-After", str(switches["retry_after"]))] if "retry_after" in switches else []
                return int(switches["status"]), {"error": "scripted_failure", "status": switches["status"]}, headers
            if len(self.jobs) >= MAX_JOBS:
                return 507, {"error": "mock_provider_full", "limit": MAX_JOBS}, []
            now = time.monotonic()
            job = Job(
                id="job_" + secrets.token_hex(8),
                key=key,
                fingerprint=fingerprint,
                width=width,
                height=height,
                switches=switches,
                created=time.time(),
                ready_at=now + float(switches.get("delay", 0)),
            )
            self.jobs[job.id] = job
            self.by_key[key] = job.id
            return 202, job.as_json(), [("Location", f"/v1/renders/{job.id}")]

    def _advance(self, job: Job) -> None:
        """Render a due job, once (under the lock)."""
        if job.status != "queued" or time.monotonic() < job.ready_at:
            return
        if job.switches.get("fail"):
            job.status = "failed"
            job.error = {"code": "render_failed", "message": "the model could not render this prompt"}
            self.failed += 1
            return
        width, height = job.width, job.height
        if job.switches.get("wrong_size"):
            width, height = width + 1, height + 1
        if job.switches.get("wrong_type"):
            job.output = render_jpeg(key=job.key, width=width, height=height)
        else:
            job.output = render_png(key=job.key, width=width, height=height)
        job.status = "succeeded"
        self.renders[job.key] += 1

    def poll(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            self.polls += 1
            job = self.jobs.get(job_id)
            if job is None:
                return None
            self._advance(job)
            return job.as_json()

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            self.lookups += 1
            job = self.jobs.get(self.by_key.get(key, ""))
            if job is None:
                return None
            self._advance(job)
            return job.as_json()

    def output(self, job_id: str) -> tuple[int, bytes | dict[str, Any]]:
        with self.lock:
            self.fetches += 1
            job = self.jobs.get(job_id)
            if job is None:
                return 404, {"error": "not_found"}
            self._advance(job)
            if job.output is None:
                return 404, {"error": "not_ready", "status": job.status}
            return 200, job.output


class MockImageHandler(JsonRequestHandler):
    server_version = "OnceguardMockImages/1"
    server: MockImageServer

    @property
    def state(self) -> MockImageState:
        return self.server.state

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/_effects":
            self.send_json(200, self.state.snapshot())
            return
        if url.path == "/_script":
            self.send_json(200, {"pending": self.state.pending_steps()})
            return
        if url.path == "/v1/renders":
            keys = parse_qs(url.query).get("idempotency_key")
            if not keys:
                self.send_json(400, {"error": "idempotency_key_query_parameter_required"})
                return
            job = self.state.lookup(keys[0])
            self.send_json(*((200, job) if job is not None else (404, {"error": "not_found"})))
            return
        match = _JOB_PATH.match(url.path)
        if not match:
            self.send_json(404, {"error": "not_found"})
            return
        if match["output"]:
            status, body = self.state.output(match["id"])
            if isinstance(body, bytes):
                # The claimed type, whatever the bytes are (the wrong_type switch).
                self.send_bytes(200, body, content_type="image/png")
            else:
                self.send_json(status, body)
            return
        job = self.state.poll(match["id"])
        self.send_json(*((200, job) if job is not None else (404, {"error": "not_found"})))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path in ("/_reset", "/_script", "/_switches", "/_release"):
                self.control(url.path)
                return
            if url.path != "/v1/renders":
                self.read_body()
                self.send_json(404, {"error": "not_found"})
                return
            body = self.read_json()
        except (BodyTooLarge, BadRequestBody) as exc:
            self.handle_body_errors(exc)
            return
        self.submit(body)

    def control(self, path: str) -> None:
        if path == "/_reset":
            self.read_body()
            self.state.reset()
            self.send_json(200, {"reset": True})
            return
        if path == "/_release":
            self.read_body()
            self.send_json(200, {"released": self.state.release()})
            return
        try:
            if path == "/_script":
                steps = validate_script(self.read_json())
                self.state.set_script(steps)
                self.send_json(200, {"pending": len(steps)})
            else:
                switches = validate_switches(self.read_json())
                self.state.set_defaults(switches)
                self.send_json(200, {"switches": switches})
        except SwitchError as exc:
            self.send_json(400, {"error": "invalid_switches", "detail": str(exc)})

    def submit(self, body: Any) -> None:
        key = (self.headers.get(KEY_HEADER) or "").strip()
        if not key:
            self.send_json(400, {"error": "idempotency_key_required"})
            return
        if not isinstance(body, dict):
            self.send_json(400, {"error": "invalid_request", "detail": "a JSON object is expected"})
            return
        width, height, prompt = body.get("width"), body.get("height"), body.get("prompt", "")
        sides_ok = all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in (width, height))
        if not sides_ok or width * height > MAX_PIXELS:
            self.send_json(400, {"error": "invalid_size", "detail": f"width and height: 1–{MAX_SIDE}"})
            return
        if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT:
            self.send_json(400, {"error": "invalid_prompt", "detail": f"at most {MAX_PROMPT} characters"})
            return
        status, answer, headers = self.state.submit(key=key, width=width, height=height, prompt=prompt)
        self.send_json(status, answer, headers)


class MockImageServer(LoopbackServer):
    def __init__(self, address: tuple[str, int], state: MockImageState) -> None:
        self.state = state
        super().__init__(address, MockImageHandler)


def make_mock_image_provider(*, host: str = "127.0.0.1", port: int = 0) -> MockImageServer:
    """A bound, not yet serving, mock image API; port 0 picks a free port."""
    server = MockImageServer((host, port), MockImageState())
    log.info("mock image provider listening on %s", server.url)
    return server
