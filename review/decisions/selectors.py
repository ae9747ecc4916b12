"""Reads for the review queue, shared by the API and the console: the operations waiting
for a human, with the evidence (attempts, events) a reviewer decides on."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from ledger.models import (
    Attempt,
    Operation,
    OperationEvent,
    OperationStatus,
    Provider,
)
from ledger.protocol.selectors import operation_search
from ledger.store.open_rows import open_rows_where


def review_item_list(
    *,
    tenant_ids: list[int] | None,
    provider: str = "",
    older_than_seconds: float | None = None,
    search: str = "",
) -> QuerySet[Operation]:
    # Attempts and events prefetched: the API renders both per item (one query each per page),
    # each read by the tenants' ids too (Citus routes a tenant's statement to one node).
    rows = (
        # Off the work queue's mirror (its (status, updated_at) index; ADR 0017).
        Operation.objects.filter(open_rows_where(status=OperationStatus.REVIEW))
        .select_related("provider", "tenant")
        .prefetch_related(*review_evidence(tenant_ids))
    )
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if provider:
        # The slug resolved to the readers' providers first, by their unique (tenant, slug)
        # index, as the operations API does: joined on the slug, PostgreSQL walked every review
        # item looking for a provider that does not exist (130 ms p50 at ten million rows,
        # bench/results/scale-10M.md). A slug that names none of them: no rows, no scan.
        named = Provider.objects.filter(slug=provider)
        if tenant_ids is not None:
            named = named.filter(tenant_id__in=tenant_ids)
        provider_ids = list(named.values_list("pk", flat=True))
        if not provider_ids:
            return rows.none()
        rows = rows.filter(provider_id__in=provider_ids)
    if older_than_seconds is not None:
        rows = rows.filter(updated_at__lt=timezone.now() - timedelta(seconds=older_than_seconds))
    if search:
        # The console's search (substring of key, handle, execution and correlation ids;
        # provider ref by prefix), every arm indexed on PostgreSQL.
        rows = operation_search(rows, search, tenant_ids=tenant_ids)
    return rows.order_by("updated_at", "id")


def review_evidence(tenant_ids: list[int] | None) -> list[Prefetch]:
    """The prefetches of a review item's attempts and events, limited to ``tenant_ids``."""
    attempts, events = Attempt.objects.all(), OperationEvent.objects.all()
    if tenant_ids is not None:
        attempts, events = attempts.filter(tenant_id__in=tenant_ids), events.filter(tenant_id__in=tenant_ids)
    return [Prefetch("attempt_set", queryset=attempts), Prefetch("events", queryset=events)]
