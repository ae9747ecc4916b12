"""An access log nobody can shorten (issue 11 item 5): the platform's retention floor holds
against a tenant admin's policy, the chain is keyed with a server key outside the database,
and signed checkpoints anchor its head, so truncation, deleted tail rows and forged rows are
reported and `accesslog_verify` exits non-zero."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule

from ledger.platform.errors import ValidationFailed
from review.audit import accesslog
from review.audit.accesslog import (
    accesslog_append,
    accesslog_checkpoint,
    accesslog_checkpoint_all,
    accesslog_seal_legacy,
    accesslog_verify,
)
from review.models import AccessLog, AccessLogCheckpoint, RetentionPolicy, RetentionRun
from review.retention.policies import retention_policy_save
from review.retention.purge import retention_purge
from review.schedules import accesslog_checkpoint_task, install_schedules
from tests.console.support import client_for, staff

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)
BASE = Path(__file__).resolve().parents[2]


def _reveals(tenant: Any, n: int) -> list[AccessLog]:
    return [
        accesslog_append(
            tenant_id=tenant.pk,
            action="reveal",
            actor="user:ada",
            object_type="ledger.operation",
            object_id=str(i),
            reason=f"support ticket {i}",
            ip="127.0.0.1",
        )
        for i in range(n)
    ]


def _verify_command() -> tuple[bool, str]:
    err = io.StringIO()
    try:
        call_command("accesslog_verify", stdout=io.StringIO(), stderr=err)
    except CommandError as exc:
        return False, f"{exc}\n{err.getvalue()}"
    return True, err.getvalue()


def _problems(tenant: Any) -> list[str]:
    return [p.problem for p in accesslog_verify(tenant_ids=[tenant.pk])[1]]


# --- The attacks of issue 11 ------------------------------------------------------------------------


def test_a_tenant_admins_one_second_access_log_policy_is_refused_in_the_console_form(tenant):
    admin_client = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = admin_client.post(
        "/admin/review/retentionpolicy/add/",
        {"tenant": tenant.pk, "record_type": "access_log", "record_ttl": "00:00:01", "legal_hold_note": ""},
    )
    assert response.status_code == 200 and "at least 365 days" in response.content.decode()
    assert not RetentionPolicy.objects.exists()


def test_a_one_second_access_log_policy_is_refused_by_the_service(tenant):
    with pytest.raises(ValidationFailed, match="at least 365 days"):
        retention_policy_save(
            tenant_id=tenant.pk, record_type="access_log", record_ttl=timedelta(seconds=1), actor="user:ada"
        )
    policy = retention_policy_save(tenant_id=tenant.pk, record_type="access_log", record_ttl=400 * DAY, actor="u:a")
    assert policy.record_ttl == 400 * DAY


def test_the_purge_erases_no_reveal_younger_than_the_floor_whatever_a_policy_says(tenant):
    # Written straight into the table, past the form and the service: the purge still obeys the floor.
    RetentionPolicy.objects.create(tenant=tenant, record_type="access_log", record_ttl=timedelta(seconds=1))
    _reveals(tenant, 3)
    AccessLog.objects.filter(seq=1).update(at=timezone.now() - 30 * DAY)
    [run] = retention_purge(now=timezone.now() + timedelta(minutes=5))
    assert run.deleted == 0
    assert AccessLog.objects.filter(tenant=tenant).count() == 3
    # Rows past the floor do go, and the chain still verifies from the signed anchor.
    AccessLog.objects.filter(seq=1).update(at=timezone.now() - 366 * DAY)
    [run] = retention_purge()
    assert run.deleted == 1 and list(AccessLog.objects.values_list("seq", flat=True).order_by("seq")) == [2, 3]
    assert AccessLogCheckpoint.objects.filter(tenant=tenant, kind="purge", seq=1).exists()
    assert _problems(tenant) == []


def test_deleting_the_newest_rows_in_sql_is_reported_and_verify_exits_non_zero(tenant):
    _reveals(tenant, 5)
    assert accesslog_checkpoint_all() == 1
    assert _verify_command()[0]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM review_accesslog WHERE tenant_id = %s AND seq >= 4", [tenant.pk])
    ok, text = _verify_command()
    assert not ok and "BROKEN" in text and "row 5" in text and "truncated or rows deleted" in text


def test_deleting_every_row_is_a_truncation_not_an_intact_empty_log(tenant):
    _reveals(tenant, 3)
    accesslog_checkpoint(tenant_id=tenant.pk)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM review_accesslog WHERE tenant_id = %s", [tenant.pk])
    ok, text = _verify_command()
    assert not ok and "0 rows" in text and "truncated" in text


def test_a_forged_row_with_a_recomputed_unkeyed_hash_is_reported(tenant):
    [*_, last] = _reveals(tenant, 2)
    forged = AccessLog(
        tenant_id=tenant.pk,
        seq=last.seq + 1,
        at=timezone.now(),
        action="reveal",
        actor="user:nobody",
        object_type="ledger.operation",
        object_id="99",
        reason="covering tracks",
        prev_hash=last.hash,
        chain_version="v1",
    )
    # The attacker knows the first (unkeyed) format: sha256 of the canonical row.
    forged.hash = hashlib.sha256(accesslog.canonical_access_row(forged).encode()).hexdigest()
    forged.save(force_insert=True)
    assert any("unkeyed (v1) row" in p for p in _problems(tenant))
    # Relabelled as a keyed row, the same unkeyed hash does not match the HMAC either.
    AccessLog.objects.filter(pk=forged.pk).update(chain_version="v2", key_id=last.key_id)
    assert any("does not match its hash" in p for p in _problems(tenant))


def test_an_edited_row_rechained_with_plain_sha256_does_not_verify(tenant):
    rows = _reveals(tenant, 3)
    target = AccessLog.objects.get(pk=rows[1].pk)
    target.reason = "nothing to see"
    target.hash = hashlib.sha256(accesslog.canonical_access_row(target).encode()).hexdigest()
    target.save()
    assert "row content does not match its hash (edited)" in _problems(tenant)


# --- The key ---------------------------------------------------------------------------------------------


def test_rows_are_keyed_hmacs_under_a_key_that_is_not_in_the_database(tenant):
    [row] = _reveals(tenant, 1)
    keys = accesslog.accesslog_keys()
    assert row.chain_version == "v2" and row.key_id == keys.current_id
    assert row.hash != hashlib.sha256(accesslog.canonical_access_row(row).encode()).hexdigest()
    secret = keys.secrets[keys.current_id].decode()
    with connection.cursor() as cursor:
        for table in ("review_accesslog", "review_accesslogcheckpoint"):
            cursor.execute(f"SELECT * FROM {table}")
            assert not any(secret in str(value) for r in cursor.fetchall() for value in r)


def test_rows_keep_verifying_under_an_older_key_after_a_new_one_is_prepended(tenant, monkeypatch):
    monkeypatch.setenv(accesslog.KEYS_ENV, "old1:" + "a" * 40)
    _reveals(tenant, 2)
    accesslog_checkpoint(tenant_id=tenant.pk)
    monkeypatch.setenv(accesslog.KEYS_ENV, "new2:" + "b" * 40 + ",old1:" + "a" * 40)
    [row] = _reveals(tenant, 1)
    assert row.key_id == "new2" and _problems(tenant) == []
    monkeypatch.setenv(accesslog.KEYS_ENV, "new2:" + "b" * 40)
    assert any("not configured" in p for p in _problems(tenant))


def test_the_key_file_is_created_once_with_mode_600_and_never_rewritten(tmp_path, monkeypatch):
    monkeypatch.delenv(accesslog.KEYS_ENV, raising=False)
    path = tmp_path / "var" / "accesslog.key"
    monkeypatch.setenv(accesslog.KEY_FILE_ENV, str(path))
    assert accesslog.accesslog_key_ensure() == path
    first = path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and first.startswith("al1:")
    assert accesslog.accesslog_key_ensure() == path and path.read_text() == first
    assert accesslog.write_secret_file(path, "other") is False and path.read_text() == first
    assert [p.name for p in path.parent.iterdir()] == ["accesslog.key"]  # no temporary file left


def test_make_run_creates_the_key_file_before_starting(tmp_path):
    # `make run` runs `manage.py accesslog_key` right after migrating.
    assert "manage.py accesslog_key" in (BASE / "Makefile").read_text()
    env = {**os.environ, "ONCEGUARD_VAR_DIR": str(tmp_path)}
    env.pop(accesslog.KEYS_ENV, None)
    env.pop(accesslog.KEY_FILE_ENV, None)
    out = subprocess.run(
        [sys.executable, "manage.py", "accesslog_key"], cwd=BASE, env=env, capture_output=True, text=True, timeout=60
    )
    key = tmp_path / "accesslog.key"
    assert out.returncode == 0, out.stderr
    assert key.exists() and stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert key.read_text().strip().partition(":")[2] not in out.stdout + out.stderr


# --- Old rows, checkpoints ----------------------------------------------------------------------------


def _legacy_rows(tenant: Any, n: int) -> list[AccessLog]:
    """Rows as the first (unkeyed) code wrote them."""
    rows, prev = [], accesslog.GENESIS
    for i in range(n):
        row = AccessLog(
            tenant_id=tenant.pk,
            seq=i + 1,
            at=timezone.now() - timedelta(days=3, minutes=n - i),
            action="reveal",
            actor="user:old",
            object_type="ledger.operation",
            object_id=str(i),
            reason=f"old reason {i}",
            prev_hash=prev,
            chain_version="v1",
        )
        row.hash = hashlib.sha256(accesslog.canonical_access_row(row).encode()).hexdigest()
        row.save(force_insert=True)
        rows.append(row)
        prev = row.hash
    return rows


def test_unkeyed_rows_from_before_the_key_still_verify_and_the_first_keyed_row_links_to_them(tenant):
    old = _legacy_rows(tenant, 3)
    # What migration review.0006 runs, with the models it is given.
    assert accesslog_seal_legacy(
        access_log_model=AccessLog, checkpoint_model=AccessLogCheckpoint, retention_run_model=RetentionRun
    )
    [new] = _reveals(tenant, 1)
    assert new.seq == 4 and new.prev_hash == old[-1].hash and new.chain_version == "v2"
    assert _problems(tenant) == []
    # An unkeyed row after the seal is a forgery, even with a correct sha256 and link.
    forged = AccessLog(
        tenant_id=tenant.pk,
        seq=5,
        at=timezone.now(),
        action="reveal",
        actor="user:old",
        object_type="t",
        reason="inserted later",
        prev_hash=new.hash,
        chain_version="v1",
    )
    forged.hash = hashlib.sha256(accesslog.canonical_access_row(forged).encode()).hexdigest()
    forged.save(force_insert=True)
    assert _problems(tenant) == ["unkeyed (v1) row where only keyed rows may be: forged"]


def test_a_legacy_purge_anchor_becomes_a_signed_one(tenant):
    rows = _legacy_rows(tenant, 4)
    run = RetentionRun.objects.create(
        tenant=tenant,
        pass_id="x",
        started_at=timezone.now(),
        accesslog_anchor_seq=2,
        accesslog_anchor_hash=rows[1].hash,
    )
    AccessLog.objects.filter(seq__lte=2).delete()
    accesslog_seal_legacy(
        access_log_model=AccessLog, checkpoint_model=AccessLogCheckpoint, retention_run_model=RetentionRun
    )
    assert run.pk and AccessLogCheckpoint.objects.filter(kind="purge", seq=2).exists()
    assert _problems(tenant) == []


def test_a_deleted_or_forged_checkpoint_is_reported(tenant):
    _reveals(tenant, 1)
    accesslog_checkpoint(tenant_id=tenant.pk)
    _reveals(tenant, 1)
    accesslog_checkpoint(tenant_id=tenant.pk)
    _reveals(tenant, 1)
    accesslog_checkpoint(tenant_id=tenant.pk)
    assert _problems(tenant) == []
    AccessLogCheckpoint.objects.filter(tenant=tenant, n=3).update(seq=1)
    assert any("signature does not match" in p for p in _problems(tenant))
    AccessLogCheckpoint.objects.filter(tenant=tenant, n=2).delete()
    assert any("checkpoint #2 is missing" in p for p in _problems(tenant))


def test_checkpoints_that_stopped_coming_are_reported(tenant):
    [row] = _reveals(tenant, 1)
    # The newest checkpoint is 26 hours old: the daily heartbeat is overdue (or newer ones
    # were deleted, together with the rows they covered).
    accesslog.checkpoint_write(
        tenant_id=tenant.pk, kind="head", seq=row.seq, hash=row.hash, at=timezone.now() - timedelta(hours=26)
    )
    assert any("schedule is not running" in p for p in _problems(tenant))
    accesslog_checkpoint(tenant_id=tenant.pk)
    assert _problems(tenant) == []


def test_old_rows_no_checkpoint_covers_are_reported(tenant):
    _reveals(tenant, 2)
    AccessLog.objects.filter(tenant=tenant).update(at=timezone.now() - timedelta(hours=3))
    problems = [p for p in _problems(tenant) if "covered by no checkpoint" in p]
    assert problems and "2 row(s)" in problems[0]


def test_the_checkpoint_schedule_signs_each_moved_head_once_and_every_purge_signs_too(tenant, other_tenant):
    assert "review.accesslog_checkpoint" in install_schedules()
    schedule = Schedule.objects.get(name="review.accesslog_checkpoint")
    assert schedule.func == "review.schedules.accesslog_checkpoint_task"
    assert schedule.minutes == settings.ONCEGUARD_ACCESS_LOG["CHECKPOINT_MINUTES"]
    _reveals(tenant, 2)
    _reveals(other_tenant, 1)
    assert accesslog_checkpoint_task() == {"checkpoints": 2}
    assert accesslog_checkpoint_task() == {"checkpoints": 0}  # nothing moved
    _reveals(tenant, 1)
    assert accesslog_checkpoint_task() == {"checkpoints": 1}
    RetentionPolicy.objects.create(tenant=tenant, record_type="access_log", record_ttl=400 * DAY)
    _reveals(tenant, 1)
    retention_purge()
    head = AccessLogCheckpoint.objects.filter(tenant=tenant).order_by("-n").first()
    assert head.kind == "head" and head.seq == 4


def test_checkpoints_and_the_keyed_chain_are_read_only_in_the_console(tenant):
    _reveals(tenant, 1)
    cp = accesslog_checkpoint(tenant_id=tenant.pk)
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    assert root.get("/admin/review/accesslogcheckpoint/add/").status_code == 403
    assert root.post(f"/admin/review/accesslogcheckpoint/{cp.pk}/delete/", {"post": "yes"}).status_code == 403
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    response = auditor.get("/admin/review/accesslogcheckpoint/")
    assert response.status_code == 200 and "head" in response.content.decode()
