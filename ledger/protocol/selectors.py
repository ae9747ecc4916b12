"""Reads shared by the API and the console."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Q, QuerySet

from ledger.models import (
    OPEN_STATES,
    SEARCH_SEPARATOR,
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    OpenOperation,
    Operation,
    OperationEvent,
    OperationMode,
    OperationSearch,
    OperationStatus,
    Provider,
    Tenant,
    WorkflowName,
)
from ledger.platform.errors import OperationNotFound
from ledger.platform.logs import operation_fields
from ledger.providers.admission import admission_refusals_by_reason
from ledger.providers.prompts import prompt_template_label
from ledger.providers.revisions import revision_number
from ledger.rules import search
from ledger.store import sql
from ledger.store.open_rows import open_rows_where

# Columns of an operation no list answer renders (OperationOutputSerializer).
LIST_DEFERRED = ("payload", "request", "search_fields", "fingerprint")


def operation_list(*, tenant: Tenant, match: list[str] | None = None) -> QuerySet[Operation]:
    """A tenant's operations; ``match`` are `path:value` filters on OPERATION_SEARCH_PATHS.

    Only what the list renders is read: the provider's slug comes from a per-process cache
    (``provider_slug``), and the sealed payload and request, the fingerprint and the search
    values are never shown — a 500-row page spent a third of its time building provider rows
    and decoding those columns. The validated output (one row or none) is joined."""
    rows = Operation.objects.filter(tenant=tenant).select_related("output").defer(*LIST_DEFERRED)
    if match:
        rows = search.filter_match(rows, search.parse_match(match, settings.ONCEGUARD["OPERATION_SEARCH_PATHS"]))
    return rows


def claim_event(op: Operation) -> OperationEvent | None:
    """A guard claim's move ('' → claimed) as the event row it used to be, read from the
    operation row (ADR 0024): at ``created_at`` (the claim's clock, as its event's was), by
    ``claim_actor``, attempt 1, reason "claimed" or "claimed, sent". Unsaved (no id). None when
    the claim has an event row of its own (execute mode; rows claimed before ADR 0024)."""
    if op.claim_actor is None:
        return None
    return OperationEvent(
        id=None,  # not a row: no id (and no page of its own)
        tenant_id=op.tenant_id,
        operation_id=op.pk,
        from_status="",
        to_status=OperationStatus.CLAIMED,
        actor=op.claim_actor,
        reason="claimed, sent" if op.claim_sent else "claimed",
        attempt=1,
        at=op.created_at,
    )


def operation_history(op: Operation, events: list[OperationEvent] | QuerySet[OperationEvent]) -> list[OperationEvent]:
    """Every move of ``op`` in order: its stored ``events`` (its own, already read) sorted by
    (at, id), after the claim kept on its row (``claim_event``), which precedes them all. What
    every page, export and check that lists an operation's moves shows (ADR 0024)."""
    stored = sorted(events, key=lambda e: (e.at, e.id))
    claim = claim_event(op)
    return stored if claim is None else [claim, *stored]


# States whose lists read the append-only events into them (opevent_terminal_status_idx,
# migration 0042): a terminal state is final, so an event into it names the row's state for
# good. `succeeded` lists read (tenant, id) and keep the 98 % that match (ADR 0017).
LISTED_BY_EVENT = frozenset({OperationStatus.FAILED, OperationStatus.ABANDONED})


def operations_in_state(rows: QuerySet[Operation], state: str, *, tenant_ids: list[int] | None) -> QuerySet[Operation]:
    """``rows`` in ``state``, each state read through an index that does not live on the
    operation row (ADR 0017): an open state through the work queue's mirror (its (tenant,
    status, id) index), `failed` and `abandoned` through the events into them, `succeeded` as
    the row says. The row's own state is checked too (it is the record). ``tenant_ids``: the
    tenants the reader sees (None: every tenant, a superuser's console)."""
    if state in OPEN_STATES:
        return rows.filter(open_rows_where(status=state))
    if state in LISTED_BY_EVENT:
        into = OperationEvent.objects.filter(to_status=state)
        if tenant_ids is not None:
            into = into.filter(tenant_id__in=tenant_ids)
        return rows.filter(status=state, pk__in=_newest_first(into.values("operation_id")))
    return rows.filter(status=state)


def operation_ids_in_terminal_state(state: str) -> QuerySet[Any]:
    """The ids of the operations in ``state`` (one of ``LISTED_BY_EVENT``), each once, read
    from the events into it alone (an index-only scan of ``opevent_terminal_status_idx``): the
    rows ``operations_in_state`` lists, since a terminal state is final and its row says so.
    For counting them without probing each operation row (ADR 0027 item 3)."""
    if state not in LISTED_BY_EVENT:
        raise ValueError(f"{state!r} is not listed by its events")
    return OperationEvent.objects.filter(to_status=state).values("operation_id").distinct()


def _newest_first(ids: QuerySet[Any]) -> QuerySet[Any]:
    """Operation ids of events, each once, newest first, on PostgreSQL (ADR 0027): an ordered
    ``DISTINCT ON`` keeps its ORDER BY inside the semi-join, so the list's page joins the first
    ids of that stream and stops at its LIMIT — a plain ``IN`` hashed every match, joined each
    to its row and sorted them all before the page (1.5 s p95 for 36,000 `failed` rows at
    10M). A supersede writes a second event into `failed` (``failed → failed``), hence the
    DISTINCT. Elsewhere (SQLite) the plain set."""
    if connection.vendor != "postgresql":
        return ids
    return ids.order_by("-operation_id").distinct("operation_id")


def operations_updated_after(
    rows: QuerySet[Operation], after: datetime, *, tenant_ids: list[int]
) -> QuerySet[Operation]:
    """``rows`` whose ``updated_at`` is later than ``after`` — the public ``updated_after``
    filter, exactly — found without an index on the operation row (ADR 0017): an open row's
    ``updated_at`` is on its work-queue mirror (same statement, same value), a finished row's
    was last written by the move into its terminal state or a supersede, each of which writes
    an event into a terminal state in the same transaction, no earlier than the row's
    ``updated_at``. So the two sets hold every row that matches, and the row's own
    ``updated_at`` then keeps exactly those.

    That union is sorted and made unique before the page, so it is read only when it is small
    (ADR 0027): past ``UPDATED_AFTER_UNION_MAX`` candidates on either side (counted on their
    indexes, stopping there) many rows moved since ``after``, and the rows are walked newest
    first on ``(tenant, id)`` keeping ``updated_at > after`` — the newest rows, created after
    ``after``, match at once. The same rows either way; only the plan differs."""
    still_open = OpenOperation.objects.filter(tenant_id__in=tenant_ids, updated_at__gt=after).values("operation_id")
    finished = OperationEvent.objects.filter(
        tenant_id__in=tenant_ids, to_status__in=sorted(TERMINAL_STATES), at__gt=after
    ).values("operation_id")
    changed = rows.filter(updated_at__gt=after)
    if any(side[:UPDATED_AFTER_UNION_MAX].count() >= UPDATED_AFTER_UNION_MAX for side in (finished, still_open)):
        return changed
    return changed.filter(pk__in=still_open.union(finished))


# Candidates of ``operations_updated_after`` read as a set at most: sorting and joining 20,000
# ids costs ~20 ms at 10M rows (1.5M of them, 1.5 s). Past it the walk newest first is cheaper.
UPDATED_AFTER_UNION_MAX = 20_000


# The identifiers the console's search finds by any part (the claim's OperationSearch row
# joins them; ADR 0018).
OPERATION_SUBSTRING_FIELDS = ("key", "reconciliation_handle", "execution_id", "correlation_id")
# A search's identifier and provider-reference matches are read newest operation first, at most
# this many at a time (one LIMIT on the search rows); each batch is narrowed by the list's own
# filters until the list has what it shows, at most MATCHED_TEXT_ROUNDS batches: past the newest
# ~4,000 matches a search narrowed further by a filter finds no older ones (a narrower text does).
MATCHED_TEXT_BATCH = 500
MATCHED_TEXT_ROUNDS = 10
# What a caller that does not say shows at most (the API's largest page).
MATCHED_TEXT_MAX = 500


# A text whose identifier matches PostgreSQL estimates at more than this (from the search rows'
# statistics, EXPLAIN: nothing read) is common: its matches are looked for in a window of the
# newest search rows only (ADR 0026). A rare text keeps the trigram index, whatever its matches' age.
COMMON_TEXT_ROWS = 20_000
# The window: this many newest search rows of each tenant searched (two per operation: about
# 25,000 operations), ~0.1 s at ten million operations; older ones window by window, on request.
SEARCH_WINDOW_ROWS = 50_000


@dataclass(frozen=True)
class SearchWindow:
    """Where a common text's identifier matches were looked for (ADR 0026): the search rows of
    operations with ids from ``floor`` (inclusive) up to ``below`` (exclusive; None: the newest).
    ``floor`` None: the window reached the scope's oldest row, nothing older is left unsearched."""

    floor: int | None
    below: int | None = None


def operation_search_window(
    text: str, *, tenant_ids: list[int] | None = None, below: int | None = None
) -> SearchWindow | None:
    """The window a search for ``text`` reads its identifier matches in, or None when the text
    is rare (every match is read through the trigram index, old or new). For a common text
    (COMMON_TEXT_ROWS) the window is the newest SEARCH_WINDOW_ROWS search rows of each of
    ``tenant_ids`` (None: of all) below ``below``: no index returns substring matches newest
    first, so without it a common text whose matches are old costs a walk over every newer row
    of the tenant (8–31 s at ten million, bench/results/scale-10M.md)."""
    text = (text or "").strip()
    if not text or connection.vendor != "postgresql" or tenant_ids == []:
        # SQLite has no estimate and no such table sizes: every match is read (and no tenant
        # has nothing to read).
        return None
    estimate = sql.estimated_rows(operations_matching(text, tenant_ids=tenant_ids, below=below))
    if estimate is None or estimate <= COMMON_TEXT_ROWS:
        return None
    floors = []
    for scope in [None] if tenant_ids is None else [[t] for t in tenant_ids]:
        # The tenant's (tenant, operation) index read backwards, an entry per row: the
        # SEARCH_WINDOW_ROWS-th newest row's operation.
        newest = OperationSearch.objects.all() if scope is None else OperationSearch.objects.filter(tenant_id=scope[0])
        if below is not None:
            newest = newest.filter(operation_id__lt=below)
        nth = newest.order_by("-operation_id").values_list("operation_id", flat=True)[
            SEARCH_WINDOW_ROWS - 1 : SEARCH_WINDOW_ROWS
        ]
        floors.append(next(iter(nth), None))
    # The highest floor: every tenant's rows above it are at most the window's (a tenant whose
    # rows all fit, floor None, is read whole under it).
    reached = [f for f in floors if f is not None]
    return SearchWindow(floor=max(reached) if reached else None, below=below)


def operation_search(
    rows: QuerySet[Operation],
    text: str,
    *,
    tenant_ids: list[int] | None = None,
    enough: int = MATCHED_TEXT_MAX,
    window: SearchWindow | None = None,
) -> QuerySet[Operation]:
    """Rows matching ``text``: a case-insensitive substring of the key, reconciliation
    handle, execution or correlation id, of a name of the row's workflow, or of the error
    text of one of its failures (``operations_failed_with``); a provider reference the row was
    given, exactly or by prefix; the row's id.

    The identifiers and provider references are read from the write-once search rows
    (``operations_matching``, ADR 0018), newest first, a batch at a time, each batch narrowed
    by ``rows``' filters, until ``enough`` rows match (the caller's page: the console asks for
    the rows up to the page it shows) — so a common text costs a page, not a join and a sort
    of every match. Every other arm has its index too (the primary key, the tenant's
    workflow ids, the failure events' trigrams).

    A whole key of one of ``tenant_ids``' operations (None: every tenant's) finds that
    operation and nothing else, through the unique (tenant, key) index: a substring search
    for a whole key reads the trigram entries of every key sharing its common parts (a
    quarter of a second per query at ten million rows).

    ``window`` (``operation_search_window``, ADR 0026): a common text's identifier matches are
    read only there; the caller says so on the page and offers the next, older window."""
    text = (text or "").strip()
    if not text:
        return rows
    exact = _whole_key(rows, text, tenant_ids=tenant_ids)
    if exact is not None:
        return exact
    ids = _matching_ids(rows, text, tenant_ids=tenant_ids, enough=enough, window=window)
    if ERROR_SEARCH_MIN <= len(text) <= ERROR_SEARCH_MAX:
        # Newest first by an expression no index serves: walking the event's operation index
        # backwards hoping for a rare match under the LIMIT is the plan this rules out.
        newest = (F("operation_id") + 0).desc()
        failed = operations_failed_with(text, tenant_ids=tenant_ids).order_by(newest)
        ids += failed.values_list("operation_id", flat=True)[:MATCHED_ERRORS_MAX]
    found = Q(pk__in=list(dict.fromkeys(ids)))
    if text.isdigit() and len(text) <= 18:
        found |= Q(pk=int(text))
    named = workflows_named(text)
    if named is not None:
        found |= named
    return rows.filter(found)


def _matching_ids(
    rows: QuerySet[Operation], text: str, *, tenant_ids: list[int] | None, enough: int, window: SearchWindow | None
) -> list[int]:
    """The ids of ``rows`` ``operations_matching`` finds, newest first, ``enough`` of them when
    there are: batch by batch of the search rows, each kept where ``rows`` holds it; only in
    ``window`` when one is given."""
    kept: list[int] = []
    below: int | None = window.below if window is not None else None
    floor = window.floor if window is not None else None
    # The first batch is the page's own LIMIT (a walk newest first stops at it); later ones,
    # needed only when the list's filters dropped matches, grow to MATCHED_TEXT_BATCH.
    size = max(1, min(enough, MATCHED_TEXT_BATCH))
    for _ in range(MATCHED_TEXT_ROUNDS):
        read = list(operations_matching(text, tenant_ids=tenant_ids, below=below, floor=floor)[:size])
        if not read:
            break
        batch = list(dict.fromkeys(read))
        kept += rows.filter(pk__in=batch).values_list("pk", flat=True)
        # Enough, or no older match left.
        if len(kept) >= enough or len(read) < size:
            break
        below = batch[-1]
        size = min(2 * size, MATCHED_TEXT_BATCH)
    return kept


def operations_matching(
    text: str, *, tenant_ids: list[int] | None = None, below: int | None = None, floor: int | None = None
) -> QuerySet[OperationSearch]:
    """The ids of the operations whose identifiers hold ``text`` (any case; not across two of
    them) or that were given a provider reference starting with it, newest first (below the
    operation id ``below``), as ``operation_id`` values (an operation with several matching rows
    may repeat). From the search rows alone (ADR 0018): trigram GIN and the references'
    pattern-ops index, or, for a common text, the (operation, seq) key walked backwards until the
    LIMIT is met — the planner chooses by the text's frequency. ``tenant_ids`` (None: every
    tenant's) bind the rows' tenant; ``floor``, a search window's lowest operation id (ADR 0026)."""
    found = Q(ref=True, text__startswith=text)
    if SEARCH_SEPARATOR not in text:
        found |= Q(ref=False, text__icontains=text)
    rows = OperationSearch.objects.filter(found)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if below is not None:
        rows = rows.filter(operation_id__lt=below)
    if floor is not None:
        rows = rows.filter(operation_id__gte=floor)
    return rows.order_by("-operation_id").values_list("operation_id", flat=True)


def operations_with_provider_ref(ref: str, *, tenant_id: int) -> QuerySet[OperationSearch]:
    """The ids of a tenant's operations ever given the provider reference ``ref`` (its index:
    the search rows', ADR 0018), for ``id IN (…)``; the API filter then compares the row's own."""
    return OperationSearch.objects.filter(tenant_id=tenant_id, ref=True, text=ref).values("operation_id")


def operations_with_handle(handle: str, *, tenant_id: int) -> QuerySet[OperationSearch]:
    """The ids of a tenant's operations whose search rows hold ``handle`` (any case), for
    ``id IN (…)``: every reconciliation handle an operation is given is written to its search
    rows (the claim's joined identifiers, or a row appended by the sent marker), so these are
    the candidates and the API filter then compares the row's own column, which keeps it exact.
    Served by the search rows' trigram index (ADR 0023: the operation row's op_handle_idx is
    gone); a handle shorter than three characters holds no trigram, and the planner walks the
    tenant's search rows instead."""
    return OperationSearch.objects.filter(tenant_id=tenant_id, ref=False, text__icontains=handle).values("operation_id")


# The states a failure moves an operation to; the event of that move holds the error text in
# its reason. Migration 0035's partial trigram index holds exactly these events' reasons.
ERROR_EVENT_STATES = (
    OperationStatus.RETRY_WAIT,
    OperationStatus.FAILED,
    OperationStatus.UNCERTAIN,
    OperationStatus.REVIEW,
)
# A search arm's error matches, newest operations first (MATCHED_TEXT_MAX says why a list).
MATCHED_ERRORS_MAX = 500
# A trigram index narrows nothing for a shorter text (it holds no trigram): it would read the
# whole index. Error text is searched from three characters on (the API says so too).
ERROR_SEARCH_MIN = 3
# The event's reason column holds at most this: a longer text matches nothing.
ERROR_SEARCH_MAX = OperationEvent._meta.get_field("reason").max_length or 500


def operations_failed_with(text: str, *, tenant_ids: list[int] | None = None) -> QuerySet[OperationEvent]:
    """Failure events whose error text holds ``text`` (any case); their ``operation_id`` names
    the operation. Read from the append-only events, never from the
    operation's ``last_error`` (a completion rewrites that; an index on it would cost every
    completion): trigram GIN on PostgreSQL (migration 0035), LIKE on SQLite. ``tenant_ids``
    (None: every tenant's) bind the event's tenant column, as Citus routes by it."""
    rows = OperationEvent.objects.filter(to_status__in=ERROR_EVENT_STATES, reason__icontains=text)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    return rows


def operation_ids_failed_with(text: str, *, tenant_ids: list[int] | None = None) -> QuerySet[OperationEvent]:
    """The ids of the operations ``operations_failed_with`` finds, for ``id IN (…)`` under a
    newest-first page (the API list's ``error``): on PostgreSQL each once and newest first.

    The order is what makes a page cheap. A plain ``IN`` joins every match to its operation
    and sorts them all before the page's 50 are taken (0.3 s for a word in 45 % of failures
    at ten million operations, docs/explanation/scale.md); matches already sorted by operation
    id (the operation's id by the join's equality) let the planner walk them newest first and
    stop when the page is full, whatever the other filters leave of them. Django keeps a
    subquery's ORDER BY only beside DISTINCT ON, which PostgreSQL alone has."""
    ids = operations_failed_with(text, tenant_ids=tenant_ids).values("operation_id")
    if connection.vendor != "postgresql":
        return ids
    return ids.order_by("-operation_id").distinct("operation_id")


def _whole_key(rows: QuerySet[Operation], text: str, *, tenant_ids: list[int] | None) -> QuerySet[Operation] | None:
    """``rows`` whose key is ``text`` when an operation of ``tenant_ids`` has that key (the
    tenants spelled out, so the unique index's leading column is bound); else None."""
    if len(text) > Operation._meta.get_field("key").max_length:
        return None
    if tenant_ids is None:
        tenant_ids = list(Tenant.objects.values_list("pk", flat=True))
    if not Operation.objects.filter(tenant_id__in=tenant_ids, key=text).exists():
        return None
    return rows.filter(tenant_id__in=tenant_ids, key=text)


# A name search matching more workflows than this is not narrowing anything; the ids beyond
# it are left out rather than sent to the database as an ever longer list.
MATCHED_WORKFLOWS_MAX = 500


def workflows_named(text: str) -> Q | None:
    """Operations whose workflow was ever named with ``text`` in it (any case), as a filter;
    None when no workflow is. One query on the names (WorkflowName, trigram index on
    PostgreSQL), then a match on (tenant, workflow id), which the operation's partial index
    serves: the ids are matched within their tenant, never across tenants."""
    text = (text or "").strip()
    if not text:
        return None
    pairs = (
        WorkflowName.objects.filter(name__icontains=text)
        .order_by("tenant_id", "workflow_id")
        .values_list("tenant_id", "workflow_id")
        .distinct()[:MATCHED_WORKFLOWS_MAX]
    )
    by_tenant: dict[int, list[str]] = {}
    for tenant_id, workflow_id in pairs:
        by_tenant.setdefault(tenant_id, []).append(workflow_id)
    found: Q | None = None
    for tenant_id, workflow_ids in by_tenant.items():
        # "<> ''" as on the other arms: the operation's index is partial.
        arm = Q(tenant_id=tenant_id, workflow_id__in=workflow_ids) & ~Q(workflow_id="")
        found = arm if found is None else found | arm
    return found


def operation_get(*, tenant: Tenant, operation_id: int) -> Operation:
    op = Operation.objects.filter(tenant=tenant, pk=operation_id).select_related("provider").first()
    if op is None:
        raise OperationNotFound("No such operation.")
    return op


# --- Runs ---------------------------------------------------------------------------------------


def run_of(*, run: str, correlation_id: str) -> str:
    """The run an operation belongs to: the explicit run id sent with it, else its correlation
    id (which stays the same across n8n retries and re-executions). Only an explicit run id is
    stored in ``run``; this is the one place that says the correlation id stands in for it."""
    return run or correlation_id


def run_operations(*, tenant_id: int, run: str) -> QuerySet[Operation]:
    """The steps of a run, in order: operations sent with this run id, and those sent without
    one whose correlation id it is; by step (steps without an ordinal last), then creation.
    Served by the partial indexes on (tenant, run, step) and on the correlation id."""
    if not run:
        return Operation.objects.none()
    return (
        Operation.objects.filter(tenant_id=tenant_id)
        .filter(Q(run=run) | Q(run="", correlation_id=run))
        .select_related("provider")
        .order_by(F("step").asc(nulls_last=True), "id")
    )


def operation_newest_in_lineage(op: Operation) -> Operation:
    """The operation whose outcome ``op``'s key answers with: itself, or, when replays
    superseded it, the newest replay (a claim of the key, its tombstone)."""
    seen = {op.pk}
    current = op
    while current.superseded_by_id and current.superseded_by_id not in seen:
        nxt = Operation.objects.filter(pk=current.superseded_by_id).first()
        if nxt is None:
            break
        seen.add(nxt.pk)
        current = nxt
    return current


_PROVIDER_SLUGS: dict[int, str] = {}


def provider_slug(provider_id: int | None) -> str | None:
    """Provider slugs never change once created (upserts key on them), so cache per process."""
    if provider_id is None:
        return None
    slug = _PROVIDER_SLUGS.get(provider_id)
    if slug is None:
        slug = Provider.objects.filter(pk=provider_id).values_list("slug", flat=True).first()
        if slug is not None:
            _PROVIDER_SLUGS[provider_id] = slug
    return slug


# --- Execute-mode metrics (exposed at /metrics by the observability work) ------------------


def metrics_admissions_refused_by_reason() -> dict[str, int]:
    """Refused execute-mode admissions since the start, by reason code (zeros included)."""
    return admission_refusals_by_reason()


def metrics_active_leases() -> int:
    """Rows held by a live lease right now (workers' and guard callers' attempts)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # The work queue's mirror holds every open row's state and lease (ADR 0017).
            f"SELECT COUNT(*) FROM ledger_open_operation WHERE status IN {sql.states_in(OperationStatus.CLAIMED)}"
            f" AND lease_expires_at > {sql.now()}",
            [],
        )
        return int(cursor.fetchone()[0])


def metrics_attempts_by_outcome() -> dict[str, int]:
    """Every attempt ever made, by outcome (every outcome present, zeros included)."""
    totals = dict.fromkeys(AttemptOutcome.values, 0)
    for row in Attempt.objects.values("outcome").annotate(n=Count("id")).order_by():
        totals[row["outcome"]] = row["n"]
    return totals


def metrics_oldest_eligible_age_seconds() -> float:
    """How long the oldest operation a worker could take right now has been due: queued or
    retry_wait, due, its provider neither paused nor throttled. 0 when nothing waits."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MIN(o.next_attempt_at), {sql.now()} FROM ledger_open_operation o"
            " JOIN ledger_provider p ON p.id = o.provider_id"
            f" WHERE o.status IN {sql.states_in(OperationStatus.QUEUED, OperationStatus.RETRY_WAIT)}"
            f" AND o.mode = '{OperationMode.EXECUTE}'"
            f" AND o.next_attempt_at <= {sql.now()} AND p.paused_at IS NULL"
            f" AND (p.throttled_until IS NULL OR p.throttled_until <= {sql.now()})",
            [],
        )
        oldest, now = cursor.fetchone()
    if oldest is None:
        return 0.0
    oldest_dt, now_dt = sql.to_datetime(oldest), sql.to_datetime(now)
    assert oldest_dt is not None and now_dt is not None
    return max(0.0, (now_dt - oldest_dt).total_seconds())


def attempt_log_fields(op: Operation, provider: Provider | None = None) -> dict[str, Any]:
    """The fields of every log line about ``op``'s latest attempt: a poll belongs to the attempt
    that submitted the job, so its lines name that attempt's adapter revision and prompt
    template version like the submit's did — also when a webhook, not a worker, runs it, and
    the sweeper's lines about the attempt (``provider``: its slug; the id without it)."""
    prompt_id = (
        Attempt.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk, number=op.attempts)
        .values_list("prompt_template_id", flat=True)
        .first()
    )
    return operation_fields(
        op,
        provider=provider.slug if provider is not None else op.provider_id,
        adapter_revision=revision_number(op.adapter_revision_id),
        prompt_template=prompt_template_label(prompt_id),
    )
