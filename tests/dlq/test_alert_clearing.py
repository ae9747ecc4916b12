"""Alerts resolve themselves (alerts.clearing): for every kind, the condition occurs → an alert
opens → the condition clears → the evaluator resolves it without anyone acknowledging it, saying
why → the condition recurs → a new alert (the next episode) opens. Time is an injected clock
(``timezone.now`` and the evaluator's ``now``), never a sleep."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.models import Schedule, Task
from prometheus_client import REGISTRY

from alerts import clearing
from alerts import schedules as alert_schedules
from alerts.clearing import CLEARING, alerts_resolve_cleared
from alerts.models import Alert, AlertState
from alerts.services import alert_acknowledge, alert_channel_upsert, alert_raise
from dlq.entries import services as dlq_entries
from dlq.models import FailedEvent
from ledger.execution import polling
from ledger.models import Operation, OperationStatus, Provider
from ledger.platform import hooks
from ledger.protocol import services as ledger_services
from ledger.protocol.transitions.claim import guarded_move
from ledger.providers import revisions
from ledger.recovery.sweeper import alert_stuck
from observability.scheduler import SWEEP_FUNC, scheduler_watch
from tests.dlq.conftest import example
from tests.observability.support import allow_outbound

S = OperationStatus
pytestmark = pytest.mark.django_db
LEAD = {
    "event_id": "lead-77",
    "idempotency_key": "lead-77:crm:create:v1",
    "payload": example("crm-create-contact-request.json"),
    "error": {"message": "CRM answered 429", "class": "transient"},
}


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> datetime:
        self.at += timedelta(**delta)
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock(timezone.now())
    monkeypatch.setattr(timezone, "now", made)
    return made


def alerts_of(kind: str, ref: str) -> list[Alert]:
    return list(Alert.objects.filter(kind=kind, ref=ref).order_by("episode"))


def evaluate(clock: Clock) -> dict[str, int]:
    """A minute later, the schedule runs."""
    return alerts_resolve_cleared(now=clock.advance(minutes=1))


def assert_resolved_by_itself(alert: Alert, clock: Clock, why: str) -> None:
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED
    assert alert.resolved_at == clock() and alert.resolved_by == "system"
    assert alert.acknowledged_at is None, "nobody had to acknowledge it"
    assert why in alert.resolution_note and alert.resolution_note.startswith("cleared: ")


def assert_recurrence_opened_episode_two(kind: str, ref: str) -> Alert:
    first, second = alerts_of(kind, ref)
    assert first.state == AlertState.RESOLVED and first.repeat_count == 0
    assert second.episode == 2 and second.state == AlertState.OPEN and second.pk > first.pk
    return second


def _claim(tenant: Any, provider: Provider, key: str) -> Operation:
    return ledger_services.operation_claim(tenant=tenant, key=key, provider=provider, request={"k": key}).operation


def _move(op: Operation, to: str) -> Operation:
    return guarded_move(operation=op, to=to, actor="test", reason=f"to {to}")


# --- Each kind, from the code path that raises it ------------------------------------------------


def test_dlq_new_resolves_when_the_entry_is_replayed_and_reopens_when_a_forced_replay_fails(
    client, target, sink, clock
):
    event_id = client.post("/api/v1/dlq/events", LEAD, format="json").json()["id"]
    [alert] = alerts_of("dlq_new", str(event_id))
    assert evaluate(clock).get("held") == 1  # still pending
    assert client.post(f"/api/v1/dlq/events/{event_id}/replay", {}, format="json").json()["outcome"] == "succeeded"
    assert evaluate(clock)["resolved"] == 1
    assert_resolved_by_itself(alert, clock, f"DLQ entry {event_id} replayed")
    sink.mode, sink.status = "status", 422
    forced = client.post(
        f"/api/v1/dlq/events/{event_id}/replay", {"force": True, "note": "customer asked again"}, format="json"
    )
    assert forced.json()["outcome"] == "failed"
    assert FailedEvent.objects.get(pk=event_id).status == "pending"
    again = assert_recurrence_opened_episode_two("dlq_new", str(event_id))
    assert "pending again" in again.summary


def test_review_needed_resolves_when_the_operation_leaves_review_and_reopens_when_it_returns(tenant, provider, clock):
    op = _move(_claim(tenant, provider, "lead-9:crm:create"), S.REVIEW)
    polling.review_alert(op)
    [alert] = alerts_of("review_needed", op.key)
    assert evaluate(clock).get("held") == 1
    op = _move(op, S.RETRY_WAIT)
    assert evaluate(clock)["resolved"] == 1
    assert_resolved_by_itself(alert, clock, f"operation {op.key} left review (retry_wait)")
    op = _move(_move(op, S.CLAIMED), S.REVIEW)
    polling.review_alert(op)
    assert_recurrence_opened_episode_two("review_needed", op.key)


def test_operation_stuck_resolves_when_the_operation_moves_and_reopens_when_it_is_stuck_again(
    tenant, provider, clock, settings
):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "STUCK_ALERT_SECONDS": 3600}
    op = _claim(tenant, provider, "lead-10:crm:create")
    Operation.objects.filter(pk=op.pk).update(updated_at=clock() - timedelta(hours=3))
    assert alert_stuck().counts == {"stuck_alerted": 1}
    [alert] = alerts_of("operation_stuck", op.key)
    assert evaluate(clock).get("held") == 1
    # The alert's transaction ended before the move's began: a move stamps the row with its
    # transaction's clock (ADR 0017), and this test runs in one transaction.
    Operation.objects.filter(pk=op.pk).update(alerted_at=F("alerted_at") - timedelta(minutes=1))
    op.refresh_from_db()
    _move(op, S.UNCERTAIN)
    assert evaluate(clock)["resolved"] == 1
    assert_resolved_by_itself(alert, clock, f"operation {op.key} moved (uncertain since")
    assert alert_stuck().counts == {}, "it moved: not stuck"
    # Two hours pass without it moving again (the sweeper reads the database's clock, so the
    # row's times go back instead of the clock going forward).
    Operation.objects.filter(pk=op.pk).update(
        updated_at=F("updated_at") - timedelta(hours=2), alerted_at=F("alerted_at") - timedelta(hours=2)
    )
    assert alert_stuck().counts == {"stuck_alerted": 1}
    assert_recurrence_opened_episode_two("operation_stuck", op.key)


def test_provider_paused_resolves_when_the_provider_resumes_and_reopens_when_it_is_paused_again(provider, clock):
    assert ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
    [alert] = alerts_of("provider_paused", provider.slug)
    assert evaluate(clock).get("held") == 1
    assert ledger_services.provider_resume(provider_id=provider.pk, actor="user:ops")
    assert evaluate(clock)["resolved"] == 1
    assert_resolved_by_itself(alert, clock, f"provider {provider.slug} resumed")
    assert ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 403")
    assert_recurrence_opened_episode_two("provider_paused", provider.slug)


def _canary_rolled_back(provider: Provider) -> None:
    # As ledger.providers.canary's watch raises it after rolling a failing revision back.
    hooks.alert_raised.send(
        tenant_id=provider.tenant_id,
        kind="provider_canary_rolled_back",
        ref=provider.slug,
        summary=f"provider {provider.slug}: 9 of 10 failed; rolled back to revision 1",
    )


def test_a_canary_rollback_resolves_when_a_new_revision_is_saved_and_reopens_on_the_next_rollback(provider, clock):
    _canary_rolled_back(provider)
    [alert] = alerts_of("provider_canary_rolled_back", provider.slug)
    assert evaluate(clock).get("held") == 1
    with transaction.atomic():
        locked = Provider.objects.select_for_update().get(pk=provider.pk)
        saved = revisions.revision_record(provider=locked, config=revisions.adapter_config(locked), actor="user:ops")
    assert evaluate(clock)["resolved"] == 1
    assert_resolved_by_itself(alert, clock, f"provider {provider.slug} has a new adapter revision ({saved.number})")
    clock.advance(hours=1)
    _canary_rolled_back(provider)
    assert_recurrence_opened_episode_two("provider_canary_rolled_back", provider.slug)


def test_a_retention_discard_notice_resolves_once_the_discard_is_done_and_a_new_one_opens_next_time(
    tenant, client, clock
):
    event_pk = client.post("/api/v1/dlq/events", LEAD, format="json").json()["id"]

    def discarding() -> None:
        # As review.retention.purge raises it, in the discard's transaction.
        alert_raise(tenant_id=tenant.pk, kind="retention_discarded", ref="lead-77", summary="discarded")

    discarding()
    [alert] = alerts_of("retention_discarded", "lead-77")
    assert evaluate(clock).get("held", 0) >= 1  # the entry is still pending
    dlq_entries.failed_event_discard(tenant_id=tenant.pk, event_pk=event_pk, actor="retention", note="TTL")
    assert evaluate(clock)["resolved"] >= 1
    assert_resolved_by_itself(alert, clock, "discarded")
    discarding()
    assert_recurrence_opened_episode_two("retention_discarded", "lead-77")


def _task(name: str, func: str, at: datetime) -> None:
    Task.objects.create(id=name, name=name, func=func, started=at, stopped=at, success=True)


def test_stale_scheduler_and_sweeper_alerts_resolve_when_they_run_again_and_reopen_when_they_stall(
    tenant, sink, clock, settings
):
    settings.SCHEDULER_STALE_SECONDS = 300
    settings.SWEEPER_STALE_SECONDS = 600
    allow_outbound(settings, sink.url)
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url=f"{sink.url}/hook")
    _task("old-sweep", SWEEP_FUNC, clock() - timedelta(minutes=30))
    ages = scheduler_watch(now=clock())
    assert ages.heartbeat_stale and ages.sweeper_stale
    [scheduler] = alerts_of("scheduler_stale", "django-q2")
    [sweeper] = alerts_of("sweeper_stale", "ledger.sweep")
    assert evaluate(clock).get("held") == 2
    _task("sweep", SWEEP_FUNC, clock())
    assert evaluate(clock)["resolved"] == 2
    assert_resolved_by_itself(scheduler, clock, "django-q2 finished a task 60 s ago")
    assert_resolved_by_itself(sweeper, clock, "the sweeper completed a pass 60 s ago")
    clock.advance(minutes=30)
    ages = scheduler_watch(now=clock())
    assert ages.heartbeat_stale and ages.sweeper_stale
    assert_recurrence_opened_episode_two("scheduler_stale", "django-q2")
    assert_recurrence_opened_episode_two("sweeper_stale", "ledger.sweep")


# --- Acknowledged, still holding, poisoned, repeats ----------------------------------------------


def test_an_acknowledged_alert_is_resolved_too_once_its_condition_clears(provider, clock):
    ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
    [alert] = alerts_of("provider_paused", provider.slug)
    assert alert_acknowledge(alert_ids=[alert.pk], actor="user:ops") == 1
    evaluate(clock)
    alert.refresh_from_db()
    assert alert.state == AlertState.ACKNOWLEDGED, "acknowledging silences; it does not resolve"
    ledger_services.provider_resume(provider_id=provider.pk, actor="user:ops")
    evaluate(clock)
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolved_by == "system"
    assert alert.acknowledged_by == "user:ops", "who was on it stays recorded"


def test_an_alert_whose_condition_still_holds_stays_open_and_counts_repeats(provider, clock):
    ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
    for _ in range(3):
        evaluate(clock)
        alert_raise(tenant_id=provider.tenant_id, kind="provider_paused", ref=provider.slug, summary="still paused")
    [alert] = alerts_of("provider_paused", provider.slug)
    assert alert.state == AlertState.OPEN and alert.repeat_count == 3 and alert.resolution_note == ""


def _failures() -> float:
    return REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": "alert_clearing"}) or 0.0


def test_one_poisoned_alert_does_not_stop_the_evaluator(tenant, provider, clock, monkeypatch):
    other = ledger_services.provider_upsert(tenant=tenant, slug="poisoned", base_url="http://127.0.0.1:9")
    for p in (provider, other):
        ledger_services.provider_pause(provider_id=p.pk, reason="HTTP 401")
        ledger_services.provider_resume(provider_id=p.pk, actor="user:ops")
    alert_raise(tenant_id=tenant.pk, kind="scheduler_stale", ref="django-q2", summary="stale")
    real = clearing.alerts_cleared_provider_paused

    def poisoned(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
        if any(a.ref == "poisoned" for a in alerts):
            raise ValueError("a row the check cannot read")
        return real(tenant_id, alerts, now)

    monkeypatch.setattr(clearing, "alerts_cleared_provider_paused", poisoned)
    _task("recent", "alerts.tasks.alerts_flush_task", clock())
    before = _failures()
    counts = evaluate(clock)
    assert counts["failed"] == 1 and counts["resolved"] == 2
    assert _failures() == before + 1
    assert alerts_of("provider_paused", "poisoned")[0].state == AlertState.OPEN
    assert alerts_of("provider_paused", provider.slug)[0].state == AlertState.RESOLVED
    assert alerts_of("scheduler_stale", "django-q2")[0].state == AlertState.RESOLVED


def test_an_alert_raised_again_while_the_evaluator_checks_it_stays_open(provider, clock, monkeypatch):
    ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
    ledger_services.provider_resume(provider_id=provider.pk, actor="user:ops")
    real = clearing.alerts_cleared_provider_paused

    def raised_meanwhile(tenant_id: int, alerts: list[Alert], now: datetime) -> dict[int, str]:
        # The condition comes back between the check's read and its resolution.
        alert_raise(tenant_id=tenant_id, kind="provider_paused", ref=provider.slug, summary="paused again")
        return real(tenant_id, alerts, now)

    monkeypatch.setattr(clearing, "alerts_cleared_provider_paused", raised_meanwhile)
    assert evaluate(clock).get("resolved", 0) == 0
    [alert] = alerts_of("provider_paused", provider.slug)
    assert alert.state == AlertState.OPEN and alert.repeat_count == 1
    monkeypatch.setattr(clearing, "alerts_cleared_provider_paused", real)
    assert evaluate(clock)["resolved"] == 1, "the next pass looks again"


def test_a_kind_without_a_condition_keeps_manual_resolution(tenant, clock):
    alert_raise(tenant_id=tenant.pk, kind="something_new", ref="x", summary="no condition declared")
    assert evaluate(clock) == {"manual": 1}
    assert alerts_of("something_new", "x")[0].state == AlertState.OPEN


def test_a_raise_after_a_person_resolved_the_alert_opens_a_new_one(tenant, clock):
    alert_raise(tenant_id=tenant.pk, kind="something_new", ref="x", summary="first")
    [first] = alerts_of("something_new", "x")
    Alert.objects.filter(pk=first.pk).update(resolved_at=clock(), resolved_by="user:ops")
    alert_raise(tenant_id=tenant.pk, kind="something_new", ref="x", summary="again")
    assert_recurrence_opened_episode_two("something_new", "x")


def test_the_console_shows_a_resolved_alert_with_when_and_why(admin_client, provider, clock):
    ledger_services.provider_pause(provider_id=provider.pk, reason="HTTP 401")
    ledger_services.provider_resume(provider_id=provider.pk, actor="user:ops")
    evaluate(clock)
    [alert] = alerts_of("provider_paused", provider.slug)
    listed = admin_client.get("/admin/alerts/alert/?state=resolved").content.decode()
    assert "resolved by system" in listed and f"cleared: provider {provider.slug} resumed" in listed
    detail = admin_client.get(f"/admin/alerts/alert/{alert.pk}/change/").content.decode()
    assert "Resolved by system at" in detail and f"cleared: provider {provider.slug} resumed" in detail


# --- The table covers every kind, and the schedule is installed ----------------------------------

RAISE = re.compile(r"(?:alert_raise|alert_raised\.send|_alert)\(\s*[^()]*?kind=\"([a-z_]+)\"", re.S)


def test_every_alert_kind_raised_in_the_code_has_a_clearing_condition():
    root = Path(django_settings.BASE_DIR)
    raised = set()
    for app in ("alerts", "dlq", "ledger", "review", "observability"):
        for source in (root / app).rglob("*.py"):
            raised |= set(RAISE.findall(source.read_text()))
    assert {"dlq_new", "review_needed", "provider_paused", "operation_stuck", "scheduler_stale"} <= raised
    assert raised == set(CLEARING), "declare the new kind's clearing condition in alerts.clearing.CLEARING"
    for clearing_of in CLEARING.values():
        assert callable(import_string(clearing_of.check))


def test_the_evaluator_runs_every_minute_from_an_installed_schedule():
    # Installed by alerts' migration; a transactional test's flush before this one (in random
    # order) empties the table, so it is installed again here, as the migration does.
    alert_schedules.install_schedules()
    schedule = Schedule.objects.get(name="alerts: resolve what has cleared")
    assert schedule.func == "alerts.tasks.alerts_resolve_cleared_task" and schedule.minutes == 1
    assert import_string(schedule.func)() == {}
