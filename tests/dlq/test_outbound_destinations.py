"""Replay targets and alert webhooks go through the outbound policy (issue 11 item 1): today
both were plain URL fields, so a tenant admin could aim replays or alerts at the cloud
metadata service or an internal port. Refused on save (service, console); a row that names
a refused destination anyway (stored by hand, or allowed once and no longer) is not sent to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from alerts import services as alerts
from alerts.models import AlertChannel, AlertDelivery, AlertDeliveryStatus
from alerts.tasks import alert_dispatch_task
from dlq.models import FailedEvent, Replay, ReplayTarget
from dlq.targets import services as dlq_targets
from ledger.platform.errors import DestinationNotAllowed
from tests.console.support import client_for, staff, submit_form
from tests.dlq.test_replay import ENVELOPE, ingest, replay
from tests.support.listener import Listener

pytestmark = pytest.mark.django_db

REFUSED = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest",
    "http://127.0.0.1:5432/",
    "http://localhost:6379/",
    "http://10.0.0.12:8080/admin",
    "http://user:pw@hooks.example.com/x",
]


@pytest.fixture
def stranger() -> Iterator[Listener]:
    """A loopback service nobody allowed (an internal port)."""
    server = Listener(allow=False)
    yield server
    server.close()


@pytest.mark.parametrize("url", REFUSED)
def test_a_replay_target_to_a_refused_destination_cannot_be_saved(tenant, url):
    with pytest.raises(DestinationNotAllowed):
        dlq_targets.replay_target_upsert(tenant=tenant, slug="t", url=url)
    assert not ReplayTarget.objects.exists()


@pytest.mark.parametrize("url", REFUSED)
def test_an_alert_webhook_to_a_refused_destination_cannot_be_saved(tenant, url):
    with pytest.raises(DestinationNotAllowed):
        alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=url)
    assert not AlertChannel.objects.exists()


def test_the_console_refuses_them_too(tenant, target):
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = submit_form(admin, f"/admin/dlq/replaytarget/{target.pk}/change/", url=REFUSED[0])
    assert response.status_code == 200 and "cloud metadata" in response.content.decode()
    assert ReplayTarget.objects.get(pk=target.pk).url == target.url


def test_a_replay_to_a_destination_nobody_allowed_makes_no_connection(client, tenant, target, stranger):
    ReplayTarget.objects.filter(pk=target.pk).update(url=f"{stranger.url}/internal")
    event_id = ingest(client, ENVELOPE)
    response = replay(client, event_id)
    assert stranger.connections == 0
    assert response.status_code in (200, 201), response.content
    assert response.json()["outcome"] == "failed"
    (made,) = Replay.objects.all()
    assert "outbound policy" in made.error_message and made.error_class == "invalid_input"
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_an_alert_to_a_destination_nobody_allowed_makes_no_connection(client, tenant, sink, stranger):
    channel = alerts.alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/hook")
    AlertChannel.objects.filter(pk=channel.pk).update(url=f"{stranger.url}/hook")
    response = client.post("/api/v1/dlq/events", ENVELOPE, format="json")
    assert response.status_code == 201
    alert_dispatch_task(tenant.pk)
    assert stranger.connections == 0 and sink.requests == []
    delivery = AlertDelivery.objects.get()
    assert delivery.status == AlertDeliveryStatus.RETRYING and "outbound policy" in delivery.last_error
