"""What a replay sends, and how the answer is read (DESIGN §3's table).

To a replay target: the payload with its key in the target's idempotency header, signed with
the target's secrets and carrying its credential; an ``echo`` target's 2xx is a delivery only
with its acknowledgement of the replay's id (ADR 0007). The target's lookup, asked first,
says whether the key already had its effect. A run's execute-mode step goes to its own
provider, as a worker would send it. Nothing here writes an entry or a replay:
``dlq.replays.services`` records the answer.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from dlq.ingest.parsing import error_class_for_status
from dlq.models import ReplayAck, ReplayTarget, replay_ledger_key
from dlq.replays.signatures import replay_ack_verify
from dlq.rules.conf import dlq_setting
from dlq.rules.destinations import replay_target_url_check
from dlq.targets.services import replay_target_signing_secrets
from ledger.execution.attempts import operation_translated
from ledger.models import ErrorClass, Operation, Provider
from ledger.platform import storable
from ledger.platform.errors import DomainError
from ledger.providers import adapters
from ledger.providers.adapters import SIGNATURE_HEADER, sign
from ledger.providers.credentials import stored_credential_value
from ledger.rules.key_rules import key_header_value
from ledger.rules.outbound import OutboundBlocked, outbound_client, outbound_refusal
from ledger.web.failures import transport_error_text


@dataclass(frozen=True)
class TargetAnswer:
    ok: bool
    status: int | None
    body: Any
    error_class: str
    message: str
    duration_ms: int
    provider_ref: str = ""


def _read_answer(response: httpx.Response) -> Any:
    keep = int(dlq_setting("RESPONSE_KEEP_BYTES"))
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > keep:
            break
    if not data:
        return None
    try:
        value = storable.loads(data[:keep])
    except storable.NotStorable:
        pass
    else:
        if storable.nul_problem(value) is None:
            return value
    # Kept as text, as it can be stored: no NUL (PostgreSQL), no lone surrogate (replaced).
    return {"text": data[:keep].decode("utf-8", errors="replace").replace("\x00", "")[:2000]}


# The replay's identity (its ledger key, ``replay:{entry}:{n}``), and the receiver's positive
# acknowledgement of it: ``v1=<hex HMAC-SHA256(signing secret, "ack." + id)>`` (ADR 0007).
REPLAY_ID_HEADER = "Onceguard-Replay-Id"
ACK_HEADER = "Onceguard-Ack"


def _unacknowledged(target: ReplayTarget, status: int, header: str | None) -> str:
    """Why a 2xx of an ``echo`` target is not a delivery, in words."""
    why = "without Onceguard-Ack" if not header else "with an Onceguard-Ack that is not over this replay's id"
    return (
        f"not acknowledged: HTTP {status} {why} (target {target.slug} answers an acknowledgement from its last"
        " step; a receiver that stopped before it, or n8n's own answer for such a workflow, sends none): the"
        " work may or may not have been done"
    )


def send_to_target(*, target: ReplayTarget, payload: Any, key: str, event_pk: int, number: int) -> TargetAnswer:
    """POST the stored payload with the key in the target's idempotency header, and classify
    the answer by DESIGN §3's table (a 409 "key in use" is transient). To an ``echo`` target
    a 2xx is a delivery only with the receiver's acknowledgement of this replay's id; without
    it the outcome is unknown (``ambiguous``), never a success (ADR 0007)."""
    replay_id = replay_ledger_key(event_pk, number)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Onceguard-replay",
        "X-Onceguard-Event": str(event_pk),
        "X-Onceguard-Replay": str(number),
        REPLAY_ID_HEADER: replay_id,
        # A stored key that is not printable ASCII is sent percent-encoded (ledger.rules.key_rules).
        target.idempotency_header: key_header_value(key),
    }
    content = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    started = time.monotonic()

    def elapsed() -> int:
        return int((time.monotonic() - started) * 1000)

    purpose = f"replay target {target.slug}"
    refused = outbound_refusal(target.url, purpose=purpose) or _target_url_refusal(target.url)
    if refused:
        message = f"not delivered: destination refused by the outbound policy: {refused}"
        return TargetAnswer(False, None, None, ErrorClass.INVALID_INPUT, message, elapsed())
    keys = replay_target_signing_secrets(target_id=target.pk)
    auth, why = _target_auth_headers(target, content, keys)
    if why:
        return TargetAnswer(False, None, None, ErrorClass.PERMISSION, f"not delivered: {why}", elapsed())
    headers.update(auth)
    try:
        with outbound_client(purpose=purpose, timeout=target.timeout_seconds) as client:
            with client.stream("POST", target.url, content=content, headers=headers) as response:
                status = response.status_code
                ack = response.headers.get(ACK_HEADER)
                body = _read_answer(response)
    except OutboundBlocked as exc:
        # Refused before any connection: nothing can have happened, and a retry would be too.
        return TargetAnswer(False, None, None, ErrorClass.INVALID_INPUT, f"not delivered: {exc}", elapsed())
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        # Never reached the target: nothing can have happened. The error's own words are kept
        # (scrubbed where stored): the console makes its sentence from them (ledger.web.failures).
        message = f"not delivered: {transport_error_text(exc, target.url)}"
        return TargetAnswer(False, None, None, ErrorClass.TRANSIENT, message, elapsed())
    except httpx.HTTPError as exc:
        message = f"sent, no answer: {transport_error_text(exc, target.url)}"
        return TargetAnswer(False, None, None, ErrorClass.AMBIGUOUS, message, elapsed())
    if 200 <= status < 300:
        if target.ack == ReplayAck.ECHO and not replay_ack_verify(keys=keys, replay_id=replay_id, header=ack):
            return TargetAnswer(
                False, status, body, ErrorClass.AMBIGUOUS, _unacknowledged(target, status, ack), elapsed()
            )
        ref = body.get("id") if isinstance(body, dict) else None
        return TargetAnswer(True, status, body, "", f"HTTP {status}", elapsed(), str(ref)[:255] if ref else "")
    error_class = ErrorClass.TRANSIENT if status == 409 else error_class_for_status(status)
    return TargetAnswer(False, status, body, error_class, f"HTTP {status}", elapsed())


def _target_url_refusal(url: str) -> str | None:
    """The https rule, checked again at send time (a target stored before it, or the
    deployment's REPLAY_ALLOW_HTTP turned off since)."""
    try:
        replay_target_url_check(url)
    except DomainError as exc:
        return exc.detail
    return None


def _target_auth_headers(target: ReplayTarget, body: bytes, keys: list[str]) -> tuple[dict[str, str], str]:
    """The signature (``Onceguard-Signature: t=…,v1=…``, the callback scheme, one ``v1`` per
    secret that signs now: ``keys``) and the target's credential header; or why it cannot be
    sent."""
    headers = {SIGNATURE_HEADER: sign(secret=keys, body=body)}
    if target.credential_header:
        value, why = stored_credential_value(target.credential_secret)
        if value is None:
            return {}, f"the target's credential ({target.credential_header}) is not usable: {why}"
        headers[target.credential_header] = value
    return headers, ""


@dataclass(frozen=True)
class LookupAnswer:
    """What a target's lookup said: ``found`` (2xx), ``not_found`` (404), or ``no_answer``
    (anything else: an error, a timeout, another status) — only the first two decide."""

    state: str
    status: int | None
    body: Any
    message: str
    duration_ms: int


def replay_target_lookup(*, target: ReplayTarget, key: str) -> LookupAnswer:
    """Ask the target's lookup whether the business key already had its effect: GET the
    lookup URL with ``{key}`` filled in (percent-encoded), signed over an empty body and with
    the target's credential, like the sweeper's provider lookup (DESIGN §4)."""
    started = time.monotonic()

    def answer(state: str, message: str, status: int | None = None, body: Any = None) -> LookupAnswer:
        return LookupAnswer(state, status, body, message, int((time.monotonic() - started) * 1000))

    url = target.lookup_url.replace("{key}", quote(key, safe=""))
    purpose = f"replay target {target.slug} lookup"
    refused = outbound_refusal(url, purpose=purpose) or _target_url_refusal(url)
    if refused:
        return answer("no_answer", f"lookup not asked: {refused}")
    keys = replay_target_signing_secrets(target_id=target.pk)
    headers, why = _target_auth_headers(target, b"", keys)
    if why:
        return answer("no_answer", f"lookup not asked: {why}")
    # An ``echo`` target acknowledges a "found" as it acknowledges a replay (ADR 0007): a 2xx
    # without it — n8n's own answer for a lookup workflow that stopped — decides nothing.
    lookup_id = f"lookup:{secrets.token_urlsafe(12)}"
    headers.update(
        {
            "User-Agent": "Onceguard-replay",
            target.idempotency_header: key_header_value(key),
            REPLAY_ID_HEADER: lookup_id,
        }
    )
    timeout = min(target.timeout_seconds, float(dlq_setting("REPLAY_LOOKUP_TIMEOUT_SECONDS")))
    try:
        with outbound_client(purpose=purpose, timeout=timeout) as client:
            with client.stream("GET", url, headers=headers) as response:
                status = response.status_code
                ack = response.headers.get(ACK_HEADER)
                body = _read_answer(response)
    except Exception as exc:  # any failure: the lookup did not answer; it decides nothing
        return answer("no_answer", f"lookup gave no answer: {type(exc).__name__}")
    if 200 <= status < 300 and target.ack == ReplayAck.ECHO:
        if not replay_ack_verify(keys=keys, replay_id=lookup_id, header=ack):
            return answer(
                "no_answer", f"the target's lookup answered HTTP {status} without its acknowledgement", status
            )
    if 200 <= status < 300:
        return answer("found", f"found by the target's lookup (HTTP {status}); not sent", status, body)
    if status == 404:
        return answer("not_found", "the target's lookup did not find the key (HTTP 404)", status)
    return answer("no_answer", f"the target's lookup answered HTTP {status}", status)


def send_to_provider(*, provider: Provider, operation: Operation) -> TargetAnswer:
    """Send a failed execute-mode operation's stored request to its provider again, under its
    original key, exactly as a worker would (ledger.providers.adapters: the provider's idempotency
    header, credential and outbound policy), and classify the answer the same way. An intent
    operation is translated first, as a worker does, under the revision ``provider`` is (its
    stable one); an intent that revision refuses is not sent."""
    envelope, _prompt, refused = operation_translated(op=operation, provider=provider)
    if refused is not None:
        return TargetAnswer(False, None, None, refused.error_class or "", refused.message, 0)
    with adapters.http_client(max_connections=1) as client:
        outcome = adapters.send(provider=provider, operation=operation, client=client, envelope=envelope)
    return TargetAnswer(
        ok=outcome.succeeded,
        status=outcome.status,
        body=outcome.body,
        error_class=outcome.error_class or "",
        message=outcome.message or (f"HTTP {outcome.status}" if outcome.status else ""),
        duration_ms=outcome.duration_ms,
        provider_ref=outcome.provider_ref,
    )
