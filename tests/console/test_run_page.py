"""The console's run page (issue 13 item 1): each step's checkpoint state and whether it is safe
to repeat, the resume's preview, and the audited resume itself — for the user's tenants only,
and only for those allowed to replay."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from dlq.models import RunResume
from dlq.targets import services as dlq_targets
from ledger.models import ErrorClass, Operation
from ledger.protocol import services
from tests.console.support import client_for, enforced_provider, page, staff
from tests.dlq.sinks import Sink

pytestmark = pytest.mark.django_db

RUN = "export-2024-05"
URL = "/admin/onceguard/runs/"


@pytest.fixture
def sink() -> Iterator[Sink]:
    receiver = Sink().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def run_steps(tenant, sink) -> list[Operation]:
    """Step 1 done, step 2 failed (nothing happened), in one run; a default replay target."""
    dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n", url=f"{sink.url}/webhook/rerun", is_default=True)
    provider = enforced_provider(tenant)
    provider = services.provider_upsert(tenant=tenant, slug=provider.slug, max_attempts=1)
    one = services.operation_claim(tenant=tenant, key="export-1:crm:v1", provider=provider, run=RUN, step=1).operation
    one = services.operation_complete(
        operation_id=one.pk, tenant_id=one.tenant_id, lease_token=one.lease_token, provider_ref="c-1"
    )
    two = services.operation_claim(
        tenant=tenant, key="export-1:notify:v1", provider=provider, run=RUN, step=2, payload={"n": 2}
    ).operation
    two = services.operation_fail(
        operation_id=two.pk,
        tenant_id=two.tenant_id,
        lease_token=two.lease_token,
        error_class=ErrorClass.TRANSIENT,
        message="HTTP 503",
    )
    assert two.status == "failed"
    return [one, two]


def run_url(tenant_id: int | None = None) -> str:
    return f"{URL}?{urlencode({'run': RUN, **({'tenant': tenant_id} if tenant_id else {})})}"


def test_an_operator_sees_the_steps_and_resumes_only_the_failed_one(tenant, run_steps, sink):
    client = client_for(staff("olga", role="operator", tenants=[tenant]))

    status, html = page(client, run_url())

    assert status == 200
    assert 'data-checkpoint="done"' in html and 'data-checkpoint="failed"' in html
    assert "re-driven</strong> via target" in html and "Resume these steps" in html
    response = client.post(
        run_url(tenant.pk), {"note": "notification service is back", "operations": str(run_steps[1].pk)}
    )
    assert response.status_code == 302
    [request] = sink.received()
    assert request.header("Idempotency-Key") == "export-1:notify:v1"
    resume = RunResume.objects.get()
    assert resume.actor == "user:olga" and resume.note == "notification service is back"
    status, html = page(client, run_url(tenant.pk))
    assert 'data-checkpoint="failed"' not in html and "Nothing to resume" in html and "notification service" in html


def test_a_stale_preview_re_drives_nothing(tenant, run_steps, sink):
    client = client_for(staff("olga", role="operator", tenants=[tenant]))

    response = client.post(run_url(tenant.pk), {"note": "retry", "operations": str(run_steps[0].pk)})

    assert response.status_code == 200 and "changed since the preview" in response.content.decode()
    assert sink.received() == [] and not RunResume.objects.exists()


def test_an_auditor_may_look_but_not_resume(tenant, run_steps, sink):
    client = client_for(staff("aude", role="auditor", tenants=[tenant]))

    status, html = page(client, run_url())

    assert status == 200 and "Resume these steps" not in html
    response = client.post(run_url(tenant.pk), {"note": "x", "operations": str(run_steps[1].pk)})
    assert response.status_code == 403 and sink.received() == []


def test_another_tenants_staff_do_not_find_the_run(tenant, other_tenant, run_steps):
    client = client_for(staff("gus", role="operator", tenants=[other_tenant]))

    status, html = page(client, run_url(tenant.pk))

    assert status == 404 and "export-1" not in html


def test_the_operation_page_links_its_run(tenant, run_steps):
    client = client_for(staff("olga", role="operator", tenants=[tenant]))

    status, html = page(client, f"/admin/ledger/operation/{run_steps[1].pk}/change/")

    assert status == 200 and f"{URL}?run={RUN}" in html.replace("&amp;", "&")
