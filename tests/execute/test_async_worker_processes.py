"""Real worker processes (``manage.py worker``) against the mock image API, killed at the two
instants an asynchronous render can lose its holder: after the provider accepted the job but
before its id was recorded, and after the output was fetched and checked but before it was
published. Each time: one render at the provider, one published file (DESIGN §5,
asynchronous providers). PostgreSQL: several processes share the database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationOutput, OperationStatus
from ledger.protocol.services import provider_upsert
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.conftest import on_postgres
from tests.execute.support import child_env, start_worker, stop_process, wait_until
from tests.execute.test_async_providers import ASK, render_fields
from tests.support.objects import stored_files

S = OperationStatus
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not on_postgres(), reason="worker processes share PostgreSQL"),
]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Short leases (no record-retry budget, a small margin, a short output fetch) so the
    # sweeper's turn comes within seconds; the objects in folders of this test.
    return child_env(
        LOG_LEVEL="INFO",
        WORKER_LEASE_MARGIN_SECONDS="0.2",
        RECORD_RETRY_SECONDS="0",
        OUTPUT_FETCH_TIMEOUT_SECONDS="2",
        OBJECT_STORAGE_DIR=str(tmp_path / "objects"),
        QUARANTINE_STORAGE_DIR=str(tmp_path / "quarantine"),
        **extra,
    )


def _lease_expired(op_id: int) -> bool:
    until = Operation.objects.get(pk=op_id).lease_expires_at
    return until is not None and until < sql.db_now()


def _finish_with_a_fresh_worker(env: dict[str, str], op_id: int) -> str:
    worker = start_worker(env=env, concurrency=2)
    try:
        assert wait_until(lambda: Operation.objects.get(pk=op_id).status == S.SUCCEEDED, timeout=40, interval=0.2)
    finally:
        output = stop_process(worker)
    return output


def test_a_worker_killed_after_the_provider_accepted_the_job_renders_once_and_publishes_once(
    tenant, mock_images, relay_factory, tmp_path
):
    # The relay forwards the submit (the provider creates the job) and holds the answer: the
    # worker is killed while it waits for the job id.
    relay = relay_factory(mock_images)
    relay.script([{"mode": "delay-then-respond", "delay": 30}])
    provider_upsert(
        tenant=tenant, slug="images", **render_fields(relay.url, timeout_seconds=2.0, poll_initial_seconds=0.2)
    )
    op = operation_submit(
        tenant=tenant,
        key="order-1:render:v1",
        provider="images",
        request={"method": "POST", "path": "/v1/renders", "body": ASK},
    ).operation
    env = _env(tmp_path)
    worker = start_worker(env=env, concurrency=2)
    try:
        assert wait_until(lambda: mock_images.effects()["jobs"] == 1, timeout=30)
        held = Operation.objects.get(pk=op.pk)
        assert held.status == S.CLAIMED and held.sent_at is not None and held.provider_ref == ""
        worker.kill()  # SIGKILL: the job id is never recorded
        worker.wait(timeout=5)
    finally:
        stop_process(worker)
    assert wait_until(lambda: _lease_expired(op.pk), timeout=10, interval=0.1)
    report = sweep()  # claimed → uncertain (marker set) → lookup by key: the job → waiting
    found = Operation.objects.get(pk=op.pk)
    assert found.status == S.WAITING and found.provider_ref.startswith("job_"), report.counts
    _finish_with_a_fresh_worker(env, op.pk)
    effects = mock_images.effects()
    assert effects["submits"] == 1 and effects["renders"] == 1 and effects["by_key"] == {"order-1:render:v1": 1}
    assert [entry["method"] for entry in relay.journal() if entry["path"] == "/v1/renders"] == ["POST", "GET"]
    assert OperationOutput.objects.filter(operation_id=op.pk).count() == 1
    assert len(stored_files(tmp_path / "objects")) == 1
    assert stored_files(tmp_path / "quarantine") == []


def test_a_worker_killed_between_the_checked_fetch_and_the_publish_renders_once_and_publishes_once(
    tenant, mock_images, tmp_path
):
    provider_upsert(
        tenant=tenant, slug="images", **render_fields(mock_images.url, timeout_seconds=2.0, poll_initial_seconds=0.2)
    )
    op = operation_submit(
        tenant=tenant,
        key="order-2:render:v1",
        provider="images",
        request={"method": "POST", "path": "/v1/renders", "body": ASK},
    ).operation
    marker = tmp_path / "publishing"
    pausing = _env(
        tmp_path,
        OBJECT_STORAGE_BACKEND="tests.support.slow_storage.PublishPausingStorage",
        OBJECT_STORAGE_OPTIONS=json.dumps({"location": str(tmp_path / "objects"), "pause_marker": str(marker)}),
    )
    worker = start_worker(env=pausing, concurrency=2)
    try:
        # Fetched, quarantined, checked: the publish has begun its write.
        assert wait_until(marker.exists, timeout=40, interval=0.1)
        held = Operation.objects.get(pk=op.pk)
        assert held.status == S.CLAIMED and held.polls >= 1
        assert len(stored_files(tmp_path / "quarantine")) == 1
        worker.kill()
        worker.wait(timeout=5)
    finally:
        stop_process(worker)
    assert stored_files(tmp_path / "objects") == [] and not OperationOutput.objects.exists()
    assert wait_until(lambda: _lease_expired(op.pk), timeout=10, interval=0.1)
    report = sweep()
    assert report.counts.get("claimed->waiting") == 1  # a poll lease: waiting again, not uncertain
    assert Operation.objects.get(pk=op.pk).status == S.WAITING
    _finish_with_a_fresh_worker(_env(tmp_path), op.pk)
    effects = mock_images.effects()
    assert effects["submits"] == 1 and effects["renders"] == 1 and effects["fetches"] == 2
    assert OperationOutput.objects.filter(operation_id=op.pk).count() == 1
    assert len(stored_files(tmp_path / "objects")) == 1
    # The killed holder's quarantined copy is what it leaves; the hourly objects sweep takes it.
    assert len(stored_files(tmp_path / "quarantine")) == 1
