"""Reads shared by the API and the console."""

from __future__ import annotations

from django.db.models import QuerySet

from ledger.errors import OperationNotFound
from ledger.models import Operation, Provider, Tenant


def operation_list(*, tenant: Tenant) -> QuerySet[Operation]:
    return Operation.objects.filter(tenant=tenant).select_related("provider")


def operation_get(*, tenant: Tenant, operation_id: int) -> Operation:
    op = Operation.objects.filter(tenant=tenant, pk=operation_id).select_related("provider").first()
    if op is None:
        raise OperationNotFound("No such operation.")
    return op


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
