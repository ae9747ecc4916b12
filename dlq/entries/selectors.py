"""Reads shared by the DLQ API, the console and the schedules."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from alerts.models import Alert
from dlq.models import (
    FE_OPEN_STATES,
    BulkReplay,
    FailedEvent,
    FailedEventAlias,
    FailedEventOccurrence,
    FailedEventStatus,
    KeySource,
    N8nConnection,
    PayloadFetch,
    PayloadSource,
    Replay,
    ReplayOutcome,
    ReplayTarget,
)
from dlq.rules.conf import dlq_setting
from dlq.rules.errors import BulkReplayNotFound, FailedEventNotFound, ReplayTargetMissing
from ledger.models import Attempt, AttemptOutcome, ErrorClass, IdempotencyClass, Operation, Provider
from ledger.platform.redaction import scrub
from ledger.rules import search
from ledger.web.display import age_words, truncate

# Newest first; (failed_at, id) is the tail of every list index, so filter + order + limit
# is one index range scan whatever the table size.
LIST_ORDERING = ("-failed_at", "-id")


def parse_match(values: list[str]) -> dict[str, str]:
    """``path:value`` pairs on the DLQ's configured searchable paths."""
    return search.parse_match(values, list(dlq_setting("SEARCH_PATHS")))


def _filter_match(qs: QuerySet[FailedEvent], match: dict[str, str]) -> QuerySet[FailedEvent]:
    return search.filter_match(qs, match)


def failed_event_list(
    *,
    tenant_id: int,
    status: str | list[str] | None = None,
    workflow: str | None = None,
    error_class: str | None = None,
    failed_after: datetime | None = None,
    failed_before: datetime | None = None,
    match: dict[str, str] | None = None,
    execution_id: str | None = None,
    original_key: str | None = None,
    shape: str | None = None,
) -> QuerySet[FailedEvent]:
    qs = FailedEvent.objects.filter(tenant_id=tenant_id)
    if isinstance(status, list):
        qs = qs.filter(status__in=status)
    elif status:
        qs = qs.filter(status=status)
    if workflow:
        qs = qs.filter(source_workflow_id=workflow)
    if error_class is not None:
        qs = qs.filter(error_class=error_class)
    if failed_after is not None:
        qs = qs.filter(failed_at__gte=failed_after)
    if failed_before is not None:
        qs = qs.filter(failed_at__lt=failed_before)
    if execution_id:
        qs = qs.filter(source_execution_id=execution_id)
    if original_key:
        qs = qs.filter(original_key=original_key)
    if shape:
        qs = qs.filter(shape=shape)
    return _filter_match(qs, match or {}).order_by(*LIST_ORDERING)


# Written at ingest, so their trigram indexes (migration dlq.0007, PostgreSQL) cost an ingest,
# never a replay.
FAILED_EVENT_SUBSTRING_FIELDS = (
    "event_id",
    "original_key",
    "source_execution_id",
    "source_workflow_name",
    "source_node",
    "error_message",
)


def failed_event_search(rows: QuerySet[FailedEvent], text: str) -> QuerySet[FailedEvent]:
    """Entries matching ``text``: a case-insensitive substring of the identity, the original
    key, the execution id, the workflow's name, the failed node or the error message, or the
    entry's id. Plain LIKE on SQLite; trigram GIN indexes serve every arm on PostgreSQL.
    Payloads are never searched (they are sealed; ``match=`` filters the configured
    non-personal paths)."""
    text = (text or "").strip()
    if not text:
        return rows
    found = Q(pk=int(text)) if text.isdigit() and len(text) <= 18 else Q(pk__in=[])
    for field in FAILED_EVENT_SUBSTRING_FIELDS:
        found |= Q(**{f"{field}__icontains": text}) & ~Q(**{field: ""})
    return rows.filter(found)


def failed_event_get(*, tenant_id: int, event_pk: int) -> FailedEvent:
    event = FailedEvent.objects.filter(tenant_id=tenant_id, pk=event_pk).first()
    if event is None:
        raise FailedEventNotFound("No such dead-letter entry.")
    return event


def failed_event_find(*, tenant_id: int, identity: str) -> FailedEvent | None:
    """The entry an identity belongs to: its own, or one it was aliased to (n8n retries)."""
    event = FailedEvent.objects.filter(tenant_id=tenant_id, event_id=identity).first()
    if event is not None:
        return event
    # Both tables by the tenant (Citus routes a join of co-located tables by it: DESIGN §12).
    alias = (
        FailedEventAlias.objects.filter(tenant_id=tenant_id, identity=identity, event__tenant_id=tenant_id)
        .select_related("event")
        .first()
    )
    return alias.event if alias is not None else None


def failed_events_of_key(*, tenant_id: int, key: str, target_slug: str) -> QuerySet[FailedEvent]:
    """Every entry of a business key for one target (``fe_key_idx``), whatever its state and
    whenever it was stored: the console shows them linked."""
    return FailedEvent.objects.filter(tenant_id=tenant_id, original_key=key, replay_target_slug=target_slug)


def failed_events_sharing_key(event: FailedEvent, *, limit: int = 20) -> list[FailedEvent]:
    """Other entries of the entry's original key and target, newest first — also entries
    stored before occurrences existed, which are left as they are and shown linked. Entries
    whose key is their own identity share it with nobody."""
    if event.key_source in (KeySource.IDENTITY, KeySource.MISSING) and event.original_key == event.event_id:
        return []
    rows = failed_events_of_key(
        tenant_id=event.tenant_id, key=event.original_key, target_slug=event.replay_target_slug
    ).exclude(pk=event.pk)
    return list(rows.order_by("-id")[:limit])


def failed_event_occurrences(event: FailedEvent) -> list[FailedEventOccurrence]:
    return list(event.occurrences.filter(tenant_id=event.tenant_id).order_by("number")[:100])


def key_origin(event: FailedEvent) -> str:
    """Where the entry's original key came from, in words (shown with the key)."""
    words = KeySource(event.key_source).label if event.key_source in KeySource.values else event.key_source
    if event.key_source == KeySource.IDENTITY:
        words = "not looked for (the entry's identity or its operation's key)"
    note = f" {event.key_note}" if event.key_note else ""
    previous = f" Follows entry {event.previous_id}, closed, of the same key." if event.previous_id else ""
    return f"{words}.{note}{previous}"


def n8n_connection_active(*, tenant_id: int) -> bool:
    """The tenant has an n8n connection that lead capture may use (switched on, with a key)."""
    return N8nConnection.objects.filter(tenant_id=tenant_id, active=True, api_key_secret__isnull=False).exists()


def payload_origin(event: FailedEvent) -> str:
    """Where the entry's payload came from, in a sentence (the entry's page and story)."""
    if event.payload_source == PayloadSource.N8N_EXECUTION_FETCH:
        return f"The payload was fetched from n8n execution {event.payload_source_ref}: {event.payload_fetch_note}"
    if event.payload_fetch == PayloadFetch.PENDING:
        return (
            f"The failed node's input items are being fetched from n8n execution {event.source_execution_id}; "
            "until then the payload is the Error Trigger report."
        )
    if event.payload_fetch == PayloadFetch.FAILED:
        return f"Fetching the failed node's input items from n8n failed: {event.payload_fetch_note} The payload is the report as received."
    return "The payload is the report as received."


def bulk_replay_get(*, tenant_id: int, bulk_id: int) -> BulkReplay:
    bulk = BulkReplay.objects.filter(pk=bulk_id, tenant_id=tenant_id).first()
    if bulk is None:
        raise BulkReplayNotFound("No such bulk replay.")
    return bulk


def replay_history(*, event: FailedEvent) -> QuerySet[Replay]:
    return event.replays.filter(tenant_id=event.tenant_id).order_by("number")


def replay_target_resolve(*, tenant_id: int, slug: str = "") -> ReplayTarget:
    """A named target, else the tenant's default one."""
    if slug:
        target = ReplayTarget.objects.filter(tenant_id=tenant_id, slug=slug).first()
        if target is None:
            raise ReplayTargetMissing(f"No replay target named {slug!r} is configured for this tenant.")
    else:
        target = ReplayTarget.objects.filter(tenant_id=tenant_id, is_default=True).first()
        if target is None:
            raise ReplayTargetMissing(
                'The entry names no replay target and the tenant has no default one; pass {"target": "slug"}.'
            )
    if not target.active:
        raise ReplayTargetMissing(f"The replay target {target.slug!r} is inactive.")
    return target


def replay_outcome_unknown(event: FailedEvent) -> str:
    """Why the entry's effect may already have happened at its receiver, in words; "" when
    it cannot have: the first try, or the latest replay, was sent and its answer lost
    (``ambiguous``: a 5xx, a timeout after sending, a reset after the request was written).
    Entries that never reached the receiver (refused connection, a 4xx, a 429) are not."""
    last = (
        Replay.objects.filter(tenant_id=event.tenant_id, event_id=event.pk, to_provider=False)
        .exclude(outcome=ReplayOutcome.REFUSED)
        .order_by("-number")
        .values_list("number", "outcome")
        .first()
    )
    if last is not None and last[1] == ReplayOutcome.AMBIGUOUS:
        return f"replay #{last[0]} was sent and its answer was lost (ambiguous)"
    if event.operation_id and (
        Attempt.objects.filter(tenant_id=event.tenant_id, operation_id=event.operation_id)
        .order_by("-number")
        .values_list("outcome", flat=True)
        .first()
        == AttemptOutcome.NOT_FOUND
    ):
        # The ledger's review settled it: a reviewer's "safe to retry" (review.decisions.services) or
        # the sweeper's lookup found the first try had no effect.
        return ""
    if event.error_class == ErrorClass.AMBIGUOUS:
        return "its first try was sent and its answer was lost (ambiguous)"
    return ""


def replay_wait_reason(*, event: FailedEvent, target: ReplayTarget) -> str:
    """Why a replay of ``event`` to ``target`` waits for a person, in words; "" when it may be
    sent. Only a key-enforced target refuses a second effect of the key: to a key-advisory
    one an entry whose first try may have acted goes only after the decision "safe to
    resend" (ADR 0003), which the next replay sent uses up."""
    if target.idempotency_class == IdempotencyClass.KEY_ENFORCED or event.resend_decided_at is not None:
        return ""
    unknown = replay_outcome_unknown(event)
    if not unknown:
        return ""
    return (
        f"This entry waits for a decision: {unknown}, and the target {target.slug} is key-advisory (it may not"
        ' refuse a second effect). Record the decision "safe to resend" with a reason, or resolve the entry.'
    )


def replay_waiting(*, tenant_id: int, event_ids: list[int], target_slug: str = "") -> dict[str, Any]:
    """How many entries of a bulk selection a replay would leave waiting for the decision
    "safe to resend" (their first try may have acted and their target is key-advisory), and
    why, in words — shown with the dry run's count. A target's lookup may still settle some."""
    candidates = (
        FailedEvent.objects.filter(tenant_id=tenant_id, pk__in=event_ids, resend_decided_at__isnull=True)
        .filter(Q(error_class=ErrorClass.AMBIGUOUS) | Q(replays__outcome=ReplayOutcome.AMBIGUOUS))
        .distinct()
    )
    targets: dict[str, ReplayTarget | None] = {}
    waiting: dict[str, int] = {}
    for event in candidates.iterator():
        slug = target_slug or event.replay_target_slug
        if slug not in targets:
            try:
                targets[slug] = replay_target_resolve(tenant_id=tenant_id, slug=slug)
            except ReplayTargetMissing:
                targets[slug] = None
        target = targets[slug]
        if target is None or not replay_wait_reason(event=event, target=target):
            continue
        waiting[target.slug] = waiting.get(target.slug, 0) + 1
    count = sum(waiting.values())
    why = "; ".join(
        f"{n} to {slug}, which is key-advisory, after a first try or replay whose answer was lost"
        for slug, n in sorted(waiting.items())
    )
    return {
        "count": count,
        "reason": f'{why}: each waits for the decision "safe to resend" and is not sent' if count else "",
    }


def filters_as_json(filters: dict[str, Any]) -> dict[str, Any]:
    """Filters as stored on a frozen selection (datetimes as ISO strings)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in filters.items() if v not in (None, "", {})}


# --- What needs a person (console) ------------------------------------------------------------


def _auto_replay_rows(tenant_ids: list[int] | None) -> Q:
    """Pending entries the auto-replay schedule will try (ignoring its per-try pause)."""
    cap = int(dlq_setting("AUTO_REPLAY_MAX_PER_ROOT"))
    oldest = timezone.now() - timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    targets = ReplayTarget.objects.filter(auto_replay=True, active=True)
    if tenant_ids is not None:
        targets = targets.filter(tenant_id__in=tenant_ids)
    to_target = Q(pk__in=[])
    for tenant_id, slug, is_default in targets.values_list("tenant_id", "slug", "is_default")[:500]:
        to_target |= Q(tenant_id=tenant_id, replay_target_slug=slug)
        if is_default:
            to_target |= Q(tenant_id=tenant_id, replay_target_slug="")
    return Q(error_class=ErrorClass.TRANSIENT, auto_replay_count__lt=cap, failed_at__gte=oldest) & to_target


def failed_events_for_a_person(*, tenant_ids: list[int] | None) -> QuerySet[FailedEvent]:
    """Pending entries no automatic replay will retry: somebody has to look."""
    rows = FailedEvent.objects.filter(status=FailedEventStatus.PENDING)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    return rows.exclude(_auto_replay_rows(tenant_ids)).order_by("failed_at", "id")


def auto_replay_outlook(event: FailedEvent) -> str:
    """One sentence: will the schedule replay this entry, and if not, why not."""
    if event.status != FailedEventStatus.PENDING:
        return ""
    if event.error_class != ErrorClass.TRANSIENT:
        return f"It will not be replayed automatically: only transient failures are ({event.error_class or 'unclassified'})."
    cap = int(dlq_setting("AUTO_REPLAY_MAX_PER_ROOT"))
    if event.auto_replay_count >= cap:
        return f"It will not be replayed automatically again: {event.auto_replay_count} automatic replays (the cap)."
    lifetime = timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    if event.failed_at + lifetime <= timezone.now():
        return "It will not be replayed automatically: past the automatic replay lifetime."
    try:
        target = replay_target_resolve(tenant_id=event.tenant_id, slug=event.replay_target_slug)
    except Exception as exc:  # ReplayTargetMissing: say what is missing
        return f"It cannot be replayed until a target exists: {getattr(exc, 'detail', exc)}"
    if not target.auto_replay:
        return f"It will not be replayed automatically: target {target.slug} does not opt in to automatic replay."
    return f"Automatic replay to {target.slug} will try it (at most {cap} times)."


@dataclass
class EntryStory:
    headline: str
    why: list[str] = dataclass_field(default_factory=list)
    error: str = ""
    notes: list[str] = dataclass_field(default_factory=list)


def failed_event_story(event: FailedEvent) -> EntryStory:
    """What failed, where, and what happens next, for the entry's detail page."""
    where = event.source_workflow_name or (f"workflow {event.source_workflow_id}" if event.source_workflow_id else "")
    at_node = f" at node “{event.source_node}”" if event.source_node else ""
    if where:
        headline = f"Failed {age_words(event.failed_at)} in “{where}”{at_node}."
    else:
        headline = f"Recorded {age_words(event.failed_at)}{at_node}."
    story = EntryStory(headline=headline, error=truncate(scrub(event.error_message), 400))
    if event.operation_id:
        story.why.append(f"Its operation {event.operation_id} ended failed; the entry holds its payload for a replay.")
    else:
        story.why.append(
            "The workflow reported it"
            + (f" (execution {event.source_execution_id})" if event.source_execution_id else "")
            + (f"; the source retried it {event.retry_count} times" if event.retry_count else "")
            + "."
        )
    if event.seen_count > 1:
        story.why.append(f"The same failure was reported {event.seen_count} times (one entry).")
    last = event.replays.filter(tenant_id=event.tenant_id).order_by("-number").first()
    if last is not None:
        if last.outcome == ReplayOutcome.SUCCEEDED:
            answer = f" (HTTP {last.response_status})" if last.response_status else ""
            story.notes.append(f"Replay {last.number} to {last.target_slug} succeeded{answer}.")
        else:
            # Its error follows as a sentence with the raw text behind a disclosure (dlq.web.console).
            story.notes.append(f"Replay {last.number} to {last.target_slug}: {last.outcome}.")
    if event.payload_fetch:
        story.notes.append(payload_origin(event))
    outlook = auto_replay_outlook(event)
    if outlook:
        story.notes.append(outlook)
    if event.weak_identity:
        story.notes.append(
            "Its identity is a digest of the body (no id or execution was found): a changed report is a new entry."
        )
    return story


# --- Alert clearing conditions (alerts.clearing names these) --------------------------------


def alerts_cleared_dlq_new(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``dlq_new`` (ref: the entry's id) clears once the entry is no longer pending or being
    replayed: replayed, resolved, discarded or gone. One query for the lot."""
    ids = {alert.pk: int(alert.ref) for alert in alerts if alert.ref.isdigit()}
    status = dict(FailedEvent.objects.filter(tenant_id=tenant_id, pk__in=set(ids.values())).values_list("pk", "status"))
    cleared = {}
    for alert_pk, event_pk in ids.items():
        if event_pk not in status:
            cleared[alert_pk] = f"cleared: DLQ entry {event_pk} no longer exists"
        elif status[event_pk] not in FE_OPEN_STATES:
            cleared[alert_pk] = f"cleared: DLQ entry {event_pk} {status[event_pk]}"
    return cleared


def alerts_cleared_retention_discarded(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
    """``retention_discarded`` (ref: the entry's event id) is a notice raised in the discard's
    own transaction: it clears once no entry with that event id is pending any more (the
    discard is done), so it is delivered and then leaves the open list by itself."""
    refs = {alert.ref for alert in alerts}
    pending = set(
        FailedEvent.objects.filter(
            tenant_id=tenant_id, event_id__in=refs, status=FailedEventStatus.PENDING
        ).values_list("event_id", flat=True)
    )
    return {
        alert.pk: "cleared: the entry was discarded (a notice: nothing is left to do)"
        for alert in alerts
        if alert.ref not in pending
    }


def entry_provider_ids(*, tenant_id: int, event_pks: list[int]) -> list[int]:
    """The providers of these entries' operations that require four-eyes approval themselves
    (ADR 0013; an n8n-reported entry has none). Most tenants have no such provider: then one
    read of the tenant's providers answers, and no operation is read."""
    requiring = Provider.objects.filter(tenant_id=tenant_id, resend_approval_required=True).values("pk")
    if not requiring.exists():
        return []
    op_ids = FailedEvent.objects.filter(tenant_id=tenant_id, pk__in=event_pks, operation_id__isnull=False).values(
        "operation_id"
    )
    providers = Operation.objects.filter(tenant_id=tenant_id, pk__in=op_ids, provider_id__in=requiring)
    return sorted(set(providers.values_list("provider_id", flat=True)))
