"""Reads for the review queue, shared by the API and the console."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from ledger.models import Operation, OperationStatus


def review_item_list(
    *,
    tenant_ids: list[int] | None,
    provider: str = "",
    older_than_seconds: float | None = None,
    search: str = "",
) -> QuerySet[Operation]:
    rows = Operation.objects.filter(status=OperationStatus.REVIEW).select_related("provider", "tenant")
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if provider:
        rows = rows.filter(provider__slug=provider)
    if older_than_seconds is not None:
        rows = rows.filter(updated_at__lt=timezone.now() - timedelta(seconds=older_than_seconds))
    if search:
        # Exact matches only: every one of these columns is indexed.
        rows = rows.filter(
            Q(key=search)
            | Q(reconciliation_handle=search)
            | Q(provider_ref=search)
            | Q(execution_id=search)
            | Q(correlation_id=search)
        )
    return rows.order_by("updated_at", "id")
