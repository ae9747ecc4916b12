"""The render-from-upload template in a real n8n, run with `n8n execute --id`: the node's
Upload File stores the workflow's PNG in Onceguard and Submit Operation sends an intent naming
it by key and digest; Onceguard renders the provider's request from the intent, once — the
same workflow run again is replayed, never rendered twice — and an intent the provider's
schema does not declare fails the execution with Onceguard's code, nothing written.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.management.commands.bootstrap_demo import (
    RENDER_INTENT_SCHEMA,
    RENDER_PROMPT,
    RENDER_PROMPT_TEXT,
    RENDER_REQUEST_TEMPLATE,
)
from ledger.models import Operation, OperationStatus, Tenant, Upload
from ledger.platform.crypto import open_json
from ledger.providers import prompts
from tests.execute.conftest import configure_provider
from tests.execute.support import RenderApi, run_due
from tests.n8n.support import N8n, node_named, template

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

S = OperationStatus
WORKFLOW, UNKNOWN_FIELD = "ogRenderUpload01", "ogRenderUnknown1"
KEY = "render-sample-1:render:v1"


def unknown_field_workflow() -> dict[str, Any]:
    """The template whose intent carries a field the provider's schema does not declare."""
    workflow = template("render-from-upload")
    workflow["id"], workflow["name"] = UNKNOWN_FIELD, "render with an undeclared intent field"
    submit = node_named(workflow, "Submit render")["parameters"]
    submit["intent"] = submit["intent"].replace(
        "description: $('Sample source image').item.json.description", "colour: 'red'"
    )
    assert "colour" in submit["intent"]
    return workflow


def sample_png() -> bytes:
    """The PNG the template's Set node carries (base64), as Upload File should send it."""
    fields = node_named(template("render-from-upload"), "Sample source image")["parameters"]["assignments"]
    (png,) = [field["value"] for field in fields["assignments"] if field["name"] == "png"]
    return base64.b64decode(png)


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, tmp_path_factory: pytest.TempPathFactory) -> N8n:
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-renders"))
    instance.import_workflows([template("render-from-upload"), unknown_field_workflow()])
    return instance


@pytest.fixture(scope="module")
def images() -> Iterator[RenderApi]:
    api = RenderApi()
    yield api
    api.stop()


@pytest.fixture
def renders(tenant: Tenant, api_key: str, images: RenderApi) -> Tenant:
    """`make run`'s demo-renders (its intent schema, request template and prompt), answered at
    once by a loopback image API that keeps every request it receives."""
    images.received.clear()
    prompts.prompt_template_create(
        tenant=tenant,
        name=RENDER_PROMPT,
        text=RENDER_PROMPT_TEXT,
        slots={"description": {"max_length": 300}},
        actor="test",
        reason="render test",
    )
    configure_provider(
        tenant,
        images.url,
        slug="demo-renders",
        enforced=True,
        lookup_path="",
        intent_schema=RENDER_INTENT_SCHEMA,
        request_template=RENDER_REQUEST_TEMPLATE,
    )
    return tenant


def test_the_workflow_uploads_its_image_submits_an_intent_naming_it_and_a_second_run_renders_nothing(
    n8n: N8n, renders: Tenant, images: RenderApi
) -> None:
    png = sample_png()
    digest = hashlib.sha256(png).hexdigest()

    first = n8n.execute(WORKFLOW)

    (uploaded,) = first.output("Upload source")
    assert uploaded["upload"]["key"] == f"up_{digest}" and uploaded["upload"]["sha256"] == digest
    assert uploaded["upload"]["media_type"] == "image/png" and uploaded["upload"]["size"] == len(png)
    assert uploaded["upload"]["created"] is True
    upload = Upload.objects.get(tenant=renders)
    assert (upload.sha256, upload.size, upload.width, upload.height) == (digest, len(png), 64, 48)
    # Node version 2: an operation in flight comes out of In Flight (output 0).
    (submitted,) = first.output("Submit render", 0)
    assert submitted["onceguard"]["outcome"] == "in_flight" and submitted["onceguard"]["replayed"] is False
    op = Operation.objects.get(key=KEY)
    assert submitted["onceguard"]["operation_id"] == op.pk and op.status == S.QUEUED
    assert op.workflow_id == WORKFLOW
    # Stored as sent: the intent, never a rendered request, with the prompt template version
    # the job was accepted under (ADR 0009: every attempt and replay renders that version).
    assert open_json(op.request) == {
        "intent": {
            "preset_id": "product-shot",
            "preset_version": 1,
            "aspect_class": "landscape",
            "source_key": f"up_{digest}",
            "source_sha256": digest,
            "description": "a red enamel mug",
        },
        "prompts": {RENDER_PROMPT: 1},
    }

    run_due()
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED
    (sent,) = images.received
    assert sent["headers"]["idempotency-key"] == KEY
    assert sent["body"]["source"] == f"up_{digest}" and (sent["body"]["width"], sent["body"]["height"]) == (256, 192)
    assert "a red enamel mug" in sent["body"]["prompt"]

    second = n8n.execute(WORKFLOW)

    (again,) = second.output("Upload source")
    assert again["upload"]["key"] == f"up_{digest}" and again["upload"]["created"] is False
    # The same key again, finished: it comes out of Succeeded (output 1) at once.
    assert second.output("Submit render", 0) == []
    (replayed,) = second.output("Submit render", 1)
    assert replayed["onceguard"]["outcome"] == "succeeded" and replayed["onceguard"]["replayed"] is True
    assert replayed["onceguard"]["operation_id"] == op.pk and replayed["onceguard"]["status"] == S.SUCCEEDED
    run_due()
    assert len(images.received) == 1
    assert Operation.objects.count() == 1 and Upload.objects.count() == 1


def test_an_intent_field_the_provider_does_not_declare_fails_the_execution_with_its_code(
    n8n: N8n, renders: Tenant, images: RenderApi
) -> None:
    run = n8n.execute(UNKNOWN_FIELD, check=False)

    assert not run.ok
    error = run.result["error"]
    assert error["message"] == "Onceguard: Unknown intent field (intent_unknown_field)"
    assert "colour" in error["description"] and "Allowed:" in error["description"]
    assert error.get("httpCode") == "400"
    assert run.ran("Upload source")
    assert not Operation.objects.exists()
    run_due()
    assert images.received == []


def test_the_template_ships_in_the_package(node_package: Path) -> None:
    assert (node_package / "workflows" / "render-from-upload.json").is_file()
