"""Restore fencing (ADR 0012): the journal outside the database of keys whose effect may have
happened, the epoch that says the database went back in time, the holds a restore leaves, and
how a hold lifts. The real pg_dump/restore round trip is tests/ledger/test_restore_fencing_pg.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from ledger.models import ConfigChange, FenceHold, FenceHoldResolution, LedgerIdentity, Operation, Tenant
from ledger.platform import env
from ledger.platform.errors import FenceJournalUnavailable, OperationHeldAfterRestore, ValidationFailed
from ledger.platform.journal import Entry, LocalJournal, RedisJournal
from ledger.protocol import fencing, services
from ledger.protocol.services import operation_claim, operation_complete, operation_mark_sent
from tests.ledger.support import CLAIM_URL, assert_problem, claim_body
from tests.support.loopback import LoopbackServer, QuietHandler


@pytest.fixture
def journal_on(settings: Any, tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "fence-journal"
    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(folder)}
    fencing.view_reset()
    yield folder
    fencing.view_reset()


def journal_lines(folder: Path) -> list[str]:
    return [line for path in sorted(folder.glob("*/*.journal")) for line in path.read_text().splitlines()]


def forget(tenant: Tenant, key: str) -> None:
    """What a restore does to a key finished after the backup: the database no longer has it."""
    op = Operation.objects.get(tenant=tenant, key=key)
    with connection.cursor() as cursor:
        for table in ("ledger_operationevent", "ledger_attempt"):
            cursor.execute(f"DELETE FROM {table} WHERE operation_id = %s", [op.pk])
    Operation.objects.filter(pk=op.pk).delete()


def finish(tenant: Tenant, provider: Any, key: str) -> Operation:
    result = operation_claim(tenant=tenant, key=key, provider=provider, action="charge", request={"n": key})
    op = result.operation
    operation_mark_sent(operation_id=op.pk, lease_token=op.lease_token, tenant_id=tenant.pk)
    return operation_complete(operation_id=op.pk, lease_token=op.lease_token, provider_ref="ch", tenant_id=tenant.pk)


# --- The journal's two stores -----------------------------------------------------------------------


def test_local_journal_reads_entries_after_the_first_mark_of_an_epoch(tmp_path: Path) -> None:
    book = LocalJournal(tmp_path, "ledger-a")
    book.append(Entry(1, None, "succeeded", "before-any-mark"))
    book.mark(3)
    book.append(Entry(1, 7, "claimed", "after-3"))
    book.mark(4)
    book.append(Entry(2, None, "failed", "after-4"))
    assert book.highest_mark() == 4
    assert [e.key for e in book.entries_since_mark(4)] == ["after-4"]
    assert [e.key for e in book.entries_since_mark(3)] == ["after-3", "after-4"]
    assert book.entries_since_mark(3).__next__() == Entry(1, 7, "claimed", "after-3")
    # No mark that old or newer: everything may be after the backup.
    assert [e.key for e in book.entries_since_mark(9)] == ["before-any-mark", "after-3", "after-4"]
    book.close()


def test_local_journal_skips_a_torn_last_line_and_prunes_whole_old_days(tmp_path: Path) -> None:
    book = LocalJournal(tmp_path, "ledger-b")
    book.mark(1)
    book.append(Entry(1, None, "succeeded", "k1"))
    book.close()
    today = next((tmp_path / "ledger-b").glob("*.journal"))
    (tmp_path / "ledger-b" / "20200101.journal").write_text("k\t1\t0\tsucceeded\told\n")
    with today.open("a") as handle:
        handle.write("k\t1\t0\tsucc")
    assert [e.key for e in book.entries_since_mark(0)] == ["k1"]
    # An older day file comes first; before any mark, it is read only when no mark is that old.
    assert [e.key for e in book.entries_since_mark(2)] == ["old", "k1"]
    assert book.prune(older_than=datetime(2021, 1, 1, tzinfo=UTC)) == 1
    assert [e.key for e in book.entries_since_mark(0)] == ["k1"]


def test_redis_journal_keeps_order_marks_and_the_highest_epoch() -> None:
    book = RedisJournal("redis://127.0.0.1:6379/0", f"test-{uuid.uuid4()}")
    try:
        book.append(Entry(1, None, "succeeded", "before"))
        book.mark(5)
        book.append(Entry(1, 3, "claimed", "after-5"))
        book.mark(4)  # a late, lower mark never lowers the highest
        book.append(Entry(1, None, "failed", "later"))
        assert book.highest_mark() == 5
        assert [e.key for e in book.entries_since_mark(5)] == ["after-5", "later"]
        assert [e.key for e in book.entries_since_mark(4)] == ["after-5", "later"]
        book.PAGE = 2  # pages are read in order
        assert [e.key for e in book.entries_since_mark(0)] == ["after-5", "later"]
    finally:
        book.client.delete(book.stream, book.stream + ":epoch")


# --- Settings: how multi-node is declared, and what it refuses -----------------------------------------


def test_multi_node_on_a_local_journal_refuses_to_start() -> None:
    with pytest.raises(env.SettingError, match="FENCE_JOURNAL=local with NODES=multi"):
        env.validate({"FENCE_JOURNAL": "local", "NODES": "multi"})
    with pytest.raises(env.SettingError, match="needs FENCE_REDIS_URL"):
        env.validate({"FENCE_JOURNAL": "redis", "NODES": "multi"})
    env.validate({"FENCE_JOURNAL": "redis", "NODES": "multi", "FENCE_REDIS_URL": "redis://127.0.0.1:6379/0"})
    env.validate({"FENCE_JOURNAL": "local"})
    with pytest.raises(env.SettingError, match="NODES"):
        env.validate({"NODES": "several"})


# --- Written before the commit ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_sent_and_finished_keys_are_journaled_and_a_plain_claim_is_not(journal_on: Path, tenant, provider) -> None:
    result = operation_claim(tenant=tenant, key="plain-claim", provider=provider, action="charge", request={})
    assert journal_lines(journal_on) == []
    op = result.operation
    operation_mark_sent(operation_id=op.pk, lease_token=op.lease_token, tenant_id=tenant.pk)
    operation_complete(operation_id=op.pk, lease_token=op.lease_token, tenant_id=tenant.pk)
    operation_claim(tenant=tenant, key="sent-at-claim", provider=provider, action="charge", request={}, mark_sent=True)
    lines = journal_lines(journal_on)
    assert lines == [
        f"k\t{tenant.pk}\t{provider.pk}\tclaimed\tplain-claim",
        f"k\t{tenant.pk}\t{provider.pk}\tsucceeded\tplain-claim",
        f"k\t{tenant.pk}\t{provider.pk}\tclaimed\tsent-at-claim",
    ]


@pytest.mark.django_db
def test_a_journal_that_cannot_be_written_fails_the_move_before_its_commit(
    settings: Any, tmp_path: Path, tenant, provider
) -> None:
    result = operation_claim(tenant=tenant, key="k-unjournaled", provider=provider, action="charge", request={})
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the journal's folder should be")
    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(blocker)}
    fencing.view_reset()
    try:
        op = result.operation
        with pytest.raises(FenceJournalUnavailable) as refused:
            operation_mark_sent(operation_id=op.pk, lease_token=op.lease_token, tenant_id=tenant.pk)
        assert (refused.value.status, refused.value.code) == (503, "fence_journal_unavailable")
        assert Operation.objects.get(pk=op.pk).sent_at is None
    finally:
        fencing.view_reset()


# --- The rule, the holds and the 409 -------------------------------------------------------------------------


@pytest.fixture(params=["local", "redis"])
def either_journal(request: Any, settings: Any, tmp_path: Path) -> Iterator[str]:
    """Each store in turn: the local folder, and a Redis stream on the local redis-server (a
    database number of its own; the stream of this test's ledger identity is deleted after)."""
    if request.param == "local":
        overrides = {"FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(tmp_path / "fence-journal")}
    else:
        overrides = {"FENCE_JOURNAL": "redis", "FENCE_REDIS_URL": "redis://127.0.0.1:6379/14"}
    settings.ONCEGUARD = {**settings.ONCEGUARD, **overrides}
    fencing.view_reset()
    yield request.param
    if request.param == "redis":
        book = RedisJournal("redis://127.0.0.1:6379/14", LedgerIdentity.objects.get().ledger_id)
        book.client.delete(book.stream, book.stream + ":epoch")
    fencing.view_reset()


@pytest.mark.django_db(transaction=True)
def test_a_database_behind_its_journal_holds_the_keys_it_lost_and_new_keys_work(
    either_journal: str, tenant, provider, make_client
) -> None:
    first = fencing.view_load()
    assert first.went_back is False and first.new_holds == 0
    finish(tenant, provider, "k-before-backup")
    backup_epoch = LedgerIdentity.objects.get().epoch
    # Time passes: the epoch advances past the backup's, more keys finish.
    fencing.view_load(at_start=False)
    finish(tenant, provider, "k-after-backup")
    # The restore: the database is back at the backup's epoch and without the later key.
    forget(tenant, "k-after-backup")
    LedgerIdentity.objects.filter(pk=1).update(epoch=backup_epoch)
    fencing.view_reset()

    report = fencing.view_load()
    assert report.went_back is True and report.new_holds == 1
    assert report.epoch > report.journal_epoch
    hold = FenceHold.objects.get()
    assert (hold.key, hold.journaled_state, hold.resolution) == ("k-after-backup", "claimed", "open")

    api = make_client(tenant)
    body = assert_problem(
        api.post(CLAIM_URL, claim_body("k-after-backup"), format="json"), 409, "operation_held_after_restore"
    )
    assert body["hold_id"] == hold.pk
    assert not Operation.objects.filter(key="k-after-backup").exists()
    assert api.post(CLAIM_URL, claim_body("k-new"), format="json").status_code == 201
    replay = api.post(CLAIM_URL, claim_body("k-before-backup", request={"n": "k-before-backup"}), format="json")
    assert replay.status_code == 200
    assert FenceHold.objects.get().refused_claims == 1
    # Loaded again (another restart): the hold is not made twice.
    assert fencing.view_load().new_holds == 0


@pytest.mark.django_db(transaction=True)
def test_a_restore_within_one_epoch_is_caught_at_the_next_start(journal_on: Path, tenant, provider) -> None:
    fencing.view_load()
    finish(tenant, provider, "k-same-epoch")
    forget(tenant, "k-same-epoch")
    fencing.view_reset()
    report = fencing.view_load()
    assert report.went_back is False and report.new_holds == 1
    with pytest.raises(OperationHeldAfterRestore):
        operation_claim(tenant=tenant, key="k-same-epoch", provider=provider, action="charge", request={"n": "x"})
    # The fence schedule, with the epochs in agreement, does not read the journal again.
    assert fencing.fence_schedule()["new_holds"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_fresh_database_starts_a_fresh_journal(journal_on: Path, tenant, provider) -> None:
    fencing.view_load()
    finish(tenant, provider, "k-old-ledger")
    old_id = LedgerIdentity.objects.get().ledger_id
    # Another database (a new install) has another identity: it finds no journal of its own.
    LedgerIdentity.objects.all().delete()
    forget(tenant, "k-old-ledger")
    fencing.view_reset()
    report = fencing.view_load()
    assert LedgerIdentity.objects.get().ledger_id != old_id
    assert report.new_holds == 0 and not FenceHold.objects.exists()


# --- Lifting a hold: a person, or the provider's lookup ----------------------------------------------------------


def _held(tenant: Tenant, provider: Any, key: str = "k-held") -> FenceHold:
    from django.utils import timezone

    return FenceHold.objects.create(
        tenant=tenant, key=key, provider_id=provider.pk, journaled_state="succeeded", epoch=3, found_at=timezone.now()
    )


@pytest.mark.django_db(transaction=True)
def test_a_person_releases_a_hold_with_a_reason_and_the_trail_records_it(journal_on: Path, tenant, provider) -> None:
    hold = _held(tenant, provider)
    fencing.view_load()
    with pytest.raises(OperationHeldAfterRestore):
        operation_claim(tenant=tenant, key="k-held", provider=provider, action="charge", request={})
    with pytest.raises(ValidationFailed, match="Say why"):
        fencing.fence_hold_resolve(hold_id=hold.pk, resolution="released", actor="user:ops", reason=" ")
    with pytest.raises(ValidationFailed):
        fencing.fence_hold_resolve(hold_id=hold.pk, resolution="lookup_found", actor="user:ops", reason="x")
    fencing.fence_hold_resolve(
        hold_id=hold.pk, resolution="released", actor="user:ops", reason="provider dashboard shows no such email"
    )
    change = ConfigChange.objects.get(object_type="fence_hold")
    assert (change.actor, change.after, change.reason) == (
        "user:ops",
        {"resolution": "released"},
        "provider dashboard shows no such email",
    )
    assert operation_claim(tenant=tenant, key="k-held", provider=provider, action="charge", request={}).acquired
    with pytest.raises(ValidationFailed, match="already resolved"):
        fencing.fence_hold_resolve(hold_id=hold.pk, resolution="performed", actor="user:ops", reason="late")


class _Lookup(QuietHandler):
    found: set[str] = set()

    def do_GET(self) -> None:
        key = self.headers.get("Idempotency-Key", "")
        if key in self.found:
            self.answer(200, json.dumps({"id": "ch_9", "status": "succeeded"}).encode())
        else:
            self.answer(404, b"{}")


@pytest.mark.django_db(transaction=True)
def test_the_providers_lookup_lifts_a_hold_or_keeps_it_refused(journal_on: Path, tenant) -> None:
    _Lookup.found = {"k-was-sent"}
    server = LoopbackServer(_Lookup).start()
    try:
        provider = services.provider_upsert(
            tenant=tenant, slug="mailer", base_url=server.url, lookup_path="/lookup/{key}"
        )
        sent = _held(tenant, provider, "k-was-sent")
        unsent = _held(tenant, provider, "k-never-sent")
        fencing.view_load()
        assert (
            fencing.fence_hold_lookup(hold_id=sent.pk, actor="user:ops").resolution == FenceHoldResolution.LOOKUP_FOUND
        )
        assert (
            fencing.fence_hold_lookup(hold_id=unsent.pk, actor="user:ops").resolution
            == FenceHoldResolution.LOOKUP_NOT_FOUND
        )
        with pytest.raises(OperationHeldAfterRestore, match="will not run again"):
            operation_claim(tenant=tenant, key="k-was-sent", provider=provider, action="send", request={})
        assert operation_claim(tenant=tenant, key="k-never-sent", provider=provider, action="send", request={}).acquired
    finally:
        server.stop()


# --- The console page ----------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_console_lists_holds_and_a_person_resolves_one(journal_on: Path, tenant, provider, client) -> None:
    from django.contrib.auth.models import User

    hold = _held(tenant, provider, "k-console")
    admin = User.objects.create_superuser("ops", "ops@example.invalid", "pw-ops-123456")
    client.force_login(admin)
    listing = client.get("/admin/ledger/fencehold/")
    assert listing.status_code == 200 and b"k-console" in listing.content
    page = client.get(f"/admin/ledger/fencehold/{hold.pk}/resolve/")
    assert page.status_code == 200 and b"operation_held_after_restore" in page.content
    missing_reason = client.post(f"/admin/ledger/fencehold/{hold.pk}/resolve/", {"verb": "performed", "reason": ""})
    assert missing_reason.status_code == 200
    assert FenceHold.objects.get().resolution == "open"
    done = client.post(f"/admin/ledger/fencehold/{hold.pk}/resolve/", {"verb": "performed", "reason": "CRM shows it"})
    assert done.status_code == 302
    hold.refresh_from_db()
    assert (hold.resolution, hold.resolved_by, hold.reason) == ("performed", "user:ops", "CRM shows it")
    assert client.get(f"/admin/ledger/fencehold/{hold.pk + 999}/resolve/").status_code == 404


# --- The claim path's cost, and the command a restore runbook runs ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_claim_asks_nothing_more_while_no_hold_exists_and_one_read_while_one_does(
    journal_on: Path, settings: Any, tenant, provider
) -> None:
    from django.test.utils import CaptureQueriesContext

    fencing.view_load()

    def statements_of_a_new_claim(key: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            operation_claim(tenant=tenant, key=key, provider=provider, action="charge", request={})
        return len(queries)

    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "off"}
    off = statements_of_a_new_claim("k-off")
    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "local"}
    assert statements_of_a_new_claim("k-on") == off
    _held(tenant, provider, "k-somebody-else")
    fencing.view_load()
    assert statements_of_a_new_claim("k-on-held") == off + 1


@pytest.mark.django_db(transaction=True)
def test_fence_check_reports_the_epochs_and_exits_3_while_holds_are_open(journal_on: Path, tenant, provider) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("fence_check", stdout=out)
    assert "in step with its journal" in out.getvalue()
    finish(tenant, provider, "k-checked")
    forget(tenant, "k-checked")
    with pytest.raises(SystemExit) as stopped:
        call_command("fence_check", stdout=out)
    assert stopped.value.code == 3
    assert "new holds 1, open holds 1" in out.getvalue()


@pytest.mark.django_db
def test_an_unreachable_redis_journal_refuses_the_sent_marker_with_a_503_problem(
    settings: Any, tenant, provider, make_client
) -> None:
    api = make_client(tenant)
    first = api.post(CLAIM_URL, claim_body("k-redis-down"), format="json").json()
    # Nothing listens on port 1: the journal cannot be written, so the marker is not committed.
    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "redis", "FENCE_REDIS_URL": "redis://127.0.0.1:1/0"}
    fencing.view_reset()
    try:
        sent = api.post(f"/api/v1/operations/{first['id']}/sent", {"lease_token": first["lease_token"]}, format="json")
        assert_problem(sent, 503, "fence_journal_unavailable")
        assert Operation.objects.get(pk=first["id"]).sent_at is None
    finally:
        fencing.view_reset()
