"""An erasure that meets a person's render still at the provider (DESIGN §8, §11; issue 15 item
6): the operation is not cancellable (the provider has the job), so it runs to its end — but
its output is neither fetched nor published once the erasure destroyed the request, also when
the erasure lands while a poll holds the row. Before, the file was stored after the erasure
said it was done. Both databases."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationEvent, OperationOutput, OperationStatus
from ledger.protocol.services import provider_upsert
from ledger.providers import adapters
from review.privacy import erasure
from review.privacy.subjects import subject_resolve
from tests.execute.support import make_due, run_due
from tests.execute.test_async_providers import ASK, render_fields
from tests.support.fixtures import *  # noqa: F403 - the loopback providers (mock_images)
from tests.support.objects import stored_files

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)
EMAIL = "mei.lin@example.invalid"


@pytest.fixture
def waiting_render(tenant, mock_images, object_dirs) -> Operation:
    provider_upsert(tenant=tenant, slug="images", **render_fields(mock_images.url))
    mock_images.set_switches(delay=120)
    op = operation_submit(
        tenant=tenant,
        key="render-1:v1",
        provider="images",
        request={"path": "/v1/renders", "body": ASK},
        payload={"customer_email": EMAIL},
    ).operation
    run_due()
    assert Operation.objects.get(pk=op.pk).status == S.WAITING
    mock_images.release()
    return op


def _erase(tenant, capture: Any) -> None:
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": EMAIL}),
        actor="user:ada",
        reason="Erasure request ER-91, verified",
        enqueue=False,
    )
    with capture(execute=True):
        run = erasure.erasure_continue(run_id=run.pk)
    assert run.operations == 1


def _nothing_kept(op: Operation, object_dirs: dict[str, Any]) -> None:
    done = Operation.objects.get(pk=op.pk)
    assert done.status == S.SUCCEEDED
    assert not OperationOutput.objects.filter(operation_id=op.pk).exists()
    assert stored_files(object_dirs["objects"]) == [] and stored_files(object_dirs["quarantine"]) == []
    last = OperationEvent.objects.filter(operation_id=op.pk).order_by("-id").first()
    assert "erased on request" in last.reason


def test_a_render_erased_while_it_waits_finishes_without_its_output_being_kept(
    tenant, waiting_render, mock_images, object_dirs, django_capture_on_commit_callbacks
):
    _erase(tenant, django_capture_on_commit_callbacks)
    make_due(waiting_render.pk)
    run_due()
    _nothing_kept(waiting_render, object_dirs)
    assert mock_images.effects()["fetches"] == 0 and mock_images.effects()["renders"] == 1


def test_a_render_erased_while_a_poll_holds_it_publishes_nothing(
    tenant, waiting_render, mock_images, object_dirs, django_capture_on_commit_callbacks
):
    make_due(waiting_render.pk)
    (held,) = operations_take(limit=1)  # the poll's holder read the row before the erasure
    _erase(tenant, django_capture_on_commit_callbacks)
    with adapters.http_client() as client:
        operation_execute(operation=held, client=client, actor="test-worker")
    _nothing_kept(waiting_render, object_dirs)
