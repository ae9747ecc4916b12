"""The console shows a quarantined DLQ entry's reason and replays it with corrected fields as
the next version of its key (issue 13 item 3), for those allowed to replay."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlq.models import FailedEvent, Replay
from dlq.targets import services as dlq_targets
from tests.console.support import client_for, enforced_provider, failed_op, page, staff
from tests.dlq.sinks import Sink

pytestmark = pytest.mark.django_db


@pytest.fixture
def sink() -> Iterator[Sink]:
    receiver = Sink().start()
    yield receiver
    receiver.stop()


def test_an_operator_corrects_a_quarantined_entry_as_the_next_version(tenant, sink):
    dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n", url=f"{sink.url}/webhook/rerun", is_default=True)
    op = failed_op(tenant, enforced_provider(tenant), "lead-1:create:v1", payload={"email": "bad@", "plan": "pro"})
    entry = FailedEvent.objects.get(operation=op)
    client = client_for(staff("olga", role="operator", tenants=[tenant]))

    status, html = page(client, f"/admin/dlq/failedevent/{entry.pk}/change/")
    assert status == 200 and 'data-testid="quarantine"' in html and "HTTP 422" in html
    assert 'data-testid="correct"' in html

    response = client.post(
        f"/admin/dlq/failedevent/{entry.pk}/correct/",
        {"fields_json": '{"email": "lead1@example.org"}', "note": "address fixed with sales", "target": ""},
    )

    assert response.status_code == 302, response.content.decode()[:500]
    [request] = sink.received()
    assert request.header("Idempotency-Key") == "lead-1:create:v2"
    assert request.json() == {"email": "lead1@example.org", "plan": "pro"}
    replay = Replay.objects.get(event=entry)
    assert replay.actor == "user:olga" and replay.corrected_fields == ["email"]


def test_an_auditor_cannot_correct(tenant):
    op = failed_op(tenant, enforced_provider(tenant), "lead-2:create:v1", payload={"email": "bad@"})
    entry = FailedEvent.objects.get(operation=op)
    client = client_for(staff("aude", role="auditor", tenants=[tenant]))

    response = client.post(f"/admin/dlq/failedevent/{entry.pk}/correct/", {"fields_json": "{}", "note": "x"})

    assert response.status_code == 403
