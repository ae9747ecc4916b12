"""The scheduler watch: a stale django-q2 cluster or sweeper raises an alert that reaches the
channels without django-q2 (the thing that is stale), once per dedup window."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Task

from alerts.models import Alert
from alerts.services import alert_channel_upsert
from observability.scheduler import SWEEP_FUNC, scheduler_ages, scheduler_watch
from tests.dlq.sinks import Sink
from tests.observability.support import allow_outbound

pytestmark = pytest.mark.django_db


@pytest.fixture
def sink(settings):
    started = Sink().start()
    allow_outbound(settings, started.url)
    yield started
    started.stop()


def _task(name: str, func: str, minutes_ago: float, success: bool = True) -> None:
    at = timezone.now() - timedelta(minutes=minutes_ago)
    Task.objects.create(id=name, name=name, func=func, started=at, stopped=at, success=success)


def test_a_stalled_cluster_and_sweeper_alert_every_channel_directly_and_once(settings, tenant, other_tenant, sink):
    settings.SCHEDULER_STALE_SECONDS = 300
    settings.SWEEPER_STALE_SECONDS = 600
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/hook")
    _task("old-sweep", SWEEP_FUNC, 30)
    _task("old-flush", "alerts.tasks.alerts_flush_task", 20, success=False)
    ages = scheduler_watch()
    assert ages.heartbeat_stale and ages.sweeper_stale
    assert sorted(Alert.objects.values_list("tenant__slug", "kind")) == [
        ("acme", "scheduler_stale"),
        ("acme", "sweeper_stale"),
    ]  # tenants without a channel get nothing
    bodies = sink.bodies_text()
    assert "scheduler_stale" in bodies and "sweeper_stale" in bodies
    delivered = len(sink.received())
    assert delivered >= 1
    scheduler_watch()  # a minute later: counted as a repeat, not sent again
    assert len(sink.received()) == delivered
    assert Alert.objects.filter(kind="scheduler_stale").get().repeat_count == 1


def test_a_running_cluster_raises_nothing(settings, tenant, sink):
    settings.SCHEDULER_STALE_SECONDS = 300
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/hook")
    _task("sweep", SWEEP_FUNC, 0.5)
    ages = scheduler_watch()
    assert not ages.heartbeat_stale and not ages.sweeper_stale
    assert not Alert.objects.exists() and sink.received() == []


def test_a_cluster_that_never_ran_is_stale_counted_from_installation(settings):
    settings.SCHEDULER_STALE_SECONDS = 300
    ages = scheduler_ages(now=timezone.now() + timedelta(hours=1))
    assert ages.heartbeat_age_seconds >= 3600 and ages.heartbeat_stale and ages.sweeper_stale


def test_scheduler_watch_once_prints_the_ages():
    _task("sweep", SWEEP_FUNC, 1)
    out = io.StringIO()
    call_command("scheduler_watch", "--once", stdout=out)
    assert "heartbeat_age_seconds=" in out.getvalue() and "stale=0" in out.getvalue()
