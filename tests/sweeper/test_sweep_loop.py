"""`manage.py sweep --every`: the loop the soak runs beside django-q2's whole-minute schedule."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from ledger.management.commands import sweep as sweep_command
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol import services
from ledger.recovery.sweeper import SweepReport
from tests.ledger.support import expire_lease

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


def test_sweep_loop_moves_an_expired_lease_and_stops_after_its_time(tenant):
    provider = services.provider_upsert(
        tenant=tenant, slug="enf", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    op = services.operation_claim(
        tenant=tenant, key="loop:1", provider=provider, request={}, uses_sent_marker=True
    ).operation
    expire_lease(op.pk)

    call_command("sweep", every=0.05, for_seconds=0.3, stdout=StringIO())

    assert Operation.objects.get(pk=op.pk).status == S.RETRY_WAIT


def test_sweep_loop_survives_a_failing_pass(monkeypatch: Any):
    calls: list[int] = []

    def flaky(*, batch: int) -> SweepReport:
        calls.append(batch)
        if len(calls) == 1:
            raise ConnectionError("database restarting")
        return SweepReport()

    monkeypatch.setattr(sweep_command, "sweep", flaky)

    call_command("sweep", every=0.05, for_seconds=0.4, stdout=StringIO())

    assert len(calls) >= 2


def test_one_pass_without_every_prints_what_it_did():
    out = StringIO()
    call_command("sweep", stdout=out)
    assert out.getvalue().strip() == "nothing to do"
