"""Adapter revisions against a real loopback provider (DESIGN §5, adapter revisions): every
adapter change is a revision, a canary takes its share of new operations, the watch rolls a
failing canary back on its own, its unsent operations go out under the previous revision,
and the provider counts no request that was sent twice for nothing."""

from __future__ import annotations

import pytest
from django.db import connection

from dlq.models import FailedEvent, FailedEventChange
from dlq.web.serializers import failed_event_representation
from ledger.execution.submission import operation_submit
from ledger.models import AdapterRevision, Attempt, ConfigChange, Operation, OperationEvent, OperationStatus, Provider
from ledger.platform import hooks
from ledger.platform.errors import AdapterRolloutConflict, ValidationFailed
from ledger.protocol.services import provider_upsert
from ledger.providers import canary, revisions
from ledger.recovery.sweeper import reconcile_uncertain, sweep
from ledger.store import sql
from tests.execute.support import make_due, run_due

S = OperationStatus


@pytest.fixture
def watch(settings):
    """A watch sized for a test: judged after six counted attempts."""
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "CANARY_MIN_SAMPLE": 6,
        "CANARY_MAX_EXCESS_PERCENT": 10,
        "CANARY_WINDOW_SECONDS": 900,
    }


def submit(tenant, key, amount=1000):
    return operation_submit(
        tenant=tenant,
        key=key,
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": amount}},
    ).operation


def canary_of(provider, mock, percent=50, reason="move to the provider's API v2"):
    """Revision 2: the same provider under its /v2 API (which the mock may break)."""
    return provider_upsert(
        tenant=provider.tenant,
        slug=provider.slug,
        base_url=mock.url + "/v2",
        canary_percent=percent,
        reason=reason,
        actor="user:alice",
    )


def backdate_sent(op_ids, seconds=30):
    past, params = sql.now_plus(-seconds)
    with connection.cursor() as cursor:
        for op_id in op_ids:
            cursor.execute(f"UPDATE ledger_operation SET sent_at = {past} WHERE id = %s", [*params, op_id])


def test_every_adapter_change_is_a_numbered_immutable_revision_and_other_changes_are_not(tenant, enforced):
    provider, mock = enforced
    (first,) = AdapterRevision.objects.filter(provider=provider)
    assert first.number == 1 and provider.revision_id == first.pk and first.config["base_url"] == mock.url
    # Retry policy is the provider's, not the adapter's: no revision.
    provider_upsert(tenant=tenant, slug="charges", max_attempts=7, actor="user:alice")
    assert AdapterRevision.objects.filter(provider=provider).count() == 1
    changed = provider_upsert(
        tenant=tenant, slug="charges", timeout_seconds=2.5, actor="user:alice", reason="slow nights"
    )
    second = AdapterRevision.objects.get(provider=provider, number=2)
    assert changed.revision_id == second.pk and second.based_on == 1 and second.created_by == "user:alice"
    assert second.config["timeout_seconds"] == 2.5 and second.reason == "slow nights"
    assert AdapterRevision.objects.get(pk=first.pk).config["timeout_seconds"] == 1.0
    trail = ConfigChange.objects.filter(object_type="ledger.adapterrevision", object_id=str(second.pk)).get()
    assert trail.before == {"timeout_seconds": 1.0} and trail.after["timeout_seconds"] == 2.5
    assert trail.reason == "slow nights" and trail.actor == "user:alice"
    move = ConfigChange.objects.filter(object_type="ledger.provider", reason="slow nights").get()
    assert move.before == {"revision": 1, "timeout_seconds": 1.0} and move.after == {
        "revision": 2,
        "timeout_seconds": 2.5,
    }


def test_a_canary_takes_its_share_of_new_keys_deterministically_and_every_attempt_records_its_revision(
    tenant, enforced
):
    provider, mock = enforced
    provider = canary_of(provider, mock, percent=50)
    stable, canary_rev = provider.revision_id, provider.canary_revision_id
    assert provider.base_url == mock.url  # the row keeps the stable revision's fields
    ops = [submit(tenant, f"order-{i}:charge:v1") for i in range(40)]
    on_canary = [op for op in ops if op.adapter_revision_id == canary_rev]
    assert {op.adapter_revision_id for op in ops} == {stable, canary_rev}
    assert 10 <= len(on_canary) <= 30
    # The choice is a function of the key: asked again, it is the same.
    for op in ops:
        again = revisions.revision_assign(provider=provider, tenant_id=tenant.pk, key=op.key)
        assert again == op.adapter_revision_id
    run_due(limit=50)
    effects = mock.effects()
    assert effects["requests_by_version"] == {"": 40 - len(on_canary), "v2": len(on_canary)}
    assert effects["count"] == 40 and set(effects["by_key"].values()) == {1}
    for op in ops:
        (attempt,) = Attempt.objects.filter(operation_id=op.pk)
        assert attempt.adapter_revision_id == op.adapter_revision_id


def test_a_failing_canary_at_50_percent_is_rolled_back_on_its_own_and_its_unsent_work_goes_out_under_revision_1(
    tenant, enforced, watch
):
    provider, mock = enforced
    mock.break_versions({"v2": 500})  # the new API version is broken: 500 for its request shape
    provider = canary_of(provider, mock, percent=50)
    stable, canary_rev = provider.revision_id, provider.canary_revision_id
    ops = [submit(tenant, f"order-{i}:charge:v1") for i in range(40)]
    on_canary = {op.pk for op in ops if op.adapter_revision_id == canary_rev}
    assert len(on_canary) >= 12
    alerts = []
    with hooks.alert_raised.connected(lambda **kw: alerts.append(kw)):
        # One at a time, as a single worker thread would: the watch runs after each canary
        # failure and rolls the canary back while most of its share is still queued.
        run_due(limit=1, rounds=60)

    provider.refresh_from_db()
    assert provider.canary_revision_id is None and provider.canary_percent == 0
    assert provider.revision_id == stable and provider.base_url == mock.url
    sent_to_canary = {a.operation_id for a in Attempt.objects.filter(adapter_revision_id=canary_rev)}
    # Rolled back at the sixth counted failure (the minimum sample): not one more was sent.
    assert len(sent_to_canary) == 6 and sent_to_canary <= on_canary
    assert mock.effects()["requests_by_version"]["v2"] == 6
    rollback = ConfigChange.objects.filter(object_type="ledger.provider", actor="system:canary-watch").get()
    assert rollback.before == {"canary_revision": 2, "canary_percent": 50}
    assert rollback.after == {"canary_revision": None, "canary_percent": 0}
    assert "canary revision 2 failed 6 of 6 counted attempts (100%)" in rollback.reason
    assert [a["kind"] for a in alerts] == ["provider_canary_rolled_back"] and alerts[0]["ref"] == "charges"

    # The canary's unsent operations were re-queued under revision 1 and went out once there.
    requeued = on_canary - sent_to_canary
    assert requeued
    for op in Operation.objects.filter(pk__in=requeued):
        assert op.status == S.SUCCEEDED and op.adapter_revision_id == stable
        (attempt,) = Attempt.objects.filter(operation_id=op.pk)
        assert attempt.adapter_revision_id == stable
        reasons = list(OperationEvent.objects.filter(operation_id=op.pk).values_list("reason", flat=True))
        assert any(r.startswith("re-queued under adapter revision 1: revision 2 was rolled back") for r in reasons)
    # The ones the canary sent got a 500: uncertain, reconciled as usual — looked up where
    # they were sent (/v2), not found there, re-issued with the same key under revision 1.
    assert set(Operation.objects.filter(pk__in=sent_to_canary).values_list("status", flat=True)) == {S.UNCERTAIN}
    backdate_sent(sent_to_canary)
    reconcile_uncertain()
    assert set(Operation.objects.filter(pk__in=sent_to_canary).values_list("status", flat=True)) == {S.RETRY_WAIT}
    run_due(limit=50)
    assert set(Operation.objects.filter(pk__in=[op.pk for op in ops]).values_list("status", flat=True)) == {S.SUCCEEDED}
    for op_id in sent_to_canary:
        numbers = list(
            Attempt.objects.filter(operation_id=op_id).order_by("number").values_list("adapter_revision_id", flat=True)
        )
        assert numbers == [canary_rev, stable]

    # The provider's own count: one effect per key, and no key sent twice except the six
    # the broken canary answered 500 (once there, once here).
    effects = mock.effects()
    keys = {op.key for op in ops}
    assert effects["by_key"] == dict.fromkeys(keys, 1)
    twice = {key for key, n in effects["requests_by_key"].items() if n > 1}
    assert twice == {op.key for op in ops if op.pk in sent_to_canary}
    assert max(effects["requests_by_key"].values()) == 2


def test_the_watch_waits_for_its_minimum_sample_and_ignores_throttling_and_the_callers_own_invalid_input(
    tenant, enforced, watch
):
    provider, mock = enforced
    provider = canary_of(provider, mock, percent=100)
    # Throttled (429) and refused on its merits (400, 422): none of it counts.
    mock.script([{"status": 429, "retry_after": 0}] * 3 + [{"status": 400}] * 3 + [{"status": 422}] * 3)
    ops = [submit(tenant, f"k-{i}") for i in range(9)]
    for _ in range(20):
        Provider.objects.filter(pk=provider.pk).update(throttled_until=None)
        for op in Operation.objects.filter(status=S.RETRY_WAIT):
            make_due(op.pk)
        run_due(limit=1)
    statuses = sorted(Operation.objects.filter(pk__in=[op.pk for op in ops]).values_list("status", flat=True))
    assert statuses == [S.FAILED] * 6 + [S.SUCCEEDED] * 3
    figures = canary.canary_figures(Provider.objects.get(pk=provider.pk))
    # Only the three successes count: no failure, and fewer than the minimum sample.
    assert figures is not None and figures.canary_attempts == 3 and figures.canary_failures == 0
    assert figures.verdict == "collecting"
    assert Provider.objects.get(pk=provider.pk).canary_revision_id is not None


def test_the_sweep_rolls_back_a_canary_whose_failures_the_workers_did_not_judge(tenant, enforced, watch):
    provider, mock = enforced
    mock.break_versions({"v2": 502})
    provider = canary_of(provider, mock, percent=100)
    ops = [submit(tenant, f"k-{i}") for i in range(6)]
    # A worker that recorded its attempts and died before judging them.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canary, "canary_watch_after_attempt", lambda **kw: None)
        run_due(limit=10)
    assert Provider.objects.get(pk=provider.pk).canary_revision_id is not None
    report = sweep()
    assert report.counts.get("canary_failing") == 1
    provider.refresh_from_db()
    assert provider.canary_revision_id is None
    # The same pass reconciles the six 502s as usual (looked up under /v2): nothing re-sent yet.
    assert mock.effects()["requests_by_version"] == {"v2": 6} and mock.effects()["count"] == 0
    assert set(Operation.objects.filter(pk__in=[op.pk for op in ops]).values_list("status", flat=True)) <= {
        S.UNCERTAIN,
        S.RETRY_WAIT,
    }


def test_rejections_under_a_rolled_back_canary_stay_in_the_dlq_naming_it_and_are_not_resent(tenant, enforced, watch):
    provider, mock = enforced
    mock.break_versions({"v2": 404})  # an unexpected 4xx: the canary's path does not exist
    provider = canary_of(provider, mock, percent=100)
    ops = [submit(tenant, f"k-{i}") for i in range(8)]
    run_due(limit=1, rounds=20)
    provider.refresh_from_db()
    assert provider.canary_revision_id is None
    rejected = Operation.objects.filter(pk__in=[op.pk for op in ops], status=S.FAILED)
    assert rejected.count() == 6
    for op in rejected:
        entry = FailedEvent.objects.get(operation_id=op.pk)
        assert entry.adapter_revision.number == 2 and entry.status == "pending"
        assert failed_event_representation(entry)["adapter_revision"] == 2
        notes = list(FailedEventChange.objects.filter(event_id=entry.pk).values_list("note", flat=True))
        assert any("adapter revision 2 was rolled back by system:canary-watch" in n for n in notes)
    # Nothing re-sent them; the two the canary never sent went out under revision 1.
    effects = mock.effects()
    assert all(effects["requests_by_key"][op.key] == 1 for op in rejected)
    assert effects["requests_by_version"] == {"v2": 6, "": 2} and effects["count"] == 2


def test_operator_promotes_a_canary_by_hand_audited_and_its_config_becomes_the_providers(tenant, enforced):
    provider, mock = enforced
    queued_on_stable = submit(tenant, "k-stable-1")
    provider = canary_of(provider, mock, percent=10)
    assert queued_on_stable.adapter_revision.number == 1
    with pytest.raises(ValidationFailed):
        canary.revision_promote(provider_id=provider.pk, actor="user:bob", reason="  ")
    promoted = canary.revision_promote(provider_id=provider.pk, actor="user:bob", reason="v2 looks fine")
    assert promoted.revision.number == 2 and promoted.canary_revision_id is None
    assert promoted.base_url == mock.url + "/v2"
    change = ConfigChange.objects.filter(actor="user:bob").get()
    assert change.before == {"revision": 1, "canary_revision": 2, "canary_percent": 10}
    assert change.after == {"revision": 2, "canary_revision": None, "canary_percent": 0}
    assert change.reason == "v2 looks fine"
    with pytest.raises(AdapterRolloutConflict):
        canary.revision_promote(provider_id=provider.pk, actor="user:bob", reason="again")
    # The row queued under revision 1 runs under revision 2 when it is taken, and says so.
    (done,) = run_due()
    assert done.status == S.SUCCEEDED and done.adapter_revision_id == promoted.revision_id
    assert Attempt.objects.get(operation_id=done.pk).adapter_revision_id == promoted.revision_id
    assert mock.effects()["requests_by_version"] == {"v2": 1}
    reasons = list(OperationEvent.objects.filter(operation_id=done.pk).values_list("reason", flat=True))
    assert any("runs under adapter revision 2 from now on" in r for r in reasons)


def test_operator_rolls_back_by_hand_the_canary_and_then_a_stable_revision_audited(tenant, enforced):
    provider, mock = enforced
    provider = canary_of(provider, mock, percent=100)
    waiting = submit(tenant, "k-1")
    assert waiting.adapter_revision.number == 2
    result = canary.revision_rollback(provider_id=provider.pk, actor="user:carol", reason="customer complaint")
    assert (result.rolled_back, result.stable, result.requeued) == (2, 1, 1)
    assert Operation.objects.get(pk=waiting.pk).adapter_revision.number == 1
    (done,) = run_due()
    assert done.status == S.SUCCEEDED and mock.effects()["requests_by_version"] == {"": 1}
    # A direct change (no canary) makes revision 3 stable; rolled back by hand to revision 1.
    provider_upsert(tenant=tenant, slug="charges", timeout_seconds=3.0, actor="user:carol", reason="slower")
    # Without a canary the revision to return to must be named: a repeated "roll the canary
    # back" changes nothing.
    with pytest.raises(AdapterRolloutConflict):
        canary.revision_rollback(provider_id=provider.pk, actor="user:carol", reason="twice")
    back = canary.revision_rollback(provider_id=provider.pk, number=1, actor="user:carol", reason="too slow")
    provider.refresh_from_db()
    assert (back.rolled_back, back.stable) == (3, 1) and provider.timeout_seconds == 1.0
    trail = list(
        ConfigChange.objects.filter(actor="user:carol", object_type="ledger.provider")
        .order_by("at", "id")
        .values_list("reason", flat=True)
    )
    assert trail == ["customer complaint", "slower", "too slow"]
    # And forward again by hand to revision 3 (roll forward names the revision).
    forward = canary.revision_promote(provider_id=provider.pk, number=3, actor="user:carol", reason="fixed")
    assert forward.timeout_seconds == 3.0 and forward.revision.number == 3


def test_an_adapter_change_while_a_canary_runs_is_refused(tenant, enforced):
    provider, mock = enforced
    canary_of(provider, mock, percent=20)
    with pytest.raises(AdapterRolloutConflict):
        provider_upsert(tenant=tenant, slug="charges", timeout_seconds=4.0, actor="user:alice")
    with pytest.raises(ValidationFailed):
        provider_upsert(tenant=tenant, slug="charges", max_attempts=5, canary_percent=150, actor="user:alice")
    assert AdapterRevision.objects.filter(provider=provider).count() == 2
