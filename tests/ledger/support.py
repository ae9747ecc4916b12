"""Helpers for the ledger suite: a loopback HTTP sink that counts side effects, and set-ups
that move time on the database's clock (the ledger never reads the app server's)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from django.db import connection

from ledger.models import Attempt, Operation, OperationEvent
from ledger.protocol.selectors import operation_history
from ledger.store import sql
from tests.support.outbound import announce

PROBLEM_JSON = "application/problem+json"


class Sink:
    """A real HTTP receiver on 127.0.0.1: every POST is one side effect, counted by path."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts: Counter[str] = Counter()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with sink.lock:
                    sink.posts[self.path] += 1
                    n = sum(sink.posts.values())
                body = json.dumps({"id": f"ch_{n}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        announce(self.url)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def send(self, path: str) -> str:
        """Perform the side effect: one POST. Returns the receiver's reference."""
        response = httpx.post(f"{self.url}/{path.lstrip('/')}", json={"effect": path}, timeout=10)
        response.raise_for_status()
        return response.json()["id"]

    def count(self, path: str | None = None) -> int:
        with self.lock:
            if path is None:
                return sum(self.posts.values())
            return self.posts[f"/{path.lstrip('/')}"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _execute(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def expire_lease(operation_id: int, *, seconds_ago: float = 1.0) -> None:
    """Move the lease into the past on the database's clock, as if time had passed."""
    past, params = sql.now_plus(-seconds_ago)
    _execute(f"UPDATE ledger_operation SET lease_expires_at = {past} WHERE id = %s", [*params, operation_id])


def make_retry_due(operation_id: int, *, seconds_ago: float = 1.0) -> None:
    schedule_retry_in(operation_id, -seconds_ago)


def schedule_retry_in(operation_id: int, seconds: float) -> None:
    due, params = sql.now_plus(seconds)
    _execute(f"UPDATE ledger_operation SET next_attempt_at = {due} WHERE id = %s", [*params, operation_id])


def row(operation_id: int) -> dict[str, Any]:
    """Every column of the operation, for before/after comparisons."""
    return Operation.objects.filter(pk=operation_id).values().get()


def attempts_of(operation_id: int) -> list[dict[str, Any]]:
    return list(Attempt.objects.filter(operation_id=operation_id).order_by("number").values())


def events_of(operation_id: int) -> list[tuple[str, str, str, str]]:
    """(from, to, actor, reason) of every move, oldest first: the operation's history as every
    page and export lists it — a guard claim kept on its row, then its event rows (ADR 0024)."""
    op = Operation.objects.get(pk=operation_id)
    return [
        (e.from_status, e.to_status, e.actor, e.reason)
        for e in operation_history(op, OperationEvent.objects.filter(operation_id=operation_id))
    ]


def plain(value: Any) -> Any:
    """A stored JSON value as plaintext: payloads and responses may be sealed at rest."""
    try:
        from ledger.platform.crypto import open_json
    except ImportError:
        return value
    return open_json(value)


def ledger_counts() -> dict[str, int]:
    from dlq.models import FailedEvent

    return {
        "operations": Operation.objects.count(),
        "attempts": Attempt.objects.count(),
        "events": OperationEvent.objects.count(),
        "failed_events": FailedEvent.objects.count(),
    }


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    """A problem+json answer (RFC 9457) with the stable code, never marked as a replay."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].split(";")[0] == PROBLEM_JSON
    body = json.loads(response.content)
    assert body["code"] == code, body
    assert body["status"] == status
    assert "Idempotent-Replayed" not in response
    return body


CLAIM_URL = "/api/v1/claims"


def claim_body(key: str | None = "order-1001:charge:v1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"provider": "stripe", "action": "charge", "request": {"amount": 1200, "currency": "eur"}}
    if key is not None:
        body["key"] = key
    body.update(overrides)
    return body


def op_url(operation_id: int, verb: str = "") -> str:
    return f"/api/v1/operations/{operation_id}" + (f"/{verb}" if verb else "")
