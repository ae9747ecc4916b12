"""Real worker processes (``manage.py worker``) against real loopback providers: the
operations table as the queue, exactly-once at a key-enforced provider, crashes."""

from __future__ import annotations

import random
import re

import pytest
from django.db import connection
from django.utils import timezone

from ledger.execution.submission import operation_submit
from ledger.models import Attempt, Operation, OperationStatus
from ledger.platform.errors import DomainError
from ledger.protocol.services import provider_resume, provider_upsert
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.execute.support import child_env, start_worker, statuses, stop_process, wait_until, worker_output

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


def request(i: int) -> dict:
    return {"method": "POST", "path": "/charges", "body": {"amount": 100 + i, "order": f"order-{i}"}}


def submit(tenant, key: str, i: int, provider: str = "charges"):
    return operation_submit(tenant=tenant, key=key, provider=provider, request=request(i))


def taken_by(output: str) -> int:
    match = re.search(r"taken=(\d+)", output)
    return int(match[1]) if match else -1


def test_two_workers_execute_each_key_exactly_once_with_duplicates_and_a_cold_start(tenant, enforced):
    provider, mock = enforced
    on_pg = connection.vendor == "postgresql"
    unique = 400 if on_pg else 60
    duplicates = unique // 4  # 20% of all submissions are repeats of a key
    keys = [f"order-{i}:charge:v1" for i in range(unique)]
    # Crash between commit and execution: everything is committed while no worker runs.
    first_wave = unique * 3 // 4
    for i in range(first_wave):
        submit(tenant, keys[i], i)
    assert statuses() == {S.QUEUED: first_wave}
    # Hold the provider until both workers are up, so both take from the backlog (one
    # starting a second late would otherwise find it drained and prove nothing).
    provider.paused_at = timezone.now()
    provider.save()
    env = child_env(LOG_LEVEL="INFO")
    workers = [start_worker(env=env, concurrency=8) for _ in range(2)]
    outputs: list[str] = []
    try:
        assert wait_until(lambda: all("worker_started" in worker_output(w) for w in workers), timeout=30)
        assert statuses() == {S.QUEUED: first_wave}  # nothing ran before both were up
        provider_resume(provider_id=provider.pk, actor="test")
        rng = random.Random(7)
        answers: dict[str, int] = {}

        def repeat(j: int) -> None:
            try:
                result = submit(tenant, keys[j], j)
                answer = "replayed" if result.replayed else ("still open" if result.still_open else "created")
            except DomainError as refusal:  # never expected: a repeat is answered, not refused
                answer = refusal.code
            answers[answer] = answers.get(answer, 0) + 1

        # The rest arrive while the workers run, mixed with repeats of keys already known.
        for i in range(first_wave, unique):
            submit(tenant, keys[i], i)
            if i % 3 == 0:
                repeat(rng.randrange(0, i + 1))
        while sum(answers.values()) < duplicates:
            repeat(rng.randrange(0, unique))
        assert sum(answers.values()) == duplicates and set(answers) <= {"replayed", "still open"}, answers
        finished = wait_until(lambda: statuses() == {S.SUCCEEDED: unique}, timeout=90, interval=0.25)
    finally:
        outputs = [stop_process(w) for w in workers]
    assert finished, (statuses(), outputs)
    effects = mock.effects()
    # Exactly once per key at the provider, and no second request was even needed.
    assert effects["by_key"] == dict.fromkeys(keys, 1)
    assert effects["count"] == unique and effects["requests"] == unique
    assert Operation.objects.count() == unique  # duplicates created nothing
    # A holder starved past the send window (a loaded machine) sends nothing and the row is
    # taken again: one more attempt, never one more request.
    stalled = sum(out.count("execute_send_skipped_stalled") for out in outputs)
    assert Attempt.objects.count() == unique + stalled
    assert all(taken_by(out) > 0 for out in outputs), outputs  # both workers took part
    assert sum(taken_by(out) for out in outputs) == unique + stalled


def _wait_for_lease_expiry(op_id: int) -> bool:
    return wait_until(
        lambda: (
            Operation.objects.get(pk=op_id).lease_expires_at is not None
            and Operation.objects.get(pk=op_id).lease_expires_at < sql.db_now()
        ),
        timeout=6,
        interval=0.1,
    )


@pytest.mark.parametrize("provider_class", ["advisory", "enforced"])
def test_a_worker_killed_mid_call_is_reconciled_and_never_runs_twice(tenant, request, provider_class):
    from tests.execute.conftest import configure_provider

    mock = request.getfixturevalue(f"mock_{provider_class}")
    configure_provider(tenant, mock, slug="fx", enforced=provider_class == "enforced", timeout_seconds=1.0)
    # The provider holds the request; the worker is killed while it waits for the answer.
    mock.script([{"delay": 0.8}])
    op = submit(tenant, "k-killed", 1, provider="fx").operation
    # A short lease (no record-retry budget, a small margin) so the sweeper's turn comes soon.
    env = child_env(LOG_LEVEL="WARNING", WORKER_LEASE_MARGIN_SECONDS="0.2", RECORD_RETRY_SECONDS="0")
    worker = start_worker(env=env, concurrency=2)
    try:
        # The provider has the request in hand (counted on arrival, held for 0.8 s). 60 s bounds a
        # cold worker start on a loaded machine; it is not a timing.
        assert wait_until(lambda: mock.effects()["requests"] == 1, timeout=60)
        assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
        worker.kill()  # SIGKILL: no cleanup, no result recorded
        worker.wait(timeout=5)
    finally:
        stop_process(worker)
    row = Operation.objects.get(pk=op.pk)
    assert row.status == S.CLAIMED and row.sent_at is not None  # the sent marker is what it left
    assert _wait_for_lease_expiry(op.pk)
    assert wait_until(lambda: mock.effects()["count"] == 1, timeout=3)  # the held request did act
    sweep()
    row = Operation.objects.get(pk=op.pk)
    if provider_class == "advisory":
        # Nothing at an advisory receiver stops a second effect: a human decides.
        assert row.status == S.REVIEW, list(row.events.values_list("reason", flat=True))
    else:
        # Looked up by key at the provider: found, recorded, never re-sent.
        assert row.status == S.SUCCEEDED and row.provider_ref.startswith("ch_")
    # Another worker comes along: it finds nothing to take.
    again = start_worker(env=env, concurrency=2, extra_args=["--max-idle", "0.5"])
    try:
        again.wait(timeout=20)
    finally:
        output = stop_process(again)
    assert taken_by(output) == 0, output
    assert mock.effects()["requests"] == 1 and mock.effects()["count"] == 1


def test_worker_processes_roll_a_failing_canary_back_and_its_unsent_share_goes_out_once_under_the_stable_revision(
    tenant, enforced
):
    """Two real worker processes (two threads each) and a canary at 50 % whose API version
    answers 500: the workers' watch rolls it back; every key takes effect exactly once."""
    provider, mock = enforced
    mock.break_versions({"v2": 500})
    provider = provider_upsert(
        tenant=tenant, slug="charges", base_url=mock.url + "/v2", canary_percent=50, reason="API v2"
    )
    canary_rev, stable = provider.canary_revision_id, provider.revision_id
    ops = [submit(tenant, f"order-{i}:charge:v1", i).operation for i in range(80)]
    on_canary = {op.pk for op in ops if op.adapter_revision_id == canary_rev}
    env = child_env(CANARY_MIN_SAMPLE="6", CANARY_MAX_EXCESS_PERCENT="10")
    workers = [start_worker(env=env, concurrency=2) for _ in range(2)]
    try:
        done = wait_until(
            lambda: not Operation.objects.filter(status__in=(S.QUEUED, S.CLAIMED, S.RETRY_WAIT)).exists(), timeout=60
        )
    finally:
        outputs = [stop_process(w) for w in workers]
    assert done, outputs
    provider.refresh_from_db()
    assert provider.canary_revision_id is None and provider.revision_id == stable
    sent_to_canary = set(Attempt.objects.filter(adapter_revision_id=canary_rev).values_list("operation_id", flat=True))
    # Stopped within about one attempt per worker thread after the sixth counted failure.
    assert 6 <= len(sent_to_canary) <= 6 + 4 and sent_to_canary <= on_canary
    assert set(Operation.objects.filter(pk__in=on_canary - sent_to_canary).values_list("status", flat=True)) == {
        S.SUCCEEDED
    }
    # The canary's 500s are reconciled as usual and re-issued under the stable revision.
    past, params = sql.now_plus(-30)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE ledger_operation SET sent_at = {past} WHERE status = %s", [*params, S.UNCERTAIN])
    sweep()
    workers = [start_worker(env=env, concurrency=2)]
    try:
        finished = wait_until(lambda: set(statuses()) == {S.SUCCEEDED}, timeout=60)
    finally:
        stop_process(workers[0])
    assert finished, statuses()
    effects = mock.effects()
    assert effects["by_key"] == {op.key: 1 for op in ops}
    assert {k for k, n in effects["requests_by_key"].items() if n > 1} == {
        op.key for op in ops if op.pk in sent_to_canary
    }
