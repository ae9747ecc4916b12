"""Reads for the console's front page: bounded counts of every list it links to
(``shown_count``: exact up to a thousand rows read from an index, else the planner's estimate),
the dashboard's numbers, what needs attention now, and each provider's activity per hour (the
settled hours kept in ``ActivityHour`` rows by the hourly rollup or the first reader, the
current ones read live).

The review queue's own reads are review.decisions.selectors."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone
from django_q.models import Task

from alerts.models import Alert
from dlq.entries.selectors import failed_events_for_a_person
from dlq.models import FailedEvent, FailedEventStatus
from ledger.models import (
    OPEN_STATES,
    TERMINAL_STATES,
    ApprovalRequest,
    ApprovalStatus,
    OpenOperation,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    Provider,
    Tenant,
)
from ledger.protocol.selectors import operations_in_state
from ledger.store import sql
from ledger.store.open_rows import open_rows_where
from review.models import ActivityHour, RetentionRun


def _scoped(qs: QuerySet, tenant_ids: list[int] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": tenant_ids})


# The dashboard counts each state exactly up to this many rows (reading at most this many
# index entries); past it, it shows PostgreSQL's estimate ("≈ 1.2M"): an exact count reads every
# row it counts, 10,000 entries per state took the page past its budget at ten million rows.
DASHBOARD_EXACT_UP_TO = 1_000


@dataclass(frozen=True)
class ShownCount:
    """A dashboard count: ``exact`` up to DASHBOARD_EXACT_UP_TO; past it the planner's
    ``estimate``, or (no estimate: SQLite) ``at_least`` the bound."""

    n: int
    how: str = "exact"

    def __str__(self) -> str:
        if self.how == "exact":
            return f"{self.n:,}"
        if self.how == "at_least":
            return f"{self.n:,}+"
        if self.n >= 1_000_000:
            return f"≈ {self.n / 1_000_000:.1f}M"
        return f"≈ {self.n / 1_000:.0f}k" if self.n >= 10_000 else f"≈ {self.n:,}"


def shown_count(qs: QuerySet) -> ShownCount:
    """``qs``'s rows: counted exactly while there are at most DASHBOARD_EXACT_UP_TO (a
    bounded subquery over an index), else estimated by PostgreSQL's planner from the
    table's statistics (EXPLAIN: nothing is read); without an estimate (SQLite), the bound."""
    qs = qs.order_by().values("pk")
    return _shown(qs, qs[: DASHBOARD_EXACT_UP_TO + 1].count())


def shown_counts(querysets: list[QuerySet]) -> list[ShownCount]:
    """``shown_count`` of each queryset, the bounded counts in one statement (a scalar
    subquery each): the console's front page counts some thirty lists, and one round trip
    each was most of its queries. Each list may be of another table; every count still reads
    at most DASHBOARD_EXACT_UP_TO + 1 rows."""
    if not querysets:
        return []
    bounded = [qs.order_by().values("pk")[: DASHBOARD_EXACT_UP_TO + 1] for qs in querysets]
    parts, params = [], []
    for n, qs in enumerate(bounded):
        text, args = qs.query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({text}) AS counted_{n})")
        params.extend(args)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        counted = cursor.fetchone()
    return [_shown(qs.order_by().values("pk"), n) for qs, n in zip(querysets, counted, strict=True)]


def _shown(qs: QuerySet, counted: int) -> ShownCount:
    # ``counted``: qs's rows counted up to DASHBOARD_EXACT_UP_TO + 1.
    if counted <= DASHBOARD_EXACT_UP_TO:
        return ShownCount(counted)
    estimate = sql.estimated_rows(qs)
    if estimate is None:
        return ShownCount(DASHBOARD_EXACT_UP_TO, "at_least")
    return ShownCount(max(estimate, counted), "estimate")


def shown_total(counts: Iterable[ShownCount]) -> str:
    """The sum of counts, exact only if every one is."""
    counts = list(counts)
    total = sum(c.n for c in counts)
    hows = {c.how for c in counts}
    if hows == {"exact"}:
        return str(ShownCount(total))
    return str(ShownCount(total, "estimate" if "estimate" in hows else "at_least"))


def state_counts(
    qs: QuerySet,
    *,
    tenant_ids: list[int],
    states: list[str],
    in_state: Callable[[QuerySet, str], QuerySet] | None = None,
    counted_by: Callable[[str], QuerySet | None] | None = None,
) -> dict[str, ShownCount]:
    """Rows per state (``shown_count``). A GROUP BY status over the operations reads every
    row (1.7 s at ten million); each count here reads at most the bound's worth of
    a (tenant, status, …) index's entries: ``tenant_ids`` is spelled out for a platform admin
    too (every tenant), so the index is usable. ``counted_by(state)``, where not None, is a
    cheaper read of the same ids, counted instead (the estimate past the bound stays the
    rows' own)."""
    rows = qs.filter(tenant_id__in=tenant_ids).order_by().values("pk")
    # ``in_state``: the operations' states are read off the work queue and the events (ADR 0017).
    each = [rows.filter(status=state) if in_state is None else in_state(rows, state) for state in states]
    cheap = [(counted_by(state) if counted_by is not None else None) for state in states]
    counts = [q if c is None else c for q, c in zip(each, cheap, strict=True)]
    # Every state's count in one statement (a round trip each was most of the page's time).
    counted = sql.capped_counts(counts, DASHBOARD_EXACT_UP_TO)
    return {state: _shown(q, n) for state, q, n in zip(states, each, counted, strict=True)}


def _operations_counted_in_state(tenant_ids: list[int]) -> Callable[[str], QuerySet | None]:
    """The dashboard's count of the operations in a state without reading an operation row
    (ADR 0017): an open state's rows are its mirror rows (``open_tenant_status_idx``, written in
    the row's own statement, so the same rows), a terminal state but ``succeeded`` the operations
    with an event into it (``opevent_terminal_status_idx``; final, so the same rows; a supersede
    writes a second one, hence each operation once). The join of either to the operation rows
    cost 0.5 s a view at ten million (a parallel scan per state, the failed events hashed)."""

    def counted(state: str) -> QuerySet | None:
        if state in OPEN_STATES:
            return OpenOperation.objects.filter(tenant_id__in=tenant_ids, status=state).values("pk")
        if state in (OperationStatus.FAILED, OperationStatus.ABANDONED) and connection.vendor == "postgresql":
            # One event per operation (DISTINCT ON: the count reads the events' pk column).
            events = OperationEvent.objects.filter(tenant_id__in=tenant_ids, to_status=state)
            return events.distinct("operation_id")
        # succeeded ((tenant, id): the rows' own read is the cheap one), and SQLite's small tables.
        return None

    return counted


def dashboard_numbers(*, tenant_ids: list[int] | None) -> dict[str, Any]:
    """Every number the console's front page shows, each scoped to the user's tenants, each
    read from an index and bounded (p95 under 300 ms at ten million rows: docs/explanation/scale.md)."""
    now = timezone.now()
    ops = _scoped(Operation.objects.all(), tenant_ids)
    # The counts name the tenants for a platform admin too (state_counts): listed once here.
    counted_for = tenant_ids if tenant_ids is not None else list(Tenant.objects.values_list("pk", flat=True))
    by_state = state_counts(
        Operation.objects.all(),
        tenant_ids=counted_for,
        states=list(OperationStatus.values),
        in_state=lambda rows, state: operations_in_state(rows, state, tenant_ids=counted_for),
        counted_by=_operations_counted_in_state(counted_for),
    )
    # Off the work queue's mirror (ADR 0017); the row's own columns checked too.
    due = open_rows_where(status__in=[OperationStatus.QUEUED, OperationStatus.RETRY_WAIT], next_attempt_at__lte=now)
    # Due work is what a worker will do: execute mode. A due guard-mode retry waits for its
    # caller to claim the key again — nobody here can do it — so it is counted apart. Oldest
    # first off the due index (status, next_attempt_at), one row each.
    eligible = (
        ops.filter(due, mode=OperationMode.EXECUTE)
        .order_by("open_row__next_attempt_at")
        .values_list("next_attempt_at")
        .first()
    )
    caller_rows = ops.filter(due, status=OperationStatus.RETRY_WAIT, mode=OperationMode.GUARD)
    caller_oldest = caller_rows.order_by("open_row__next_attempt_at").values_list("next_attempt_at").first()
    # The review backlog is the review state's count; its oldest row off (status, updated_at).
    review_oldest = (
        ops.filter(open_rows_where(status=OperationStatus.REVIEW))
        .order_by("open_row__updated_at")
        .values_list("updated_at")
        .first()
    )
    dlq_by_status = state_counts(
        FailedEvent.objects.all(), tenant_ids=counted_for, states=list(FailedEventStatus.values)
    )
    paused = list(
        _scoped(Provider.objects.filter(paused_at__isnull=False), tenant_ids)
        .select_related("tenant")
        .order_by("paused_at")[:20]
    )
    throttled = _scoped(Provider.objects.filter(throttled_until__gt=now), tenant_ids).count()
    last_purge = _scoped(RetentionRun.objects.all(), tenant_ids).order_by("-started_at", "-id").first()
    eligible_at = eligible[0] if eligible else None
    oldest_review = review_oldest[0] if review_oldest else None
    return {
        "now": now,
        "operations": [(s, label, by_state[s]) for s, label in OperationStatus.choices],
        "operations_total": shown_total(by_state.values()),
        "oldest_eligible_at": eligible_at,
        "oldest_eligible_age": (now - eligible_at) if eligible_at else None,
        "waiting_for_caller": shown_count(caller_rows),
        "open_alerts": _scoped(Alert.objects.filter(resolved_at__isnull=True), tenant_ids).count(),
        "waiting_for_caller_oldest_at": caller_oldest[0] if caller_oldest else None,
        "review_backlog": by_state[OperationStatus.REVIEW],
        "review_oldest_at": oldest_review,
        "review_oldest_age": (now - oldest_review) if oldest_review else None,
        "dlq": [(s, label, dlq_by_status[s]) for s, label in FailedEventStatus.choices],
        "dlq_total": shown_total(dlq_by_status.values()),
        "paused_providers": paused,
        "throttled_providers": throttled,
        "last_purge": last_purge,
        "last_sweep": last_sweep(),
    }


def last_sweep() -> dict[str, Any] | None:
    """The sweeper's last scheduled run (django-q2's task record), if it has run."""
    task = (
        Task.objects.filter(func="ledger.schedules.sweep_task")
        .order_by("-stopped")
        .values("stopped", "success", "result")
        .first()
    )
    return task


# --- Needs attention now, and the last 24 h per provider --------------------------------------

ATTENTION_ROWS = 5


def attention_now(*, tenant_ids: list[int] | None) -> dict[str, list[Any]]:
    """The oldest of each kind of thing a person must look at, each a few rows: review items,
    DLQ entries no automatic replay will retry, re-sends waiting for a second person, paused
    providers, operations open too long."""
    now = timezone.now()
    # provider__tenant: a provider prints as "tenant/slug" (one query per row without it).
    # Only what the rows show (key, state, provider, time): an operation with its provider and
    # tenants is some 140 columns, a dozen JSON decoded.
    ops = (
        _scoped(Operation.objects.all(), tenant_ids)
        .select_related("provider__tenant")
        .only("id", "tenant_id", "key", "status", "updated_at", "provider__slug", "provider__tenant__slug")
    )
    cutoff = now - timedelta(seconds=int(settings.ONCEGUARD["STUCK_ALERT_SECONDS"]))
    return {
        "review": list(
            ops.filter(open_rows_where(status=OperationStatus.REVIEW)).order_by("open_row__updated_at", "id")[
                :ATTENTION_ROWS
            ]
        ),
        "dlq": list(failed_events_for_a_person(tenant_ids=tenant_ids).select_related("tenant")[:ATTENTION_ROWS]),
        # Re-sends waiting for a second person (four-eyes, ADR 0013), the one closest to expiring first.
        "approvals": list(
            _scoped(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING), tenant_ids).order_by(
                "expires_at", "id"
            )[:ATTENTION_ROWS]
        ),
        "paused": list(
            _scoped(Provider.objects.filter(paused_at__isnull=False), tenant_ids)
            .select_related("tenant")
            .order_by("paused_at")[:ATTENTION_ROWS]
        ),
        # Oldest first (by id, the order of the work queue's (id, updated_at) index, ADR 0017).
        "stuck": list(
            ops.filter(
                open_rows_where(
                    status__in=[OperationStatus.CLAIMED, OperationStatus.UNCERTAIN, OperationStatus.QUEUED],
                    updated_at__lt=cutoff,
                )
            ).order_by("id")[:ATTENTION_ROWS]
        ),
    }


CHART_SERIES = ("succeeded", "failed", "dead_lettered", "reviewed")
CHART_PROVIDERS = 8


# An hour is read into the rollup (review.models.ActivityHour) this long after it ended: a row
# finished at 10:59:59 may commit a moment later. Until then it is read live, as the current one.
ACTIVITY_SETTLE = timedelta(minutes=2)
# Rolled-up hours older than this are deleted by the hourly schedule (the chart shows 24).
ACTIVITY_KEEP = timedelta(days=2)
# A process keeps the settled hours it read (they do not change) this long.
ACTIVITY_CACHE_SECONDS = 3600


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def provider_activity(*, tenant_ids: list[int] | None, hours: int = 24) -> dict[str, Any]:
    """Per provider and hour of the last ``hours``: operations that succeeded or failed, DLQ
    entries recorded, review decisions made; the busiest providers first. Hours that are over
    come from the rollup (``activity_hours``: each read from the ledger once, by the hourly
    schedule or the first view that needs it, a few rows per tenant and hour); the current hour
    — and the last one for ACTIVITY_SETTLE after it ends — is read live through the time
    indexes: operations by (tenant, ``updated_at``) (a finished row's last update is its finish),
    review decisions by their event's time (a partial index of the events that leave review),
    DLQ entries by (tenant, ``failed_at``). At ten million rows a day's finished operations are
    some 55,000 rows (~0.5 s): read from the ledger once, not on each process's first view;
    a process keeps the rolled-up rows it read for the hour (ACTIVITY_CACHE_SECONDS)."""
    moment = timezone.now()
    now = _hour(moment) + timedelta(hours=1)
    since = now - timedelta(hours=hours)
    settled = max(since, _hour(moment - ACTIVITY_SETTLE))
    if tenant_ids is None:
        tenant_ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    # Settled hours never change: this process keeps what it read of them for the hour.
    key = "onceguard:activity:" + hashlib.sha256(f"{sorted(tenant_ids)}|{since}|{settled}".encode()).hexdigest()
    past = cache.get(key)
    if past is None:
        past = activity_hours(tenant_ids=tenant_ids, since=since, until=settled)
        cache.set(key, past, ACTIVITY_CACHE_SECONDS)
    rows = past + _activity_rows(tenant_ids=tenant_ids, since=settled, until=None, cap=ACTIVITY_LIVE_ROWS)
    buckets: dict[str, dict[str, list[int]]] = {}
    for _tenant, provider, series, hour, n in rows:
        slot = int((hour - since).total_seconds() // 3600)
        if 0 <= slot < hours and series:
            row = buckets.setdefault(provider, {name: [0] * hours for name in CHART_SERIES})
            row[series][slot] += n
    ranked = sorted(buckets.items(), key=lambda item: -sum(sum(v) for v in item[1].values()))[:CHART_PROVIDERS]
    return {"since": since, "until": now, "hours": hours, "providers": ranked}


Row = tuple[int, str, str, datetime, int]


def activity_hours(*, tenant_ids: list[int], since: datetime, until: datetime) -> list[Row]:
    """(tenant, provider, series, hour, count) of the whole hours from ``since`` to ``until``
    (both on the hour, ``until`` settled), from the rollup; the hours it lacks for any of the
    tenants are read from the ledger first, in one pass per table, and stored (with the
    empty-series row that says the hour was read). Concurrent readers store the same counts:
    the second one's rows are ignored (unique per tenant, hour, series and provider)."""
    wanted = []
    hour = since
    while hour < until:
        wanted.append(hour)
        hour += timedelta(hours=1)
    if not wanted or not tenant_ids:
        return []
    stored: list[Row] = list(
        ActivityHour.objects.filter(tenant_id__in=tenant_ids, hour__gte=since, hour__lt=until).values_list(
            "tenant_id", "provider", "series", "hour", "n"
        )
    )
    done = {(t, h) for t, _p, series, h, _n in stored if series == ""}
    missing = {t: {h for h in wanted if (t, h) not in done} for t in tenant_ids}
    missing = {t: hs for t, hs in missing.items() if hs}
    if missing:
        first = min(min(hs) for hs in missing.values())
        # Every count, uncapped: what is stored here is the hour's record for good, never read
        # again (a cap would lose the counts past it for ever). At most a count per tenant,
        # provider, series and hour: bounded by the chart's 24 hours and the 200 tenants a
        # rollup pass takes at a time.
        read = _activity_rows(tenant_ids=sorted(missing), since=first, until=until, cap=None)
        new = [ActivityHour(tenant_id=t, hour=h) for t, hs in missing.items() for h in sorted(hs)]
        new += [
            ActivityHour(tenant_id=t, provider=provider, series=series, hour=h, n=n)
            for t, provider, series, h, n in read
            if h in missing.get(t, ())
        ]
        ActivityHour.objects.bulk_create(new, ignore_conflicts=True)
        # A concurrent reader's rows, if it stored first, hold the same counts as these.
        stored = [r for r in stored if (r[0], r[3]) not in {(a.tenant_id, a.hour) for a in new}]
        stored += [(a.tenant_id, a.provider, a.series, a.hour, a.n) for a in new]
    return stored


def activity_rollup(*, hours: int = 24) -> int:
    """The hourly schedule's pass: every tenant's settled hours of the chart read into the
    rollup (so no dashboard view reads a finished hour from the ledger), rows past
    ACTIVITY_KEEP deleted. Returns the tenants covered."""
    moment = timezone.now()
    until = _hour(moment - ACTIVITY_SETTLE)
    since = _hour(moment) + timedelta(hours=1) - timedelta(hours=hours)
    ActivityHour.objects.filter(hour__lt=moment - ACTIVITY_KEEP).delete()
    tenant_ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(tenant_ids), 200):
        activity_hours(tenant_ids=tenant_ids[start : start + 200], since=since, until=until)
    return len(tenant_ids)


# The live hours' read shows at most this many counts per table (a chart, not a record).
ACTIVITY_LIVE_ROWS = 20000


def _activity_rows(*, tenant_ids: list[int], since: datetime, until: datetime | None, cap: int | None) -> list[Row]:
    """(tenant, provider, series, hour, count) of ``provider_activity`` from ``since`` up to
    ``until``, at most ``cap`` counts per table (None: all of them)."""
    rows: list[Row] = []
    upto_cap = slice(None, cap)

    def upto(field: str) -> Q:
        return Q() if until is None else Q(**{f"{field}__lt": until})

    # The finished rows are found by their events into a terminal state since ``since``
    # (opevent_terminal_at_idx, pruned to the months after ``since``; ADR 0017): an operation
    # that finished at ``done_at`` wrote such an event in the same transaction, at or after
    # ``done_at``, so every row that counts is among them; the row's own ``done_at`` and state
    # then keep exactly the rows of each hour. No upper bound on the event's time: a supersede
    # (failed → failed) writes a later one, and the row still counts in its ``done_at``'s hour.
    ended = OperationEvent.objects.filter(
        tenant_id__in=tenant_ids, to_status__in=sorted(TERMINAL_STATES), at__gte=since
    ).values("operation_id")
    finished = (
        Operation.objects.filter(tenant_id__in=tenant_ids, updated_at__gte=since, pk__in=ended)
        .filter(upto("done_at"), status__in=[OperationStatus.SUCCEEDED, OperationStatus.FAILED], done_at__gte=since)
        .annotate(hour=TruncHour("done_at", tzinfo=UTC))
        .values("tenant_id", "provider__slug", "status", "hour")
        .annotate(n=Count("id"))
    )
    rows += [
        (r["tenant_id"], r["provider__slug"] or "(no provider)", r["status"], r["hour"], r["n"])
        for r in finished[upto_cap]
    ]
    # Review decisions off their own partial index by time (ledger_operationevent's
    # opevent_review_exit_idx), then their operations by primary key.
    reviewed = (
        OperationEvent.objects.filter(
            upto("at"),
            from_status=OperationStatus.REVIEW,
            at__gte=since,
            # Both tables by the tenants (the event carries its operation's tenant): DESIGN §12.
            tenant_id__in=tenant_ids,
            operation__tenant_id__in=tenant_ids,
        )
        .exclude(to_status=OperationStatus.REVIEW)
        .annotate(hour=TruncHour("at", tzinfo=UTC))
        .values("operation__tenant_id", "operation__provider__slug", "hour")
        .annotate(n=Count("id"))
    )
    rows += [
        (r["operation__tenant_id"], r["operation__provider__slug"] or "(no provider)", "reviewed", r["hour"], r["n"])
        for r in reviewed[upto_cap]
    ]
    dead = (
        FailedEvent.objects.filter(upto("failed_at"), tenant_id__in=tenant_ids, failed_at__gte=since)
        .annotate(hour=TruncHour("failed_at", tzinfo=UTC))
        .values("tenant_id", "operation__provider__slug", "hour")
        .annotate(n=Count("id"))
    )
    rows += [
        (r["tenant_id"], r["operation__provider__slug"] or "(posted by workflows)", "dead_lettered", r["hour"], r["n"])
        for r in dead[upto_cap]
    ]
    return rows
