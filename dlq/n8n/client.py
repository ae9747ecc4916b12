"""Lead capture for n8n Error Trigger entries (design §7): n8n's public REST API
and how a failed execution is read. No database writes here — the services
(``dlq.ingest.fetch.failed_event_n8n_fetch``) decide what is stored.

An Error Trigger report names the failed execution, not the item that failed. With the
tenant's n8n connection, ``GET {base}/api/v1/executions/{id}?includeData=true`` (header
``X-N8N-API-KEY``; n8n 1.x answers the execution with its run data unflattened) gives the
failed node's input items: the entry of ``executionData.nodeExecutionStack`` that n8n put
back for the failed node (what a retry of the execution would run it with), else what the
node's ``source`` says its inputs were (the output of the node before it, from
``resultData.runData``). Only each item's ``json`` is kept; binary data is not fetched.

Every request goes through the outbound policy (``ledger.rules.outbound``), each one bounded by the
connection's timeout (reading included), and a try is repeated only for what may pass
(the execution not saved yet, n8n unreachable or busy), at most ``FETCH_TRIES`` times.
Reasons are our own words with the HTTP status at most: never n8n's answer, never the
items, so they can be shown on the entry and logged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from dlq.rules.destinations import N8N_PURPOSE
from ledger.platform import storable
from ledger.rules.outbound import OutboundBlocked, outbound_client, outbound_refusal

API_KEY_HEADER = "X-N8N-API-KEY"
# Tries of one fetch, and the pauses between them: an Error Trigger may fire before n8n has
# written the failed execution (a 404 at first), or n8n may be restarting.
FETCH_TRIES = 3
FETCH_PAUSES = (1.0, 3.0)
# n8n's answer is read up to this many bytes (an execution's data can be large); more is a
# failed fetch, not a partial one.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Execution states whose data is complete. ("error" is the usual one; a crashed execution's
# stack may still hold the node it crashed in.)
FINISHED_STATES = frozenset({"error", "crashed", "success", "canceled"})


class FetchFailed(Exception):
    """Why the failed items could not be had, in words safe to show and log."""

    def __init__(self, reason: str, *, retry: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry


@dataclass(frozen=True)
class FailedItems:
    execution_id: str
    node: str
    # Each input item's ``json``, in order (every main input of the node, one after another).
    items: list[Any]
    # Items that carried binary data, which is not fetched.
    with_binary: int = 0


def execution_url(base_url: str, execution_id: str) -> str:
    return f"{base_url.rstrip('/')}/api/v1/executions/{quote(execution_id, safe='')}?includeData=true"


def _read_bounded(response: httpx.Response, *, deadline: float, limit: int) -> bytes:
    data = bytearray()
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > limit:
            raise FetchFailed(f"n8n's answer is larger than {limit} bytes; not read")
        if time.monotonic() > deadline:
            raise FetchFailed("n8n answered too slowly (over the connection's timeout)", retry=True)
    return bytes(data)


@dataclass(frozen=True)
class Answer:
    status: int
    # The body, read only for the statuses the caller asked to read (bounded by ``limit``).
    body: bytes = b""


def n8n_call(
    *,
    method: str,
    url: str,
    api_key: str,
    timeout: float,
    read_statuses: frozenset[int] = frozenset({200}),
    limit: int = MAX_ANSWER_BYTES,
    verb: str = "fetched",
    user_agent: str = "Onceguard-lead-capture",
) -> Answer:
    """One request to n8n's public API through the outbound policy, bounded by ``timeout``
    (reading included): n8n's status, and its body for ``read_statuses`` (an answer not read
    is never held: a DELETE answers with the execution it deleted, personal data included).
    FetchFailed (``retry``) for what may pass: n8n unreachable or too slow. Shared by lead
    capture, the erasure's deletions and the workflow audit (dlq.n8n.api)."""
    refused = outbound_refusal(url, purpose=N8N_PURPOSE)
    if refused:
        raise FetchFailed(f"not {verb}: {refused}")
    deadline = time.monotonic() + timeout
    headers = {API_KEY_HEADER: api_key, "Accept": "application/json", "User-Agent": user_agent}
    body = b""
    try:
        with outbound_client(purpose=N8N_PURPOSE, timeout=timeout, max_connections=1) as client:
            with client.stream(method, url, headers=headers) as response:
                status = response.status_code
                if status in read_statuses:
                    body = _read_bounded(response, deadline=deadline, limit=limit)
    except OutboundBlocked as exc:
        raise FetchFailed(f"not {verb}: {exc.reason}") from None
    except httpx.TimeoutException:
        raise FetchFailed(f"n8n did not answer within {timeout:g} s", retry=True) from None
    except httpx.HTTPError as exc:
        # The class only: a transport error's text can hold addresses and names.
        raise FetchFailed(f"n8n could not be reached ({type(exc).__name__})", retry=True) from None
    return Answer(status, body)


def fetch_execution(
    *, base_url: str, api_key: str, execution_id: str, timeout: float, limit: int = MAX_ANSWER_BYTES
) -> Any:
    """One GET of the execution with its data: the parsed JSON, or FetchFailed."""
    answer = n8n_call(
        method="GET", url=execution_url(base_url, execution_id), api_key=api_key, timeout=timeout, limit=limit
    )
    status = answer.status
    if status in (401, 403):
        raise FetchFailed(
            f"n8n refused the API key (HTTP {status}): set a key that may read executions (scope execution:read)"
        )
    if status == 404:
        raise FetchFailed(
            f"n8n has no execution {execution_id} for this API key (HTTP 404): it was not saved"
            " (EXECUTIONS_DATA_SAVE_ON_ERROR), was pruned, or belongs to a workflow the key's user cannot read",
            retry=True,
        )
    if status == 429 or status >= 500:
        raise FetchFailed(f"n8n answered HTTP {status}", retry=True)
    if status != 200:
        raise FetchFailed(f"n8n answered HTTP {status} (expected 200 with the execution)")
    try:
        return storable.loads(answer.body)
    except storable.NotStorable:
        raise FetchFailed("n8n's answer is not JSON that can be stored") from None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _items_of(main: Any) -> tuple[list[Any], int] | None:
    """The ``json`` of every item of every main input (a list of lists of items); None when
    it is not that shape."""
    if not isinstance(main, list):
        return None
    items: list[Any] = []
    with_binary = 0
    for connection in main:
        if connection is None:
            continue
        if not isinstance(connection, list):
            return None
        for item in connection:
            if not isinstance(item, dict) or not isinstance(item.get("json"), dict):
                return None
            items.append(item["json"])
            if item.get("binary"):
                with_binary += 1
    return items, with_binary


def _from_stack(data: dict[str, Any], node: str) -> tuple[list[Any], int] | None:
    for entry in _list(_dict(data.get("executionData")).get("nodeExecutionStack")):
        entry = _dict(entry)
        if _dict(entry.get("node")).get("name") == node:
            return _items_of(_dict(entry.get("data")).get("main"))
    return None


def _from_sources(run_data: dict[str, Any], node: str) -> tuple[list[Any], int] | None:
    runs = _list(run_data.get(node))
    if not runs:
        return None
    sources = _list(_dict(runs[-1]).get("source"))
    if not sources:
        return None
    items: list[Any] = []
    with_binary = 0
    for source in sources:
        if source is None:
            continue
        source = _dict(source)
        previous = source.get("previousNode")
        output = source.get("previousNodeOutput") or 0
        run = source.get("previousNodeRun") or 0
        previous_runs = _list(run_data.get(previous)) if isinstance(previous, str) else []
        if not isinstance(output, int) or not isinstance(run, int) or not 0 <= run < len(previous_runs):
            return None
        outputs = _list(_dict(_dict(previous_runs[run]).get("data")).get("main"))
        if not 0 <= output < len(outputs):
            return None
        found = _items_of([outputs[output]])
        if found is None:
            return None
        items += found[0]
        with_binary += found[1]
    return items, with_binary


def failed_input_items(execution: Any, *, execution_id: str, node_hint: str = "") -> FailedItems:
    """The failed node's input items in an execution as n8n's public API returns it (with
    ``includeData``). FetchFailed when the execution is not finished yet (retry) or holds no
    such items."""
    execution = _dict(execution)
    if not execution:
        raise FetchFailed("n8n's answer is not an execution (a JSON object was expected)")
    if str(execution.get("id", execution_id)) != execution_id:
        raise FetchFailed("n8n answered with another execution than the one asked for")
    status = execution.get("status")
    if isinstance(status, str) and status not in FINISHED_STATES:
        raise FetchFailed(f"the execution is still {status[:20]} in n8n", retry=True)
    data = execution.get("data")
    if not isinstance(data, dict):
        raise FetchFailed("the execution has no data (n8n may not save the data of failed executions)")
    result = _dict(data.get("resultData"))
    run_data = _dict(result.get("runData"))
    failed = _dict(_dict(result.get("error")).get("node")).get("name")
    candidates = [n for n in (failed, result.get("lastNodeExecuted"), node_hint) if isinstance(n, str) and n]
    if not candidates:
        raise FetchFailed("the execution does not say which node failed")
    node = candidates[0]
    for name in dict.fromkeys(candidates):
        found = _from_stack(data, name) or _from_sources(run_data, name)
        if found is not None and found[0]:
            return FailedItems(execution_id=execution_id, node=name, items=found[0], with_binary=found[1])
    raise FetchFailed(f"the execution holds no input items for the failed node {node[:100]!r}")


def fetch_failed_items(
    *,
    base_url: str,
    api_key: str,
    execution_id: str,
    node_hint: str,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
) -> FailedItems:
    """Fetch the execution and read the failed node's input items, trying again (at most
    ``FETCH_TRIES`` times, pausing ``FETCH_PAUSES``) only after a failure that may pass."""
    last: FetchFailed | None = None
    for attempt in range(FETCH_TRIES):
        if attempt:
            sleep(FETCH_PAUSES[min(attempt - 1, len(FETCH_PAUSES) - 1)])
        try:
            execution = fetch_execution(base_url=base_url, api_key=api_key, execution_id=execution_id, timeout=timeout)
            return failed_input_items(execution, execution_id=execution_id, node_hint=node_hint)
        except FetchFailed as exc:
            last = exc
            if not exc.retry:
                break
    assert last is not None
    if last.retry and FETCH_TRIES > 1:
        raise FetchFailed(f"{last.reason} (tried {FETCH_TRIES} times)")
    raise last


@dataclass(frozen=True)
class HeldItems:
    # What the entry stores: the failed item itself, or ``{"items": [...]}`` when it cannot
    # be told apart.
    payload: Any
    # The failed item (None when it cannot be told apart).
    item: dict[str, Any] | None
    # Why several items are held, in words (empty when the failed item is held).
    note: str = ""


def items_payload(found: FailedItems, *, item_index: int | None = None) -> HeldItems:
    """An entry holds and replays only the failed item (DESIGN §7, occurrences): the one input
    item, or the one the error names (``context.itemIndex``). Several items none of which the
    error names are held together, and the entry says so: replaying them as is would re-send
    the items that succeeded before the failure."""
    if len(found.items) == 1:
        return HeldItems(found.items[0], found.items[0])
    if item_index is not None and 0 <= item_index < len(found.items):
        return HeldItems(found.items[item_index], found.items[item_index])
    return HeldItems(
        {"items": found.items},
        None,
        f"The failed item cannot be told apart among {len(found.items)} input items (the error names none):"
        " a person must choose it before a replay, which would re-send every item as it is.",
    )


def payload_bytes(payload: Any) -> int:
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
