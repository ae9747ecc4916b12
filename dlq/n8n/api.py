"""The rest of n8n's public REST API Onceguard uses, beside lead capture's fetch (dlq.n8n.client):
deleting an execution (a person's erasure, review.privacy.erasure_n8n) and listing the workflows
(the workflow audit, dlq.n8n.audit). Every request goes through ``dlq.n8n.client.n8n_call`` — the
outbound policy, the connection's timeout, the ``X-N8N-API-KEY`` header, our own words for
failures — and no transaction is held across one.

Verified against n8n 1.123.81 (tests/n8n/test_erasure_n8n.py, test_workflow_audit.py):
``DELETE /api/v1/executions/{id}`` answers 200 with the execution it deleted (not read: it
holds the person's data), 404 for an execution it does not have (pruned, deleted already,
or of a workflow the key's user cannot see); a key without the scope ``execution:delete``
is refused with 403. ``GET /api/v1/workflows?limit=&cursor=`` answers
``{"data": [...], "nextCursor": …}`` (scope ``workflow:list``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from dlq.n8n.client import FetchFailed, n8n_call
from ledger.platform import storable

USER_AGENT = "Onceguard-n8n"
# Workflows per page (n8n's maximum is 250) and pages read at most: past that the audit says
# it stopped instead of paging forever on an instance that keeps answering a cursor.
WORKFLOWS_PAGE_SIZE = 100
WORKFLOWS_MAX_PAGES = 50
# A page of workflows holds their nodes and parameters, not executions' data.
WORKFLOWS_PAGE_BYTES = 16 * 1024 * 1024


class Deleted:
    """How one execution's deletion went (the erasure's report and its access-log rows)."""

    # n8n deleted it (200/204).
    DELETED = "deleted"
    # n8n has no such execution for this key: pruned or deleted already, or of a workflow the
    # key's user cannot see. Listed in the report: the two cannot be told apart from here.
    NOT_FOUND = "not_found"
    # n8n refused (the key's scope, a running execution): a person removes it by hand.
    REFUSED = "refused"
    # n8n did not answer, or answered 429/5xx: a person removes it by hand (or the erasure
    # is run again once n8n is back).
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Deletion:
    execution_id: str
    outcome: str
    # Our own words, safe to show and log: never n8n's answer.
    reason: str = ""


def execution_delete_url(base_url: str, execution_id: str) -> str:
    return f"{base_url.rstrip('/')}/api/v1/executions/{quote(execution_id, safe='')}"


def execution_delete(*, base_url: str, api_key: str, execution_id: str, timeout: float) -> Deletion:
    """One ``DELETE`` of an execution; never raises for what n8n answers or fails to."""
    try:
        answer = n8n_call(
            method="DELETE",
            url=execution_delete_url(base_url, execution_id),
            api_key=api_key,
            timeout=timeout,
            read_statuses=frozenset(),
            verb="deleted",
            user_agent=USER_AGENT,
        )
    except FetchFailed as exc:
        outcome = Deleted.UNREACHABLE if exc.retry else Deleted.REFUSED
        return Deletion(execution_id, outcome, exc.reason)
    status = answer.status
    if status in (200, 204):
        return Deletion(execution_id, Deleted.DELETED)
    if status == 404:
        return Deletion(
            execution_id,
            Deleted.NOT_FOUND,
            "n8n has no such execution for this API key (HTTP 404): pruned or deleted already,"
            " or of a workflow the key's user cannot see",
        )
    if status in (401, 403):
        return Deletion(
            execution_id,
            Deleted.REFUSED,
            f"n8n refused the API key (HTTP {status}): it needs the scope execution:delete",
        )
    if status == 429 or status >= 500:
        return Deletion(execution_id, Deleted.UNREACHABLE, f"n8n answered HTTP {status}")
    return Deletion(execution_id, Deleted.REFUSED, f"n8n answered HTTP {status} (a running execution is not deleted)")


@dataclass(frozen=True)
class Workflows:
    items: list[dict[str, Any]]
    # True when the listing stopped at WORKFLOWS_MAX_PAGES with a cursor still given.
    truncated: bool = False


def workflows_url(base_url: str, cursor: str | None, page_size: int) -> str:
    query = {"limit": str(page_size), **({"cursor": cursor} if cursor else {})}
    return f"{base_url.rstrip('/')}/api/v1/workflows?{urlencode(query)}"


def workflows_list(
    *,
    base_url: str,
    api_key: str,
    timeout: float,
    page_size: int | None = None,
    max_pages: int | None = None,
) -> Workflows:
    """Every workflow of the instance the key's user can see, page by page (n8n's cursor).
    FetchFailed, in words safe to show, when a page cannot be had."""
    page_size = page_size or WORKFLOWS_PAGE_SIZE
    max_pages = max_pages or WORKFLOWS_MAX_PAGES
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(max_pages):
        answer = n8n_call(
            method="GET",
            url=workflows_url(base_url, cursor, page_size),
            api_key=api_key,
            timeout=timeout,
            limit=WORKFLOWS_PAGE_BYTES,
            verb="read",
            user_agent=USER_AGENT,
        )
        if answer.status in (401, 403):
            raise FetchFailed(
                f"n8n refused the API key (HTTP {answer.status}): it needs the scopes workflow:list and workflow:read"
            )
        if answer.status != 200:
            raise FetchFailed(f"n8n answered HTTP {answer.status} (expected 200 with a page of workflows)")
        try:
            page = storable.loads(answer.body)
        except storable.NotStorable:
            raise FetchFailed("n8n's answer is not JSON") from None
        data = page.get("data") if isinstance(page, dict) else None
        if not isinstance(data, list):
            raise FetchFailed("n8n's answer is not a page of workflows (no data list)")
        items += [w for w in data if isinstance(w, dict)]
        cursor = page.get("nextCursor")
        if not cursor or not isinstance(cursor, str):
            return Workflows(items)
    return Workflows(items, truncated=True)
