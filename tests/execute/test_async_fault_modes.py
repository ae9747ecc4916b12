"""One render through every fault mode of the relay (relay.fault_relay), at each of its three
calls — the submit, a poll, the output's fetch: whatever is lost, the job renders once at the
provider, one checked output is published, and the operation ends ``succeeded``. The figures
of each run (attempts, provider submits/renders/polls/fetches/lookups, sweeper passes) are
printed (``pytest -s``) and recorded in DESIGN §5, asynchronous providers.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import Attempt, Operation, OperationEvent, OperationOutput, OperationStatus
from ledger.protocol.services import provider_upsert
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from relay.fault_relay import (
    DELAY_THEN_RESPOND,
    FAIL_BEFORE_FORWARD,
    FAIL_BEFORE_FORWARD_CLOSE,
    FORWARD_AND_RESPOND,
    FORWARD_THEN_DROP_RESPONSE,
    FORWARD_THEN_RESET,
)
from tests.execute.support import make_due, run_due
from tests.execute.test_async_providers import ASK, render_fields

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

FAULTS = (
    FORWARD_AND_RESPOND,
    FAIL_BEFORE_FORWARD,
    FAIL_BEFORE_FORWARD_CLOSE,
    FORWARD_THEN_DROP_RESPONSE,
    FORWARD_THEN_RESET,
    DELAY_THEN_RESPOND,
)
# The calls of one render through the relay, in order: which one the fault hits.
STAGES = {"submit": 0, "poll": 1, "fetch": 2}


def _drive(op_id: int) -> int:
    """Run workers and sweeper passes until the operation is finished (bounded); the sweeper
    passes it took. Instead of sleeping, due times and the lookup's settle time are brought
    forward on the database clock."""
    sweeps = 0
    for _ in range(30):
        row = Operation.objects.get(pk=op_id)
        if row.status in (S.SUCCEEDED, S.FAILED, S.REVIEW, S.ABANDONED):
            return sweeps
        if row.status in (S.WAITING, S.RETRY_WAIT, S.QUEUED):
            make_due(op_id)
            run_due()
        elif row.status == S.UNCERTAIN:
            # A "not found" is trusted once the provider had its timeout to settle.
            Operation.objects.filter(pk=op_id).update(sent_at=sql.db_now() - timedelta(seconds=30))
            sweep()
            sweeps += 1
    return sweeps


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("fault", FAULTS)
def test_one_render_through_each_fault_renders_once_and_publishes_one_checked_output(
    tenant, mock_images, relay_factory, stage, fault, capsys
):
    relay = relay_factory(mock_images)
    # The held answer outlasts the provider's timeout: sent, answer never seen.
    step = {"mode": fault, "delay": 2.5} if fault == DELAY_THEN_RESPOND else {"mode": fault}
    relay.script([FORWARD_AND_RESPOND] * STAGES[stage] + [step])
    provider_upsert(
        tenant=tenant,
        slug="images",
        **render_fields(relay.url, timeout_seconds=1.0, poll_initial_seconds=0.05, poll_max_seconds=0.2),
    )
    op = operation_submit(
        tenant=tenant,
        key=f"render-{stage}-{fault}:v1",
        provider="images",
        request={"method": "POST", "path": "/v1/renders", "body": ASK},
    ).operation
    sweeps = _drive(op.pk)
    done = Operation.objects.get(pk=op.pk)
    effects = mock_images.effects()
    moves = list(OperationEvent.objects.filter(operation_id=op.pk).values_list("to_status", flat=True))
    figures = {
        "stage": stage,
        "fault": fault,
        "status": done.status,
        "attempts": Attempt.objects.filter(operation_id=op.pk).count(),
        "submits": effects["submits"],
        "renders": effects["renders"],
        "polls": effects["polls"],
        "fetches": effects["fetches"],
        "lookups": effects["lookups"],
        "sweeps": sweeps,
        "path": " → ".join(moves),
    }
    with capsys.disabled():
        print("\nrender-fault " + " ".join(f"{k}={v}" for k, v in figures.items()))
    assert done.status == S.SUCCEEDED, figures
    assert effects["renders"] == 1 and effects["by_key"] == {op.key: 1}, figures
    assert OperationOutput.objects.filter(operation_id=op.pk).count() == 1
    # A key-enforced provider that can be looked up is never sent the job a second time while
    # it has one: a lost answer is found by lookup, a refused send is re-issued (not seen twice).
    assert effects["submits"] == 1, figures
