"""Alerts to loopback sinks posing as Slack, Discord and a generic webhook: the right shape,
no payload text, deduplicated, digested under a burst, retried — and ingestion never waits
for a channel, whether it answers 500 or hangs."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from alerts import services as alerts
from alerts.models import Alert, AlertChannel, AlertDelivery
from alerts.tasks import alert_dispatch_task, alerts_flush_task
from dlq.ingest import services as dlq_ingest
from ledger.platform.tasks import enqueue as real_enqueue  # bound before the autouse `enqueued` fixture stubs it
from tests.dlq.conftest import example

PERSONAL = ("Priya", "priya.raman", "+61412345678", "Raman", "2010", "home and contents")
LEAD = {
    "idempotency_key": "lead-77:crm:create:v1",
    "payload": example("voice-call-analyzed.json"),
    "error": {"message": "CRM rejected priya.raman@example.invalid (+61412345678)", "class": "invalid_input"},
    "source": {"workflow_id": "17", "workflow_name": "Voice call analyzed -> CRM lead"},
}


def channel(tenant, kind, sink, **extra) -> AlertChannel:
    made = alerts.alert_channel_upsert(tenant=tenant, name=kind, kind=kind, url=f"{sink.url}/hook", kinds=None)
    if extra:
        AlertChannel.objects.filter(pk=made.pk).update(**extra)
        made.refresh_from_db()
    return made


def ingest(client, n: int = 1, start: int = 0) -> list[int]:
    ids = []
    for i in range(start, start + n):
        response = client.post("/api/v1/dlq/events", LEAD | {"event_id": f"lead-{i}"}, format="json")
        assert response.status_code == 201, response.content
        ids.append(response.json()["id"])
    return ids


def in_transaction(conn: Any) -> bool:
    """Whether another thread's connection has a transaction open: an atomic block, or one
    the driver itself began."""
    if conn.in_atomic_block:
        return True
    if conn.connection is None:
        return False
    if conn.vendor == "postgresql":
        return conn.connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
    return bool(conn.connection.in_transaction)


def assert_no_personal_data(text: str) -> None:
    for secret in PERSONAL:
        assert secret not in text, secret


@pytest.mark.django_db
def test_slack_gets_text_with_ids_and_a_console_link_and_no_payload_text(client, tenant, sink, settings):
    settings.ONCEGUARD_ALERTS = {"CONSOLE_BASE_URL": "https://og.example.invalid"}
    channel(tenant, "slack", sink)
    [event_id] = ingest(client)
    alert_dispatch_task(tenant.pk)
    [message] = sink.received()
    body = message.json()
    assert set(body) == {"text", "unfurl_links", "unfurl_media"}
    assert f"dlq_new {event_id}" in body["text"]
    assert f"<https://og.example.invalid/admin/dlq/failedevent/{event_id}/change/|Open console>" in body["text"]
    assert_no_personal_data(message.body.decode())
    assert "Voice call analyzed" not in message.body.decode()


@pytest.mark.django_db
def test_discord_gets_content_without_mentions_and_no_payload_text(client, tenant, sink):
    channel(tenant, "discord", sink)
    alerts.alert_raise(tenant_id=tenant.pk, kind="review_needed", ref="42", summary="@everyone look <!channel>")
    [event_id] = ingest(client)
    alert_dispatch_task(tenant.pk)
    bodies = [r.json() for r in sink.received()]
    assert len(bodies) == 2
    for body in bodies:
        assert set(body) == {"username", "content", "allowed_mentions"}
        assert body["allowed_mentions"] == {"parse": []} and len(body["content"]) <= 2000
    assert any(f"dlq_new {event_id}" in b["content"] for b in bodies)
    assert any("/admin/ledger/operation/42/change/" in b["content"] for b in bodies)
    assert_no_personal_data(json.dumps(bodies))


@pytest.mark.django_db
def test_a_generic_webhook_gets_structured_ids(client, tenant, sink):
    channel(tenant, "webhook", sink)
    [event_id] = ingest(client)
    alert_dispatch_task(tenant.pk)
    body = sink.received()[0].json()
    assert body["type"] == "onceguard.alerts" and body["digest"] is False and body["count"] == 1
    assert body["alerts"][0]["kind"] == "dlq_new" and body["alerts"][0]["ref"] == str(event_id)
    assert_no_personal_data(json.dumps(body))


@pytest.mark.django_db
def test_a_burst_of_200_entries_becomes_one_digest_per_channel(client, tenant, sink_factory):
    slack_sink, discord_sink = sink_factory(), sink_factory()
    channel(tenant, "slack", slack_sink)
    channel(tenant, "discord", discord_sink)
    for i in range(200):
        dlq_ingest.failed_event_ingest(
            tenant=tenant, raw=json.dumps(LEAD | {"event_id": f"burst-{i}"}).encode(), actor="t"
        )
    assert Alert.objects.count() == 200
    alert_dispatch_task(tenant.pk)
    [slack] = slack_sink.received()
    [discord] = discord_sink.received()
    assert "200 alerts: 200 × dlq_new" in slack.json()["text"]
    assert "200 alerts: 200 × dlq_new" in discord.json()["content"]
    assert "… and 180 more" in discord.json()["content"]
    assert_no_personal_data(slack.body.decode() + discord.body.decode())
    assert AlertDelivery.objects.filter(digest=True, alert_count=200, status="sent").count() == 2


@pytest.mark.django_db
def test_alerts_dispatched_one_by_one_are_rate_limited_then_digested(client, tenant, sink, settings):
    ch = channel(tenant, "slack", sink, max_messages_per_window=5, window_seconds=60)
    # The worst case: a dispatch after every single commit.
    for i in range(200):
        dlq_ingest.failed_event_ingest(tenant=tenant, raw=json.dumps(LEAD | {"event_id": f"b-{i}"}).encode(), actor="t")
        alert_dispatch_task(tenant.pk)
    assert len(sink.received()) == 5
    # The window passes; the flush schedule sends the rest as one digest.
    AlertDelivery.objects.filter(channel=ch).update(created_at=timezone.now() - timedelta(seconds=61))
    alerts_flush_task()
    messages = sink.received()
    assert len(messages) == 6
    assert "195 alerts" in messages[-1].json()["text"]
    assert AlertDelivery.objects.filter(channel=ch).values_list("alert_count", flat=True).count() == 6


@pytest.mark.django_db
def test_the_same_alert_raised_twice_is_one_alert_and_one_dispatch(
    tenant, django_capture_on_commit_callbacks, enqueued
):
    with django_capture_on_commit_callbacks(execute=True):
        alerts.alert_raise(tenant_id=tenant.pk, kind="provider_paused", ref="stripe", summary="401 from provider")
        alerts.alert_raise(tenant_id=tenant.pk, kind="provider_paused", ref="stripe", summary="401 from provider")
    alert = Alert.objects.get()
    assert alert.repeat_count == 1
    assert enqueued == [("alerts.tasks.alert_dispatch_task", tenant.pk)]


@pytest.mark.django_db
def test_two_dispatchers_never_take_the_same_alerts(client, tenant, sink):
    channel(tenant, "slack", sink)
    ingest(client, 2)
    first, second = AlertChannel.objects.get(), AlertChannel.objects.get()  # both read the old cursor
    taken, _ = alerts._take_alerts(first)
    again, _ = alerts._take_alerts(second)
    assert len(taken) == 2 and again == []


@pytest.mark.django_db
def test_a_channel_only_gets_the_kinds_it_asked_for(client, tenant, sink):
    channel(tenant, "webhook", sink, kinds=["review_needed"])
    ingest(client)
    alerts.alert_raise(tenant_id=tenant.pk, kind="review_needed", ref="7", summary="operation 7 needs a decision")
    alert_dispatch_task(tenant.pk)
    [message] = sink.received()
    assert [a["kind"] for a in message.json()["alerts"]] == ["review_needed"]


@pytest.mark.django_db
def test_a_channel_answering_500_is_retried_with_backoff_then_given_up(client, tenant, sink, settings):
    settings.ONCEGUARD_ALERTS = {"MAX_ATTEMPTS": 3, "RETRY_BASE_SECONDS": 30}
    channel(tenant, "slack", sink)
    sink.mode, sink.status = "status", 500
    ingest(client)  # ingestion does not care
    alert_dispatch_task(tenant.pk)
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "retrying" and delivery.attempts == 1 and delivery.last_error == "HTTP 500"
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=25)
    # Not due yet: the flush leaves it alone.
    alerts_flush_task()
    assert len(sink.received()) == 1
    for expected in ("retrying", "dead"):
        AlertDelivery.objects.update(next_attempt_at=timezone.now())
        alerts_flush_task()
        assert AlertDelivery.objects.get().status == expected
    assert len(sink.received()) == 3


@pytest.mark.django_db
def test_a_channel_that_recovers_gets_the_message_on_the_retry(client, tenant, sink):
    channel(tenant, "discord", sink)
    sink.mode, sink.status = "status", 503
    ingest(client)
    alert_dispatch_task(tenant.pk)
    sink.mode = "ok"
    AlertDelivery.objects.update(next_attempt_at=timezone.now())
    alerts_flush_task()
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "sent" and delivery.attempts == 2
    assert sink.received()[0].body == sink.received()[1].body


@pytest.mark.django_db(transaction=True)
def test_ingestion_is_unaffected_while_a_channel_hangs(client, tenant, sink):
    channel(tenant, "slack", sink, timeout_seconds=0.5)
    sink.mode = "hang"
    ingest(client)
    dispatching: dict[str, Any] = {}
    waiting = threading.Event()

    def dispatcher() -> None:
        dispatching["connection"] = connections["default"]  # this thread's own
        try:
            alert_dispatch_task(tenant.pk)
        finally:
            connection.close()

    def channel_called() -> None:
        # The dispatcher is inside its call to the channel now: what does it hold?
        dispatching["in_transaction"] = in_transaction(dispatching["connection"])
        waiting.set()

    sink.on_post = channel_called
    worker = threading.Thread(target=dispatcher)
    worker.start()
    assert waiting.wait(timeout=30)  # the dispatcher is now waiting on the hanging channel
    ids = ingest(client, 10, start=100)
    worker.join(timeout=10)
    assert len(ids) == 10
    # While the channel hangs the dispatcher holds no transaction, so no ingest waits on it
    # (was: ten ingests took under 2 s of wall clock).
    assert dispatching["in_transaction"] is False
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "retrying" and delivery.last_error == "ReadTimeout"


@pytest.mark.django_db(transaction=True)
def test_ingestion_answers_201_when_the_channel_answers_500_and_delivery_runs_after_commit(
    client, tenant, sink, monkeypatch
):
    """Delivery inline after commit (as django-q2's sync mode would): still 201, still stored."""
    channel(tenant, "slack", sink)
    sink.mode, sink.status = "status", 500
    monkeypatch.setattr("ledger.platform.tasks.enqueue", lambda func, *args: alert_dispatch_task(*args))
    response = client.post("/api/v1/dlq/events", LEAD | {"event_id": "x"}, format="json")
    assert response.status_code == 201
    assert len(sink.received()) == 1 and AlertDelivery.objects.get().status == "retrying"


@pytest.mark.django_db(transaction=True)
def test_django_q2_runs_the_enqueued_dispatch_by_its_dotted_path(client, tenant, sink, monkeypatch):
    """The real enqueue (django-q2 in sync mode): the task path resolves and delivers."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", True)
    monkeypatch.setattr("ledger.platform.tasks.enqueue", real_enqueue)
    channel(tenant, "webhook", sink)
    [event_id] = ingest(client)
    assert [a["ref"] for a in sink.received()[0].json()["alerts"]] == [str(event_id)]
