"""Retention: one purge run redacts payloads past their TTL, deletes records past theirs,
leaves legal holds alone, discards stale pending DLQ entries with an alert first, and leaves
tombstones that keep answering the deleted keys for at least 24 h."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from alerts.models import Alert
from dlq.models import FailedEvent, FailedEventStatus
from dlq.rules.errors import FailedEventBusy
from ledger.models import Attempt, Operation, OperationEvent, OperationStatus, Tombstone
from ledger.platform import crypto
from ledger.platform.errors import KeyReusedWithDifferentRequest
from ledger.protocol import services
from review.models import AccessLog, RetentionPolicy, RetentionRun, SubjectIndex
from review.privacy import payloads as privacy
from review.retention.batches import PurgeBudget, TenantPurge, _keyset_batches
from review.retention.purge import retention_purge, retention_purge_tenant
from tests.console.support import MARKERS, client_for, enforced_provider, example, failed_op, page, staff, succeeded_op

pytestmark = pytest.mark.django_db(transaction=True)
DAY = timedelta(days=1)


def age(model: Any, pk: int, *, days: float, fields: tuple[str, ...]) -> None:
    """Move a row's timestamps ``days`` into the past (as if time had passed)."""
    when = timezone.now() - timedelta(days=days)
    model.objects.filter(pk=pk).update(**{f: when for f in fields})


def age_op(op: Operation, days: float) -> None:
    age(Operation, op.pk, days=days, fields=("created_at", "updated_at", "done_at"))


def age_event(event: FailedEvent, days: float) -> None:
    age(FailedEvent, event.pk, days=days, fields=("failed_at", "updated_at", "last_seen_at"))


@pytest.fixture
def crm(tenant: Any) -> Any:
    return enforced_provider(tenant)


def test_one_run_redacts_past_payload_ttl_deletes_past_record_ttl_and_writes_its_run(tenant, crm):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", payload_ttl=30 * DAY, record_ttl=365 * DAY)
    voice = example("voice-call-analyzed.json")
    fresh = succeeded_op(tenant, crm, "fresh", payload=voice)
    stale_payload = succeeded_op(
        tenant, crm, "month-old", payload=voice, response={"email": "priya.raman@example.invalid"}
    )
    ancient = succeeded_op(tenant, crm, "year-old", payload=voice)
    open_op = services.operation_claim(tenant=tenant, key="still-open", provider=crm, payload=voice).operation
    age_op(stale_payload, 40)
    age_op(ancient, 400)
    age(Operation, open_op.pk, days=400, fields=("created_at", "updated_at"))

    [run] = retention_purge(trigger="test")

    assert (run.status, run.redacted, run.deleted, run.tombstones_created) == ("done", 1, 1, 1)
    assert run.details["operations"]["redacted"] == 1 and run.details["operations"]["deleted"] == 1
    assert crypto.is_sealed(Operation.objects.get(pk=fresh.pk).payload)
    redacted = Operation.objects.get(pk=stale_payload.pk)
    marker = redacted.payload[crypto.REDACTED]
    assert marker["at"] and marker["policy"] and len(marker["hmac"]) == 64 and marker["key_id"]
    assert crypto.is_redacted(redacted.response_body)
    assert not any(m in str(redacted.payload) for m in MARKERS)
    # History stays: the redacted record keeps its events and attempts.
    assert (
        OperationEvent.objects.filter(operation=redacted).exists()
        and Attempt.objects.filter(operation=redacted).exists()
    )
    assert not Operation.objects.filter(pk=ancient.pk).exists()
    # The index keeps its links (keyed digest, id) marked gone, so the person's trail can say
    # "deleted" (review.privacy.subjects); searches find living records only.
    links = SubjectIndex.objects.filter(record_type="operations", record_id=ancient.pk)
    assert links.exists() and not links.filter(gone_at__isnull=True).exists()
    # Open operations are never touched, however old.
    assert crypto.is_sealed(Operation.objects.get(pk=open_op.pk).payload)


def test_legal_hold_keeps_everything(tenant, crm):
    RetentionPolicy.objects.create(
        tenant=tenant,
        record_type="operations",
        payload_ttl=DAY,
        record_ttl=2 * DAY,
        legal_hold=True,
        legal_hold_note="case 17",
    )
    op = succeeded_op(tenant, crm, "held", payload=example("voice-call-analyzed.json"))
    age_op(op, 400)
    [run] = retention_purge()
    assert run.details["operations"]["held"] is True and run.redacted == run.deleted == 0
    assert crypto.is_sealed(Operation.objects.get(pk=op.pk).payload)


def test_a_deleted_key_keeps_answering_from_its_tombstone_and_is_never_recreated(tenant, crm, make_client):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=30 * DAY)
    op = succeeded_op(tenant, crm, "order-1001:charge:v1", payload={"amount": 10})
    age_op(op, 40)
    retention_purge()
    assert not Operation.objects.filter(pk=op.pk).exists()
    stone = Tombstone.objects.get(tenant=tenant, key=op.key)
    assert stone.final_status == "succeeded" and stone.provider_ref == op.provider_ref

    again = services.operation_claim(tenant=tenant, key=op.key, provider=crm, payload={"amount": 10})
    assert again.replayed and not again.acquired
    assert again.operation.status == "succeeded" and again.operation.provider_ref == op.provider_ref
    assert not Operation.objects.filter(tenant=tenant, key=op.key).exists()
    with pytest.raises(KeyReusedWithDifferentRequest):
        services.operation_claim(tenant=tenant, key=op.key, provider=crm, request={"other": True})
    api = make_client(tenant)
    r = api.post("/api/v1/claims", {"key": op.key, "provider": "crm", "payload": {"amount": 10}}, format="json")
    assert r.status_code == 200 and r["Idempotent-Replayed"] == "true" and r.json()["provider_ref"] == op.provider_ref


def test_the_claim_insert_itself_refuses_a_tombstoned_key(tenant, crm):
    # No pre-check in Python: the guard is inside the INSERT (a racing claim cannot slip by).
    now = timezone.now()
    Tombstone.objects.create(
        tenant=tenant,
        key="k-gone",
        operation_id=1,
        mode="guard",
        fingerprint="x",
        final_status="failed",
        created_at=now,
        done_at=now,
        deleted_at=now,
        keep_until=now + DAY,
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM ledger_operation WHERE key = %s", ["k-gone"])
        assert cursor.fetchone()[0] == 0
    with pytest.raises(KeyReusedWithDifferentRequest):
        services.operation_claim(tenant=tenant, key="k-gone", provider=crm)
    assert not Operation.objects.filter(key="k-gone").exists()


def test_tombstones_live_at_least_24h_and_the_providers_key_ttl(tenant, crm):
    long_ttl = services.provider_upsert(
        tenant=tenant,
        slug="stripe",
        base_url="http://127.0.0.1:9",
        idempotency_class="key_enforced",
        key_ttl_seconds=3 * 86400,
    )
    short_ttl = services.provider_upsert(
        tenant=tenant, slug="short", base_url="http://127.0.0.1:9", idempotency_class="key_enforced", key_ttl_seconds=60
    )
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=DAY)
    a = succeeded_op(tenant, long_ttl, "a")
    b = succeeded_op(tenant, short_ttl, "b")
    age_op(a, 2)
    age_op(b, 2)
    retention_purge()
    stones = {t.key: t for t in Tombstone.objects.all()}
    assert stones["a"].keep_until - stones["a"].deleted_at == timedelta(days=3)
    assert stones["b"].keep_until - stones["b"].deleted_at == timedelta(hours=24)  # the 24 h floor
    # Before its time a tombstone survives later runs; after it, it is purged and the key is free.
    retention_purge(now=timezone.now() + timedelta(hours=23))
    assert Tombstone.objects.filter(key="b").exists()
    [run] = retention_purge(now=timezone.now() + timedelta(hours=25))
    assert not Tombstone.objects.filter(key="b").exists() and Tombstone.objects.filter(key="a").exists()
    assert run.tombstones_expired == 1
    assert services.operation_claim(tenant=tenant, key="b", provider=short_ttl).acquired


def test_an_operation_something_still_references_is_not_deleted_but_is_redacted(tenant, crm):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", payload_ttl=DAY, record_ttl=DAY)
    failed = failed_op(tenant, crm, "with-dlq-entry", payload={"x": 1})
    age_op(failed, 10)
    [run] = retention_purge()
    assert Operation.objects.filter(pk=failed.pk).exists() and run.details["operations"]["deleted"] == 0
    assert crypto.is_redacted(Operation.objects.get(pk=failed.pk).payload) and run.redacted == 1


def test_dlq_entries_pending_past_ttl_are_discarded_with_an_alert_first_then_deleted_after_the_grace(
    tenant, crm, settings
):
    settings.ONCEGUARD_RETENTION = {"DISCARD_GRACE_SECONDS": 3600}
    RetentionPolicy.objects.create(tenant=tenant, record_type="failed_events", payload_ttl=7 * DAY, record_ttl=30 * DAY)
    pending = FailedEvent.objects.get(
        operation=failed_op(tenant, crm, "p", payload=example("voice-call-analyzed.json"))
    )
    resolved = FailedEvent.objects.get(
        operation=failed_op(tenant, crm, "r", payload=example("voice-call-analyzed.json"))
    )
    young_resolved = FailedEvent.objects.get(operation=failed_op(tenant, crm, "y", payload={"email": "a@b.invalid"}))
    from dlq.entries.services import failed_event_resolve

    failed_event_resolve(tenant_id=tenant.pk, event_pk=resolved.pk, actor="t", note="fixed by hand")
    failed_event_resolve(tenant_id=tenant.pk, event_pk=young_resolved.pk, actor="t", note="fixed by hand")
    age_event(pending, 40)
    age_event(resolved, 40)
    age_event(young_resolved, 10)

    [run] = retention_purge()
    assert run.discarded == 1 and run.deleted == 1
    pending.refresh_from_db()
    assert pending.status == FailedEventStatus.DISCARDED and pending.status_note.startswith("retention:")
    assert Alert.objects.filter(kind="retention_discarded", ref=pending.event_id).exists()
    assert not FailedEvent.objects.filter(pk=resolved.pk).exists()
    young_resolved.refresh_from_db()
    assert crypto.is_redacted(young_resolved.payload)  # past the 7-day payload TTL, not the record TTL

    # Within the grace the discarded entry stays visible; after it, it goes.
    retention_purge()
    assert FailedEvent.objects.filter(pk=pending.pk).exists()
    FailedEvent.objects.filter(pk=pending.pk).update(updated_at=timezone.now() - timedelta(hours=2))
    retention_purge()
    assert not FailedEvent.objects.filter(pk=pending.pk).exists()


def test_access_log_purge_cuts_a_prefix_and_the_chain_still_verifies_from_the_anchor(tenant):
    RetentionPolicy.objects.create(tenant=tenant, record_type="access_log", record_ttl=400 * DAY)
    for n in range(6):
        privacy.accesslog_append(
            tenant_id=tenant.pk,
            action="reveal",
            actor="user:x",
            object_type="t",
            object_id=str(n),
            reason=f"reason {n} long",
            ip=None,
        )
    AccessLog.objects.filter(seq__lte=4).update(at=timezone.now() - 500 * DAY)
    # Backdating changed the hashed content of rows 1-4 — they are deleted, so that is fine;
    # rows 5-6 are untouched and must verify from the anchor.
    [run] = retention_purge()
    assert run.deleted == 4 and run.accesslog_anchor_seq == 4 and run.accesslog_anchor_hash
    assert list(AccessLog.objects.values_list("seq", flat=True).order_by("seq")) == [5, 6]
    checked, problems = privacy.accesslog_verify()
    assert checked == 2 and problems == []
    entry = privacy.accesslog_append(
        tenant_id=tenant.pk, action="reveal", actor="user:x", object_type="t", reason="after the purge", ip=None
    )
    assert entry.seq == 7 and privacy.accesslog_verify()[1] == []


def test_purge_works_in_bounded_batches_and_reports_partial_runs(tenant, crm):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", record_ttl=DAY)
    ops = [succeeded_op(tenant, crm, f"bulk-{n}") for n in range(7)]
    for op in ops:
        age_op(op, 5)
    run = retention_purge_tenant(tenant_id=tenant.pk, batch_size=3, max_batches=2)
    assert (run.status, run.deleted, run.batches) == ("partial", 6, 2)
    run = retention_purge_tenant(tenant_id=tenant.pk, batch_size=3, max_batches=2)
    assert (run.status, run.deleted) == ("done", 1)
    assert Operation.objects.filter(tenant=tenant).count() == 0 and Tombstone.objects.count() == 7


def test_keyset_batches_visit_every_row_once_across_ties_even_when_the_caller_leaves_them(tenant, crm):
    """Rows sharing the batch column (one timestamp for all) straddle batch boundaries: each
    id comes exactly once, in index order, though nothing changes the rows in between."""
    ops = [succeeded_op(tenant, crm, f"tie-{n}") for n in range(7)]
    Operation.objects.filter(pk__in=[op.pk for op in ops]).update(updated_at=timezone.now() - DAY)
    tp = TenantPurge(
        run=RetentionRun(tenant_id=tenant.pk), now=timezone.now(), budget=PurgeBudget(batch_size=3, max_batches=10)
    )

    batches = list(_keyset_batches(tp, Operation.objects.filter(tenant=tenant), "updated_at"))

    assert [len(b) for b in batches] == [3, 3, 1]
    assert [pk for b in batches for pk in b] == sorted(op.pk for op in ops)
    assert tp.budget.used == 3 and not tp.exhausted


def test_a_stale_pending_entry_that_cannot_be_discarded_is_passed_over_not_retried_until_the_budget_ends(
    tenant, crm, monkeypatch
):
    """A replay holds the entry (FailedEventBusy): the run moves on and finishes ``done``; a
    loop that re-read from the start would take that entry again each batch until the budget
    ran out, and report the run ``partial``."""
    RetentionPolicy.objects.create(tenant=tenant, record_type="failed_events", record_ttl=30 * DAY)
    events = [FailedEvent.objects.get(operation=failed_op(tenant, crm, f"busy-{n}")) for n in range(3)]
    for event in events:
        age_event(event, 40)
    tried: list[int] = []

    def busy(*, event_pk: int, **_: Any) -> None:
        tried.append(event_pk)
        raise FailedEventBusy("being replayed")

    monkeypatch.setattr("review.retention.purge.failed_event_discard", busy)

    run = retention_purge_tenant(tenant_id=tenant.pk, batch_size=2, max_batches=20)

    assert (run.status, run.discarded, run.batches) == ("done", 0, 2)
    assert sorted(tried) == sorted(e.pk for e in events)
    assert set(FailedEvent.objects.values_list("status", flat=True)) == {FailedEventStatus.PENDING}
    assert not Alert.objects.filter(kind="retention_discarded").exists()  # rolled back with the discard


def test_a_redacted_record_says_so_in_the_console_and_keeps_its_history(tenant, crm):
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", payload_ttl=DAY)
    op = succeeded_op(tenant, crm, "redact-me", payload=example("voice-call-analyzed.json"))
    age_op(op, 3)
    retention_purge()
    client = client_for(staff("aud", role="auditor", tenants=[tenant]))
    _, body = page(client, f"/admin/ledger/operation/{op.pk}/change/")
    assert 'data-testid="redacted"' in body and "Destroyed by retention on" in body
    assert "claimed" in body  # the event history is still there
    assert not any(m in body for m in MARKERS)
    _, runs = page(client, "/admin/review/retentionrun/")
    assert "done" in runs


def test_retention_runs_are_scheduled_by_django_q():
    from django_q.models import Schedule

    from review.schedules import install_schedules, retention_purge_task

    assert install_schedules() == ["review.retention_purge", "review.accesslog_checkpoint", "review.activity_rollup"]
    assert Schedule.objects.get(name="review.retention_purge").func == "review.schedules.retention_purge_task"
    assert retention_purge_task() == {"tenants": 0, "redacted": 0, "deleted": 0, "discarded": 0, "erasures_resumed": 0}
    assert RetentionRun.objects.count() == 0
    assert OperationStatus.SUCCEEDED  # (import used)
