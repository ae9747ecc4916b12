"""No payload value ever reaches a log line (DESIGN §7): every logger's output is captured,
at DEBUG, while the representative flows run — claims with personal payloads, failures into
the DLQ, ingest of the voice-call webhook, replays, reviews, reveals (console and API), the
data-subject search, exports, retention, the demo seed and the error paths."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command

from dlq.models import FailedEvent
from dlq.replays import bulk as dlq_bulk
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from ledger.platform import logs
from ledger.platform.errors import DomainError
from ledger.protocol import services
from review.models import RetentionPolicy
from review.retention.purge import retention_purge
from tests.console.support import (
    MARKERS,
    advisory_provider,
    client_for,
    enforced_provider,
    example,
    failed_op,
    op_in_review,
    staff,
    succeeded_op,
)
from tests.ledger.support import Sink

pytestmark = pytest.mark.django_db(transaction=True)


class Capture(logging.Handler):
    """Each record twice: as plain text (what the code wrote) and as the JSON line
    LOG_FORMAT=json writes (with the fields bound by log_context, after redaction)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []
        self.json_lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.json = logs.formatter("json")

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)
        self.json_lines.append(self.json.format(record))


@pytest.fixture
def captured() -> Iterator[Capture]:
    """A handler on the root logger and on every logger that does not propagate, at DEBUG."""
    handler = Capture()
    loggers = [logging.getLogger()] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if not name.startswith("django.db")
    ]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        if lg.name.startswith(("onceguard", "dlq", "review", "ledger")) or lg is logging.getLogger():
            lg.setLevel(logging.DEBUG)
    yield handler
    for lg, level in saved:
        lg.removeHandler(handler)
        lg.setLevel(level)


def _flows(tenant: Any, other_tenant: Any, make_client: Any) -> None:
    voice, contact = example("voice-call-analyzed.json"), example("crm-create-contact-request.json")
    crm, mailer = enforced_provider(tenant), advisory_provider(tenant)
    # Ledger: claims with personal payloads; complete with a personal response; failures.
    succeeded_op(tenant, crm, "log:1", payload=voice, response=contact["body"])
    lead = failed_op(tenant, crm, "log:2", payload=contact)
    review = op_in_review(tenant, mailer, "log:3", handle="msg-1", payload=voice)
    with pytest.raises(DomainError):
        services.operation_claim(tenant=tenant, key="log:1", provider=crm, payload=voice, request={"different": voice})
    api = make_client(tenant, ["read", "write", "payload"])
    api.post("/api/v1/claims", {"key": "log:api", "provider": "crm", "payload": voice}, format="json")
    api.post("/api/v1/claims", {"key": "log:api", "provider": "crm", "request": contact}, format="json")  # 422
    api.post("/api/v1/claims", {"key": "", "provider": "crm", "payload": voice}, format="json")  # 400
    # DLQ: ingest the raw webhook and the n8n error trigger; replay to a receiver; bulk replay.
    api.post(
        "/api/v1/dlq/events", {"event_id": "log:evt", "payload": voice, "error": {"message": "429"}}, format="json"
    )
    api.post("/api/v1/dlq/events", example("n8n-error-trigger-execution.json"), format="json")
    api.post("/api/v1/dlq/events", voice, format="json")  # an unknown shape: kept raw
    sink = Sink()
    try:
        dlq_targets.replay_target_upsert(tenant=tenant, slug="hook", url=f"{sink.url}/hook", is_default=True)
        event = FailedEvent.objects.get(operation=lead)
        dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=event.pk, actor="user:ops", note="limit lifted")
        bulk = dlq_bulk.bulk_replay_prepare(tenant=tenant, filters={}, actor="user:ops")
        dlq_bulk.bulk_replay_confirm(tenant=tenant, bulk_id=bulk.pk, actor="user:ops", count=bulk.count)
        dlq_bulk.bulk_replay_run(bulk_id=bulk.pk)
    finally:
        sink.close()
    dlq_targets.replay_target_upsert(tenant=tenant, slug="hook", url="http://127.0.0.1:9/refused", is_default=True)
    pending = FailedEvent.objects.filter(tenant=tenant, status="pending").first()
    if pending is not None:
        dlq_replays.failed_event_replay(tenant_id=tenant.pk, event_pk=pending.pk, actor="user:ops")
    # Console: review decision, reveal, export, access log, subject search, a refused reveal.
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    admin.post(f"/admin/review/reviewitem/{review.pk}/change/", {"decision": "confirm_succeeded", "note": "seen"})
    admin.post(
        f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/", {"fields_wanted": ["payload"], "reason": "ticket OPS-1"}
    )
    b"".join(admin.get("/admin/ledger/operation/export.csv").streaming_content)
    b"".join(admin.get("/admin/review/accesslog/export.csv").streaming_content)
    admin.post(
        "/admin/onceguard/subjects/",
        {"phone": "+61412345678", "email": "priya.raman@example.invalid", "reason": "APP 12 request"},
    )
    for url in (
        "/admin/",
        "/admin/ledger/operation/",
        f"/admin/ledger/operation/{lead.pk}/change/",
        "/admin/dlq/failedevent/",
    ):
        admin.get(url)
    client_for(staff("rita", role="reviewer", tenants=[tenant])).post(
        f"/admin/onceguard/reveal/ledger/operation/{lead.pk}/", {"fields_wanted": ["payload"], "reason": "curious only"}
    )
    api.post(f"/api/v1/operations/{lead.pk}/payload", {"reason": "support ticket 9"}, format="json")
    make_client(other_tenant, ["payload"]).post(
        f"/api/v1/operations/{lead.pk}/payload", {"reason": "not mine at all"}, format="json"
    )
    # Retention, rotation and verification.
    RetentionPolicy.objects.create(tenant=tenant, record_type="operations", payload_ttl=timedelta(seconds=1))
    retention_purge()
    call_command("encryption_rotate", stdout=io.StringIO())
    call_command("accesslog_verify", stdout=io.StringIO())


def test_no_payload_value_appears_in_any_log_line(captured, tenant, other_tenant, make_client):
    _flows(tenant, other_tenant, make_client)
    from review.demo import demo_seed

    demo_seed()
    text = "\n".join(captured.lines)
    assert len(captured.lines) > 30, "the flows logged almost nothing: the capture is not working"
    assert "operation_succeeded" in text and "dlq_ingested" in text and "access_logged" in text
    leaks = [line for line in captured.lines if any(m in line for m in MARKERS)]
    assert leaks == [], json.dumps(leaks[:5], indent=2)
    # The same records as JSON lines: one object per line, bound fields included, no leak.
    assert len(captured.json_lines) == len(captured.lines)
    events = [json.loads(line) for line in captured.json_lines]
    assert {"operation_succeeded", "dlq_ingested", "access_logged"} <= {e["event"] for e in events}
    json_leaks = [line for line in captured.json_lines if any(m in line for m in MARKERS)]
    assert json_leaks == [], json.dumps(json_leaks[:5], indent=2)


def test_the_capture_would_see_a_leak(captured):
    logging.getLogger("onceguard.ledger").info("oops payload=%s", example("voice-call-analyzed.json"))
    assert any("Priya" in line for line in captured.lines)
    # A personal value bound as a field of no known name shows only in the JSON line.
    with logs.log_context(customer="Priya Raman"):
        logging.getLogger("onceguard.ledger").info("operation_claimed key=%s", "k:1")
    assert "Priya" not in captured.lines[-1] and "Priya" in captured.json_lines[-1]
