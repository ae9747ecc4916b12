"""The operations list renders a 500-row page in a fraction of the time it took (issue 16):
it reads only the columns it shows and renders UTC times without a time-zone lookup per
value — with the same answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers

from ledger.protocol import services
from ledger.protocol.representation import UtcDateTimeField


@pytest.mark.parametrize(
    "value",
    [
        None,
        datetime(2026, 12, 2, 6, 0, tzinfo=UTC),
        datetime(2026, 12, 2, 6, 0, 1, 250, tzinfo=UTC),
        datetime(2026, 12, 2, 8, 0, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 12, 2, 6, 0),
    ],
)
def test_utc_times_render_exactly_as_drfs_datetime_field(value, settings):
    settings.USE_TZ = value is None or value.tzinfo is not None
    drf = serializers.DateTimeField(allow_null=True)
    ours = UtcDateTimeField(allow_null=True)
    expected = drf.to_representation(value) if value else None
    assert (ours.to_representation(value) if value else None) == expected


@pytest.mark.django_db
def test_the_operations_list_reads_only_what_it_renders(tenant, provider, api):
    op = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge", payload={"a": 1})
    services.operation_complete(
        operation_id=op.operation.pk,
        tenant_id=op.operation.tenant_id,
        lease_token=op.operation.lease_token,
        provider_ref="r",
    )
    with CaptureQueriesContext(connection) as ctx:
        body = api.get("/api/v1/operations?page_size=500").json()
    listing = [q["sql"] for q in ctx.captured_queries if 'FROM "ledger_operation"' in q["sql"]]
    assert len(listing) == 1, listing
    for column in ("payload", "request", "fingerprint", "search_fields"):
        assert f'"ledger_operation"."{column}"' not in listing[0]
    assert "ledger_provider" not in listing[0]  # the slug comes from the per-process cache
    (row,) = body["results"]
    assert row["provider"] == provider.slug and row["key"] == "k-1" and row["updated_at"].endswith("Z")
    assert row["response"] == {"status": 200, "body": None, "masked": True}


@pytest.mark.django_db
def test_a_list_of_operations_renders_each_row_as_drfs_serializer_does(tenant, provider):
    from ledger.models import Operation
    from ledger.protocol.representation import (
        OperationOutputSerializer,
        PlannedListSerializer,
        ReplayedOperationOutputSerializer,
    )

    done = services.operation_claim(tenant=tenant, key="k-1", provider=provider, action="charge", payload={"a": 1})
    services.operation_complete(
        operation_id=done.operation.pk,
        tenant_id=done.operation.tenant_id,
        lease_token=done.operation.lease_token,
        provider_ref="ch_1",
        response_body={"id": "ch_1", "card": "4242"},
    )
    failed = services.operation_claim(tenant=tenant, key="k-2", provider=provider, action="charge")
    services.operation_fail(
        operation_id=failed.operation.pk,
        tenant_id=failed.operation.tenant_id,
        lease_token=failed.operation.lease_token,
        error_class="invalid_input",
        message="no",
    )
    services.operation_claim(tenant=tenant, key="k-3", provider=provider, action="charge", correlation_id="run-9")
    rows = list(Operation.objects.order_by("id"))
    for child in (OperationOutputSerializer, ReplayedOperationOutputSerializer):
        planned = child(rows, many=True)
        assert isinstance(planned, PlannedListSerializer)
        drf = serializers.ListSerializer(rows, child=child())
        assert planned.data == drf.data
        assert [list(row) for row in planned.data] == [list(row) for row in drf.data]  # same keys, same order


@pytest.mark.django_db
def test_one_operation_renders_by_plan_exactly_as_a_fresh_serializer(tenant, provider):
    from ledger.models import Operation
    from ledger.protocol.representation import (
        ClaimOutputSerializer,
        OperationOutputSerializer,
        ReplayedOperationOutputSerializer,
        operation_represented,
    )

    claimed = services.operation_claim(
        tenant=tenant, key="one-1", provider=provider, action="charge", request={"a": 1}, run="run-1", step=2
    ).operation
    done = services.operation_claim(tenant=tenant, key="one-2", provider=provider, action="charge").operation
    services.operation_complete(
        operation_id=done.pk,
        tenant_id=done.tenant_id,
        lease_token=done.lease_token,
        provider_ref="ch_1",
        response_body={"id": "ch_1", "amount": 1},
    )
    failed = services.operation_claim(tenant=tenant, key="one-3", provider=None, action="x").operation
    services.operation_fail(
        operation_id=failed.pk, tenant_id=failed.tenant_id, lease_token=failed.lease_token, error_class="invalid_input"
    )
    for op in [claimed, *Operation.objects.filter(key__in=["one-2", "one-3"])]:
        for serializer in (OperationOutputSerializer, ReplayedOperationOutputSerializer, ClaimOutputSerializer):
            expected = dict(serializer(op).data)
            rendered = operation_represented(serializer, op)
            assert rendered == expected and list(rendered) == list(expected), (serializer.__name__, op.key)
