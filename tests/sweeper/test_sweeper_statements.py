"""The sweeper's per-row statements: what a pass costs grows with the rows it moves (2,000 at
10M, bench.scale), so a read repeated per row is a read repeated 500–1,500 times a pass."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alerts import services as alerts
from alerts.models import Alert
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol import services
from ledger.recovery.sweeper import reconcile_uncertain, sweep_expired_leases
from tests.ledger.support import expire_lease

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reconciled_row_reads_its_attempts_prompt_template_once(tenant: Any) -> None:
    provider = services.provider_upsert(
        tenant=tenant,
        slug="smtp",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
        lookup_path="/x?k={key}",
    )
    op = services.operation_claim(tenant=tenant, key="c:1", provider=provider, request={}, mark_sent=True).operation
    expire_lease(op.pk)
    sweep_expired_leases()

    with CaptureQueriesContext(connection) as captured:
        report = reconcile_uncertain()

    assert report.counts == {"uncertain->review": 1}
    # Once for the row's log context; the move inside it names the same attempt.
    assert sum('"ledger_attempt"."prompt_template_id"' in sql for sql in _sql(captured)) == 1, _sql(captured)
    assert Operation.objects.get(pk=op.pk).status == OperationStatus.REVIEW


def test_a_new_alert_is_inserted_without_reading_its_dedup_key_first(tenant: Any) -> None:
    with CaptureQueriesContext(connection) as captured:
        alerts.alert_raise(tenant_id=tenant.pk, kind="operation_stuck", ref="k-1", summary="stuck")

    assert not [sql for sql in _sql(captured) if sql.startswith("SELECT") and '"dedup_key" =' in sql]
    assert Alert.objects.get(tenant=tenant, ref="k-1").episode == 1


def test_a_raise_that_loses_the_episode_to_a_concurrent_one_counts_a_repeat(tenant: Any, monkeypatch: Any) -> None:
    alerts.alert_raise(tenant_id=tenant.pk, kind="operation_stuck", ref="k-2", summary="stuck")
    # The concurrent raise's view: it read before the first raise committed (no unresolved
    # alert, episode 1 free), then inserts the same episode.
    monkeypatch.setattr(alerts, "_repeat", lambda same, now: False)

    class NoEpisode:
        def aggregate(self, **kw: Any) -> dict[str, Any]:
            return {"last": None}

    real_filter = alerts.Alert.objects.filter
    monkeypatch.setattr(
        alerts.Alert.objects,
        "filter",
        lambda *a, **kw: _first_read_empty(real_filter(*a, **kw), kw, NoEpisode),
    )
    alerts.alert_raise(tenant_id=tenant.pk, kind="operation_stuck", ref="k-2", summary="stuck")

    [alert] = Alert.objects.filter(tenant=tenant, ref="k-2")
    assert (alert.episode, alert.repeat_count) == (1, 1)


def _first_read_empty(qs: Any, kw: dict[str, Any], empty: Any) -> Any:
    # The raise's own (tenant, kind, ref) read answers "no episode yet"; other filters are real.
    return empty() if set(kw) == {"tenant_id", "kind", "ref"} else qs


def _sql(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries]
