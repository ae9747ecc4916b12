"""Payloads are encrypted at rest and masked everywhere; a reveal needs view_payload and a
reason, and leaves a hash-chained AccessLog row; the API reveal needs the `payload` scope."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from dlq.models import FailedEvent
from ledger.models import Operation, bytes_to_sealed
from ledger.platform import crypto
from review.models import AccessLog, SubjectIndex
from review.privacy import payloads as privacy
from review.privacy.keys import encryption_rotate
from tests.console.support import (
    MARKERS,
    client_for,
    enforced_provider,
    example,
    failed_op,
    page,
    staff,
    succeeded_op,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _raw(table: str, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])
        value = cursor.fetchone()[0]
    if isinstance(value, (bytes, memoryview)):
        # The ledger's sealed columns on PostgreSQL (ledger.models.SealedJSONField): the bytes
        # as stored, and the envelope they hold.
        raw = bytes(value)
        return raw.decode("latin-1") + "\n" + json.dumps(bytes_to_sealed(raw))
    return value if isinstance(value, str) else json.dumps(value)


@pytest.fixture
def lead(tenant: Any) -> Operation:
    provider = enforced_provider(tenant)
    return failed_op(tenant, provider, "lead:call_7f3c", payload=example("voice-call-analyzed.json"))


def test_payloads_and_recorded_responses_are_ciphertext_in_the_database(tenant):
    provider = enforced_provider(tenant)
    op = succeeded_op(
        tenant,
        provider,
        "k1",
        payload=example("voice-call-analyzed.json"),
        response={"email": "priya.raman@example.invalid"},
    )
    for column in ("payload", "response_body"):
        stored = _raw("ledger_operation", column, op.pk)
        assert '"_enc": "v2:' in stored.replace('":"', '": "') or '"_enc":"v2:' in stored
        assert not any(marker in stored for marker in MARKERS), column
    # The owner's API still gets its recorded outcome back (DESIGN §5 replay).
    assert crypto.open_json(Operation.objects.get(pk=op.pk).response_body) == {"email": "priya.raman@example.invalid"}


def test_the_dlq_copy_of_a_failed_operation_is_sealed_too(lead):
    event = FailedEvent.objects.get(operation=lead)
    stored = _raw("dlq_failedevent", "payload", event.pk)
    assert "_enc" in stored and not any(m in stored for m in MARKERS)


def test_operation_and_dlq_pages_show_the_shape_but_no_value(tenant, lead):
    client = client_for(staff("op", role="operator", tenants=[tenant]))
    event = FailedEvent.objects.get(operation=lead)
    for url in (
        f"/admin/ledger/operation/{lead.pk}/change/",
        f"/admin/dlq/failedevent/{event.pk}/change/",
        "/admin/ledger/operation/",
        "/admin/dlq/failedevent/",
    ):
        status, body = page(client, url)
        assert status == 200, url
        assert not any(m in body for m in MARKERS), url
    _, body = page(client, f"/admin/ledger/operation/{lead.pk}/change/")
    assert "from_number" in body and "‹text·12›" in body  # keys shown, values replaced


def test_a_reviewer_without_view_payload_cannot_reveal(tenant, lead):
    client = client_for(staff("rev", role="reviewer", tenants=[tenant]))
    _, body = page(client, f"/admin/ledger/operation/{lead.pk}/change/")
    assert 'data-testid="no-reveal"' in body and 'data-testid="reveal-link"' not in body
    url = f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/"
    assert client.get(url).status_code == 403
    response = client.post(url, {"fields_wanted": ["payload"], "reason": "I just want to see it"})
    assert response.status_code == 403
    assert not any(m in response.content.decode() for m in MARKERS)
    assert AccessLog.objects.count() == 0


def test_reveal_needs_a_reason_then_shows_the_value_and_logs_who_what_why_when_where(tenant, lead):
    user = staff("ada", role="admin", tenants=[tenant])
    client = client_for(user)
    url = f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/"
    short = client.post(url, {"fields_wanted": ["payload"], "reason": "why"})
    assert "Priya" not in short.content.decode() and AccessLog.objects.count() == 0
    response = client.post(
        url, {"fields_wanted": ["payload"], "reason": "Ticket OPS-142: lead missing in CRM"}, REMOTE_ADDR="10.1.2.3"
    )
    body = response.content.decode()
    assert response.status_code == 200 and "Priya Raman" in body and "+61412345678" in body
    assert "no-store" in response["Cache-Control"]
    entry = AccessLog.objects.get()
    assert (entry.actor, entry.user_id_at_time, entry.tenant_id) == ("user:ada", user.pk, tenant.pk)
    assert (entry.object_type, entry.object_id, entry.object_ref) == ("ledger.operation", str(lead.pk), lead.key)
    assert entry.fields == ["payload"] and entry.reason == "Ticket OPS-142: lead missing in CRM"
    assert entry.ip == "10.1.2.3" and entry.at is not None and entry.seq == 1


def test_reveal_of_another_tenants_record_is_a_404_even_with_view_payload(tenant, other_tenant):
    theirs = failed_op(other_tenant, enforced_provider(other_tenant), "x", payload={"email": "a@b.invalid"})
    client = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = client.post(
        f"/admin/onceguard/reveal/ledger/operation/{theirs.pk}/",
        {"fields_wanted": ["payload"], "reason": "long enough reason"},
    )
    assert response.status_code == 404 and AccessLog.objects.count() == 0


def test_reveal_post_without_csrf_token_is_refused(tenant, lead):
    from django.test import Client

    user = staff("ada", role="admin", tenants=[tenant])
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(
        f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/",
        {"fields_wanted": ["payload"], "reason": "long enough reason"},
    )
    assert response.status_code == 403 and AccessLog.objects.count() == 0


def test_auditor_lists_filters_and_exports_the_access_log_as_csv(tenant, lead):
    admin_client = client_for(staff("ada", role="admin", tenants=[tenant]))
    admin_client.post(
        f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/",
        {"fields_wanted": ["payload"], "reason": "Ticket OPS-142 follow-up"},
    )
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    status, body = page(auditor, "/admin/review/accesslog/", data={"action__exact": "reveal"})
    assert status == 200 and "user:ada" in body and "Ticket OPS-142 follow-up" in body
    status, text = page(auditor, "/admin/review/accesslog/export.csv", data={"action__exact": "reveal"})
    rows = list(csv.reader(io.StringIO(text)))
    assert status == 200 and rows[0][:3] == ["At", "Tenant", "Actor"]
    assert any("user:ada" in r and "Ticket OPS-142 follow-up" in r for r in rows[1:])
    # The export itself is an access: it is logged (and chained) too.
    assert AccessLog.objects.filter(action="export", actor="user:aud").count() == 1


def test_the_access_log_chain_verifies_and_any_edit_or_deletion_is_detected(tenant):
    for n in range(5):
        privacy.accesslog_append(
            tenant_id=tenant.pk,
            action="reveal",
            actor="user:x",
            object_type="ledger.operation",
            object_id=str(n),
            reason=f"reason number {n}",
            ip="127.0.0.1",
        )
    out = io.StringIO()
    call_command("accesslog_verify", stdout=out)
    assert "5 rows verified" in out.getvalue()
    AccessLog.objects.filter(seq=3).update(reason="nothing to see")
    with pytest.raises(CommandError, match="BROKEN"):
        call_command("accesslog_verify", stdout=io.StringIO(), stderr=io.StringIO())
    AccessLog.objects.filter(seq=3).delete()
    checked, problems = privacy.accesslog_verify()
    assert {p.seq for p in problems} == {4}


def test_access_log_rows_cannot_be_added_changed_or_deleted_in_the_console_even_by_a_superuser(tenant):
    from django.contrib.auth.models import User

    privacy.accesslog_append(
        tenant_id=tenant.pk, action="reveal", actor="user:x", object_type="t", reason="reason long", ip=None
    )
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    entry = AccessLog.objects.get()
    assert root.get("/admin/review/accesslog/add/").status_code == 403
    assert root.post(f"/admin/review/accesslog/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    root.post(f"/admin/review/accesslog/{entry.pk}/change/", {"reason": "edited"})
    assert AccessLog.objects.get().reason == "reason long"
    assert root.get("/admin/ledger/operation/add/").status_code == 403
    # Attempts and events have console pages without any add page (review.console.history_pages).
    for url in ("/admin/ledger/attempt/add/", "/admin/ledger/operationevent/add/"):
        assert root.get(url).status_code == 404, url


# --- API reveal ------------------------------------------------------------------------------------


def test_api_reveal_needs_the_payload_scope_and_a_reason_and_logs_the_key(tenant, lead, make_client):
    url = f"/api/v1/operations/{lead.pk}/payload"
    for scopes in (["read"], ["read", "write", "admin"]):
        assert make_client(tenant, scopes).post(url, {"reason": "support ticket 7"}, format="json").status_code == 403
    api = make_client(tenant, ["read", "payload"])
    assert api.post(url, {}, format="json").status_code == 400
    response = api.post(
        url, {"reason": "support ticket 7", "fields": ["payload"]}, format="json", REMOTE_ADDR="10.9.8.7"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["fields"]["payload"]["call"]["from_number"] == "+61412345678"
    entry = AccessLog.objects.get()
    assert entry.actor.startswith("apikey:") and entry.reason == "support ticket 7" and entry.ip == "10.9.8.7"
    assert body["access_log"]["seq"] == entry.seq and "no-store" in response["Cache-Control"]


def test_api_reveal_of_another_tenants_operation_is_a_404(tenant, other_tenant, lead, make_client):
    api = make_client(other_tenant, ["payload"])
    url = f"/api/v1/operations/{lead.pk}/payload"
    assert api.post(url, {"reason": "support ticket 7"}, format="json").status_code == 404
    assert AccessLog.objects.count() == 0


def test_api_reveal_of_a_dlq_entry(tenant, lead, make_client):
    event = FailedEvent.objects.get(operation=lead)
    response = make_client(tenant, ["payload"]).post(
        f"/api/v1/dlq/events/{event.pk}/payload", {"reason": "replay check 12"}, format="json"
    )
    assert response.status_code == 200 and response.json()["fields"]["payload"]["event_type"] == "call_analyzed"


def test_operation_api_output_never_carries_the_payload(tenant, lead, make_client):
    body = make_client(tenant, ["read", "admin"]).get(f"/api/v1/operations/{lead.pk}").json()
    assert "payload" not in body and not any(m in json.dumps(body) for m in MARKERS)


# --- Data-subject search ---------------------------------------------------------------------------


def test_subject_index_holds_keyed_digests_only_and_finds_records_by_phone_or_email(tenant, other_tenant, lead):
    stored = list(SubjectIndex.objects.values_list("digest", flat=True))
    assert stored and not any(m in d for d in stored for m in MARKERS)
    event = FailedEvent.objects.get(operation=lead)
    # The same person, written differently.
    hits = privacy.subject_search(tenant_ids=[tenant.pk], phone="0061 412 345 678")
    assert hits.operation_ids == [lead.pk] and event.pk in hits.failed_event_ids
    assert privacy.subject_search(tenant_ids=[tenant.pk], email=" Priya.Raman@Example.INVALID ").operation_ids == [
        lead.pk
    ]
    assert privacy.subject_search(tenant_ids=[other_tenant.pk], phone="+61412345678").operation_ids == []


def test_subject_search_page_needs_a_reason_and_logs_no_identifier(tenant, lead):
    client = client_for(staff("aud", role="auditor", tenants=[tenant]))
    response = client.post("/admin/onceguard/subjects/", {"phone": "+61 412 345 678", "reason": "APP 12 request #2291"})
    body = response.content.decode()
    assert response.status_code == 200 and lead.key in body
    entry = AccessLog.objects.get(action="subject_search")
    assert entry.reason == "APP 12 request #2291" and entry.fields == ["phone"]
    assert "412" not in entry.object_ref and "412" not in entry.reason


def test_a_dlq_entry_ingested_from_n8n_is_indexed_and_found(tenant, make_client):
    voice = example("voice-call-analyzed.json")
    api = make_client(tenant, ["read", "write"])
    r = api.post(
        "/api/v1/dlq/events", {"event_id": "evt-1", "payload": voice, "error": {"message": "429"}}, format="json"
    )
    assert r.status_code in (200, 201), r.content
    hits = privacy.subject_search(tenant_ids=[tenant.pk], email="priya.raman@example.invalid")
    assert hits.failed_event_ids == [r.json()["id"]]


# --- Keys ---------------------------------------------------------------------------------------------


def test_rotation_reencrypts_under_the_new_key_and_the_old_key_can_then_be_dropped(tenant, monkeypatch):
    old_spec = f"old1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, old_spec)
    provider = enforced_provider(tenant, "crm2")
    op = succeeded_op(tenant, provider, "rot-1", payload=example("crm-create-contact-request.json"))
    assert crypto.key_id_of(Operation.objects.get(pk=op.pk).payload) == "old1"
    new_spec = f"new1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, f"{new_spec},{old_spec}")
    assert crypto.open_json(Operation.objects.get(pk=op.pk).payload)["body"]["firstName"] == "Priya"
    report = encryption_rotate(batch_size=2)
    assert report["ledger.Operation"]["resealed"] >= 1
    assert crypto.key_id_of(Operation.objects.get(pk=op.pk).payload) == "new1"
    assert encryption_rotate(dry_run=True)["ledger.Operation"]["stale"] == 0
    assert set(
        SubjectIndex.objects.filter(record_id=op.pk, record_type="operations").values_list("key_id", flat=True)
    ) == {"new1"}
    monkeypatch.setenv(crypto.KEYS_ENV, new_spec)
    assert crypto.open_json(Operation.objects.get(pk=op.pk).payload)["body"]["email"] == "priya.raman@example.invalid"
    assert privacy.subject_search(tenant_ids=[tenant.pk], phone="+61412345678").operation_ids == [op.pk]


def test_legacy_fernet_values_still_open_and_rotation_rewrites_them_as_v2(tenant, monkeypatch):
    spec = f"same1:{Fernet.generate_key().decode()}"
    monkeypatch.setenv(crypto.KEYS_ENV, spec)
    provider = enforced_provider(tenant, "crm3")
    op = succeeded_op(tenant, provider, "legacy-1", payload=example("crm-create-contact-request.json"))
    ring = crypto.keyring()
    # A value as the first format (v1, a Fernet token) wrote it, under the same key.
    blob = json.dumps({"email": "priya.raman@example.invalid"}).encode()
    legacy = {crypto.ENVELOPE: f"v1:same1:{ring.fernets['same1'].encrypt(blob).decode()}"}
    Operation.objects.filter(pk=op.pk).update(response_body=legacy)
    assert crypto.open_json(Operation.objects.get(pk=op.pk).response_body) == {"email": "priya.raman@example.invalid"}
    assert encryption_rotate(dry_run=True)["ledger.Operation"]["stale"] == 1
    encryption_rotate()
    stored = Operation.objects.get(pk=op.pk).response_body
    assert stored[crypto.ENVELOPE].startswith("v2:same1:")
    assert crypto.open_json(stored) == {"email": "priya.raman@example.invalid"}


def test_a_tampered_or_foreign_envelope_is_refused_with_a_clear_error(monkeypatch):
    monkeypatch.setenv(crypto.KEYS_ENV, f"mine1:{Fernet.generate_key().decode()}")
    sealed = crypto.seal_json({"phone": "+61412345678"})
    head, _, token = sealed[crypto.ENVELOPE].rpartition(":")
    flipped = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    for bad in (f"{head}:{flipped}", f"v2:other1:{token}", f"v9:mine1:{token}", "v2:mine1:"):
        with pytest.raises(crypto.EncryptionKeyError) as err:
            crypto.open_json({crypto.ENVELOPE: bad})
        assert "+614" not in str(err.value)


def test_the_embedded_default_generates_a_key_file_once(tmp_path, settings, monkeypatch, caplog):
    monkeypatch.delenv(crypto.KEYS_ENV, raising=False)
    settings.VAR_DIR = tmp_path
    ring = crypto.keyring()
    path = tmp_path / "encryption.key"
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    assert str(path) in caplog.text
    assert crypto.keyring().current_id == ring.current_id
