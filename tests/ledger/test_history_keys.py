"""Attempts and events are keyed ``(id, started_at)`` / ``(id, at)`` through Django's
``CompositePrimaryKey`` (issue 16 item 4): the database still numbers each row — the raw
statements of ``queries.sql`` and the ORM alike, PostgreSQL's identity or SQLite's rowid — and
a created row knows its id and its key at once."""

from __future__ import annotations

import importlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.models import Attempt, Operation, OperationEvent, OperationStatus
from ledger.protocol import services
from tests.conftest import on_postgres

pytestmark = pytest.mark.django_db

S = OperationStatus


def _finished(tenant: Any, provider: Any, key: str) -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=provider).operation
    return services.operation_complete(
        operation_id=op.pk, lease_token=op.lease_token, provider_ref="ch_1", tenant_id=op.tenant_id
    )


def test_the_models_declare_the_partitioned_tables_keys():
    assert Attempt._meta.is_composite_pk and OperationEvent._meta.is_composite_pk
    assert [f.name for f in Attempt._meta.pk_fields] == ["id", "started_at"]
    assert [f.name for f in OperationEvent._meta.pk_fields] == ["id", "at"]


def test_rows_written_by_the_raw_statements_have_ids_from_the_database(tenant, provider):
    first = _finished(tenant, provider, "k-1")
    second = _finished(tenant, provider, "k-2")

    attempts = list(Attempt.objects.filter(operation__in=[first, second]).order_by("id"))
    events = list(OperationEvent.objects.filter(operation__in=[first, second]).order_by("id"))

    assert [a.operation_id for a in attempts] == [first.pk, second.pk]
    assert all(isinstance(a.id, int) and a.pk == (a.id, a.started_at) for a in attempts)
    # One event row per guard pair: the claim is kept on the operation row (ADR 0024).
    assert len({e.id for e in events}) == len(events) == 2
    assert all(e.pk == (e.id, e.at) for e in events)


def test_an_orm_create_gets_the_next_id_and_its_key_back(tenant, provider):
    op = _finished(tenant, provider, "k-orm")
    before = max(OperationEvent.objects.values_list("id", flat=True))
    at = timezone.now()

    event = OperationEvent.objects.create(
        operation=op, tenant_id=op.tenant_id, from_status="", to_status=S.SUCCEEDED, actor="t", at=at
    )
    after = OperationEvent.objects.create(
        operation=op, tenant_id=op.tenant_id, from_status="", to_status=S.SUCCEEDED, actor="t", at=at
    )

    assert isinstance(event.id, int) and event.id > before and after.id > event.id
    assert event.pk == (event.id, at)
    assert OperationEvent.objects.get(pk=event.pk).id == event.id
    # The raw statements go on from there: the same numbering, no collision.
    later = _finished(tenant, provider, "k-after")
    assert min(OperationEvent.objects.filter(operation=later).values_list("id", flat=True)) > after.id


def test_a_key_is_a_tuple_that_filters_refreshes_and_deletes_one_row(tenant, provider):
    op = _finished(tenant, provider, "k-tuple")
    attempt = Attempt.objects.get(operation=op)

    assert Attempt.objects.filter(pk=attempt.pk).count() == 1
    assert Attempt.objects.filter(pk__in=[attempt.pk]).count() == 1
    # Another time with the same id names no row.
    assert not Attempt.objects.filter(pk=(attempt.id, attempt.started_at + timedelta(seconds=1))).exists()
    attempt.message = "edited in memory"
    attempt.refresh_from_db()
    assert attempt.message == ""
    Attempt.objects.filter(pk=attempt.pk).update(message="updated by key")
    assert Attempt.objects.get(id=attempt.id).message == "updated by key"
    # An operation's deletion takes its history with it (the foreign key's CASCADE).
    Operation.objects.filter(pk=op.pk).delete()
    assert not Attempt.objects.filter(id=attempt.id).exists()
    assert not OperationEvent.objects.filter(operation_id=op.pk).exists()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_inserts_through_the_orm_and_the_raw_statements_never_share_an_id(tenant, provider):
    if not on_postgres():
        pytest.skip("real concurrency is PostgreSQL's")
    op = _finished(tenant, provider, "k-race")
    events_before = OperationEvent.objects.count()
    threads_n, per_thread = 8, 25
    barrier = threading.Barrier(threads_n)
    ids: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            mine = []
            for n in range(per_thread):
                if i % 2:
                    # ORM inserts, each in its own transaction.
                    with transaction.atomic():
                        mine.append(
                            OperationEvent.objects.create(
                                operation=op,
                                tenant_id=op.tenant_id,
                                from_status="",
                                to_status=S.SUCCEEDED,
                                actor=f"t{i}",
                                at=timezone.now(),
                            ).id
                        )
                else:
                    # The services' raw statements.
                    claimed = services.operation_claim(tenant=tenant, key=f"race-{i}-{n}", provider=provider).operation
                    services.operation_complete(
                        operation_id=claimed.pk, lease_token=claimed.lease_token, tenant_id=tenant.pk
                    )
            with lock:
                ids.extend(mine)
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    every = list(OperationEvent.objects.values_list("id", flat=True))
    assert len(ids) == (threads_n // 2) * per_thread
    # One event row per raw claim→complete pair: the claim is kept on the operation row (ADR 0024).
    assert len(every) == len(set(every)) == events_before + len(ids) + (threads_n // 2) * per_thread
    assert set(ids) <= set(every)
    attempt_ids = list(Attempt.objects.values_list("id", flat=True))
    assert len(attempt_ids) == len(set(attempt_ids)) == 1 + (threads_n // 2) * per_thread


def test_sqlite_times_are_written_as_django_writes_them_so_a_key_finds_its_row(tenant, provider):
    if on_postgres():
        pytest.skip("PostgreSQL compares timestamps, not text")
    from ledger.store.statements import _SQLITE_NOW

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_SQLITE_NOW.replace('%%', '%')}")
        (text,) = cursor.fetchone()
    parsed = datetime.fromisoformat(text).replace(tzinfo=UTC)
    assert connection.ops.adapt_datetimefield_value(parsed) == text


@pytest.mark.parametrize("fraction", ["710", "000"])
def test_the_migration_rewrites_sqlite_times_written_in_the_old_form(tenant, provider, fraction):
    if on_postgres():
        pytest.skip("SQLite only: PostgreSQL stores timestamps")
    migration = importlib.import_module("ledger.migrations.0030_attempt_event_composite_pk")
    op = _finished(tenant, provider, "k-old-form")
    attempt = Attempt.objects.get(operation=op)
    old_form = f"{attempt.started_at:%Y-%m-%d %H:%M:%S}.{fraction}"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_attempt SET started_at = %s WHERE id = %s", [old_form, attempt.id])
    stored = Attempt.objects.get(id=attempt.id)
    assert not Attempt.objects.filter(pk=stored.pk).exists()  # the old form: the key misses its row

    class Editor:  # the one thing the step uses of a schema editor (SQLite's needs no transaction)
        def __init__(self) -> None:
            self.connection = connection

        def execute(self, sql: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql)

    migration.sqlite_times_as_django_writes_them(None, Editor())

    assert Attempt.objects.filter(pk=stored.pk).get().id == attempt.id
    assert Attempt.objects.get(id=attempt.id).started_at == stored.started_at
