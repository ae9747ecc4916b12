"""Eligibility rechecks (issue 13 item 2): a retry older than its provider's recheck_after
first asks the tenant's eligibility webhook (a real loopback receiver) — "no" abandons it with
the answer as reason, "yes" lets it go ahead, no answer keeps it waiting and visible."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationEvent, OperationStatus, Provider, Tenant
from ledger.protocol import callbacks
from ledger.protocol.services import tenant_update
from ledger.providers import adapters
from ledger.recovery.eligibility import eligibility_recheck
from ledger.store import sql
from relay.testing import RunningServer
from tests.dlq.sinks import Sink
from tests.execute.conftest import configure_provider
from tests.execute.support import make_due, run_due

S = OperationStatus
pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[Sink]:
    sink = Sink().start()
    yield sink
    sink.stop()


@pytest.fixture
def rechecked(tenant: Tenant, mock_enforced: RunningServer, receiver: Sink) -> tuple[Provider, RunningServer]:
    tenant_update(tenant_id=tenant.pk, actor="test", eligibility_url=f"{receiver.url}/still-wanted")
    provider = configure_provider(tenant, mock_enforced, slug="charges", enforced=True, recheck_after=60)
    return provider, mock_enforced


def waiting_retry(tenant: Tenant, mock: RunningServer, *, age_seconds: float = 120) -> Operation:
    """An operation whose first attempt failed before any effect (HTTP 408), created
    ``age_seconds`` ago on the database's clock, its retry due now."""
    mock.script([{"status": 408}])
    op = operation_submit(
        tenant=tenant,
        key="order-1001:charge:v3",
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": 1200}},
        payload={"email": "jane@example.com"},
    ).operation
    [recorded] = run_due()
    assert recorded.status == S.RETRY_WAIT
    past, params = sql.now_plus(-age_seconds)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET created_at = {past} WHERE id = %s", [*params, op.pk])
    make_due(op.pk)
    return Operation.objects.get(pk=op.pk)


def test_an_old_retry_is_not_sent_and_a_no_abandons_it_with_the_answer_as_reason(tenant, rechecked, receiver):
    _, mock = rechecked
    op = waiting_retry(tenant, mock)
    receiver.answer_body = b'{"wanted": false, "reason": "order 1001 was refunded"}'

    assert run_due() == []  # the workers do not take it: the tenant is asked first
    counts = eligibility_recheck()

    assert counts == {"abandoned": 1}
    op.refresh_from_db()
    assert op.status == S.ABANDONED and op.next_attempt_at is None
    event = OperationEvent.objects.filter(operation=op, to_status=S.ABANDONED).get()
    assert event.actor == "eligibility" and "order 1001 was refunded" in event.reason
    assert mock.effects()["count"] == 0
    # The question was signed like a callback, named the operation, and carried no payload.
    [question] = receiver.received()
    assert question.path == "/still-wanted" and question.header("Idempotency-Key") == op.key
    secret = callbacks.tenant_callback_secret(tenant_id=tenant.pk)
    assert adapters.verify_signature(secret=secret, body=question.body, header=question.header("Onceguard-Signature"))
    assert question.json()["operation"]["id"] == op.pk
    assert "jane@example.com" not in question.body.decode()


def test_a_yes_lets_the_retry_go_ahead_once(tenant, rechecked, receiver):
    _, mock = rechecked
    op = waiting_retry(tenant, mock)
    receiver.answer_body = b'{"wanted": true}'

    assert eligibility_recheck() == {"confirmed": 1}
    [sent] = run_due()

    assert sent.status == S.SUCCEEDED
    assert mock.effects()["count"] == 1
    assert Operation.objects.get(pk=op.pk).eligibility_confirmed_at is not None


def test_no_answer_keeps_it_waiting_and_visible(tenant, rechecked, receiver):
    _, mock = rechecked
    op = waiting_retry(tenant, mock)
    receiver.mode, receiver.status = "status", 503

    assert eligibility_recheck() == {"unanswered": 1}

    op.refresh_from_db()
    assert op.status == S.RETRY_WAIT
    assert "eligibility unanswered" in op.last_error and "HTTP 503" in op.last_error
    make_due(op.pk)
    assert run_due() == [] and mock.effects()["count"] == 0  # still not sent without an answer


def test_a_young_retry_does_not_ask(tenant, rechecked, receiver):
    _, mock = rechecked
    waiting_retry(tenant, mock, age_seconds=0)

    [sent] = run_due()

    assert sent.status == S.SUCCEEDED and receiver.received() == []


def test_a_guard_mode_claim_of_an_old_retry_waits_for_the_answer(tenant, rechecked, make_client):
    api = make_client(tenant)
    body = {"key": "lead-9:crm:v1", "provider": "charges", "action": "create", "request": {"n": 1}}
    created = api.post("/api/v1/claims", body, format="json").json()
    api.post(
        f"/api/v1/operations/{created['id']}/fail",
        {"lease_token": created["lease_token"], "error_class": "transient"},
        format="json",
    )
    past, params = sql.now_plus(-120)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET created_at = {past} WHERE id = %s", [*params, created["id"]])
    make_due(created["id"])

    again = api.post("/api/v1/claims", body, format="json")

    assert again.status_code == 409 and again.json()["code"] == "operation_retry_scheduled"
    assert again.json()["waiting_for"] == "eligibility"
