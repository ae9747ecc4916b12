"""Reads shared by the DLQ API, the console and the schedules."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from dlq.conf import dlq_setting
from dlq.errors import BulkReplayNotFound, FailedEventNotFound, ReplayTargetMissing
from dlq.models import BulkReplay, FailedEvent, FailedEventAlias, Replay, ReplayTarget
from ledger import search

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
    alias = FailedEventAlias.objects.filter(tenant_id=tenant_id, identity=identity).select_related("event").first()
    return alias.event if alias is not None else None


def bulk_replay_get(*, tenant_id: int, bulk_id: int) -> BulkReplay:
    bulk = BulkReplay.objects.filter(pk=bulk_id, tenant_id=tenant_id).first()
    if bulk is None:
        raise BulkReplayNotFound("No such bulk replay.")
    return bulk


def replay_history(*, event: FailedEvent) -> QuerySet[Replay]:
    return event.replays.order_by("number")


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


def filters_as_json(filters: dict[str, Any]) -> dict[str, Any]:
    """Filters as stored on a frozen selection (datetimes as ISO strings)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in filters.items() if v not in (None, "", {})}
