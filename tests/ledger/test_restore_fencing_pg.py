"""The restore round trip (ADR 0012), for real: keys are claimed and finished, the database is
dumped with pg_dump, more keys finish, the dump is restored with pg_restore and the ledger's view
is re-read — the later keys are held, new keys work, and nothing reaches the provider twice
(counted at a loopback receiver).

The test works in a database of its own on 127.0.0.1:5432, created from this run's test database
and dropped at the end; it never touches another. Heavy: it runs once, in the PostgreSQL pass."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from ledger.models import FenceHold, IdempotencyClass, LedgerIdentity, Operation, Tenant
from ledger.platform.errors import OperationHeldAfterRestore
from ledger.protocol import fencing, services
from ledger.protocol.services import operation_claim, operation_complete
from tests.conftest import on_postgres
from tests.ledger.support import CLAIM_URL, Sink, assert_problem, claim_body

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]


def _pg_args() -> list[str]:
    s = connection.settings_dict
    return ["-h", s.get("HOST") or "127.0.0.1", "-p", str(s.get("PORT") or 5432), "-U", s.get("USER") or "postgres"]


def _admin(sql: str) -> None:
    s = connection.settings_dict
    with psycopg.connect(
        host=s.get("HOST") or "127.0.0.1",
        port=s.get("PORT") or 5432,
        user=s.get("USER") or "postgres",
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(sql)


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=120)


@pytest.fixture
def own_database(tmp_path: Path) -> Iterator[str]:
    """A database of this test's own: this run's test database (schema and migration rows)
    copied with pg_dump, the ledger's connection pointed at it, and dropped afterwards."""
    if not on_postgres():
        pytest.skip("PostgreSQL only")
    source = connection.settings_dict["NAME"]
    own = f"onceguard_restore_{uuid.uuid4().hex[:12]}"
    seed = tmp_path / "seed.dump"
    _run("pg_dump", *_pg_args(), "-Fc", "-f", str(seed), source)
    _admin(f'CREATE DATABASE "{own}"')
    connection.close()
    try:
        _run("pg_restore", *_pg_args(), "-d", own, str(seed))
        connection.settings_dict["NAME"] = own
        yield own
    finally:
        connection.close()
        connection.settings_dict["NAME"] = source
        _admin(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')


@pytest.fixture
def journal_on(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "FENCE_JOURNAL": "local",
        "FENCE_JOURNAL_DIR": str(tmp_path / "fence-journal"),
    }
    fencing.view_reset()
    yield
    fencing.view_reset()


def _perform(tenant: Tenant, provider: Any, sink: Sink, key: str) -> str:
    """A caller's step in guard mode: claim with the sent marker, perform, complete. Returns
    what the claim answered."""
    try:
        result = operation_claim(
            tenant=tenant, key=key, provider=provider, action="send", request={"to": key}, mark_sent=True
        )
    except OperationHeldAfterRestore:
        return "held"
    if not result.acquired:
        return "replayed"
    op = result.operation
    ref = sink.send(key)
    operation_complete(operation_id=op.pk, lease_token=op.lease_token, provider_ref=ref, tenant_id=tenant.pk)
    return "performed"


def test_a_restored_backup_holds_the_keys_finished_after_it_and_nothing_is_performed_twice(
    own_database: str, journal_on: None, sink: Sink, tmp_path: Path, make_client: Any
) -> None:
    tenant = services.tenant_create(slug="acme")
    # A key-advisory provider (an e-mail sender): nothing on its side stops a second send.
    provider = services.provider_upsert(
        tenant=tenant, slug="mailer", base_url=sink.url, idempotency_class=IdempotencyClass.KEY_ADVISORY
    )
    assert fencing.view_load().new_holds == 0
    before = ["mail-1", "mail-2", "mail-3"]
    after = ["mail-4", "mail-5", "mail-6"]
    assert [_perform(tenant, provider, sink, key) for key in before] == ["performed"] * 3

    backup = tmp_path / "backup.dump"
    _run("pg_dump", *_pg_args(), "-Fc", "-f", str(backup), own_database)

    assert [_perform(tenant, provider, sink, key) for key in after] == ["performed"] * 3
    # Claimed but never sent: nothing may have happened, so nothing is journaled for it.
    operation_claim(tenant=tenant, key="mail-7", provider=provider, action="send", request={"to": "mail-7"})
    assert sink.count() == 6

    # The restore: the database as the backup left it.
    connection.close()
    _admin(f'DROP DATABASE "{own_database}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{own_database}"')
    _run("pg_restore", *_pg_args(), "-d", own_database, str(backup))
    assert not Operation.objects.filter(key__in=after).exists()

    # The ledger's view is read again (what a restart does).
    fencing.view_reset()
    report = fencing.view_load()
    assert report.new_holds == 3
    assert LedgerIdentity.objects.get().epoch == report.epoch > report.journal_epoch
    assert sorted(FenceHold.objects.values_list("key", flat=True)) == after

    # Every workflow runs again: the held keys are refused, the others answer as before.
    outcomes = {key: _perform(tenant, provider, sink, key) for key in [*before, *after, "mail-7", "mail-8"]}
    assert outcomes == {
        **dict.fromkeys(before, "replayed"),
        **dict.fromkeys(after, "held"),
        "mail-7": "performed",
        "mail-8": "performed",
    }
    for key in [*before, *after, "mail-7", "mail-8"]:
        assert sink.count(key) == 1, key

    api = make_client(tenant)
    held = api.post(
        CLAIM_URL, claim_body("mail-5", provider="mailer", action="send", request={"to": "mail-5"}), format="json"
    )
    body = assert_problem(held, 409, "operation_held_after_restore")
    assert "restored from a backup" in body["detail"]
    assert sink.count() == 8
