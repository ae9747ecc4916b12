"""One bad row never stops a retention purge (ledger.platform.passes): a batch that raises is retried
row by row, the row that still raises stays for a later run — counted, and recorded on the
run, which ends partial — and the rest of the batch, the other record types and the other
tenants are purged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from ledger.models import Operation, Tombstone
from review.models import RetentionPolicy
from review.retention import purge as retention
from tests.console.support import enforced_provider, succeeded_op

pytestmark = pytest.mark.django_db(transaction=True)


def failures(job: str) -> float:
    return REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": job}) or 0.0


def old_op(tenant: Any, provider: Any, key: str) -> Operation:
    op = succeeded_op(tenant, provider, key)
    when = timezone.now() - timedelta(days=400)
    Operation.objects.filter(pk=op.pk).update(created_at=when, updated_at=when, done_at=when)
    return op


def test_a_row_that_raises_is_left_for_a_later_run_and_the_others_are_purged(tenant, other_tenant, monkeypatch):
    for owner in (tenant, other_tenant):
        RetentionPolicy.objects.create(tenant=owner, record_type="operations", record_ttl=timedelta(days=365))
    crm, other_crm = enforced_provider(tenant), enforced_provider(other_tenant)
    poisoned, fine = old_op(tenant, crm, "poisoned"), old_op(tenant, crm, "fine")
    elsewhere = old_op(other_tenant, other_crm, "elsewhere")
    real = retention.tombstones_create

    def tombstones_create(*, plain_ids: list[int], superseded_ids: list[int], deleted_at: Any) -> int:
        if poisoned.pk in plain_ids:
            raise RuntimeError("a row retention cannot handle")
        return real(plain_ids=plain_ids, superseded_ids=superseded_ids, deleted_at=deleted_at)

    monkeypatch.setattr(retention, "tombstones_create", tombstones_create)
    before = failures("retention_purge")

    runs = {run.tenant_id: run for run in retention.retention_purge(trigger="test")}

    assert Operation.objects.filter(pk=poisoned.pk).exists()
    assert not Operation.objects.filter(pk__in=[fine.pk, elsewhere.pk]).exists()
    assert set(Tombstone.objects.values_list("key", flat=True)) == {"fine", "elsewhere"}
    mine = runs[tenant.pk]
    assert mine.status == "partial" and mine.deleted == 1 and mine.tombstones_created == 1
    assert "RuntimeError" in mine.error
    assert runs[other_tenant.pk].status == "done"
    assert failures("retention_purge") == before + 1
