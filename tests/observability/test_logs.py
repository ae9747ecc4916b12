"""Logs: JSON lines with LOG_FORMAT=json, key=value otherwise, one pipeline for our lines,
Django's and django-q2's; operation fields bound once reach every line; redaction masks
what must never be written."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledger.platform import logs

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def emitted() -> Iterator[dict[str, io.StringIO]]:
    """The "onceguard.test" logger written through both formats."""
    streams = {"json": io.StringIO(), "kv": io.StringIO()}
    logger = logging.getLogger("onceguard.test")
    handlers = []
    for fmt, stream in streams.items():
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logs.formatter(fmt))
        logger.addHandler(handler)
        handlers.append(handler)
    saved = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield streams
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]


def _json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_key_value_message_becomes_a_json_event_with_typed_fields(emitted):
    logging.getLogger("onceguard.test").info(
        "operation_failed key=%s attempt=%s error_class=%s duration_ms=%s to=%s",
        "1001",
        2,
        "transient",
        12.5,
        "retry_wait",
    )
    [line] = _json_lines(emitted["json"])
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    assert line["event"] == "operation_failed" and line["level"] == "info" and line["logger"] == "onceguard.test"
    assert line["key"] == "1001"  # an identifier stays a string
    assert line["attempt"] == 2 and line["duration_ms"] == 12.5
    assert line["error_class"] == "transient" and line["to"] == "retry_wait"
    kv = emitted["kv"].getvalue().strip()
    assert kv.endswith(
        " INFO onceguard.test operation_failed key=1001 attempt=2 error_class=transient duration_ms=12.5 to=retry_wait"
    )


def test_fields_bound_for_an_operation_reach_every_line_inside_the_block_only(emitted):
    op = SimpleNamespace(
        tenant_id=3,
        pk=42,
        key="order-1001:charge:v1",
        attempts=2,
        provider_id=7,
        provider_ref="ch_9",
        error_class="",
        workflow_id="17",
        workflow_version="v4",
        execution_id="4812",
        correlation_id="corr-1",
    )
    with logs.log_context(**logs.operation_fields(op, provider="stripe", duration_ms=31)):
        logging.getLogger("onceguard.test").info("execute_attempt outcome=%s", "succeeded")
        logs.get_logger("onceguard.test").info("callback_queued", target="hook")
    logging.getLogger("onceguard.test").info("after_the_block")
    first, second, after = _json_lines(emitted["json"])
    expected = {
        "tenant": 3,
        "operation": 42,
        "key": "order-1001:charge:v1",
        "attempt": 2,
        "provider": "stripe",
        "provider_ref": "ch_9",
        "workflow_id": "17",
        "workflow_version": "v4",
        "execution_id": "4812",
        "correlation_id": "corr-1",
        "duration_ms": 31,
    }
    assert expected.items() <= first.items() and first["outcome"] == "succeeded"
    assert expected.items() <= second.items() and second["event"] == "callback_queued"
    assert "error_class" not in first  # empty values are left out
    assert "key" not in after and "tenant" not in after


@pytest.mark.parametrize(
    "text",
    [
        "contact priya.raman@example.invalid failed",
        "call +61 412 345 678 back",
        "call +61412345678 back",
        "call 0412 345 678 back",
        "msisdn 61412345678 unknown",
        "Authorization: Bearer abc.def-ghi",
        "used og_ab12cd34_Zx9yQwErTy0123456789abcdef",
        "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc refused",
        "url https://x.invalid/?api_key=abc123&x=1",
        "password=hunter2 rejected",
    ],
)
def test_redaction_masks_contacts_and_credentials_in_any_text(emitted, text):
    logging.getLogger("onceguard.test").warning("provider_error message=%s", text)
    line = _json_lines(emitted["json"])[0]
    assert "[redacted]" in line["message"]
    for secret in ("priya", "412", "345", "abc.def", "Zx9yQ", "4eC39", "abc123", "hunter2"):
        assert secret not in line["message"]
    assert "[redacted]" in emitted["kv"].getvalue()


def test_redaction_masks_known_payload_fields_wherever_they_appear(emitted):
    logger = logging.getLogger("onceguard.test")
    logger.info("oops payload=%s", {"caller": {"name": "Priya Raman"}})
    logs.get_logger("onceguard.test").info("nested", detail={"request": {"name": "Priya"}, "ok": 1}, email="x")
    first, second = _json_lines(emitted["json"])
    assert first["payload"] == "[redacted]"
    assert second["detail"] == {"request": "[redacted]", "ok": 1} and second["email"] == "[redacted]"
    assert "Priya" not in emitted["json"].getvalue() + emitted["kv"].getvalue()


def test_operation_fields_passed_as_extra_reach_the_line(emitted):
    op = SimpleNamespace(tenant_id=3, pk=9, key="k:9", attempts=1, provider_id=2, workflow_id="17")
    logging.getLogger("onceguard.test").info("operation_failed to=%s", "failed", extra=logs.operation_fields(op))
    [line] = _json_lines(emitted["json"])
    assert line["tenant"] == 3 and line["operation"] == 9 and line["key"] == "k:9" and line["workflow_id"] == "17"
    assert " operation_failed tenant=3 operation=9 key=k:9 attempt=1 provider=2 workflow_id=17 to=failed" in (
        emitted["kv"].getvalue()
    )


def test_a_message_field_named_like_the_event_keeps_the_event_name(emitted):
    logging.getLogger("onceguard.test").info("dlq_ingested tenant=%s event=%s", "acme", 5)
    [line] = _json_lines(emitted["json"])
    assert line["event"] == "dlq_ingested" and line["event_"] == 5 and line["tenant"] == "acme"


def test_a_record_formatted_by_another_handler_first_gains_no_fields():
    record = logging.LogRecord("onceguard.test", logging.INFO, __file__, 1, "swept key=%s", ("k:1",), None)
    logging.Formatter("%(asctime)s %(message)s").format(record)  # sets record.message, record.asctime
    line = json.loads(logs.formatter("json").format(record))
    assert "message" not in line and "asctime" not in line and line["key"] == "k:1"


def test_identifiers_times_and_durations_are_not_mistaken_for_phone_numbers(emitted):
    logging.getLogger("onceguard.test").info(
        "sweeper_moved key=%s attempt=%s ref=%s at=%s", "order-1001:charge:v1", 3, "n8n:17:4812", "2026-11-30T10:00:00"
    )
    [line] = _json_lines(emitted["json"])
    assert (
        line["key"] == "order-1001:charge:v1" and line["ref"] == "n8n:17:4812" and line["at"] == "2026-11-30T10:00:00"
    )


def test_a_message_of_another_shape_stays_whole_and_exceptions_are_one_json_line(emitted):
    logger = logging.getLogger("onceguard.test")
    logger.info("fault relay (%s) listening on %s", "drop", "http://127.0.0.1:8011")
    try:
        raise ValueError("bad thing for priya.raman@example.invalid")
    except ValueError:
        logger.exception("worker_execute_error key=%s", "k:1")
    first, second = _json_lines(emitted["json"])
    assert first["event"] == "fault relay (drop) listening on http://127.0.0.1:8011"
    assert second["event"] == "worker_execute_error" and "ValueError" in second["exception"]
    assert "priya" not in second["exception"]


def test_log_format_json_makes_every_logger_write_json_lines_through_settings(tmp_path):
    """The settings' LOGGING: ours, Django's request log and django-q2's, all JSON."""
    script = (
        "import django, logging\n"
        "django.setup()\n"
        "from django.test import Client\n"
        "logging.getLogger('onceguard.ledger').info('operation_failed key=%s attempt=%s', 'k:1', 1)\n"
        "logging.getLogger('django-q').warning('cluster stopped')\n"
        "logging.getLogger('django.request').error('Internal Server Error: /x')\n"
        "logging.getLogger('onceguard.ledger').debug('not at INFO')\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_FORMAT": "json",
        "LOG_LEVEL": "INFO",
        "ONCEGUARD_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("onceguard.ledger", "operation_failed"),
        ("django-q", "cluster stopped"),
        ("django.request", "Internal Server Error: /x"),
    ]
    assert lines[0]["key"] == "k:1" and lines[0]["attempt"] == 1
