"""Provider adapters: turn an execute-mode operation into one HTTP call and classify what
came back (DESIGN §3 "Failure classes").

Providers are data (base URL, idempotency header, ref pointer, status pointer, timeout), so
one adapter serves them all. The operation key always travels in the provider's
idempotency header: a key-enforced provider dedups a re-issue against the first try.

Nothing here writes to the database; ``ledger.execution.attempts`` records the outcome. Nothing here
logs a URL, a body or a header value: paths and bodies may carry personal data.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from ledger.models import ErrorClass, IdempotencyClass, Operation, Provider, ProviderKind, Tenant
from ledger.platform import storable
from ledger.platform.crypto import open_json
from ledger.platform.redaction import scrub
from ledger.platform.storable import MAX_DURATION_SECONDS
from ledger.providers.credentials import credential_value
from ledger.providers.reconcile import json_pointer
from ledger.rules.key_rules import key_header_value
from ledger.rules.outbound import OutboundBlocked, origin_refusal, outbound_client

SIGNATURE_HEADER = "Onceguard-Signature"

# Statuses DESIGN §3 names explicitly; everything else falls back by range.
_TRANSIENT = {408, 425}
_THROTTLED = {429, 503}
_PERMISSION = {401, 403}


@dataclass(frozen=True)
class Outcome:
    """What one attempt established. ``error_class`` None means the effect succeeded."""

    error_class: str | None
    provider_ref: str = ""
    status: int | None = None
    body: Any = None
    message: str = ""
    # 429/503: how long the provider asked us to stay away; the attempt is not counted.
    throttled: bool = False
    retry_after: float | None = None
    duration_ms: int = 0
    # Set by the adapter when the request may have reached the provider.
    sent: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.error_class is None


def record_retry_seconds() -> float:
    """How long a worker holding an outcome retries recording it through a database blip."""
    return max(0.0, float(settings.ONCEGUARD["RECORD_RETRY_SECONDS"]))


def worker_lease_seconds(timeout_seconds: float) -> float:
    """Lease of a worker's attempt: send bound + record retry budget + margin.

    httpx bounds each phase (connect, write, each read) by the provider's timeout and the
    adapter stops reading once the attempt's deadline has passed, so two timeouts cover a
    slow connect followed by a slow answer. The record step's retries then run for at most
    ``RECORD_RETRY_SECONDS``, and the margin covers the last try itself: the sweeper never
    moves a row whose outcome a live worker still holds (DESIGN §5)."""
    return (
        2 * float(timeout_seconds) + record_retry_seconds() + float(settings.ONCEGUARD["WORKER_LEASE_MARGIN_SECONDS"])
    )


def poll_lease_seconds(timeout_seconds: float) -> float:
    """Lease of one poll of an asynchronous provider's job (DESIGN §5, asynchronous
    providers): the status request (one timeout), the output's fetch when the job is done
    (``OUTPUT_FETCH_TIMEOUT_SECONDS``) and the margin for checking, publishing and recording.
    No record-retry budget: a poll's answer that cannot be recorded is asked again, since a
    poll changes nothing at the provider. Shorter than a send's, and like it below the
    django-q2 timeout."""
    fetch = float(settings.ONCEGUARD["OUTPUT_FETCH_TIMEOUT_SECONDS"])
    return float(timeout_seconds) + fetch + float(settings.ONCEGUARD["WORKER_LEASE_MARGIN_SECONDS"])


def lease_seconds_for(provider: Provider) -> float:
    return worker_lease_seconds(float(provider.timeout_seconds))


def send_window_seconds() -> float:
    """How long after its take a worker may still start sending: the lease's margin. A send
    that starts later could outlive the lease (two timeouts plus the record retries), and the
    sweeper may already have moved the row to review, where a reviewer can abandon it — so a
    holder stalled past this window records the attempt as not sent instead of sending."""
    return float(settings.ONCEGUARD["WORKER_LEASE_MARGIN_SECONDS"])


def parse_retry_after(value: str | None, *, cap: float) -> float | None:
    """Retry-After as delta-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    seconds: float | None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    # Bounded whatever the provider's cap says: now + it must stay a datetime.
    return min(max(0.0, seconds), cap, float(MAX_DURATION_SECONDS))


def retry_after_cap(provider: Provider) -> float:
    """The longest Retry-After honoured: beyond our backoff cap, within reason."""
    return max(float(provider.max_delay_seconds), float(settings.ONCEGUARD["RETRY_AFTER_MAX_SECONDS"]))


def throttle_of(
    *, provider: Provider, status: int | None, headers: httpx.Headers | dict[str, str] | None
) -> tuple[bool, float | None]:
    """Whether an answer of the provider throttles it (429/503), and its Retry-After in seconds
    (None when absent or unreadable). The same for a send, a poll and an output fetch."""
    if status not in _THROTTLED:
        return False, None
    return True, parse_retry_after((headers or {}).get("Retry-After"), cap=retry_after_cap(provider))


def classify_response(
    *, provider: Provider, status: int, headers: httpx.Headers | dict[str, str], body: Any
) -> Outcome:
    """DESIGN §3's table for an answer that arrived."""
    if 200 <= status < 300:
        if not provider.ref_pointer:
            ref = ""
        else:
            value = json_pointer(body, provider.ref_pointer) if isinstance(body, (dict, list)) else None
            if value in (None, "") or isinstance(value, (dict, list, bool)):
                # The provider says yes but we cannot tell which object: reconcile, don't guess.
                return Outcome(
                    ErrorClass.AMBIGUOUS, status=status, body=body, message=f"HTTP {status} without a usable ref"
                )
            ref = str(value)
        if provider.status_pointer and provider.success_values:
            state = json_pointer(body, provider.status_pointer) if isinstance(body, (dict, list)) else None
            if str(state) not in {str(v) for v in provider.success_values}:
                return Outcome(
                    ErrorClass.AMBIGUOUS,
                    provider_ref=ref,
                    status=status,
                    body=body,
                    # Masked before the cut: a cut address would no longer look like one.
                    message=f"HTTP {status} with status {scrub(str(state))[:40]!r}",
                )
        return Outcome(None, provider_ref=ref, status=status, body=body)
    throttled, retry_after = throttle_of(provider=provider, status=status, headers=headers)
    if throttled:
        return Outcome(
            ErrorClass.TRANSIENT,
            status=status,
            body=body,
            message=f"HTTP {status}: throttled",
            throttled=True,
            retry_after=retry_after,
        )
    if status in _TRANSIENT:
        return Outcome(ErrorClass.TRANSIENT, status=status, body=body, message=f"HTTP {status}")
    if status == 409 and provider.idempotency_class == IdempotencyClass.KEY_ENFORCED:
        # "Key in use": our earlier request with this key is still being handled there.
        retry_after = parse_retry_after(headers.get("Retry-After"), cap=retry_after_cap(provider))
        return Outcome(
            ErrorClass.TRANSIENT, status=status, body=body, message="HTTP 409: key in use", retry_after=retry_after
        )
    if status in _PERMISSION:
        return Outcome(ErrorClass.PERMISSION, status=status, body=body, message=f"HTTP {status}: permission")
    if 300 <= status < 500:
        return Outcome(ErrorClass.INVALID_INPUT, status=status, body=body, message=f"HTTP {status}")
    # 500/502/504 and the rest: the provider may have acted.
    return Outcome(ErrorClass.AMBIGUOUS, status=status, body=body, message=f"HTTP {status}")


# --- Building the request ---------------------------------------------------------------------


def purpose_of(provider: Provider) -> str:
    """What an outbound call is for, in the policy's messages and logs."""
    return "callback" if provider.kind == ProviderKind.CALLBACK else f"provider {provider.slug}"


class CredentialUnavailable(Exception):
    """The provider names a credential that may not or cannot be read: nothing is sent."""


def credential_headers(provider: Provider) -> dict[str, str]:
    """The provider's credential in its ``auth_header`` (empty when it has none); raises
    :class:`CredentialUnavailable` when it names one that may not or cannot be read."""
    if not (provider.auth_header and (provider.auth_secret or provider.auth_secret_env)):
        return {}
    # Only the provider's own sealed credential or a variable of the tenant's declared set
    # (ledger.providers.credentials): never an arbitrary environment variable.
    # The tenant's stored secret namespace names its declared variables — never its slug,
    # which can change (ADR 0001); a stored credential needs no query.
    namespace = (
        ""
        if provider.auth_secret
        else Tenant.objects.filter(pk=provider.tenant_id).values_list("secret_namespace", flat=True).first() or ""
    )
    secret, problem = credential_value(provider=provider, namespace=namespace)
    if problem:
        raise CredentialUnavailable(problem)
    return {provider.auth_header: secret} if secret else {}


@dataclass(frozen=True)
class PreparedRequest:
    method: str
    url: str
    params: dict[str, Any]
    headers: dict[str, str]
    content: bytes | None


def join_url(base_url: str, path: str) -> str:
    """A path under a provider's base URL (one slash between them)."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def prepare_request(
    *,
    provider: Provider,
    operation: Operation,
    callback_body: bytes | None = None,
    extra_headers: dict[str, str] | None = None,
    envelope: dict[str, Any] | None = None,
) -> PreparedRequest:
    """The HTTP request of an attempt: the stored envelope (or ``envelope``, an intent's
    translation: ledger.execution.translation), the key, the credentials."""
    if envelope is None:
        envelope = open_json(operation.request) or {}
    headers = {str(k): str(v) for k, v in (envelope.get("headers") or {}).items()}
    headers.update(extra_headers or {})
    # A stored key that is not printable ASCII goes percent-encoded (ledger.rules.key_rules).
    headers[provider.idempotency_header] = key_header_value(operation.key)
    headers.update(credential_headers(provider))
    content: bytes | None = None
    if callback_body is not None:
        content = callback_body
        headers["Content-Type"] = "application/json"
        url = str(envelope["url"])
    else:
        url = join_url(provider.base_url, str(envelope.get("path") or "/"))
        if "body" in envelope and envelope["body"] is not None:
            content = json.dumps(envelope["body"], separators=(",", ":"), ensure_ascii=False).encode()
            headers.setdefault("content-type", "application/json")
    return PreparedRequest(
        method=str(envelope.get("method") or "POST").upper(),
        url=url,
        params=dict(envelope.get("query") or {}),
        headers=headers,
        content=content,
    )


def sign(*, secret: str | list[str], body: bytes, timestamp: int | None = None) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`` (Stripe's scheme).

    Several secrets (during a rotation's overlap: the new one first, then the previous one)
    give one ``v1=`` each: ``t=…,v1=<new>,v1=<old>``. A receiver accepts the callback when any
    ``v1`` matches a secret it holds (:func:`verify_signature`), so it can switch to the new
    secret at any moment of the overlap."""
    ts = int(time.time()) if timestamp is None else timestamp
    keys = [secret] if isinstance(secret, str) else list(secret)
    macs = [hmac.new(k.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest() for k in keys]
    return ",".join([f"t={ts}", *(f"v1={mac}" for mac in macs)])


def verify_signature(*, secret: str, body: bytes, header: str, tolerance_seconds: int = 300) -> bool:
    """What a callback receiver does (also used by the tests): the timestamp is recent and
    one of the ``v1`` signatures is the HMAC under ``secret``."""
    timestamps: list[str] = []
    signatures: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if sep and name == "t":
            timestamps.append(value)
        elif sep and name == "v1":
            signatures.append(value)
    try:
        (ts_text,) = timestamps
        ts = int(ts_text)
    except ValueError:
        return False
    if abs(time.time() - ts) > tolerance_seconds:
        return False
    expected = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures)


# --- Sending ------------------------------------------------------------------------------


def http_client(*, max_connections: int = 20) -> httpx.Client:
    """One per worker thread: pooled keep-alive connections through the outbound policy
    (ledger.rules.outbound: every connect checked after DNS and pinned, no redirects followed — a
    3xx is an answer —, no proxy variables from the environment)."""
    return outbound_client(purpose="worker", max_connections=max_connections)


def get_json(
    *, client: httpx.Client, url: str, headers: dict[str, str], timeout: float
) -> tuple[int | None, Any, str, httpx.Headers | None]:
    """GET ``url`` through ``client`` (the outbound policy), reading at most
    ``WORKER_MAX_RESPONSE_BYTES`` within ``timeout``: (HTTP status, JSON body or None, error,
    the answer's headers). Never raises for network trouble: a status of None and the error's
    class say what went wrong (the class only: an error's text can carry the URL)."""
    refused = origin_refusal(url, purpose="provider status")
    if refused:
        return None, None, f"destination refused by the outbound policy: {refused}", None
    limit = int(settings.ONCEGUARD["WORKER_MAX_RESPONSE_BYTES"])
    try:
        request = client.build_request("GET", url, headers=headers, timeout=httpx.Timeout(timeout))
        response = client.send(request, stream=True)
        try:
            raw, complete = _read_body(response, deadline=time.monotonic() + timeout, limit=limit)
        finally:
            response.close()
    except OutboundBlocked as exc:
        return None, None, str(exc), None
    # InvalidURL is no HTTPError: a URL httpx will not build is no answer either.
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        return None, None, type(exc).__name__, None
    return response.status_code, _decode(raw, complete), "", response.headers


def _read_body(response: httpx.Response, *, deadline: float, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes, stopping once the attempt's deadline has passed."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("attempt deadline passed while reading the answer")
    return b"".join(chunks), True


def _decode(raw: bytes, complete: bool) -> Any:
    """The answer's JSON, or None when there is none — or none that could be stored and read
    back (ledger.platform.storable: too deep, NaN, lone surrogates, NUL): such an answer counts as an
    answer without a body, never as a crash while recording it."""
    if not raw or not complete:
        return None
    try:
        value = storable.loads(raw)
    except storable.NotStorable:
        return None
    return None if storable.nul_problem(value) is not None else value


def send(
    *,
    provider: Provider,
    operation: Operation,
    client: httpx.Client,
    callback_body: bytes | None = None,
    extra_headers: dict[str, str] | None = None,
    envelope: dict[str, Any] | None = None,
) -> Outcome:
    """One attempt against the provider, classified. Never raises for network trouble."""
    timeout = float(provider.timeout_seconds)
    started = time.monotonic()
    deadline = started + timeout

    def done(outcome: Outcome) -> Outcome:
        ms = int((time.monotonic() - started) * 1000)
        return Outcome(**{**outcome.__dict__, "duration_ms": ms})

    try:
        prepared = prepare_request(
            provider=provider,
            operation=operation,
            callback_body=callback_body,
            extra_headers=extra_headers,
            envelope=envelope,
        )
        scheme = urlsplit(prepared.url).scheme
        if scheme not in ("http", "https"):
            return done(Outcome(ErrorClass.INVALID_INPUT, message="provider URL is not http(s)", sent=False))
        # Checked here as well as by the client's transport (after DNS): a client that is not
        # the policy's own still never reaches an address the deployment refuses.
        refused = origin_refusal(prepared.url, purpose=purpose_of(provider))
        if refused:
            message = f"destination refused by the outbound policy: {refused}"
            return done(Outcome(ErrorClass.INVALID_INPUT, message=message, sent=False))
        request = client.build_request(
            prepared.method,
            prepared.url,
            params=prepared.params,
            headers=prepared.headers,
            content=prepared.content,
            timeout=httpx.Timeout(timeout),
        )
    except CredentialUnavailable as exc:
        # A configuration problem of the provider, not of this request: like a 401 it pauses
        # the provider (with this reason) and fails the attempt, before anything is sent.
        return done(Outcome(ErrorClass.PERMISSION, message=f"credential refused: {exc}", sent=False))
    except (httpx.InvalidURL, ValueError, KeyError, TypeError) as exc:
        return done(
            Outcome(ErrorClass.INVALID_INPUT, message=f"request not buildable ({type(exc).__name__})", sent=False)
        )

    limit = int(settings.ONCEGUARD["WORKER_MAX_RESPONSE_BYTES"])
    try:
        response = client.send(request, stream=True)
        try:
            raw, complete = _read_body(response, deadline=deadline, limit=limit)
        finally:
            response.close()
    except OutboundBlocked as exc:
        # Refused before any connection (an address the deployment does not allow): a
        # definite "not sent", and retrying changes nothing until the configuration does.
        return done(Outcome(ErrorClass.INVALID_INPUT, message=str(exc), sent=False))
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # Nothing left this process: the provider cannot have acted.
        return done(Outcome(ErrorClass.TRANSIENT, message=f"{type(exc).__name__} before send", sent=False))
    except httpx.HTTPError as exc:
        # Timeout, reset or protocol error after the request went out: we do not know.
        return done(Outcome(ErrorClass.AMBIGUOUS, message=f"{type(exc).__name__} after send"))
    except OSError as exc:
        return done(Outcome(ErrorClass.AMBIGUOUS, message=f"{type(exc).__name__} after send"))
    outcome = classify_response(
        provider=provider, status=response.status_code, headers=response.headers, body=_decode(raw, complete)
    )
    return done(outcome)


def is_asynchronous(provider: Provider) -> bool:
    """Whether the provider answers a submission with a job to poll."""
    return bool(provider.poll_path)
