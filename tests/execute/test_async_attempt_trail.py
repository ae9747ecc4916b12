"""What a poll does belongs to the attempt that submitted the job (DESIGN §5, asynchronous
providers; intents): its log lines name that attempt's adapter revision and prompt template
version — whether a worker or the provider's webhook runs it —, and the output is fetched
under the operation's adapter revision, as its submit and polls were. Both databases."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from ledger.execution import uploads
from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.management.commands import bootstrap_demo as demo
from ledger.models import ErrorClass, IdempotencyClass, Operation, OperationOutput, OperationStatus, Provider, Upload
from ledger.protocol.services import provider_upsert
from ledger.providers import adapters, prompts
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.execute.support import make_due, run_due
from tests.execute.test_async_providers import ASK, WEBHOOK_SECRET, render_fields
from tests.support.objects import image_bytes

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)
DESCRIPTION = "Ada Lovelace's red mug"


@pytest.fixture
def demo_renders(tenant, mock_images, object_dirs) -> Provider:
    """The render demo's provider (make run), on the mock image API."""
    prompts.prompt_template_create(
        tenant=tenant,
        name=demo.RENDER_PROMPT,
        text=demo.RENDER_PROMPT_TEXT,
        slots={"description": {"max_length": 300}},
        actor="user:alice",
    )
    return provider_upsert(
        tenant=tenant,
        slug="demo-renders",
        base_url=mock_images.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        lookup_path="/v1/renders?idempotency_key={key}",
        ref_pointer="/id",
        lookup_settle_seconds=0,
        timeout_seconds=2,
        webhook_secret=WEBHOOK_SECRET,
        intent_schema=demo.RENDER_INTENT_SCHEMA,
        request_template=demo.RENDER_REQUEST_TEMPLATE,
        **demo.RENDER_ASYNC_FIELDS,
    )


def _submit(tenant, key: str) -> Operation:
    source = uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(10, 10))).upload
    intent = {
        "preset_id": "product-shot",
        "preset_version": 1,
        "aspect_class": "square",
        "source_key": source.key,
        "source_sha256": source.sha256,
        "description": DESCRIPTION,
    }
    return operation_submit(tenant=tenant, key=key, provider="demo-renders", intent=intent).operation


def _lines_of(lines: list[str], key: str) -> list[str]:
    return [line for line in lines if f"key={key}" in line]


def test_every_line_of_a_workers_poll_names_the_attempts_template_version_and_revision(tenant, demo_renders, log_lines):
    op = _submit(tenant, "render-1:v1")
    run_due()
    make_due(op.pk)
    run_due()
    assert Operation.objects.get(pk=op.pk).status == S.SUCCEEDED
    lines = _lines_of(log_lines, "render-1:v1")
    assert {line.split()[3] for line in lines} >= {"execute_attempt", "output_published", "poll"}
    for line in lines:
        assert "prompt_template=demo-product-shot@1" in line and "adapter_revision=1" in line, line
    assert not [line for line in log_lines if "Lovelace" in line]


def test_every_line_of_a_webhooks_poll_names_the_attempts_template_version_and_revision(
    tenant, demo_renders, mock_images, log_lines
):
    mock_images.set_switches(delay=120)
    op = _submit(tenant, "render-2:v1")
    run_due()
    job = Operation.objects.get(pk=op.pk).provider_ref
    mock_images.release()
    log_lines.clear()
    body = json.dumps({"id": job}).encode()
    answer = APIClient().post(
        f"/api/v1/webhooks/{tenant.slug}/demo-renders",
        body,
        content_type="application/json",
        HTTP_ONCEGUARD_SIGNATURE=adapters.sign(secret=WEBHOOK_SECRET, body=body),
    )
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    lines = _lines_of(log_lines, "render-2:v1")
    assert {line.split()[3] for line in lines} >= {"output_published", "poll"}
    for line in lines:
        assert "prompt_template=demo-product-shot@1" in line and "adapter_revision=1" in line, line
        assert f"tenant={tenant.pk}" in line and f"operation={op.pk}" in line, line
    assert not [line for line in log_lines if "Lovelace" in line]


def test_the_output_is_fetched_under_the_operations_adapter_revision(tenant, mock_images, relay_factory, object_dirs):
    provider_upsert(tenant=tenant, slug="images", **render_fields(mock_images.url))
    # Revision 2 reaches the same API through another address (the relay): a canary for all.
    relay = relay_factory(mock_images)
    provider_upsert(tenant=tenant, slug="images", base_url=relay.url, canary_percent=100, reason="new address")
    op = operation_submit(
        tenant=tenant, key="order-9:render:v1", provider="images", request={"path": "/v1/renders", "body": ASK}
    ).operation
    assert op.adapter_revision.number == 2
    run_due()
    make_due(op.pk)
    run_due()
    done = Operation.objects.get(pk=op.pk)
    assert done.status == S.SUCCEEDED and OperationOutput.objects.filter(operation_id=op.pk).exists()
    seen = [(entry["method"], entry["path"]) for entry in relay.journal()]
    # Submit, poll and the output's fetch all went to revision 2's base URL.
    assert ("GET", f"/v1/renders/{done.provider_ref}/output") in seen, seen
    assert mock_images.effects()["fetches"] == 1


def test_a_wrong_size_output_is_refused_also_when_the_source_upload_was_deleted_while_the_job_ran(
    tenant, demo_renders, mock_images
):
    # The size asked for comes from the intent's translation; the upload it named being gone
    # (retention, an erasure of another job naming the same bytes) changes nothing about it.
    mock_images.script([{"wrong_size": True}])
    op = _submit(tenant, "render-3:v1")
    run_due()
    assert Operation.objects.get(pk=op.pk).status == S.WAITING
    Upload.objects.filter(tenant=tenant).delete()
    make_due(op.pk)
    run_due()
    failed = Operation.objects.get(pk=op.pk)
    assert failed.status == S.FAILED and failed.error_class == ErrorClass.INVALID_OUTPUT, failed.last_error
    assert "expected 256×256" in failed.last_error
    assert not OperationOutput.objects.filter(operation_id=op.pk).exists()


def test_the_sweepers_lines_about_an_attempt_name_its_template_version_and_revision(
    tenant, demo_renders, mock_images, log_lines
):
    mock_images.set_switches(delay=120)
    op = _submit(tenant, "render-4:v1")
    run_due()
    make_due(op.pk)
    assert len(operations_take(limit=1)) == 1  # a poll's holder that dies
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=sql.db_now() - timedelta(seconds=1))
    log_lines.clear()
    sweep()
    assert Operation.objects.get(pk=op.pk).status == S.WAITING
    (moved,) = [line for line in _lines_of(log_lines, "render-4:v1") if "sweeper_moved" in line]
    assert "prompt_template=demo-product-shot@1" in moved and "adapter_revision=1" in moved, moved


def test_the_sweepers_reconciliation_lines_name_the_attempts_template_version_and_revision(
    tenant, demo_renders, log_lines
):
    op = _submit(tenant, "render-5:v1")
    (taken,) = operations_take(limit=1)
    # The worker rendered the request and recorded its prompt version, then died sending it.
    prompt = prompts.prompt_template_get(tenant_id=tenant.pk, name=demo.RENDER_PROMPT)
    prompts.attempt_prompt_record(operation_id=op.pk, lease_token=taken.lease_token, prompt_id=prompt.pk)
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=sql.db_now() - timedelta(seconds=1))
    # The provider cannot be reached for the lookup: the sweeper says so, about this attempt.
    Provider.objects.filter(pk=demo_renders.pk).update(base_url="http://127.0.0.1:9")
    log_lines.clear()
    sweep()
    lines = _lines_of(log_lines, "render-5:v1")
    assert any("sweeper_lookup_unknown" in line for line in lines), lines
    for line in lines:
        assert "prompt_template=demo-product-shot@1" in line and "adapter_revision=1" in line, line
