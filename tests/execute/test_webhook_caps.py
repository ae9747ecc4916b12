"""A provider's webhook is polled on the workers' terms (DESIGN §5, asynchronous providers;
rate and concurrency caps): a paused or throttled provider, or one at its caps, is not called
because it sent a note — the row stays waiting, due now, for the workers — and a poll the caps
admit is spent from the provider's bucket like a worker's. Both databases."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from ledger.execution.attempts import operations_take
from ledger.models import Operation, OperationStatus, Provider
from ledger.protocol.services import provider_upsert
from ledger.providers import adapters
from ledger.store import sql
from tests.execute.support import make_due, run_due
from tests.execute.test_async_providers import WEBHOOK_SECRET, render_fields, row, submit

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def renders(tenant, mock_images) -> Provider:
    return provider_upsert(
        tenant=tenant, slug="images", webhook_secret=WEBHOOK_SECRET, **render_fields(mock_images.url)
    )


def _note(tenant, job: str):
    body = json.dumps({"id": job}).encode()
    return APIClient().post(
        f"/api/v1/webhooks/{tenant.slug}/images",
        body,
        content_type="application/json",
        HTTP_ONCEGUARD_SIGNATURE=adapters.sign(secret=WEBHOOK_SECRET, body=body),
    )


def _waiting(tenant, mock_images, n: int) -> list[Operation]:
    mock_images.set_switches(delay=120)
    ops = [submit(tenant, key=f"order-{i}:render:v1").operation for i in range(n)]
    run_due()
    assert {row(op.pk).status for op in ops} == {S.WAITING}
    return [row(op.pk) for op in ops]


@pytest.mark.parametrize("hold", ["paused", "throttled"])
def test_a_webhook_does_not_call_a_paused_or_throttled_provider_and_leaves_the_row_due(
    tenant, renders, mock_images, hold
):
    (op,) = _waiting(tenant, mock_images, 1)
    mock_images.release()
    until = sql.db_now() + timedelta(hours=1)
    Provider.objects.filter(pk=renders.pk).update(
        **({"paused_at": sql.db_now()} if hold == "paused" else {"throttled_until": until})
    )
    polls = mock_images.effects()["polls"]

    answer = _note(tenant, op.provider_ref)

    assert answer.status_code == 200 and answer.json() == {"operation": op.pk, "status": "waiting", "applied": False}
    assert mock_images.effects()["polls"] == polls
    held = row(op.pk)
    assert held.status == S.WAITING and held.polls == 0 and held.next_attempt_at <= sql.db_now()
    Provider.objects.filter(pk=renders.pk).update(paused_at=None, throttled_until=None)
    run_due()
    assert row(op.pk).status == S.SUCCEEDED and mock_images.effects()["renders"] == 1


def test_a_webhook_does_not_poll_past_the_providers_in_flight_cap(tenant, renders, mock_images):
    first, second = _waiting(tenant, mock_images, 2)
    provider_upsert(tenant=tenant, slug="images", max_in_flight=1)
    make_due(first.pk)
    (polling,) = operations_take(limit=5)  # a worker holds the first job's poll
    assert polling.pk == first.pk and row(first.pk).status == S.CLAIMED
    polls = mock_images.effects()["polls"]

    answer = _note(tenant, second.provider_ref)

    assert answer.json()["applied"] is False and row(second.pk).status == S.WAITING
    assert mock_images.effects()["polls"] == polls


def test_a_webhooks_poll_spends_the_providers_rate(tenant, renders, mock_images):
    first, second = _waiting(tenant, mock_images, 2)
    provider_upsert(tenant=tenant, slug="images", rate_limit=1, rate_period_seconds=3600, rate_burst=1)
    polls = mock_images.effects()["polls"]

    assert _note(tenant, first.provider_ref).json()["applied"] is True
    assert mock_images.effects()["polls"] == polls + 1
    # The bucket's one call is spent: the next note waits for the workers, like a due poll.
    assert _note(tenant, second.provider_ref).json()["applied"] is False
    assert mock_images.effects()["polls"] == polls + 1
    make_due(second.pk)
    assert operations_take(limit=5) == []
