"""Uploads outlive the jobs that name them (DESIGN §11, retention): an accepted job raises its
uploads' ``retain_until`` to the end of its lifetime plus its last attempt's lease, retention
keeps an upload until then whatever its TTL, and deletes it on a later pass — so housekeeping
never makes an accepted job impossible. An erasure still deletes, and the job then fails
``invalid_input`` saying why; a correction of an old job whose upload is gone is a 400."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F

from dlq.models import FailedEvent, ReplayOutcome
from dlq.replays.services import failed_event_replay
from ledger.execution import uploads
from ledger.models import ErrorClass, Operation, OperationStatus, Provider, Tenant, Upload
from ledger.protocol.services import provider_upsert
from ledger.store import sql
from review.models import RecordType
from review.retention.policies import retention_policy_save
from review.retention.purge import retention_purge_tenant
from tests.execute.conftest import configure_provider
from tests.execute.support import RenderApi, make_due, run_due, unthrottle, wait_until
from tests.execute.test_intents import INTENT, SCHEMA, TEMPLATE, submit, upload_of
from tests.support.objects import image_bytes, stored_files

S = OperationStatus


@pytest.fixture
def renders(tenant: Tenant, render_api: RenderApi) -> Provider:
    """The intent provider of tests/execute/test_intents.py (lifetime 120 s)."""
    return configure_provider(
        tenant,
        render_api.url,
        slug="renders",
        enforced=True,
        lookup_path="",
        intent_schema=SCHEMA,
        request_template=TEMPLATE,
    )


def _old_upload(tenant: Tenant, side: int = 6) -> Upload:
    """An upload stored ten days ago, past a five-day TTL."""
    source = upload_of(tenant, image_bytes(side, side))
    Upload.objects.filter(pk=source.pk).update(created_at=F("created_at") - timedelta(days=10))
    retention_policy_save(
        tenant_id=tenant.pk, record_type=RecordType.UPLOADS, record_ttl=timedelta(days=5), actor="test"
    )
    return Upload.objects.get(pk=source.pk)


def _naming(source: Upload) -> dict[str, Any]:
    return {**INTENT, "source_key": source.key, "source_sha256": source.sha256}


def _upload_counts(run: Any) -> tuple[int, int]:
    details = run.details[RecordType.UPLOADS]
    return details["deleted"], details["skipped_referenced"]


# On commit: the objects go once the purge's batch commits.
@pytest.mark.django_db(transaction=True)
def test_a_retrying_job_keeps_its_upload_past_the_ttl_succeeds_and_a_pass_after_its_lifetime_deletes_it(
    api, tenant, renders, render_api: RenderApi, object_dirs
):
    source = _old_upload(tenant)
    render_api.statuses = [503]  # the first send fails: the job waits for its retry
    assert submit(api, _naming(source)).status_code == 202
    run_due()
    op = Operation.objects.get()
    assert op.status == S.RETRY_WAIT

    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert _upload_counts(run) == (0, 1)
    assert Upload.objects.filter(pk=source.pk).exists()
    assert stored_files(object_dirs["objects"]) == [source.storage_name]
    make_due(op.pk)
    unthrottle(renders.pk)  # a 503 paused the provider too
    run_due()
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED
    assert render_api.received[-1]["body"]["image"] == {"key": source.key, "sha256": source.sha256}

    # Kept past the job's lifetime by its last attempt's lease, then gone with its bytes.
    retain_until = Upload.objects.get(pk=source.pk).retain_until
    assert op.expires_at < retain_until
    early = retention_purge_tenant(tenant_id=tenant.pk, now=op.expires_at)
    assert _upload_counts(early) == (0, 1)
    late = retention_purge_tenant(tenant_id=tenant.pk, now=retain_until + timedelta(seconds=1))
    assert _upload_counts(late) == (1, 0)
    assert not Upload.objects.exists()
    assert stored_files(object_dirs["objects"]) == []


def test_of_two_jobs_naming_one_upload_the_one_that_can_run_longer_sets_how_long_it_is_kept(
    api, tenant, renders: Provider
):
    source = _old_upload(tenant)
    provider_upsert(tenant=tenant, slug="renders", lifetime_seconds=60)
    assert submit(api, _naming(source), key="short-1:v1").status_code == 202
    short_until = Upload.objects.get(pk=source.pk).retain_until
    provider_upsert(tenant=tenant, slug="renders", lifetime_seconds=3600)
    assert submit(api, _naming(source), key="long:v1").status_code == 202
    long_until = Upload.objects.get(pk=source.pk).retain_until
    # A shorter job after a longer one never lowers it.
    provider_upsert(tenant=tenant, slug="renders", lifetime_seconds=60)
    assert submit(api, _naming(source), key="short-2:v1").status_code == 202

    assert Upload.objects.get(pk=source.pk).retain_until == long_until
    assert long_until - short_until > timedelta(seconds=3500)
    ops = {op.key: op for op in Operation.objects.all()}
    assert ops["short-2:v1"].expires_at < ops["long:v1"].expires_at < long_until
    # Past both short jobs' lifetimes the long one still holds it; past its own, nothing does.
    between = retention_purge_tenant(tenant_id=tenant.pk, now=short_until + timedelta(seconds=120))
    assert _upload_counts(between) == (0, 1) and Upload.objects.filter(pk=source.pk).exists()
    after = retention_purge_tenant(tenant_id=tenant.pk, now=long_until + timedelta(seconds=1))
    assert _upload_counts(after) == (1, 0) and not Upload.objects.exists()


def test_an_upload_no_job_names_is_deleted_by_its_ttl_as_before(api, tenant, renders):
    named = _old_upload(tenant, side=6)
    unnamed = _old_upload(tenant, side=8)
    assert submit(api, _naming(named)).status_code == 202

    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert _upload_counts(run) == (1, 1)
    assert list(Upload.objects.values_list("pk", flat=True)) == [named.pk]
    assert Upload.objects.get(pk=named.pk).retain_until is not None
    assert unnamed.retain_until is None


@pytest.mark.django_db(transaction=True)
def test_a_reupload_of_bytes_past_their_ttl_answers_a_key_the_next_purge_does_not_take(api, tenant, object_dirs):
    source = _old_upload(tenant)

    again = api.generic("POST", "/api/v1/uploads", image_bytes(6, 6), content_type="application/octet-stream")
    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert again.status_code == 200 and again.json()["key"] == source.key
    assert _upload_counts(run) == (0, 1)
    assert api.get(f"/api/v1/uploads/{source.key}/content").status_code == 200
    kept = Upload.objects.get(pk=source.pk).retain_until
    assert kept - run.started_at > timedelta(seconds=uploads.REUPLOAD_RETAIN_SECONDS - 600)
    later = retention_purge_tenant(tenant_id=tenant.pk, now=kept + timedelta(seconds=1))
    assert _upload_counts(later) == (1, 0) and stored_files(object_dirs["objects"]) == []


def test_a_purge_that_read_its_candidates_before_the_submission_still_keeps_the_upload(api, tenant, renders):
    source = _old_upload(tenant)
    # The purge's keyset read (no lock) saw the upload as a candidate; then the job was accepted.
    candidates = [source.pk]
    assert submit(api, _naming(source)).status_code == 202

    with transaction.atomic():
        deleted, kept = uploads.uploads_purge(tenant_id=tenant.pk, upload_ids=candidates, now=sql.db_now())

    assert (deleted, kept) == (0, 1)
    run_due()
    assert Operation.objects.get().status == S.SUCCEEDED


def test_an_erasure_deletes_the_upload_anyway_and_the_job_fails_invalid_input_saying_why(
    api, tenant, renders, render_api
):
    source = upload_of(tenant, image_bytes(7, 7))
    assert submit(api, _naming(source)).status_code == 202
    # What an erasure calls for the uploads a person's jobs named (review.privacy.erasure).
    assert uploads.uploads_delete_named(tenant_id=tenant.pk, keys={source.key}) == 1

    run_due()

    op = Operation.objects.get()
    assert op.status == S.FAILED and op.error_class == ErrorClass.INVALID_INPUT
    assert "(upload_reference_invalid)" in op.last_error
    assert "no longer stored: it was deleted after the job was accepted (by an erasure request" in op.last_error
    assert render_api.received == []


def test_the_same_submission_again_after_its_upload_is_gone_answers_the_recorded_outcome_not_a_400(
    api, tenant, renders, render_api
):
    source = upload_of(tenant, image_bytes(5, 5))
    first = submit(api, _naming(source))
    run_due()
    uploads.uploads_delete(tenant_id=tenant.pk, upload_ids=[source.pk])  # an erasure, later

    again = submit(api, _naming(source))
    other = submit(api, {**_naming(source), "aspect_class": "square"})
    new_key = submit(api, _naming(source), key="render-2:v1")

    assert first.status_code == 202
    assert again.status_code == 200 and again.json()["status"] == S.SUCCEEDED
    assert again.json()["id"] == first.json()["id"]
    # Another request under the key is still a 422, and a new key naming the upload a 400.
    assert other.status_code == 422
    assert new_key.status_code == 400 and new_key.json()["code"] == "upload_reference_invalid"
    assert len(render_api.received) == 1 and Operation.objects.filter(provider__isnull=False).count() == 1


def test_a_replay_or_correction_of_an_old_job_whose_upload_is_gone_is_invalid_input_never_a_5xx(
    api, tenant, renders, render_api
):
    source = upload_of(tenant, image_bytes(9, 9))
    render_api.statuses = [400]  # the provider refuses: failed, in the DLQ
    assert submit(api, _naming(source), key="photo-9:render:v1").status_code == 202
    run_due()
    op = Operation.objects.get()
    assert op.status == S.FAILED
    entry = FailedEvent.objects.get(operation_id=op.pk)
    # Long after: retention (past the job's lifetime) or an erasure took the upload.
    uploads.uploads_delete(tenant_id=tenant.pk, upload_ids=[source.pk])

    replay = failed_event_replay(tenant_id=tenant.pk, event_pk=entry.pk, actor="user:alice", to_provider=True)
    corrected = api.post(
        f"/api/v1/dlq/events/{entry.pk}/correct",
        {"fields": {"intent.aspect_class": "square"}, "note": "square after all"},
        format="json",
    )

    assert replay.outcome == ReplayOutcome.FAILED and replay.error_class == ErrorClass.INVALID_INPUT
    assert "(upload_reference_invalid)" in replay.error_message and "no longer stored" in replay.error_message
    assert corrected.status_code == 400 and corrected["Content-Type"].startswith("application/problem+json")
    assert corrected.json()["code"] == "upload_reference_invalid", corrected.json()["detail"]
    assert len(render_api.received) == 1 and Operation.objects.filter(provider__isnull=False).count() == 1


# --- The race on PostgreSQL -------------------------------------------------------------------


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views answer from a snapshot: take a fresh one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(target())
        except BaseException as exc:  # surfaced by the caller's assertions
            results.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_submission_racing_a_purge_that_locked_the_upload_first_is_refused_not_accepted(
    api, tenant, renders, render_api
):
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    source = _old_upload(tenant)
    with transaction.atomic():
        # The purge holds the row (locked, deleted, not committed) while the job is submitted.
        assert uploads.uploads_purge(tenant_id=tenant.pk, upload_ids=[source.pk], now=sql.db_now()) == (1, 0)
        thread, results = _in_thread(lambda: submit(api, _naming(source)))
        assert wait_until(_blocked_on_a_lock, timeout=20), "the submission never waited for the purge's lock"
    thread.join(timeout=30)

    assert not thread.is_alive()
    (response,) = results
    assert response.status_code == 400 and response.json()["code"] == "upload_reference_invalid"
    assert not Operation.objects.filter(provider__isnull=False).exists()
    assert not Upload.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_purge_waiting_on_a_submissions_lock_keeps_the_upload_and_the_job_succeeds(
    api, tenant, renders, render_api
):
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    source = _old_upload(tenant)

    def purge() -> tuple[int, int]:
        with transaction.atomic():
            return uploads.uploads_purge(tenant_id=tenant.pk, upload_ids=[source.pk], now=sql.db_now())

    with transaction.atomic():
        # The submission's retain UPDATE holds the row (as inside a DLQ correction's transaction).
        assert uploads.uploads_retain(tenant_id=tenant.pk, keys={source.key}, seconds=600) == 1
        thread, results = _in_thread(purge)
        assert wait_until(_blocked_on_a_lock, timeout=20), "the purge never waited for the submission's lock"
    thread.join(timeout=30)
    assert submit(api, _naming(source)).status_code == 202

    assert not thread.is_alive() and results == [(0, 1)]
    run_due()
    assert Operation.objects.get(provider__isnull=False).status == S.SUCCEEDED
