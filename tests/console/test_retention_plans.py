"""The purge's operation batches read a tenant's rows on an index in their own order.

No index leads with ``updated_at`` since the open-rows mirror (ADR 0017): a batch read in
``(updated_at, id)`` order read and sorted every row of the tenant, each batch (0.5–1.2 s for a
111,000-row tenant at 10M, the big tenant's 9M rows each batch). In the tenant's id order
(``op_tenant_id_idx``) a batch stops at its last match, and no Sort sits above the scan.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.models import Operation
from review.models import RetentionPolicy
from review.retention.purge import retention_purge_tenant
from tests.conftest import on_postgres
from tests.console.support import enforced_provider, succeeded_op
from tests.support.plans import captured_statements, explain

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not on_postgres(), reason="PostgreSQL's planner"),
]


@pytest.mark.parametrize("ttl", ["record_ttl", "payload_ttl"])
def test_purge_batches_of_operations_are_read_in_the_tenants_id_order_without_a_sort(tenant: Any, ttl: str) -> None:
    crm = enforced_provider(tenant)
    ops = [succeeded_op(tenant, crm, f"old-{i}", payload={"n": i}) for i in range(3)]
    past = timezone.now() - timedelta(days=400)
    Operation.objects.filter(pk__in=[op.pk for op in ops]).update(created_at=past, updated_at=past, done_at=past)
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", **{ttl: timedelta(days=30)})

    with captured_statements() as seen:
        retention_purge_tenant(tenant_id=tenant.pk, batch_size=2, max_batches=10, trigger="test")

    reads = [
        s
        for s in seen
        if 'FROM "ledger_operation" WHERE' in s.sql
        and "ORDER BY" in s.sql
        and "LIMIT" in s.sql
        and "FOR UPDATE" not in s.sql
    ]
    assert len(reads) == 2, [s.sql for s in seen]  # a full batch of 2, then the last one
    for read in reads:
        with transaction.atomic():
            plan = explain(read.sql, read.params, plan="custom", enable_seqscan="off")
        assert "op_tenant_id_idx" in plan and "Sort" not in plan, plan
