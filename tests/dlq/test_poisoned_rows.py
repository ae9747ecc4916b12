"""The DLQ and the alerts under keys that break the key rule and rows that raise: ingest
never refuses an entry for its key (it keeps "no usable key"), a stored non-ASCII key is
replayed percent-encoded, and automatic replay and the alert flush go on past a row that
raises (ledger.platform.passes), which records the error and backs off."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from alerts import services as alerts
from alerts.models import AlertDelivery
from dlq.models import FailedEvent, Replay
from dlq.replays import automatic as dlq_automatic
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from dlq.tasks import auto_replay_task

pytestmark = pytest.mark.django_db

FULLWIDTH = "lead-\uff43:crm:create:v1"


def failures(job: str) -> float:
    return REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": job}) or 0.0


def ingest(client: Any, event_id: str, **extra: Any) -> dict[str, Any]:
    body = {"event_id": event_id, "payload": {"n": event_id}, "error": {"class": "transient"}, **extra}
    response = client.post("/api/v1/dlq/events", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.mark.parametrize("key", [FULLWIDTH, "lead\x07:1", "x" * 256])
def test_ingest_keeps_an_entry_whose_key_breaks_the_rule_with_no_usable_key(client, key):
    created = ingest(client, "e-1", idempotency_key=key)
    event = FailedEvent.objects.get(pk=created["id"])
    # The identity stands in for the key a replay sends, as for an entry that names none.
    assert event.original_key == "e-1"


def test_ingest_keeps_an_entry_whose_header_key_breaks_the_rule(client):
    response = client.post(
        "/api/v1/dlq/events",
        {"event_id": "e-2", "payload": {}, "error": {"class": "transient"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="lead-\u00e9",
    )
    assert response.status_code == 201, response.content
    assert FailedEvent.objects.get(pk=response.json()["id"]).original_key == "e-2"


def test_an_identity_that_breaks_the_key_rule_is_no_usable_key(client):
    created = ingest(client, "lead-\uff43")
    assert FailedEvent.objects.get(pk=created["id"]).original_key == ""


def test_a_stored_non_ascii_key_is_replayed_percent_encoded(client, target, sink):
    created = ingest(client, "e-3")
    FailedEvent.objects.filter(pk=created["id"]).update(original_key=FULLWIDTH)

    replay = client.post(f"/api/v1/dlq/events/{created['id']}/replay", {}, format="json").json()

    assert replay["outcome"] == "succeeded"
    assert [r.header("Idempotency-Key") for r in sink.received()] == ["lead-%EF%BD%83:crm:create:v1"]
    assert Replay.objects.get().sent_key == FULLWIDTH


def test_automatic_replay_goes_on_past_an_entry_that_raises(client, tenant, sink, monkeypatch):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="auto", url=sink.url, is_default=True, auto_replay=True, timeout_seconds=2
    )
    poisoned, fine = ingest(client, "poisoned")["id"], ingest(client, "fine")["id"]
    real = dlq_replays.failed_event_replay

    def replay(**kwargs: Any) -> Any:
        if kwargs["event_pk"] == poisoned:
            raise RuntimeError("an entry the replay cannot handle")
        return real(**kwargs)

    monkeypatch.setattr(dlq_automatic, "failed_event_replay", replay)
    before = failures("dlq_auto_replay")

    counts = auto_replay_task()

    assert counts["replayed"] == 1
    assert [r.header("Idempotency-Key") for r in sink.received()] == ["fine"]
    assert FailedEvent.objects.get(pk=fine).status == "replayed"
    entry = FailedEvent.objects.get(pk=poisoned)
    assert entry.status == "pending" and entry.auto_replay_count == 1
    assert entry.status_note == "dlq_auto_replay failed on this row: RuntimeError"
    assert failures("dlq_auto_replay") == before + 1


def test_the_alert_flush_goes_on_past_a_delivery_that_raises(tenant, other_tenant, sink, monkeypatch):
    channels = [
        alerts.alert_channel_upsert(tenant=owner, name="hook", kind="webhook", url=f"{sink.url}/hook", kinds=None)
        for owner in (tenant, other_tenant)
    ]
    for owner in (tenant, other_tenant):
        alerts.alert_raise(tenant_id=owner.pk, kind="review_needed", ref=f"op-{owner.pk}", summary="needs a decision")
    real = alerts.alert_delivery_send
    poisoned_channel = channels[0].pk

    def send(*, delivery_id: int) -> Any:
        if AlertDelivery.objects.get(pk=delivery_id).channel_id == poisoned_channel:
            raise RuntimeError("a delivery the flush cannot handle")
        return real(delivery_id=delivery_id)

    monkeypatch.setattr(alerts, "alert_delivery_send", send)
    before = failures("alert_digest")

    result = alerts.alert_dispatch()

    assert result["planned"] == 2 and result["sent"] == 1
    assert len(sink.received()) == 1
    stuck = AlertDelivery.objects.get(channel_id=poisoned_channel)
    assert stuck.status == "retrying"
    assert stuck.last_error == "alert_digest failed on this row: RuntimeError"
    assert stuck.next_attempt_at > timezone.now()
    assert AlertDelivery.objects.get(channel_id=channels[1].pk).status == "sent"
    assert failures("alert_digest") == before + 1
