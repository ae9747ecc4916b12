"""The access log's head is witnessed outside the database as it moves: every appended row's
chain hash goes to the structured log stream once committed, and `accesslog_verify --log FILE`
checks the database against those lines, so deleting the newest rows is reported before any
checkpoint has signed them."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from ledger.platform.logs import formatter, logging_config
from review.audit.accesslog import accesslog_append, accesslog_checkpoint_all
from review.models import AccessLog, RetentionPolicy
from review.retention.purge import retention_purge

pytestmark = pytest.mark.django_db(transaction=True)


class _Stream:
    """The service's log stream as a file: the lines of every `onceguard` logger, rendered
    by the deployment's formatter (JSON or key=value)."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.handler = logging.FileHandler(path, encoding="utf-8")
        self.handler.setLevel(logging.INFO)
        self.handler.setFormatter(formatter(fmt))

    def lines(self) -> list[str]:
        self.handler.flush()
        return self.path.read_text().splitlines()

    def witnesses(self) -> list[dict[str, Any]]:
        found = []
        for line in self.lines():
            if line.startswith("{"):
                document = json.loads(line)
                if document["event"] == "accesslog_witness":
                    found.append(document)
        return found


def _stream(tmp_path: Path, fmt: str) -> Iterator[_Stream]:
    stream = _Stream(tmp_path / f"onceguard-{fmt}.log", fmt)
    logger = logging.getLogger("onceguard")
    logger.addHandler(stream.handler)
    try:
        # Another line of the stream between the witnesses, as in a real log.
        logging.getLogger("onceguard.test").warning("unrelated_line detail=%s", "{not json")
        yield stream
    finally:
        logger.removeHandler(stream.handler)
        stream.handler.close()


@pytest.fixture
def log_stream(tmp_path: Path) -> Iterator[_Stream]:
    yield from _stream(tmp_path, "json")


@pytest.fixture
def kv_stream(tmp_path: Path) -> Iterator[_Stream]:
    yield from _stream(tmp_path, "kv")


def _reveals(tenant: Any, n: int) -> list[AccessLog]:
    return [
        accesslog_append(
            tenant_id=tenant.pk,
            action="reveal",
            actor="user:ada.lovelace",
            object_type="ledger.operation",
            object_id=str(i),
            reason=f"support ticket for Priya Sharma {i}",
            ip="127.0.0.1",
        )
        for i in range(n)
    ]


def _verify(*logs: Path | str, stdin: io.StringIO | None = None) -> tuple[bool, str]:
    out, err = io.StringIO(), io.StringIO()
    args = [arg for log in logs for arg in ("--log", str(log))]
    try:
        call_command("accesslog_verify", *args, stdout=out, stderr=err, stdin=stdin)
    except CommandError as exc:
        return False, f"{exc}\n{err.getvalue()}"
    return True, out.getvalue() + err.getvalue()


def test_each_committed_row_is_witnessed_once_with_its_id_and_hash_and_nothing_personal(tenant, log_stream):
    rows = _reveals(tenant, 3)
    witnessed = log_stream.witnesses()
    assert [(w["tenant"], w["seq"], w["id"], w["hash"]) for w in witnessed] == [
        (tenant.pk, r.seq, r.pk, AccessLog.objects.get(pk=r.pk).hash) for r in rows
    ]
    assert all(w["logger"] == "onceguard.accesslog.witness" for w in witnessed)
    # Only the words themselves: a 64-hex hash may spell "ada" (or "add", "bad") by chance.
    text = json.dumps([{k: v for k, v in w.items() if k != "hash"} for w in witnessed])
    assert "ada" not in text and "Priya" not in text and "127.0.0.1" not in text and "ledger.operation" not in text


def test_a_row_rolled_back_with_its_transaction_is_not_witnessed(tenant, log_stream):
    with pytest.raises(RuntimeError), transaction.atomic():
        _reveals(tenant, 1)
        raise RuntimeError("the caller's work failed")
    assert log_stream.witnesses() == [] and not AccessLog.objects.exists()
    [row] = _reveals(tenant, 1)
    assert [w["seq"] for w in log_stream.witnesses()] == [row.seq] == [1]
    assert _verify(log_stream.path)[0]


def test_witness_lines_are_written_even_when_the_log_level_is_warning(tenant, tmp_path):
    logging.config.dictConfig(logging_config(level="WARNING", fmt="json"))
    streams = _stream(tmp_path, "json")
    try:
        stream = next(streams)
        _reveals(tenant, 1)
        assert len(stream.witnesses()) == 1
        assert not any('"access_logged"' in line for line in stream.lines())  # the INFO line is below the level
    finally:
        streams.close()
        # The configuration of this run back (a fresh copy: dictConfig consumes the one it is given).
        logging.config.dictConfig(
            logging_config(
                level=django_settings.LOG_LEVEL,
                fmt=django_settings.LOG_FORMAT,
                q_level=django_settings.Q_CLUSTER["log_level"],
            )
        )


def test_an_untouched_log_verifies_against_its_witnesses(tenant, other_tenant, log_stream):
    _reveals(tenant, 3)
    _reveals(other_tenant, 2)
    ok, text = _verify(log_stream.path)
    assert ok, text
    assert "5 witnessed rows checked" in text


def test_deleting_the_newest_rows_before_any_checkpoint_fails_naming_them(tenant, log_stream):
    _reveals(tenant, 5)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM review_accesslog WHERE tenant_id = %s AND seq >= 4", [tenant.pk])
    # What the checkpoints alone cannot see: the shortened chain is whole and nothing signed rows 4-5.
    assert _verify()[0]
    ok, text = _verify(log_stream.path)
    assert not ok and "BROKEN" in text
    assert f"tenant {tenant.pk} seq 4: row 4 is missing from the database" in text
    assert f"tenant {tenant.pk} seq 5: row 5 is missing from the database" in text
    assert "seq 3:" not in text


def test_deleting_rows_after_the_last_checkpoint_fails_naming_them(tenant, log_stream):
    _reveals(tenant, 3)
    assert accesslog_checkpoint_all() == 1
    _reveals(tenant, 2)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM review_accesslog WHERE tenant_id = %s AND seq > 3", [tenant.pk])
    assert _verify()[0]
    ok, text = _verify(log_stream.path)
    assert not ok and "seq 4: row 4 is missing" in text and "seq 5: row 5 is missing" in text


def test_a_hash_that_differs_from_its_witness_fails(tenant, log_stream):
    _reveals(tenant, 3)
    # The log's line edited: it no longer matches what the database holds.
    lines = log_stream.lines()
    edited = []
    for line in lines:
        if '"accesslog_witness"' in line and '"seq": 2' in line:
            document = json.loads(line)
            document["hash"] = "f" * 64
            line = json.dumps(document)
        edited.append(line)
    tampered = log_stream.path.with_name("tampered.log")
    tampered.write_text("\n".join(edited) + "\n")
    ok, text = _verify(tampered)
    assert not ok and f"tenant {tenant.pk} seq 2: hash differs from the one witnessed at {tampered}:" in text
    # The database's row replaced instead (its hash rewritten): the witness says what it was.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE review_accesslog SET hash = %s WHERE tenant_id = %s AND seq = 3", ["e" * 64, tenant.pk])
    ok, text = _verify(log_stream.path)
    assert not ok and "seq 3: hash differs from the one witnessed" in text


def test_a_witness_line_without_its_fields_is_reported(tenant, log_stream):
    _reveals(tenant, 1)
    broken = log_stream.path.with_name("broken.log")
    broken.write_text(log_stream.path.read_text() + '{"event": "accesslog_witness", "tenant": 1, "seq": "x"}\n')
    ok, text = _verify(broken)
    assert not ok and "broken.log:" in text and "without a tenant, seq and 64-digit hash" in text


def test_a_log_with_no_witness_at_all_is_not_a_pass(tenant, tmp_path):
    _reveals(tenant, 1)
    empty = tmp_path / "other-service.log"
    empty.write_text('{"event": "request_finished", "status": 200}\nplain text line\n')
    ok, text = _verify(empty)
    assert not ok and "no accesslog_witness lines" in text


def test_key_value_lines_and_standard_input_are_read_too(tenant, kv_stream):
    _reveals(tenant, 2)
    lines = kv_stream.lines()
    assert sum(" accesslog_witness " in line for line in lines) == 2
    # A collector's prefix in front of each line.
    prefixed = "".join(f"2026-12-06T20:00:00Z node-1 onceguard[42]: {line}\n" for line in lines)
    assert _verify("-", stdin=io.StringIO(prefixed))[0]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM review_accesslog WHERE tenant_id = %s AND seq = 2", [tenant.pk])
    ok, text = _verify("-", stdin=io.StringIO(prefixed))
    assert not ok and "seq 2: row 2 is missing" in text


def test_rows_purged_by_retention_under_a_signed_anchor_are_not_reported(tenant, log_stream):
    RetentionPolicy.objects.create(tenant=tenant, record_type="access_log", record_ttl=timedelta(days=366))
    _reveals(tenant, 3)
    AccessLog.objects.filter(tenant=tenant, seq__in=[1, 2]).update(at=timezone.now() - timedelta(days=400))
    [run] = retention_purge()
    assert run.deleted == 2
    ok, text = _verify(log_stream.path)
    assert ok, text
