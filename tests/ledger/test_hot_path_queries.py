"""The hot path costs what it cost before the moves were gathered in ledger.protocol.transitions: a
fresh claim, its sent marker and its completion, counted statement by statement (inside the
test's transaction, so each atomic block is a savepoint pair)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.protocol import transitions

pytestmark = pytest.mark.django_db

# Measured on the code before ledger.protocol.transitions existed (claim, mark sent, complete):
# PostgreSQL runs claim and complete as one statement each (operation_claim_pg,
# operation_complete_pg) plus the planner settings around the atomic blocks; SQLite runs the
# portable statements one by one — and, since the search rows (ADR 0018), one more for the
# claim's search row and one for the provider reference the completion brings (PostgreSQL
# writes both inside the claim's and the completion's one statement).
MOST = {"postgresql": (2, 7, 5), "sqlite": (7, 5, 6)}


def test_a_claim_its_sent_marker_and_its_completion_take_no_more_statements_than_before(tenant, provider):
    with CaptureQueriesContext(connection) as claim:
        op = transitions.operation_claim(
            tenant=tenant, key="hot-1", provider=provider, action="charge", request={"amount": 1}
        ).operation
    with CaptureQueriesContext(connection) as sent:
        transitions.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    with CaptureQueriesContext(connection) as done:
        transitions.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
        )

    counts = (len(claim), len(sent), len(done))
    most = MOST[connection.vendor]
    assert all(n <= m for n, m in zip(counts, most, strict=True)), (counts, most)
