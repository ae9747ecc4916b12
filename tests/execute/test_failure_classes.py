"""End to end against real loopback providers: each outcome of DESIGN §3's failure-class
table, what it does to the operation, its attempt and its provider."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.db import connection

from dlq.models import FailedEvent
from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, AttemptOutcome, Operation, OperationStatus, Provider
from ledger.platform import hooks
from ledger.platform.crypto import open_json
from ledger.protocol import services
from ledger.protocol.services import provider_resume
from ledger.providers import adapters
from ledger.recovery.sweeper import reconcile_uncertain, sweep
from ledger.store import sql
from tests.execute.conftest import configure_provider
from tests.execute.support import make_due, run_due, unthrottle, wait_until
from tests.support.holds import HoldsUntilOpened

S = OperationStatus


def submit(tenant, key, provider="charges", amount=1000, **kwargs):
    return operation_submit(
        tenant=tenant,
        key=key,
        provider=provider,
        request={"method": "POST", "path": "/charges", "body": {"amount": amount}},
        **kwargs,
    ).operation


def only_attempt(op_id):
    (attempt,) = Attempt.objects.filter(operation_id=op_id)
    return attempt


def test_success_records_the_ref_from_the_json_pointer_and_one_effect(tenant, enforced):
    _, mock = enforced
    op = submit(tenant, "order-1:charge:v1")
    (done,) = run_due()
    assert done.pk == op.pk and done.status == S.SUCCEEDED
    assert done.provider_ref.startswith("ch_") and done.response_status == 201
    assert open_json(done.response_body)["status"] == "succeeded"
    attempt = only_attempt(op.pk)
    assert attempt.outcome == AttemptOutcome.SUCCEEDED and attempt.sent_at is not None
    assert mock.effects()["by_key"] == {"order-1:charge:v1": 1}


def test_a_2xx_without_a_usable_ref_is_ambiguous_and_reconciled_not_guessed(tenant, enforced):
    _, mock = enforced
    mock.script([{"status": 201, "body": {"id": None}}])
    op = submit(tenant, "k-noref")
    (row,) = run_due()
    assert row.status == S.UNCERTAIN and row.error_class == "ambiguous"
    assert only_attempt(op.pk).outcome == AttemptOutcome.AMBIGUOUS
    # The sweeper looks it up by key and finds the object the provider did create.
    reconcile_uncertain()
    row = Operation.objects.get(pk=op.pk)
    assert row.status == S.SUCCEEDED and row.provider_ref.startswith("ch_")
    assert mock.effects()["count"] == 1


@pytest.mark.parametrize("step", [{"status": 400}, {"status": 404}, {"status": 422}, {"outcome": "failed"}])
def test_invalid_input_fails_with_a_dlq_entry_and_no_retry(tenant, enforced, step):
    _, mock = enforced
    mock.script([step])
    op = submit(tenant, "k-invalid")
    (row,) = run_due()
    assert row.status == S.FAILED and row.error_class == "invalid_input"
    assert row.done_at is not None and row.last_error.startswith("HTTP 4")
    assert FailedEvent.objects.filter(operation_id=op.pk, original_key="k-invalid").exists()
    assert run_due() == [] and only_attempt(op.pk).outcome == AttemptOutcome.FAILED


def test_an_invalid_output_recorded_by_the_holder_is_final_not_retried(tenant, enforced):
    # Fetching the same wrong output again would fail the same way: like invalid_input, the
    # class is final at once (ledger.models.NO_RETRY_ERROR_CLASSES).
    op = submit(tenant, "k-invalid-output")
    (taken,) = operations_take(limit=1)
    row = services.operation_fail(
        operation_id=taken.pk,
        tenant_id=taken.tenant_id,
        lease_token=taken.lease_token,
        error_class="invalid_output",
        message="wrong size",
    )
    assert row.status == S.FAILED and row.error_class == "invalid_output" and row.next_attempt_at is None
    assert only_attempt(op.pk).outcome == AttemptOutcome.FAILED
    assert FailedEvent.objects.filter(operation_id=op.pk).exists()


@pytest.mark.parametrize("status", [401, 403])
def test_permission_fails_pauses_the_provider_and_alerts(tenant, enforced, status):
    provider, mock = enforced
    alerts = []
    mock.script([{"status": status}])
    first = submit(tenant, "k-perm-1")
    second = submit(tenant, "k-perm-2")
    with hooks.alert_raised.replaced(lambda **kw: alerts.append(kw)):
        rows = run_due(limit=1)
    assert [r.status for r in rows] == [S.FAILED] and rows[0].error_class == "permission"
    provider.refresh_from_db()
    assert provider.paused_at is not None and f"HTTP {status}" in provider.paused_reason
    assert [a["kind"] for a in alerts] == ["provider_paused"] and alerts[0]["ref"] == "charges"
    # Workers skip a paused provider: the other operation waits, it is not failed too.
    assert run_due() == []
    assert Operation.objects.get(pk=second.pk).status == S.QUEUED
    assert provider_resume(provider_id=provider.pk, actor="operator:test")
    (row,) = run_due()
    assert row.pk == second.pk and row.status == S.SUCCEEDED
    assert Operation.objects.get(pk=first.pk).status == S.FAILED


def test_key_in_use_409_from_a_key_enforced_provider_is_transient(tenant, enforced):
    _, mock = enforced
    mock.script([{"status": 409, "retry_after": 1}])
    op = submit(tenant, "k-409")
    (row,) = run_due()
    assert row.status == S.RETRY_WAIT and row.error_class == "transient"
    assert only_attempt(op.pk).outcome == AttemptOutcome.TRANSIENT


def test_409_from_a_key_advisory_provider_is_invalid_input(tenant, advisory):
    _, mock = advisory
    mock.script([{"status": 409}])
    submit(tenant, "k-409-adv", provider="webhook")
    (row,) = run_due()
    assert row.status == S.FAILED and row.error_class == "invalid_input"


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_sets_throttled_until_from_retry_after_and_consumes_no_attempt(tenant, enforced, status):
    provider, mock = enforced
    provider.max_attempts = 1
    provider.save()
    # More throttled answers than max_attempts allows: none of them may count.
    # Retry-After 60 s: the throttle must still hold when the provider's other work is offered
    # below (1 s ran out first on a loaded machine); the loop lifts it by hand.
    mock.script([{"status": status, "retry_after": 60}] * 4)
    op = submit(tenant, "k-throttled")
    before = sql.db_now()
    (row,) = run_due(limit=1)
    after = sql.db_now()
    assert row.status == S.RETRY_WAIT and row.throttled_attempts == 1 and row.attempts == 1
    provider.refresh_from_db()
    assert provider.throttled_until is not None
    # Retry-After from the answer, which came between `before` and `after` on the database's
    # clock (was: at most 2 s after `before`, which a busy machine overran).
    assert provider.throttled_until - before >= timedelta(seconds=59.9)
    assert provider.throttled_until - after <= timedelta(seconds=61)
    assert row.next_attempt_at - before >= timedelta(seconds=59.9)
    # The provider's other work is not taken while it is throttled.
    other = submit(tenant, "k-waits-behind-throttle")
    assert run_due() == [] and Operation.objects.get(pk=other.pk).status == S.QUEUED
    for _ in range(5):
        unthrottle(provider.pk)
        for pk in (op.pk, other.pk):
            if Operation.objects.get(pk=pk).status == S.RETRY_WAIT:
                make_due(pk)
        run_due()
    op, other = Operation.objects.get(pk=op.pk), Operation.objects.get(pk=other.pk)
    assert op.status == S.SUCCEEDED and other.status == S.SUCCEEDED
    assert op.throttled_attempts + other.throttled_attempts == 4
    assert op.throttled_attempts >= 2  # more than max_attempts, still not failed
    assert op.attempts - op.throttled_attempts == 1 and other.attempts - other.throttled_attempts == 1
    assert mock.effects()["count"] == 2


def test_a_500_after_commit_is_ambiguous_then_found_by_lookup_exactly_once(tenant, enforced):
    _, mock = enforced
    mock.script([{"status": 500, "commit": True}])
    op = submit(tenant, "k-500")
    (row,) = run_due()
    assert row.status == S.UNCERTAIN and row.error_class == "ambiguous"
    reconcile_uncertain()
    row = Operation.objects.get(pk=op.pk)
    assert row.status == S.SUCCEEDED and row.provider_ref.startswith("ch_")
    assert mock.effects()["by_key"] == {"k-500": 1}


def test_refused_connection_is_transient_before_send(tenant, outbound_allow):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    outbound_allow(f"http://127.0.0.1:{closed_port}")
    configure_provider(tenant, f"http://127.0.0.1:{closed_port}", slug="charges", enforced=True)
    op = submit(tenant, "k-refused")
    (row,) = run_due()
    assert row.status == S.RETRY_WAIT and row.error_class == "transient"
    assert "ConnectError" in row.last_error
    assert only_attempt(op.pk).outcome == AttemptOutcome.TRANSIENT


def test_timeout_after_send_is_ambiguous_and_the_reissue_with_the_same_key_acts_once(tenant, enforced):
    provider, mock = enforced
    provider.timeout_seconds = 0.3
    provider.save()
    mock.script([{"delay": 0.8}])
    # The provider holds its answer until this test lets it go, however long the attempt takes.
    mock.server.stopping = held = HoldsUntilOpened()
    op = submit(tenant, "k-timeout")
    (row,) = run_due()
    assert row.status == S.UNCERTAIN and "Timeout" in row.last_error
    # The attempt's deadline held: it was over while the provider still held its answer (was:
    # the attempt's recorded duration was under 0.9 s).
    assert held.holding == 1 and mock.effects()["by_key"] == {}
    held.open()

    # The sweeper reconciles until the provider's answer settles; a re-issue carries the same
    # key, so the held request and the re-issue make one effect between them.
    def settled() -> bool:
        sweep()
        if Operation.objects.get(pk=op.pk).status == S.RETRY_WAIT:
            run_due()
        return Operation.objects.get(pk=op.pk).status == S.SUCCEEDED

    assert wait_until(settled, timeout=8, interval=0.2)
    assert mock.effects()["by_key"] == {"k-timeout": 1}


def test_backoff_is_exponential_with_full_jitter_and_recorded_on_the_row(tenant, enforced, monkeypatch):
    provider, mock = enforced
    provider.max_attempts = 4
    provider.base_delay_seconds = 0.5
    provider.max_delay_seconds = 1.5
    provider.save()
    # Full jitter draws uniform(0, ceiling): pin the draw to the ceiling to read the ceiling.
    monkeypatch.setattr("ledger.protocol.inputs.random.uniform", lambda low, high: high)
    mock.script([{"status": 408}] * 3)
    op = submit(tenant, "k-backoff")
    delays = []
    for _ in range(3):
        make_due(op.pk)
        (row,) = run_due()
        assert row.status == S.RETRY_WAIT
        # Measured from the row's own record: operation_fail writes updated_at and
        # next_attempt_at in one statement from one reading of the database's clock (was: from
        # the attempt's finished_at, another statement, with a 0.1 s tolerance).
        delays.append((row.next_attempt_at - row.updated_at).total_seconds())
    assert delays[0] == pytest.approx(0.5, abs=1e-3)
    assert delays[1] == pytest.approx(1.0, abs=1e-3)
    assert delays[2] == pytest.approx(1.5, abs=1e-3)  # capped
    make_due(op.pk)
    (row,) = run_due()
    assert row.status == S.SUCCEEDED and row.attempts == 4


def test_jitter_stays_within_zero_and_the_ceiling(tenant, enforced):
    provider, mock = enforced
    provider.base_delay_seconds = 1.0
    provider.max_delay_seconds = 1.0
    provider.save()
    mock.script([{"status": 408}] * 5)
    for i in range(5):
        submit(tenant, f"k-jitter-{i}")
    rows = run_due()
    assert len(rows) == 5
    for row in rows:
        # From the failure's own statement, which sets the due time and updated_at from one
        # reading of the database's clock (was: from the attempt's finished_at, another
        # statement's reading on SQLite, within -0.1..1.1 s).
        assert timedelta(0) <= row.next_attempt_at - row.updated_at <= timedelta(seconds=1)


def test_exhaustion_lands_in_failed_with_a_dlq_entry(tenant, enforced):
    _, mock = enforced
    mock.script([{"status": 408}] * 3)
    op = submit(tenant, "k-exhausted")
    for _ in range(3):
        make_due(op.pk)
        run_due()
    row = Operation.objects.get(pk=op.pk)
    assert row.status == S.FAILED and row.attempts == 3 and "attempts exhausted" in row.events.last().reason
    assert FailedEvent.objects.filter(operation_id=op.pk).count() == 1
    assert mock.effects()["count"] == 0


def test_exhaustion_with_an_unresolved_sent_attempt_goes_to_review_not_failed(tenant, enforced):
    provider, mock = enforced
    provider.lookup_path = ""  # no lookup: the sweeper re-issues with the same key, unresolved
    provider.save()
    mock.script([{"status": 502}, {"status": 408}, {"status": 408}])
    op = submit(tenant, "k-review")
    (row,) = run_due()
    assert row.status == S.UNCERTAIN
    sweep()
    assert Operation.objects.get(pk=op.pk).status == S.RETRY_WAIT
    for _ in range(2):
        make_due(op.pk)
        run_due()
    row = Operation.objects.get(pk=op.pk)
    assert row.status == S.REVIEW, row.events.last().reason
    assert not FailedEvent.objects.filter(operation_id=op.pk).exists()


def test_work_past_its_deadline_expires_instead_of_acting(tenant, enforced):
    _, mock = enforced
    op = submit(tenant, "k-deadline", deadline_seconds=60)
    # A minute passes before any worker gets to it (on the database's clock).
    past, params = sql.now_plus(-1)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET deadline = {past} WHERE id = %s", [*params, op.pk])
    (taken,) = operations_take(limit=5)
    assert taken.sent_at is None  # taken to be failed, never marked sent
    with adapters.http_client() as client:
        row = operation_execute(operation=taken, client=client)
    assert row.status == S.FAILED and "deadline" in row.last_error
    assert mock.effects()["requests"] == 0


def test_a_finished_operation_is_never_taken_again(tenant, enforced):
    _, mock = enforced
    submit(tenant, "k-once")
    run_due()
    for _ in range(3):
        assert run_due() == []
    assert mock.effects()["requests"] == 1
    assert Provider.objects.count() == 1
