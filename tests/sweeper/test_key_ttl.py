"""The provider's key TTL counts from the key's first use: past it a re-issue could act twice."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db.models import F

from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, IdempotencyClass, Operation, OperationStatus, Provider
from ledger.protocol import services
from ledger.recovery.sweeper import sweep

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)
TTL = 100


class ForgetfulReceiver:
    """Key-enforced like Stripe: dedups on the key, and forgets a key TTL seconds after its
    first use. Every answer is lost (a timeout after the request left)."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.first_use: dict[str, float] = {}
        self.effects: Counter[str] = Counter()

    def handle(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        first = self.first_use.get(key)
        if first is None or self.clock - first > TTL:
            self.first_use[key] = self.clock
            self.effects[key] += 1
        raise httpx.ReadTimeout("answer lost", request=request)


def _advance(receiver: ForgetfulReceiver, tenant: Any, seconds: float) -> None:
    """Time passes: every stored time moves into the past, the receiver's memory ages."""
    receiver.clock += seconds
    delta = timedelta(seconds=seconds)
    cols = ("claimed_at", "sent_at", "created_at", "updated_at", "next_attempt_at", "expires_at", "lease_expires_at")
    Operation.objects.filter(tenant=tenant).update(**{c: F(c) - delta for c in cols})
    Attempt.objects.filter(operation__tenant=tenant).update(
        started_at=F("started_at") - delta, sent_at=F("sent_at") - delta
    )


def _execute_once(client: httpx.Client) -> None:
    (op,) = operations_take(limit=1)
    operation_execute(operation=op, client=client)


def _set_up(tenant: Any) -> tuple[Provider, ForgetfulReceiver, httpx.Client, Operation]:
    provider = services.provider_upsert(
        tenant=tenant,
        slug="nolookup",
        base_url="http://nolookup.test",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        key_ttl_seconds=TTL,
        timeout_seconds=5,
        max_attempts=6,
        lifetime_seconds=1000,
    )
    receiver = ForgetfulReceiver()
    client = httpx.Client(transport=httpx.MockTransport(receiver.handle))
    op = operation_submit(
        tenant=tenant, key="order-9:charge:v1", provider=provider.slug, request={"method": "POST", "path": "/c"}
    ).operation
    return provider, receiver, client, op


def test_a_key_is_not_reissued_once_the_provider_may_have_forgotten_its_first_use(tenant):
    """Measured from the latest re-issue (t=60) the TTL had 40 s left at t=120; measured from
    the key's first use (t=0), the provider forgot it at t=100."""
    _, receiver, client, op = _set_up(tenant)

    _execute_once(client)  # attempt 1 at t=0: performed, answer lost → uncertain
    sweep()  # no lookup: re-issue with the same key (the provider dedups)
    _advance(receiver, tenant, 60)
    _execute_once(client)  # attempt 2 at t=60: deduplicated, answer lost again
    _advance(receiver, tenant, 60)  # t=120: the provider forgot the key at t=100
    sweep()
    for _ in range(3):
        if not Operation.objects.filter(pk=op.pk, status__in=[S.QUEUED, S.RETRY_WAIT]).exists():
            break
        _execute_once(client)
        sweep()

    assert receiver.effects["order-9:charge:v1"] == 1
    assert Operation.objects.get(pk=op.pk).status == S.REVIEW


def test_a_reissue_held_back_past_the_key_ttl_goes_to_review_instead_of_being_sent(tenant):
    """A paused provider holds the re-issue back beyond the TTL: the worker that finally takes
    it must not send it."""
    provider, receiver, client, op = _set_up(tenant)
    _execute_once(client)  # t=0: performed, answer lost → uncertain
    sweep()  # → retry_wait, re-issue with the same key
    services.provider_pause(provider_id=provider.pk, reason="401 from the provider")
    _advance(receiver, tenant, 120)
    services.provider_resume(provider_id=provider.pk, actor="operator")

    _execute_once(client)

    assert receiver.effects["order-9:charge:v1"] == 1
    assert Operation.objects.get(pk=op.pk).status == S.REVIEW
