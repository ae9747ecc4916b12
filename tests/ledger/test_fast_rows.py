"""ledger.store.fast_rows loads exactly what ``Manager.raw`` loads: every field's value and type,
the instance's state, nothing more — for every statement of the ledger that returns
operations, on PostgreSQL (elsewhere ``Manager.raw`` itself is used)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from ledger.models import ErrorClass, Operation, OperationMode, OperationStatus
from ledger.protocol import services
from ledger.store import fast_rows, statements
from tests.conftest import on_postgres
from tests.ledger.support import make_retry_due

S = OperationStatus
pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not on_postgres(), reason="fast_rows serves PostgreSQL; SQLite uses Manager.raw"),
]


def _as_raw_loads(op: Operation) -> None:
    """``op`` equals the row as ``Operation.objects.raw`` loads it now, field by field."""
    raw = list(Operation.objects.raw("SELECT * FROM ledger_operation WHERE id = %s", [op.pk]))[0]
    for field in Operation._meta.concrete_fields:
        mine, theirs = getattr(op, field.attname), getattr(raw, field.attname)
        assert mine == theirs and type(mine) is type(theirs), field.name
    assert (op._state.adding, op._state.db) == (raw._state.adding, raw._state.db) == (False, "default")
    assert set(vars(op)) == set(vars(raw))


def test_every_statement_that_returns_operations_loads_them_as_manager_raw_does(tenant, provider, monkeypatch):
    loaded: dict[str, list[Operation]] = {}
    run = statements.operations

    def recording(name: str, params: dict[str, Any]) -> list[Operation]:
        rows = run(name, params)
        loaded.setdefault(name, []).extend(rows)
        # What the statement returned is the row as it now is, in this transaction.
        for op in rows:
            _as_raw_loads(op)
        return rows

    monkeypatch.setattr(statements, "operations", recording)

    def claim(key: str, **kwargs: Any) -> Operation:
        return services.operation_claim(
            tenant=tenant, key=key, provider=provider, action="charge", request={"amount": 1}, **kwargs
        ).operation

    # JSON of every shape (object, scalar string, null), a run, a version, a deadline.
    first = claim("fr-1", payload={"order": "A-1", "n": [1, 2.5, None]}, run="run-1", step=3, deadline_seconds=60)
    services.operation_mark_sent(
        operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, reconciliation_handle="h-1"
    )
    services.operation_heartbeat(
        operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, lease_seconds=45
    )
    services.operation_complete(
        operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token, response_body="plain text"
    )
    claim("fr-1")  # a replay: operation_by_key
    second = claim("fr-2", payload="just a string")
    services.operation_fail(
        operation_id=second.pk,
        tenant_id=second.tenant_id,
        lease_token=second.lease_token,
        error_class=ErrorClass.TRANSIENT,
    )
    make_retry_due(second.pk)
    again = claim("fr-2", payload="just a string")  # operation_reclaim
    services.operation_fail(
        operation_id=again.pk,
        tenant_id=again.tenant_id,
        lease_token=again.lease_token,
        error_class=ErrorClass.PERMISSION,
        response_status=403,
    )
    queued = claim("inv-9:charge:v2", mode=OperationMode.EXECUTE, via_claims=False, record="inv-9", version=2)
    taken = services.operation_take(
        operation_id=queued.pk,
        tenant_id=queued.tenant_id,
        from_status=S.QUEUED,
        lease_seconds=30,
        past_deadline=False,
        actor="worker",
    )
    assert taken is not None
    services.operation_complete(
        operation_id=taken.pk, tenant_id=taken.tenant_id, lease_token=taken.lease_token, response_body=None
    )

    assert {"operation_claim_pg", "operation_by_key", "operation_mark_sent", "operation_heartbeat"} <= set(loaded)
    assert {"operation_complete_pg", "operation_reclaim", "operation_take"} <= set(loaded)
    rows = [op for ops in loaded.values() for op in ops]
    assert any(isinstance(op.cost, Decimal) for op in rows)


def test_the_same_statement_loads_the_same_operation_both_ways(tenant, provider, monkeypatch):
    op = services.operation_claim(
        tenant=tenant, key="fr-same", provider=provider, action="a", request=None, payload={"x": "y"}
    ).operation
    params = {"tenant_id": tenant.pk, "key": "fr-same"}
    fast = statements.operation("operation_by_key", params)
    monkeypatch.setattr(statements, "FAST_ROWS", False)
    framework = statements.operation("operation_by_key", params)
    assert fast is not None and framework is not None and fast.pk == op.pk
    for field in Operation._meta.concrete_fields:
        assert getattr(fast, field.attname) == getattr(framework, field.attname), field.name
        assert type(getattr(fast, field.attname)) is type(getattr(framework, field.attname)), field.name
    assert set(vars(fast)) == set(vars(framework))


def test_rows_that_are_not_whole_operations_are_refused(tenant, provider):
    services.operation_claim(tenant=tenant, key="fr-part", provider=provider, action="a", request=None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, key FROM ledger_operation WHERE key = %s", ["fr-part"])
        with pytest.raises(ValueError, match="not the columns of an operation row"):
            fast_rows.operations_from(cursor)
        cursor.execute("SELECT * FROM ledger_operation WHERE key = %s", ["no-such-key"])
        assert fast_rows.operations_from(cursor) == []
