"""The ledger's named statements (ledger/queries.sql, run by ledger.statements) behave like
Django's own cursor and ORM: rows are real model instances, statements join the caller's
transaction, raise Django's errors and are seen by query observers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError

from ledger import crypto, services, statements
from ledger.models import Operation, OperationStatus, Provider, Tenant
from tests.ledger.support import events_of, ledger_counts

S = OperationStatus
pytestmark = pytest.mark.django_db


def _claim(tenant: Tenant, provider: Provider, key: str, **kwargs: Any) -> Operation:
    result = services.operation_claim(
        tenant=tenant, key=key, provider=provider, action="charge", request={"amount": 1}, **kwargs
    )
    assert result.acquired
    return result.operation


def test_rows_returned_by_the_statements_equal_what_the_orm_loads(tenant, provider):
    op = _claim(tenant, provider, "hot-1", payload={"order_id": "A-1"})
    done = services.operation_complete(
        operation_id=op.pk, lease_token=op.lease_token, provider_ref="ch_1", response_body={"ok": True}
    )
    loaded = Operation.objects.get(pk=op.pk)
    for row in (op, done):
        assert row._state.adding is False and row._state.db == "default"
    for field in Operation._meta.concrete_fields:
        assert getattr(done, field.attname) == getattr(loaded, field.attname), field.name
    # Relations and methods work as on an ORM instance.
    assert done.tenant == tenant and done.provider == provider
    assert done.is_terminal and str(done) == "hot-1"
    done.refresh_from_db()
    assert done.status == S.SUCCEEDED


def test_a_claim_inside_an_atomic_block_is_rolled_back_with_it(tenant, provider):
    before = ledger_counts()
    with transaction.atomic():
        _claim(tenant, provider, "hot-rolled-back")
        assert Operation.objects.filter(key="hot-rolled-back").exists()
        transaction.set_rollback(True)
    assert ledger_counts() == before
    # And the key is free again.
    assert _claim(tenant, provider, "hot-rolled-back").attempts == 1


def test_database_errors_are_djangos(tenant):
    with pytest.raises(IntegrityError), transaction.atomic():
        statements.execute(
            "event_insert",
            {"operation_id": None, "from_status": "", "to_status": "claimed", "actor": "t", "reason": "", "attempt": 1},
        )


def test_a_broken_transaction_is_refused_before_the_statement_like_djangos_cursor(tenant, provider):
    with transaction.atomic():
        connection.needs_rollback = True  # what an error swallowed inside the block leaves
        with pytest.raises(TransactionManagementError):
            _claim(tenant, provider, "hot-after-error")


def test_an_observer_sees_the_ledger_statements(tenant, provider):
    seen: list[str] = []

    def wrapper(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(statement)
        return execute(statement, params, many, context)

    with connection.execute_wrapper(wrapper):
        op = _claim(tenant, provider, "hot-observed")
        services.operation_complete(operation_id=op.pk, lease_token=op.lease_token, response_body={})
    assert any("ledger_operation" in s and "INSERT" in s for s in seen)
    assert any("UPDATE ledger_operation" in s for s in seen)


def test_a_completion_from_uncertain_still_records_the_move_it_made(tenant, provider):
    op = _claim(tenant, provider, "hot-uncertain")
    services.operation_transition(operation=op, to=S.UNCERTAIN, actor="sweeper", reason="lease expired")
    done = services.operation_complete(operation_id=op.pk, lease_token=op.lease_token, response_body={"late": 1})
    assert done.status == S.SUCCEEDED
    assert [(e[0], e[1]) for e in events_of(op.pk)][-2:] == [("claimed", "uncertain"), ("uncertain", "succeeded")]


@pytest.mark.parametrize("encrypt", [True, False])
def test_json_scalars_round_trip_through_the_statements(tenant, provider, settings, encrypt):
    settings.ONCEGUARD_PRIVACY = {**getattr(settings, "ONCEGUARD_PRIVACY", {}), "ENCRYPT": encrypt}
    op = _claim(tenant, provider, f"hot-scalar-{encrypt}", payload="just text")
    done = services.operation_complete(operation_id=op.pk, lease_token=op.lease_token, response_body="plain")
    replayed = services.operation_claim(
        tenant=tenant, key=f"hot-scalar-{encrypt}", provider=provider, action="charge", request={"amount": 1}
    )
    for row in (done, replayed.operation, Operation.objects.get(pk=op.pk)):
        assert crypto.open_json(row.response_body) == "plain"
        assert crypto.open_json(row.payload) == "just text"


def test_every_statement_is_loaded_with_declared_literals_only():
    text = statements.QUERIES.read_text(encoding="utf-8")
    for vendor in ("postgresql", "sqlite"):
        parsed = statements.parse(text, vendor=vendor)
        assert {"operation_insert", "operation_complete", "operation_fail", "event_insert"} <= set(parsed)
        for sql in parsed.values():
            assert "{" not in sql and "ledger_now_plus" not in sql
    with pytest.raises(ValueError, match="not a declared state"):
        statements.parse("-- name: bad --\nUPDATE ledger_operation SET status = {finished}", vendor="sqlite")


def test_every_named_statement_is_used_by_the_ledger():
    source = "".join(p.read_text() for p in Path(statements.__file__).parent.glob("*.py"))
    parsed = statements.parse(statements.QUERIES.read_text(encoding="utf-8"), vendor="sqlite")
    unused = [name for name in parsed if f'"{name}"' not in source]
    assert unused == []


def test_every_hot_transition_writes_its_event_in_the_same_transaction(tenant, provider):
    op = _claim(tenant, provider, "stmt-events")
    services.operation_mark_sent(operation_id=op.pk, lease_token=op.lease_token)
    with transaction.atomic():
        services.operation_complete(operation_id=op.pk, lease_token=op.lease_token, response_body={})
        transaction.set_rollback(True)
    # Rolled back together: the row is still claimed and its last event is the sent marker.
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert [(e[0], e[1]) for e in events_of(op.pk)] == [("", "claimed"), ("claimed", "claimed")]
