"""The ledger's named statements (ledger/store/queries.sql, run by ledger.store.statements) behave like
Django's own cursor and ORM: rows are real model instances, statements join the caller's
transaction, raise Django's errors and are seen by query observers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError

from ledger.models import (
    Attempt,
    AttemptOutcome,
    Operation,
    OperationEvent,
    OperationMode,
    OperationStatus,
    Provider,
    Tenant,
)
from ledger.platform import crypto
from ledger.platform.errors import LeaseLost
from ledger.protocol import services
from ledger.protocol.transitions.claim import guarded_move
from ledger.store import statements
from tests.conftest import on_postgres
from tests.ledger.support import attempts_of, events_of, ledger_counts

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
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref="ch_1",
        response_body={"ok": True},
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
            {
                "tenant_id": tenant.pk,
                "operation_id": None,
                "from_status": "",
                "to_status": "claimed",
                "actor": "t",
                "reason": "",
                "attempt": 1,
            },
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
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body={}
        )
    assert any("ledger_operation" in s and "INSERT" in s for s in seen)
    assert any("UPDATE ledger_operation" in s for s in seen)


def test_a_completion_from_uncertain_still_records_the_move_it_made(tenant, provider):
    op = _claim(tenant, provider, "hot-uncertain")
    guarded_move(operation=op, to=S.UNCERTAIN, actor="sweeper", reason="lease expired")
    done = services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body={"late": 1}
    )
    assert done.status == S.SUCCEEDED
    assert [(e[0], e[1]) for e in events_of(op.pk)][-2:] == [("claimed", "uncertain"), ("uncertain", "succeeded")]


@pytest.mark.parametrize("encrypt", [True, False])
def test_json_scalars_round_trip_through_the_statements(tenant, provider, settings, encrypt):
    settings.ONCEGUARD_PRIVACY = {**getattr(settings, "ONCEGUARD_PRIVACY", {}), "ENCRYPT": encrypt}
    op = _claim(tenant, provider, f"hot-scalar-{encrypt}", payload="just text")
    done = services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body="plain"
    )
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
    source = "".join(p.read_text() for p in Path(statements.__file__).parents[1].rglob("*.py"))
    parsed = statements.parse(statements.QUERIES.read_text(encoding="utf-8"), vendor="sqlite")
    unused = [name for name in parsed if f'"{name}"' not in source]
    assert unused == []


def test_every_hot_transition_writes_its_event_in_the_same_transaction(tenant, provider):
    op = _claim(tenant, provider, "stmt-events")
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    with transaction.atomic():
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body={}
        )
        transaction.set_rollback(True)
    # Rolled back together: the row is still claimed and its last event is the sent marker.
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert [(e[0], e[1]) for e in events_of(op.pk)] == [("", "claimed"), ("claimed", "claimed")]


# --- PostgreSQL's one-statement claim and complete answer like the portable statements ---------

# What differs between two runs of the same journey by construction: ids, keys, the random
# lease tokens and sealed JSON (a fresh nonce each time; compared in clear instead).
_RUN_SPECIFIC = {"id", "key", "lease_token", "operation_id", "superseded_by_id", "replaced_by_id"}
_SEALED = {"payload", "request", "response_body"}


def _comparable(values: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in values.items() if k not in _RUN_SPECIFIC}
    for name in _SEALED & set(out):
        out[name] = crypto.open_json(out[name])
    return out


def _answer(call: Any) -> Any:
    """What a service call answered: the operation it returned (as comparable fields and
    flags), or the named error it raised (class, status, code and extra, ids left out)."""
    try:
        result = call()
    except Exception as error:
        extra = {k: v for k, v in getattr(error, "extra", {}).items() if k != "operation_id"}
        return ("error", type(error).__name__, getattr(error, "status", None), getattr(error, "code", None), extra)
    if isinstance(result, services.ClaimResult):
        op = result.operation
        stored = _comparable(Operation.objects.filter(pk=op.pk).values().get()) if result.acquired else None
        returned = _comparable({f.attname: getattr(op, f.attname) for f in Operation._meta.concrete_fields})
        return ("claim", result.acquired, result.replayed, stored, returned)
    return ("op", _comparable({f.attname: getattr(result, f.attname) for f in Operation._meta.concrete_fields}))


def _journey(tenant: Tenant, other: Tenant, provider: Provider, prefix: str) -> dict[str, Any]:
    """Claims and completes through every branch of the two statements, then every row they
    left. Run twice in one transaction (now() is the same for both), once on each path."""
    from ledger.models import OperationMode, Tombstone

    def claim(key: str, **kwargs: Any) -> Any:
        return lambda: services.operation_claim(
            tenant=tenant, key=f"{prefix}{key}", provider=provider, action="charge", request={"amount": 1}, **kwargs
        )

    def complete(op: Operation, **kwargs: Any) -> Any:
        arguments = {
            "operation_id": op.pk,
            "tenant_id": op.tenant_id,
            "lease_token": op.lease_token,
            "provider_ref": "ch_1",
            **kwargs,
        }
        return lambda: services.operation_complete(response_body={"ok": True}, **arguments)

    answers: list[Any] = []
    ops: dict[str, Operation] = {}
    for name, call in (
        ("plain", claim("plain")),
        ("sent", claim("sent", mark_sent=True, uses_sent_marker=True, lease_seconds=45)),
        ("with-payload", claim("with-payload", payload={"email": "a@example.com"}, run="run-1", step=2)),
        ("queued", claim("queued", mode=OperationMode.EXECUTE, via_claims=False, payload={"n": 1})),
        ("deadline", claim("deadline", deadline_seconds=90.5, execution_id="ex-1", correlation_id="c-1")),
        ("uncertain", claim("uncertain")),
        ("review", claim("review")),
    ):
        answers.append(_answer(call))
        ops[name] = Operation.objects.get(tenant=tenant, key=f"{prefix}{name}")
    answers.append(_answer(claim("plain")))  # taken, in progress
    Tombstone.objects.create(
        tenant=tenant, key=f"{prefix}gone", operation_id=1, mode="guard", action="charge",
        provider_slug=provider.slug, fingerprint=ops["plain"].fingerprint, final_status=S.SUCCEEDED,
        created_at=ops["plain"].created_at, done_at=ops["plain"].created_at,
        deleted_at=ops["plain"].created_at, keep_until=ops["plain"].created_at,
    )  # fmt: skip
    answers.append(_answer(claim("gone")))
    guarded_move(operation=ops["uncertain"], to=S.UNCERTAIN, actor="sweeper", reason="expired")
    guarded_move(operation=ops["review"], to=S.REVIEW, actor="sweeper", reason="review it")
    for name in ("plain", "sent", "with-payload", "uncertain", "review"):
        answers.append(_answer(complete(ops[name], reason=f"done {name}", actor="worker-1")))
    answers.append(_answer(complete(ops["plain"])))  # the same holder again: the row back
    answers.append(_answer(complete(ops["plain"], provider_ref="other")))  # finished
    answers.append(_answer(complete(ops["deadline"], lease_token="f" * 32)))  # fenced
    answers.append(_answer(complete(ops["deadline"], tenant_id=other.pk)))  # another tenant's
    answers.append(_answer(complete(ops["queued"])))  # not reportable
    answers.append(_answer(claim("plain")))  # a replay of the finished row
    rows = {}
    for name, op in ops.items():
        rows[name] = {
            "operation": _comparable(Operation.objects.filter(pk=op.pk).values().get()),
            "attempts": [_comparable(a) for a in attempts_of(op.pk)],
            "tokens_agree": all(
                a["lease_token"] == Operation.objects.get(pk=op.pk).lease_token for a in attempts_of(op.pk)
            ),
            "events": [
                {k: v for k, v in e.items() if k not in ("id", "operation_id")}
                for e in OperationEvent.objects.filter(operation_id=op.pk).order_by("id").values()
            ],
        }
    return {"answers": answers, "rows": rows}


@pytest.mark.skipif(not on_postgres(), reason="the one-statement forms are PostgreSQL's")
def test_the_one_statement_claim_and_complete_answer_exactly_like_the_portable_statements(
    tenant, other_tenant, provider, monkeypatch
):
    seen: list[str] = []

    def wrapper(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(statement)
        return execute(statement, params, many, context)

    with connection.execute_wrapper(wrapper):
        combined = _journey(tenant, other_tenant, provider, "cte-")
    assert any(statements.text("operation_claim_pg") == s for s in seen)
    assert any(statements.text("operation_complete_pg") == s for s in seen)
    monkeypatch.setattr(statements, "COMBINED", False)
    seen.clear()
    with connection.execute_wrapper(wrapper):
        portable = _journey(tenant, other_tenant, provider, "one-")
    assert not any("WITH op AS" in s for s in seen)
    assert combined["rows"] == portable["rows"]
    assert combined["answers"] == portable["answers"]
    assert all(r["tokens_agree"] for r in combined["rows"].values())
    assert [a[1] for a in combined["answers"] if a[0] == "error"] == [
        "OperationInProgress",
        "OperationAlreadyFinished",
        "LeaseLost",
        "OperationNotFound",
        "LeaseLost",
    ]
    assert [a[1:3] for a in combined["answers"] if a[0] == "claim"][-2:] == [(False, True), (False, True)]


def test_the_one_statement_claim_writes_the_insert_of_the_portable_statement():
    """The claim's INSERT is written twice (operation_insert, operation_claim_pg): the same
    columns, values, tombstone guard and conflict clause, word for word."""
    parsed = statements.parse(statements.QUERIES.read_text(encoding="utf-8"), vendor="postgresql")
    insert = " ".join(parsed["operation_insert"].split())
    combined = " ".join(parsed["operation_claim_pg"].split())
    assert insert.replace("RETURNING *", "").strip() in combined
    attempt = " ".join(parsed["attempt_open"].split())
    columns = attempt.split(" SELECT ")[0]
    assert columns in combined


@pytest.mark.skipif(not on_postgres(), reason="the one-statement forms are PostgreSQL's")
def test_a_fresh_claim_without_a_payload_is_one_statement_after_its_read_and_a_completion_one(tenant, provider):
    seen: list[str] = []

    def wrapper(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(statement)
        return execute(statement, params, many, context)

    # No savepoint around the claim: on its own it is a transaction of one statement.
    with connection.execute_wrapper(wrapper):
        op = _claim(tenant, provider, "rt-1")
        claim_statements = list(seen)
        services.operation_complete(
            operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, response_body={}
        )
    assert claim_statements == [statements.text("operation_by_key"), statements.text("operation_claim_pg")]
    # The completion's atomic block is a savepoint here, BEGIN … COMMIT on its own; in it, its
    # one statement and no planner setting (docs/adr/0010-claim-path-plans-from-statistics.md).
    completion = [s for s in seen[2:] if "SAVEPOINT" not in s]
    assert completion == [statements.text("operation_complete_pg")]


@pytest.mark.skipif(not on_postgres(), reason="row locks between two connections: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_completion_that_waits_for_the_sweepers_move_completes_from_the_state_it_left(tenant, provider):
    """The completion starts while the sweeper's claimed → uncertain is uncommitted, waits for
    its row lock, and must then move the row as the sweeper left it (uncertain → succeeded),
    not miss it because its own snapshot still saw `claimed`."""
    op = _claim(tenant, provider, "waits-for-sweeper")
    services.operation_mark_sent(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token)
    moved, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def sweeper() -> None:
        try:
            with transaction.atomic():
                row = Operation.objects.select_for_update().get(pk=op.pk)
                guarded_move(operation=row, to=S.UNCERTAIN, actor="sweeper", reason="lease expired")
                moved.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def holder() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            outcome["done"] = services.operation_complete(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                provider_ref="ch_late",
                response_body={"ok": 1},
            )
        except Exception as error:  # surfaced by the assertion below
            outcome["error"] = error
        finally:
            connection.close()

    first = threading.Thread(target=sweeper)
    first.start()
    assert moved.wait(timeout=30)
    second = threading.Thread(target=holder)
    second.start()
    # Release the sweeper only once the completion waits for its lock.
    for _ in range(300):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [outcome.get("pid", 0)]
            )
            if cursor.fetchone():
                break
        time.sleep(0.05)
    else:
        pytest.fail("the completion never waited for the sweeper's lock")
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["done"].status == S.SUCCEEDED
    assert [(e[0], e[1]) for e in events_of(op.pk)][-2:] == [("claimed", "uncertain"), ("uncertain", "succeeded")]


# --- Asynchronous providers: wait and poll take (portable statements, both databases) ------------


def test_the_wait_and_poll_statements_move_hold_and_fence_alike_on_either_database(tenant, provider):
    queued = _claim(tenant, provider, "stmt-job", mode=OperationMode.EXECUTE, via_claims=False)
    taken = services.operation_take(
        operation_id=queued.pk,
        tenant_id=queued.tenant_id,
        from_status=S.QUEUED,
        lease_seconds=45,
        past_deadline=False,
        actor="worker-1",
    )
    assert taken is not None and taken.polls == 0

    def wait(op: Operation, seconds: float = 5.0) -> Operation:
        return services.operation_wait(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            provider_ref="job_1",
            poll_in_seconds=seconds,
            response_status=202,
            actor="worker-1",
            reason="accepted",
        )

    waiting = wait(taken)
    assert (waiting.status, waiting.provider_ref, waiting.lease_expires_at, waiting.polls) == (
        S.WAITING,
        "job_1",
        None,
        0,
    )
    assert waiting.next_attempt_at - waiting.updated_at == timedelta(seconds=5)
    (attempt,) = Attempt.objects.filter(operation_id=taken.pk)
    assert (attempt.outcome, attempt.provider_ref, attempt.response_status) == (AttemptOutcome.PENDING, "job_1", 202)
    # The same holder's repeat (a retried record whose commit landed): the row, no second event.
    assert wait(taken).pk == taken.pk and len(events_of(taken.pk)) == 3
    polled = services.operation_poll_take(
        operation_id=taken.pk, tenant_id=tenant.pk, lease_seconds=12, actor="worker-2", reason="poll"
    )
    assert polled is not None and polled.status == S.CLAIMED and polled.polls == 1 and polled.attempts == 1
    assert polled.lease_token != taken.lease_token and polled.lease_expires_at is not None
    assert polled.lease_expires_at - polled.claimed_at == timedelta(seconds=12)
    # Only one taker; the submit's token is fenced out.
    assert (
        services.operation_poll_take(
            operation_id=taken.pk, tenant_id=tenant.pk, lease_seconds=12, actor="x", reason="poll"
        )
        is None
    )
    with pytest.raises(LeaseLost):
        wait(taken)
    again = wait(polled, seconds=2.5)
    assert again.status == S.WAITING and again.polls == 1
    assert Attempt.objects.get(operation_id=taken.pk).response_status == 202  # a poll's wait leaves the attempt
    final = services.operation_poll_take(
        operation_id=taken.pk, tenant_id=tenant.pk, lease_seconds=12, actor="worker-3", reason="poll"
    )
    assert final is not None and final.polls == 2
    done = services.operation_complete(
        operation_id=taken.pk, tenant_id=taken.tenant_id, lease_token=final.lease_token, provider_ref="job_1"
    )
    assert done.status == S.SUCCEEDED
    assert Attempt.objects.get(operation_id=taken.pk).outcome == AttemptOutcome.SUCCEEDED
    assert [(e[0], e[1]) for e in events_of(taken.pk)] == [
        ("", "queued"),
        ("queued", "claimed"),
        ("claimed", "waiting"),
        ("waiting", "claimed"),
        ("claimed", "waiting"),
        ("waiting", "claimed"),
        ("claimed", "succeeded"),
    ]
    # A take for a send starts the count of polls again.
    assert "polls = 0" in statements.text("operation_take")
