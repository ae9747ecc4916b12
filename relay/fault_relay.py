"""The fault-injection relay: sits between a client and a provider and loses things on purpose.

It produces the two failure classes of DESIGN §1 on a real socket, so the code under test
meets them exactly as it would in production:

- ``forward-and-respond`` (default): forward, answer what the provider answered.
- ``fail-before-forward``: the provider never sees the request; answer 502 problem+json.
- ``fail-before-forward-close``: the provider never sees it; close without answering.
- ``forward-then-drop-response``: forward, let the provider commit, then close the
  client's connection without a single response byte (Class 2: sent, answer never seen).
- ``forward-then-reset``: the same, but with a TCP reset instead of an orderly close.
- ``delay-then-respond``: forward, then hold the answer ``delay`` seconds (to exceed the
  caller's deadline after the provider committed).

The mode of a request comes from, first that applies: its ``X-Relay-Mode`` header; the next
step of the relay's script (``POST /_relay/script``); the relay's mode (``--mode``,
``RELAY_MODE``, or ``POST /_relay/mode``). The delay likewise from ``X-Relay-Delay``, the
step, the relay's delay. ``X-Relay-*`` headers are never forwarded. Code under test that
cannot set headers (a worker calling a configured provider) is steered with the script
or the mode endpoint.

Control paths (never forwarded, never journaled):

- ``GET /_relay/journal`` → ``[{seq, method, path, mode, forwarded, upstream_status,
  dropped, idempotency_key, delay, error}]``. Paths without their query string, no
  bodies, no header values other than the idempotency key (keys never carry personal data).
- ``POST /_relay/reset`` empties the journal and the script and restores the start-up mode.
- ``POST /_relay/script`` with a list of steps, each a mode name or ``{"mode", "delay"}``,
  consumed one per forwarded request that has no ``X-Relay-Mode`` header.
- ``POST /_relay/mode`` with ``{"mode": M, "delay": S}`` sets the relay's mode.
- ``GET /_relay/health`` → the relay's configuration.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import httpx

from relay.server import (
    HOP_BY_HOP,
    MAX_DELAY_SECONDS,
    MAX_RELAY_BODY_BYTES,
    MAX_SCRIPT_STEPS,
    BadRequestBody,
    BodyTooLarge,
    JsonRequestHandler,
    LoopbackServer,
    log,
)

FORWARD_AND_RESPOND = "forward-and-respond"
FAIL_BEFORE_FORWARD = "fail-before-forward"
FAIL_BEFORE_FORWARD_CLOSE = "fail-before-forward-close"
FORWARD_THEN_DROP_RESPONSE = "forward-then-drop-response"
FORWARD_THEN_RESET = "forward-then-reset"
DELAY_THEN_RESPOND = "delay-then-respond"
MODES = (
    FORWARD_AND_RESPOND,
    FAIL_BEFORE_FORWARD,
    FAIL_BEFORE_FORWARD_CLOSE,
    FORWARD_THEN_DROP_RESPONSE,
    FORWARD_THEN_RESET,
    DELAY_THEN_RESPOND,
)
FORWARDING_MODES = (FORWARD_AND_RESPOND, FORWARD_THEN_DROP_RESPONSE, FORWARD_THEN_RESET, DELAY_THEN_RESPOND)

MODE_HEADER = "X-Relay-Mode"
DELAY_HEADER = "X-Relay-Delay"
JOURNAL_LIMIT = 10_000
# Headers the relay recomputes or must not pass on, besides the hop-by-hop ones.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
_NOT_RETURNED = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}


class RelayConfigError(ValueError):
    pass


def validate_mode(mode: Any) -> str:
    if mode not in MODES:
        raise RelayConfigError(f"unknown relay mode {mode!r}; one of {', '.join(MODES)}")
    return mode


def validate_delay(delay: Any) -> float:
    try:
        value = float(delay)
    except (TypeError, ValueError) as exc:
        raise RelayConfigError("delay must be a number of seconds") from exc
    if not 0 <= value <= MAX_DELAY_SECONDS:
        raise RelayConfigError(f"delay must be 0–{MAX_DELAY_SECONDS} seconds")
    return value


def validate_steps(steps: Any) -> list[dict[str, Any]]:
    if not isinstance(steps, list) or len(steps) > MAX_SCRIPT_STEPS:
        raise RelayConfigError(f"a relay script is a list of at most {MAX_SCRIPT_STEPS} steps")
    normalized = []
    for step in steps:
        if isinstance(step, str):
            step = {"mode": step}
        if not isinstance(step, dict) or set(step) - {"mode", "delay"}:
            raise RelayConfigError("a relay step is a mode name or {'mode': ..., 'delay': ...}")
        normalized.append(
            {
                "mode": validate_mode(step.get("mode", FORWARD_AND_RESPOND)),
                **({"delay": validate_delay(step["delay"])} if "delay" in step else {}),
            }
        )
    return normalized


class RelayState:
    """Configuration, script and journal of one relay, guarded by one lock."""

    def __init__(
        self,
        upstream: str,
        *,
        mode: str = FORWARD_AND_RESPOND,
        delay: float = 0.0,
        header: str = "Idempotency-Key",
        upstream_timeout: float = 30.0,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise RelayConfigError("the upstream must be an http(s) URL")
        self.upstream = upstream.rstrip("/")
        self.initial_mode = self.mode = validate_mode(mode)
        self.initial_delay = self.delay = validate_delay(delay)
        self.header = header
        self.lock = threading.Lock()
        self.journal: deque[dict[str, Any]] = deque(maxlen=JOURNAL_LIMIT)
        self.script: deque[dict[str, Any]] = deque()
        self.seq = 0
        # trust_env=False: a proxy configured in the environment must not sit between
        # the relay and a loopback provider.
        self.client = httpx.Client(timeout=upstream_timeout, trust_env=False, follow_redirects=False)

    def reset(self) -> None:
        with self.lock:
            self.journal.clear()
            self.script.clear()
            self.mode, self.delay = self.initial_mode, self.initial_delay

    def set_mode(self, mode: str, delay: float | None = None) -> None:
        with self.lock:
            self.mode = validate_mode(mode)
            if delay is not None:
                self.delay = validate_delay(delay)

    def set_script(self, steps: list[dict[str, Any]]) -> None:
        with self.lock:
            self.script = deque(steps)

    def settings(self) -> dict[str, Any]:
        with self.lock:
            return {"upstream": self.upstream, "mode": self.mode, "delay": self.delay, "pending": len(self.script)}

    def choose(self, header_mode: str | None, header_delay: str | None) -> tuple[str, float]:
        """The request's mode and delay: header, else the next script step, else the relay's."""
        with self.lock:
            step: dict[str, Any] = {}
            if header_mode is None and self.script:
                step = self.script.popleft()
            mode = header_mode if header_mode is not None else step.get("mode", self.mode)
            delay = step.get("delay", self.delay)
        if header_delay is not None:
            delay = header_delay
        return validate_mode(mode), validate_delay(delay)

    def open_entry(self, *, method: str, path: str, mode: str, delay: float, key: str | None) -> dict[str, Any]:
        with self.lock:
            self.seq += 1
            entry = {
                "seq": self.seq,
                "method": method,
                "path": path,
                "mode": mode,
                "delay": delay if mode == DELAY_THEN_RESPOND else 0.0,
                "forwarded": False,
                "upstream_status": None,
                "dropped": False,
                "idempotency_key": key,
                "error": None,
            }
            self.journal.append(entry)
            return entry

    def update(self, entry: dict[str, Any], **changes: Any) -> None:
        with self.lock:
            entry.update(changes)

    def journal_snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(entry) for entry in self.journal]

    def close(self) -> None:
        self.client.close()


class RelayHandler(JsonRequestHandler):
    server_version = "OnceguardFaultRelay/1"
    server: FaultRelayServer

    @property
    def state(self) -> RelayState:
        return self.server.state

    def do_GET(self) -> None:
        self.relay()

    def do_POST(self) -> None:
        self.relay()

    def do_PUT(self) -> None:
        self.relay()

    def do_PATCH(self) -> None:
        self.relay()

    def do_DELETE(self) -> None:
        self.relay()

    def do_HEAD(self) -> None:
        self.relay()

    def do_OPTIONS(self) -> None:
        self.relay()

    # --- control ---

    def control(self) -> None:
        path = self.path_only
        try:
            if self.command == "GET" and path == "/_relay/journal":
                self.send_json(200, self.state.journal_snapshot())
            elif self.command == "GET" and path == "/_relay/health":
                self.send_json(200, self.state.settings())
            elif self.command == "POST" and path == "/_relay/reset":
                self.read_body()
                self.state.reset()
                self.send_json(200, {"reset": True})
            elif self.command == "POST" and path == "/_relay/script":
                steps = validate_steps(self.read_json())
                self.state.set_script(steps)
                self.send_json(200, {"pending": len(steps)})
            elif self.command == "POST" and path == "/_relay/mode":
                body = self.read_json()
                if not isinstance(body, dict):
                    raise RelayConfigError("expected {'mode': ..., 'delay': ...}")
                self.state.set_mode(body.get("mode", self.state.initial_mode), body.get("delay"))
                self.send_json(200, self.state.settings())
            else:
                self.send_problem(404, "relay_unknown_control_path", "Unknown relay control path")
        except RelayConfigError as exc:
            self.send_problem(400, "relay_invalid_configuration", "Invalid relay configuration", str(exc))
        except (BodyTooLarge, BadRequestBody) as exc:
            self.handle_body_errors(exc)

    # --- relaying ---

    def relay(self) -> None:
        if self.path_only.startswith("/_relay/"):
            self.control()
            return
        if not self.path.startswith("/"):
            # Absolute-form targets would make this an open proxy; it only reaches its upstream.
            self.send_problem(400, "relay_origin_form_only", "The relay only accepts origin-form paths")
            return
        try:
            body = self.read_body(MAX_RELAY_BODY_BYTES)
        except (BodyTooLarge, BadRequestBody) as exc:
            self.handle_body_errors(exc, MAX_RELAY_BODY_BYTES)
            return
        try:
            mode, delay = self.state.choose(self.headers.get(MODE_HEADER), self.headers.get(DELAY_HEADER))
        except RelayConfigError as exc:
            self.send_problem(400, "relay_invalid_configuration", "Invalid relay instructions", str(exc))
            return
        key = (self.headers.get(self.state.header) or "").strip() or None
        entry = self.state.open_entry(method=self.command, path=self.path_only, mode=mode, delay=delay, key=key)

        if mode == FAIL_BEFORE_FORWARD:
            self.send_problem(
                502, "relay_fail_before_forward", "Upstream not reached", "The fault relay refused to forward."
            )
            return
        if mode == FAIL_BEFORE_FORWARD_CLOSE:
            self.state.update(entry, dropped=True)
            self.drop_connection()
            return

        try:
            response = self.state.client.request(
                self.command, self.state.upstream + self.path, headers=self.forward_headers(), content=body
            )
        except httpx.HTTPError as exc:
            # A connect failure means the provider never saw it; anything later may have.
            reached = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            self.state.update(entry, forwarded=reached, error=type(exc).__name__)
            log.info("relay: upstream error %s on %s %s", type(exc).__name__, self.command, self.path_only)
            if isinstance(exc, httpx.TimeoutException):
                self.send_problem(504, "relay_upstream_timeout", "Upstream timed out")
            else:
                self.send_problem(502, "relay_upstream_error", "Upstream unreachable")
            return
        self.state.update(entry, forwarded=True, upstream_status=response.status_code)

        if mode in (FORWARD_THEN_DROP_RESPONSE, FORWARD_THEN_RESET):
            self.state.update(entry, dropped=True)
            self.drop_connection(reset=mode == FORWARD_THEN_RESET)
            return
        if mode == DELAY_THEN_RESPOND and delay and self.server.stopping.wait(delay):
            # Stopped while holding the answer: the caller never gets it.
            self.state.update(entry, dropped=True)
            self.drop_connection()
            return
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _NOT_RETURNED]
        if not self.send_bytes(response.status_code, response.content, headers):
            # The caller gave up (its timeout) before the answer came: it saw nothing.
            self.state.update(entry, error="client_gone")

    def forward_headers(self) -> list[tuple[str, str]]:
        return [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _NOT_FORWARDED and not name.lower().startswith("x-relay-")
        ]


class FaultRelayServer(LoopbackServer):
    def __init__(self, address: tuple[str, int], state: RelayState) -> None:
        self.state = state
        super().__init__(address, RelayHandler)

    def stop(self) -> None:
        super().stop()
        self.state.close()


def make_relay(
    upstream: str,
    *,
    mode: str = FORWARD_AND_RESPOND,
    delay: float = 0.0,
    host: str = "127.0.0.1",
    port: int = 0,
    header: str = "Idempotency-Key",
    upstream_timeout: float = 30.0,
) -> FaultRelayServer:
    """A bound, not yet serving, relay; port 0 picks a free port."""
    state = RelayState(upstream, mode=mode, delay=delay, header=header, upstream_timeout=upstream_timeout)
    server = FaultRelayServer((host, port), state)
    log.info("fault relay (%s) listening on %s", mode, server.url)
    return server
