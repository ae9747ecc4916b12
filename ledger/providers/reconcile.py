"""Looking an operation up at its provider, for the sweeper (DESIGN §3 "The sweeper").

A lookup answers one of three things: found (with the provider's reference and whether
its status means success), not found, or unknown (anything else: errors, timeouts,
unexpected answers). Only found/not found are evidence; unknown changes nothing. A lookup
goes through the outbound policy (ledger.rules.outbound) like every send: a destination the
deployment refuses is "unknown", and no connection is made.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import httpx

from ledger.models import Operation, Provider
from ledger.rules.key_rules import key_header_value, key_path_segment
from ledger.rules.outbound import OutboundBlocked, origin_refusal, outbound_client
from ledger.rules.provider_checks import path_fill


class LookupOutcome(enum.Enum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LookupResult:
    outcome: LookupOutcome
    provider_ref: str = ""
    succeeded: bool = False
    status_value: str = ""
    http_status: int | None = None
    body: Any = None
    error: str = ""


_MISSING = object()


def json_pointer(document: Any, pointer: str) -> Any:
    """RFC 6901: resolve ``pointer`` in ``document``; a missing path yields None."""
    if pointer in ("", "/"):
        return document if pointer == "" else (document.get("") if isinstance(document, dict) else None)
    if not pointer.startswith("/"):
        return None
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            current = current.get(token, _MISSING)
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            return None
        if current is _MISSING:
            return None
    return current


def lookup_url(provider: Provider, op: Operation) -> str:
    path = path_fill(
        provider.lookup_path,
        {"key": key_path_segment(op.key), "reconciliation_handle": key_path_segment(op.reconciliation_handle or "")},
    )
    return provider.base_url.rstrip("/") + "/" + path.lstrip("/")


def provider_lookup(*, provider: Provider, operation: Operation, client: httpx.Client | None = None) -> LookupResult:
    """GET the provider's lookup path: 200 = found, 404 = not found, anything else unknown."""
    if not provider.lookup_path:
        return LookupResult(LookupOutcome.UNKNOWN, error="provider has no lookup")
    try:
        url = lookup_url(provider, operation)
    except (KeyError, IndexError, ValueError):
        return LookupResult(LookupOutcome.UNKNOWN, error="lookup path is not valid")
    refused = origin_refusal(url, purpose=f"lookup of {provider.slug}")
    if refused:
        return LookupResult(LookupOutcome.UNKNOWN, error=refused)
    timeout = httpx.Timeout(provider.timeout_seconds)
    owns_client = client is None
    client = client or outbound_client(purpose=f"lookup of {provider.slug}", timeout=timeout)
    try:
        response = client.get(
            url, headers={provider.idempotency_header: key_header_value(operation.key)}, timeout=timeout
        )
    except OutboundBlocked as exc:
        return LookupResult(LookupOutcome.UNKNOWN, error=str(exc))
    except httpx.HTTPError as exc:
        # The class only: the exception text may carry the URL, which may carry personal data.
        return LookupResult(LookupOutcome.UNKNOWN, error=type(exc).__name__)
    finally:
        if owns_client:
            client.close()
    if response.status_code == 404:
        return LookupResult(LookupOutcome.NOT_FOUND, http_status=404)
    if response.status_code != 200:
        return LookupResult(
            LookupOutcome.UNKNOWN, http_status=response.status_code, error=f"HTTP {response.status_code}"
        )
    try:
        body = response.json()
    except ValueError:
        return LookupResult(LookupOutcome.UNKNOWN, http_status=200, error="lookup answered non-JSON")
    # A list-style lookup (?idempotency_key=) may answer {"data": [...]} or a bare list.
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        body = body["data"]
    if isinstance(body, list):
        if not body:
            return LookupResult(LookupOutcome.NOT_FOUND, http_status=200)
        body = body[0]
    ref = json_pointer(body, provider.ref_pointer or "/id")
    if ref in (None, ""):
        return LookupResult(LookupOutcome.UNKNOWN, http_status=200, body=body, error="lookup answer has no reference")
    status_value = json_pointer(body, provider.status_pointer) if provider.status_pointer else None
    succeeded = True if not provider.status_pointer else str(status_value) in {str(v) for v in provider.success_values}
    return LookupResult(
        LookupOutcome.FOUND,
        provider_ref=str(ref),
        succeeded=succeeded,
        status_value="" if status_value is None else str(status_value),
        http_status=200,
        body=body,
    )
