"""A strict CRM on loopback for the n8n suite: ``POST /contacts`` creates one contact from one
contact's fields under the key the lead's workflow sends (``{call_id}:crm-contact:v1``) and
refuses (422) any other shape — a replay body ``{"items": [...]}``, a report — or any other key.
It does not dedup: every accepted request is a new contact, so a duplicate shows as two.
Scripted answers (e.g. 429) come first, before anything is created. ``delay`` makes it slow:
each accepted contact is created at once but answered that many seconds later (a CRM whose
answer outlasts the caller's patience)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.support.loopback import LoopbackServer, QuietHandler

CONTACT_FIELDS = frozenset({"firstName", "lastName", "email", "phone", "source", "tags", "customFields"})


def expected_key(contact: dict[str, Any]) -> str:
    return f"{contact['customFields']['call_id']}:crm-contact:v1"


def refusal(body: Any, key: str | None) -> str:
    """Why the CRM refuses a request, or "" when it is one contact under its own key."""
    if not isinstance(body, dict) or set(body) != CONTACT_FIELDS:
        shape = sorted(body) if isinstance(body, dict) else type(body).__name__
        return f"one contact expected, got {shape}"
    call_id = body["customFields"].get("call_id") if isinstance(body["customFields"], dict) else None
    if not isinstance(call_id, str):
        return "customFields.call_id missing"
    if key != expected_key(body):
        return f"Idempotency-Key {key!r} is not this contact's key"
    return ""


class StrictCrm(LoopbackServer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contacts: list[tuple[str, dict[str, Any]]] = []
        self.refused: list[str] = []
        self.script: list[int] = []
        self.delay = 0.0
        crm = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                key = self.headers.get("Idempotency-Key")
                with crm.lock:
                    scripted = crm.script.pop(0) if crm.script else None
                if self.path != "/contacts":
                    self.answer(404, b'{"error": "no such path"}')
                    return
                if scripted is not None:
                    self.answer(
                        scripted, json.dumps({"error": f"scripted {scripted}"}).encode(), headers={"Retry-After": "1"}
                    )
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                why = refusal(body, key)
                with crm.lock:
                    if why:
                        crm.refused.append(why)
                    else:
                        crm.contacts.append((key or "", body))
                        number = len(crm.contacts)
                if why:
                    self.answer(422, json.dumps({"error": why}).encode())
                else:
                    time.sleep(crm.delay)
                    self.answer(201, json.dumps({"id": f"contact-{number}"}).encode())

        super().__init__(Handler)

    def reset(self, *, script: list[int] | None = None, delay: float = 0.0) -> None:
        with self.lock:
            self.contacts, self.refused, self.script, self.delay = [], [], list(script or []), delay
