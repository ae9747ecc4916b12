import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dlq.entries import selectors
from dlq.models import FailedEvent
from ledger.protocol import approvals
from tests.console.support import enforced_provider, failed_op

pytestmark = pytest.mark.django_db


def test_measure(db):
    from ledger.protocol import services as s

    tenant = s.tenant_create(slug="acme")
    failed = failed_op(tenant, enforced_provider(tenant), "pay-9:charge:v1", payload={"amount": 12})
    event = FailedEvent.objects.get(operation=failed)

    def gate():
        ids = selectors.entry_provider_ids(tenant_id=tenant.pk, event_pks=[event.pk])
        approvals.approval_guard(tenant_id=tenant.pk, provider_id=None, provider_ids=ids)

    with CaptureQueriesContext(connection) as q:
        gate()
    n = 2000
    for _ in range(100):
        gate()
    t = time.perf_counter()
    for _ in range(n):
        gate()
    per = (time.perf_counter() - t) / n * 1e6
    print(f"\nMEASURE vendor={connection.vendor} queries={len(q.captured_queries)} us_per_gate={per:.0f}")
    for x in q.captured_queries:
        print("  ", x["sql"][:200])
