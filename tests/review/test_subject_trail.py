"""A person's data trail (issue 13 item 5): every record that holds their data and every event
on it, in time order; exported for an access request (the export logged and in the trail);
erased on request as a resumable run that leaves nothing of them anywhere."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from dlq.models import FailedEvent
from ledger.execution import objects
from ledger.models import Operation, Tombstone
from ledger.platform import crypto
from ledger.platform.errors import ValidationFailed
from ledger.protocol import services
from review.models import AccessLog, ErasureRun, ErasureState, RetentionPolicy, SubjectIndex
from review.privacy import erasure
from review.privacy.subjects import subject_resolve, subject_trail
from review.retention.policies import retention_policy_save
from review.retention.purge import retention_purge_tenant
from review.tasks import erasure_run_task
from tests.console.support import client_for, enforced_provider, staff, succeeded_op
from tests.console.test_no_payload_in_logs import Capture, captured  # noqa: F401 (the fixture)
from tests.dlq.sinks import Sink
from tests.ledger.support import assert_problem
from tests.review.trail_support import (
    EMAIL,
    MARKERS,
    OTHER_EMAIL,
    OTHER_MARKERS,
    PHONE,
    build_world,
    database_text,
    found,
)

pytestmark = pytest.mark.django_db(transaction=True)

WHO = {"identifiers": {"email": EMAIL, "phone": PHONE}}
# Her payload values that no masked rendering may show.
IDENTIFIERS = (EMAIL, PHONE, "61412345678", "412 345 678", "Wattle Street")


@pytest.fixture
def sink() -> Iterator[Sink]:
    sink = Sink().start()
    yield sink
    sink.stop()


@pytest.fixture
def world(tenant: Any, sink: Sink) -> Any:
    return build_world(tenant, sink)


def _trail(client: Any, reason: str = "Access request AR-2291 (APP 12)") -> dict[str, Any]:
    response = client.post("/api/v1/subjects/trail", {**WHO, "reason": reason}, format="json")
    assert response.status_code == 200, response.content
    assert response["Cache-Control"] == "no-store"
    return response.json()


def _first(events: list[dict[str, Any]], event: str, record_contains: str = "") -> int:
    return next(i for i, e in enumerate(events) if e["event"] == event and record_contains in e["record"])


# --- The trail --------------------------------------------------------------------------------------


def test_a_subjects_trail_lists_every_record_and_ingest_reveal_replay_redaction_in_order(world, make_client, tenant):
    body = _trail(make_client(tenant, ["audit"]))
    refs = {(r["kind"], r["ref"]) for r in body["records"]}
    # Every record that holds her data: found by the index, or linked to one that is.
    assert ("operation", "lead:call_7f3c") in refs
    assert ("DLQ entry", f"op:{world.lead.pk}") in refs
    assert ("replay", f"replay:{world.entry.pk}:1") in refs
    assert ("operation", "quote:q-77") in refs and ("review item", "mail:confirm-77") in refs
    assert ("DLQ entry", "n8n:wf-9:exec-31") in refs
    assert ("operation", "quote:q-12") in refs  # redacted by retention: still listed
    assert ("operation", "quote:q-3") in refs  # deleted by retention: listed from its tombstone
    assert all(r["ref"] != "quote:q-88" for r in body["records"])  # not hers
    by_ref = {r["ref"]: r for r in body["records"]}
    assert by_ref["quote:q-77"]["run"] == "order-77" and by_ref["quote:q-77"]["step"] == 1
    assert by_ref["quote:q-12"]["payload"] == "redacted" and by_ref["quote:q-3"]["payload"] == "deleted"
    events = body["events"]
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    ingest = _first(events, "ingested", "lead:call_7f3c")
    reveal = _first(events, "revealed", "lead:call_7f3c")
    replay = _first(events, "replayed", f"op:{world.lead.pk}")
    redaction = _first(events, "redacted", "quote:q-12")
    deletion = _first(events, "deleted", "quote:q-3")
    assert ingest < reveal < replay < redaction, [(e["event"], e["record"]) for e in events]
    assert deletion > ingest
    assert events[reveal]["actor"] == "user:ada" and "Ticket OPS-142" in events[reveal]["detail"]
    assert "target n8n" in events[replay]["detail"] and events[replay]["actor"] == "user:ops"
    assert "retention policy" in events[redaction]["detail"]
    assert "tombstone" in events[deletion]["detail"]
    # Masked: no payload value of hers, only shapes and keyed references. (Error texts are
    # shown as stored: masked for addresses and numbers; a provider's echo of her name is
    # what an erasure cuts out, below.)
    assert not found(json.dumps(body), IDENTIFIERS)
    assert body["subject"]["kinds"] == ["email", "phone"]
    # The lookup itself is logged, names her by keyed reference only, and is in the trail.
    row = AccessLog.objects.filter(tenant=tenant, object_type="subject").latest("seq")
    assert row.action == "subject_search" and row.object_ref == " ".join(body["subject"]["refs"])
    assert not found(row.object_ref + row.reason, MARKERS)
    again = _trail(make_client(tenant, ["admin"]))
    assert again["events"][-1]["event"] == "looked up" and "AR-2291" in again["events"][-1]["detail"]


def test_one_identifier_finds_the_same_person_and_phone_spellings_agree(world, make_client, tenant):
    api = make_client(tenant, ["audit"])
    by_phone = api.post(
        "/api/v1/subjects/trail",
        {"identifiers": {"phone": "+61 (412) 345-678"}, "reason": "AR-2291 by phone"},
        format="json",
    ).json()
    assert {r["ref"] for r in by_phone["records"]} >= {"quote:q-12", "lead:call_7f3c"}


def test_the_trail_needs_audit_or_admin_scope_stays_in_its_tenant_and_refuses_bad_input(
    world, make_client, tenant, other_tenant
):
    assert_problem(
        make_client(tenant, ["read", "write"]).post(
            "/api/v1/subjects/trail", {**WHO, "reason": "curious only"}, format="json"
        ),
        403,
        "forbidden",
    )
    assert (
        make_client(other_tenant, ["audit"])
        .post("/api/v1/subjects/trail", {**WHO, "reason": "not my tenant"}, format="json")
        .json()["records"]
        == []
    )
    api = make_client(tenant, ["audit"])
    for body in (
        {**WHO, "reason": "short"},
        {"identifiers": {"shoe_size": "42"}, "reason": "AR-2291 odd kind"},
        {"identifiers": {"email": "not an address"}, "reason": "AR-2291 bad email"},
        {"identifiers": {}, "reason": "AR-2291 nothing"},
        ["not", "an", "object"],
    ):
        assert_problem(api.post("/api/v1/subjects/trail", body, format="json"), 400, "validation_error")
    # Identifiers never travel in a URL: there is no GET.
    assert api.get("/api/v1/subjects/trail").status_code == 405


# --- Export for an access request ------------------------------------------------------------------


def test_export_in_clear_needs_the_payload_scope_is_logged_and_appears_in_the_trail(world, make_client, tenant):
    request = {**WHO, "reason": "Access request AR-2291 (APP 12)", "decrypt": True}
    assert_problem(
        make_client(tenant, ["audit"]).post("/api/v1/subjects/export", request, format="json"), 403, "forbidden"
    )
    assert not AccessLog.objects.filter(action="export", object_type="subject").exists()
    api = make_client(tenant, ["audit", "payload"])
    response = api.post("/api/v1/subjects/export", request, format="json")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert 'attachment; filename="subject-trail-' in response["Content-Disposition"]
    document = json.loads(response.content)
    assert document["decrypted"] is True
    data = {r["ref"]: r["data"] for r in document["records"]}
    assert data["lead:call_7f3c"]["payload"]["call"]["from_number"] == PHONE
    assert data["quote:q-77"]["response_body"] == {"phone": PHONE}
    assert data["quote:q-12"]["payload"] is None  # redacted before: nothing to give
    row = AccessLog.objects.get(action="export", object_type="subject")
    assert row.fields == ["data in clear", "json export"] and "AR-2291" in row.reason
    # The export is in the trail; a masked CSV export holds none of her values.
    csv_response = make_client(tenant, ["audit"]).post(
        "/api/v1/subjects/export", {**WHO, "reason": "AR-2291 masked copy", "format": "csv"}, format="json"
    )
    assert csv_response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(csv_response.content.decode())))
    assert rows[0] == ["section", "at", "record_type", "record_id", "record", "event", "actor", "detail", "data"]
    assert {r[0] for r in rows[1:]} == {"record", "event"}
    assert any(r[5] == "exported" and "data in clear" in r[7] for r in rows[1:])
    assert not found(csv_response.content.decode(), IDENTIFIERS)
    events = _trail(api)["events"]
    assert [e["event"] for e in events].count("exported") == 2


def test_the_console_page_shows_the_trail_and_exports_only_for_those_allowed(world, tenant):
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    form = {"tenant": tenant.pk, "email": EMAIL, "phone": "", "reason": "Access request AR-2291 (APP 12)"}
    page = auditor.post("/admin/onceguard/subjects/trail/", {**form, "action": "trail"})
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    html = page.content.decode()
    assert 'data-testid="trail-events"' in html and "lead:call_7f3c" in html and "quote:q-3" in html
    assert 'data-testid="erase"' not in html  # auditors see, never erase
    # Her e-mail is on the page only inside the form field she typed it in (never in a link).
    assert html.count(EMAIL) == 1 and f'value="{EMAIL}"' in html
    assert (
        auditor.post("/admin/onceguard/subjects/trail/", {**form, "action": "erase", "confirm_erase": "on"}).status_code
        == 403
    )
    assert (
        auditor.post("/admin/onceguard/subjects/trail/", {**form, "action": "export_json", "decrypt": "on"}).status_code
        == 403
    )
    masked = auditor.post("/admin/onceguard/subjects/trail/", {**form, "action": "export_csv"})
    assert masked.status_code == 200 and not found(masked.content.decode(), IDENTIFIERS)
    admin = client_for(staff("ada2", role="admin", tenants=[tenant]))
    clear = admin.post("/admin/onceguard/subjects/trail/", {**form, "action": "export_json", "decrypt": "on"})
    assert EMAIL in clear.content.decode()
    assert AccessLog.objects.get(action="export", actor="user:ada2").fields == ["data in clear", "json export"]
    # A reviewer has no business here.
    reviewer = client_for(staff("rev", role="reviewer", tenants=[tenant]))
    assert reviewer.post("/admin/onceguard/subjects/trail/", {**form, "action": "trail"}).status_code == 403
    # A tenant the user does not work for is not a choice.
    refused = auditor.post("/admin/onceguard/subjects/trail/", {**form, "tenant": tenant.pk + 999, "action": "trail"})
    assert refused.status_code == 200 and 'data-testid="trail-events"' not in refused.content.decode()


# --- Erasure ----------------------------------------------------------------------------------------


def _stored_files() -> dict[str, bytes]:
    """Every file the service keeps: under its var directory (keys, and on SQLite the database
    itself, checkpointed and vacuumed first so the file holds only what its tables hold) and
    in its object storages (uploads, outputs, quarantine; each test has folders of its own).
    Other databases in the var directory (the development one, other runs') are not this
    run's. PostgreSQL's files are the server's: its tables are scanned instead, and the space
    of old row versions is reclaimed by (auto)vacuum (docs/design.md §8)."""
    ours: set[Path] = set()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            cursor.execute("VACUUM")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        name = Path(connection.settings_dict["NAME"]).resolve()
        ours = {name, Path(f"{name}-wal"), Path(f"{name}-shm")}
    roots = {Path(settings.VAR_DIR)}
    for storage in (objects.objects_storage(), objects.quarantine_storage()):
        roots.add(Path(storage.location))
    files = {}
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or (".sqlite3" in path.name and path.resolve() not in ours):
                continue
            files[str(path)] = path.read_bytes()
    if ours:
        assert str(min(ours, key=lambda p: len(str(p)))) in files
    return files


def _output_files() -> str:
    """The text of the files in the objects storage (where published outputs live)."""
    root = Path(objects.objects_storage().location)
    return "\n".join(p.read_bytes().decode("utf-8", errors="replace") for p in root.rglob("*") if p.is_file())


def test_an_erase_run_leaves_nothing_of_that_person_anywhere(world, make_client, tenant, captured, caplog):  # noqa: F811
    caplog.set_level("DEBUG")
    subject = subject_resolve(WHO["identifiers"])
    assert SubjectIndex.objects.filter(digest__in=subject.digests).exists()
    before = database_text()
    # The scan sees what is sealed: before the erasure her values are found once decrypted.
    assert found(before["ledger_operation"], MARKERS) and found(before["dlq_failedevent"], MARKERS)
    assert found(before["dlq_replay"], ("Priya Raman",))
    # The file scan sees stored files: the quote's output names her.
    assert found(_output_files(), ("Priya Raman",))
    response = make_client(tenant, ["admin"]).post(
        "/api/v1/subjects/erasures", {**WHO, "reason": "Erasure request ER-17, verified by phone"}, format="json"
    )
    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    assert response.json()["state"] == "pending" and response.json()["records"] == 7
    # The same request again while it is open answers the same run.
    again = make_client(tenant, ["admin"]).post(
        "/api/v1/subjects/erasures", {**WHO, "reason": "Erasure request ER-17 again"}, format="json"
    )
    assert again.status_code == 200 and again.json()["id"] == run_id
    # The django-q2 task (what a worker runs).
    assert erasure_run_task(run_id)["state"] == "done"
    run = ErasureRun.objects.get(pk=run_id)
    assert run.state == ErasureState.DONE and run.digests == [] and run.finished_at is not None
    assert (run.operations, run.failed_events, run.replays, run.outputs, run.missing) == (5, 2, 1, 1, 0)
    assert run.texts >= 3 and run.index_entries >= 6 and run.discarded >= 2
    assert not found(run.subject_ref + run.reason + run.actor, MARKERS)

    # Nothing of her in any column of any table, sealed values decrypted …
    after = database_text()
    leaks = {table: found(text, MARKERS) for table, text in after.items() if found(text, MARKERS)}
    assert leaks == {}
    # … while the other person's records are whole (the scan would have seen hers).
    assert found(after["ledger_operation"], OTHER_MARKERS) == list(OTHER_MARKERS)
    # Her index entries are gone; the audit trail and the digests stay.
    assert not SubjectIndex.objects.filter(digest__in=subject.digests).exists()
    assert not SubjectIndex.objects.filter(record_type="operations", record_id=world.lead.pk).exists()
    assert SubjectIndex.objects.filter(record_type="operations", record_id=world.other.pk).exists()
    lead = Operation.objects.get(pk=world.lead.pk)
    assert lead.status == "failed" and lead.events.count() >= 2
    assert crypto.is_redacted(lead.payload) and lead.payload["_redacted"]["erasure"] == run_id
    assert lead.payload["_redacted"]["hmac"] and "[erased]" in lead.last_error
    assert Tombstone.objects.filter(tenant=tenant, key="quote:q-3").exists()
    assert FailedEvent.objects.get(pk=world.ingested.pk).status == "discarded"
    # Logs of the whole test (every logger at DEBUG, plain and JSON) and pytest's capture.
    log_text = "\n".join(captured.lines + captured.json_lines) + caplog.text
    assert "erasure_pass" in log_text and not found(log_text, MARKERS)
    # Stored files.
    for name, content in _stored_files().items():
        assert not found(content.decode("utf-8", errors="replace"), MARKERS), name

    # The trail still finds what happened, by the same identifiers — and shows the erasure.
    subject_trail_after = subject_trail(tenant_id=tenant.pk, subject=subject_resolve(WHO["identifiers"]))
    kinds = [e.event for e in subject_trail_after.events]
    assert "erasure requested" in kinds and kinds[-1] == "erased"
    assert subject_trail_after.records == [] and subject_trail_after.erased
    api_run = make_client(tenant, ["audit"]).get(f"/api/v1/subjects/erasures/{run_id}").json()
    assert api_run["state"] == "done" and api_run["counts"]["operations"] == run.operations
    assert (
        make_client(tenant, ["audit"])
        .post("/api/v1/subjects/erasures", {**WHO, "reason": "auditors may not erase"}, format="json")
        .status_code
        == 403
    )


def _erased_by(target: tuple[str, int], run_id: int) -> bool:
    """Whether every stored payload column of the record carries this erasure's marker."""
    record_type, pk = target
    if record_type == "operations":
        op = Operation.objects.get(pk=pk)
        values = [op.payload, op.request, op.response_body]
    else:
        values = [FailedEvent.objects.get(pk=pk).payload]
    stored = [v for v in values if v is not None]
    return bool(stored) and all(crypto.is_redacted(v) and v["_redacted"].get("erasure") == run_id for v in stored)


def test_an_erase_interrupted_midway_continues_where_it_stopped(world, tenant, monkeypatch):
    subject = subject_resolve(WHO["identifiers"])
    run, created = erasure.erasure_request(
        tenant_id=tenant.pk, subject=subject, actor="user:ada", reason="Erasure request ER-18", enqueue=False
    )
    assert created and run.state == ErasureState.PENDING
    targets = [tuple(t) for t in run.targets]
    # The process dies while erasing the 5th record (batches of 2: the 3rd batch).
    real = dict(erasure.ERASERS)
    calls = {"n": 0}

    def dying(kind: str) -> Any:
        def erase(run: ErasureRun, pk: int, now: Any) -> bool:
            calls["n"] += 1
            if calls["n"] == 5:
                raise RuntimeError("worker killed")
            return real[kind](run, pk, now)

        return erase

    monkeypatch.setattr(erasure, "ERASERS", {k: dying(k) for k in real})
    with pytest.raises(RuntimeError):
        erasure.erasure_continue(run_id=run.pk, batch_size=2)
    stopped = ErasureRun.objects.get(pk=run.pk)
    assert stopped.state == ErasureState.RUNNING and stopped.cursor == 4 and stopped.error == "RuntimeError"
    done_first = stopped.operations + stopped.failed_events + stopped.missing
    assert done_first == 4
    # The first two batches are erased; the batch under way rolled back whole.
    assert [_erased_by(t, run.pk) for t in targets] == [True] * 4 + [False] * (len(targets) - 4)
    # Re-run (the task again, after the crash): it continues at the cursor.
    monkeypatch.setattr(erasure, "ERASERS", real)
    assert erasure_run_task(run.pk)["state"] == "done"
    finished = ErasureRun.objects.get(pk=run.pk)
    assert finished.passes == 2 and finished.cursor == len(targets)
    # Each record counted once, across both passes, and each erased.
    assert finished.operations + finished.failed_events + finished.missing == len(targets)
    assert all(_erased_by(t, run.pk) for t in targets if t[1] != world.old.pk)
    assert not found("\n".join(database_text().values()), MARKERS)
    # A stalled open run is picked up by the purge schedule's recovery.
    stale, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": OTHER_EMAIL}),
        actor="user:ada",
        reason="Erasure request ER-19",
        enqueue=False,
    )
    ErasureRun.objects.filter(pk=stale.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert erasure.erasures_resume_stalled() == [stale.pk]


def test_the_console_erases_with_a_confirmation_and_shows_the_run(world, tenant):
    admin = client_for(staff("ada3", role="admin", tenants=[tenant]))
    form = {"tenant": tenant.pk, "email": EMAIL, "reason": "Erasure request ER-20", "action": "erase"}
    unconfirmed = admin.post("/admin/onceguard/subjects/trail/", form)
    assert "Tick the confirmation" in unconfirmed.content.decode() and not ErasureRun.objects.exists()
    page = admin.post("/admin/onceguard/subjects/trail/", {**form, "confirm_erase": "on"}, follow=True)
    run = ErasureRun.objects.get()
    assert run.actor == "user:ada3" and 'data-testid="trail-erasures"' in page.content.decode()
    erasure_run_task(run.pk)
    shown = admin.post("/admin/onceguard/subjects/trail/", {**form, "action": "trail"}).content.decode()
    assert "erased" in shown and "erasure requested" in shown


# --- Retention: defaults and floors ---------------------------------------------------------------


def test_tenant_policies_cannot_go_below_the_platform_floor(tenant):
    with pytest.raises(ValidationFailed, match="at least"):
        retention_policy_save(
            tenant_id=tenant.pk, record_type="operations", record_ttl=timedelta(days=10), actor="user:ada"
        )
    with pytest.raises(ValidationFailed, match="at least"):
        retention_policy_save(
            tenant_id=tenant.pk, record_type="failed_events", payload_ttl=timedelta(hours=2), actor="user:ada"
        )
    policy = retention_policy_save(
        tenant_id=tenant.pk,
        record_type="operations",
        payload_ttl=timedelta(days=7),
        record_ttl=timedelta(days=90),
        actor="user:ada",
    )
    assert policy.record_ttl == timedelta(days=90)


def test_a_tenant_without_a_policy_gets_the_documented_defaults(tenant):
    crm = enforced_provider(tenant)
    old = succeeded_op(tenant, crm, "k:old", payload={"email": EMAIL})
    fresh = succeeded_op(tenant, crm, "k:fresh", payload={"email": EMAIL})
    past = timezone.now() - timedelta(days=31)
    Operation.objects.filter(pk=old.pk).update(updated_at=past, done_at=past)
    assert not RetentionPolicy.objects.exists()
    run = retention_purge_tenant(tenant_id=tenant.pk)
    assert run is not None and run.details["operations"]["policy"] == "default"
    assert crypto.is_redacted(Operation.objects.get(pk=old.pk).payload)
    assert crypto.is_sealed(Operation.objects.get(pk=fresh.pk).payload)
    assert Operation.objects.get(pk=old.pk).payload["_redacted"]["policy"] == "default"
    services.tenant_create(slug="later")  # (a new tenant is covered by the same defaults)


def test_a_configured_identifier_kind_finds_its_records_and_is_a_field_on_the_page(tenant, make_client, settings):
    settings.ONCEGUARD_PRIVACY = {**getattr(settings, "ONCEGUARD_PRIVACY", {}), "SUBJECT_KEYS": {"member_no": "member"}}
    crm = enforced_provider(tenant)
    mine = succeeded_op(tenant, crm, "renewal:m-1", payload={"member_no": " M-0042917 ", "plan": "gold"})
    succeeded_op(tenant, crm, "renewal:m-2", payload={"member_no": "M-0000001"})
    body = make_client(tenant, ["audit"]).post(
        "/api/v1/subjects/trail", {"identifiers": {"member": "M-0042917"}, "reason": "AR-3001 member"}, format="json"
    )
    assert [r["ref"] for r in body.json()["records"]] == [mine.key]
    auditor = client_for(staff("aud-m", role="auditor", tenants=[tenant]))
    assert 'name="id_member"' in auditor.get("/admin/onceguard/subjects/trail/").content.decode()
