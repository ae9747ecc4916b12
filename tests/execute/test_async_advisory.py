"""A key-advisory render provider (DESIGN §5, asynchronous providers, item 4 of issue 15): when
the job id of a submit is lost, it is never re-submitted on a guess — the row goes to review
like any advisory provider's, and the provider saw one submit. Both databases."""

from __future__ import annotations

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol.services import provider_upsert
from ledger.recovery.sweeper import sweep
from tests.execute.support import make_due, run_due
from tests.execute.test_async_providers import ASK, render_fields

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lost_job_id_of_a_key_advisory_render_provider_goes_to_review_without_a_second_submit(
    tenant, mock_images, relay_factory
):
    relay = relay_factory(mock_images)
    # The provider creates the job; its answer arrives after the worker gave up on it.
    relay.script([{"mode": "delay-then-respond", "delay": 2.5}])
    provider_upsert(
        tenant=tenant,
        slug="images",
        **render_fields(
            relay.url, idempotency_class=IdempotencyClass.KEY_ADVISORY, lookup_path="", timeout_seconds=1.0
        ),
    )
    op = operation_submit(
        tenant=tenant, key="order-5:render:v1", provider="images", request={"path": "/v1/renders", "body": ASK}
    ).operation
    run_due()
    assert Operation.objects.get(pk=op.pk).status == S.UNCERTAIN
    sweep()
    make_due(op.pk)
    run_due()
    sweep()
    final = Operation.objects.get(pk=op.pk)
    assert final.status == S.REVIEW, final.status
    assert mock_images.effects()["submits"] == 1 and mock_images.effects()["renders"] <= 1
