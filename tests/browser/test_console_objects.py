"""Uploads and published outputs in a real browser at 1,280 px (issue 15 item 6): both lists fit
with their named columns, a detail page shows the facts and never the bytes, and a download
asks for a reason and comes back as a file. Screenshots go to test-artifacts/browser/."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest

from ledger.execution import objects, uploads
from ledger.models import OperationOutput, Provider, Tenant
from ledger.protocol import services
from review.models import AccessLog
from tests.browser.test_console_issue14 import assert_fits, signed_in
from tests.support.objects import image_bytes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _files(tenant: Tenant) -> tuple[Any, OperationOutput]:
    source = uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(640, 480))).upload
    provider = Provider.objects.filter(tenant=tenant).first()
    op = services.operation_claim(tenant=tenant, key="render:browser-1", provider=provider).operation
    op = services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="r-1"
    )
    content = image_bytes(1024, 1024, color=(1, 2, 3))
    digest = hashlib.sha256(content).hexdigest()
    name = objects.object_save(
        objects.objects_storage(),
        name=objects.object_name(kind="outputs", tenant_id=tenant.pk, sha256=digest),
        file=io.BytesIO(content),
    )
    output = OperationOutput.objects.create(
        tenant=tenant,
        operation=op,
        key=f"out_{digest}",
        sha256=digest,
        size=len(content),
        media_type="image/png",
        width=1024,
        height=1024,
        storage_name=name,
    )
    return source, output


def test_uploads_and_outputs_fit_1280_px_show_facts_not_bytes_and_download_with_a_reason(console):
    tab, made = signed_in(console, "demo-admin")
    tenant = Tenant.objects.get(slug=made["tenant"])
    source, output = _files(tenant)
    columns = ["key", "media type", "size", "dimensions", "created", "file"]
    tab.go("/admin/ledger/upload/")
    assert_fits(tab, columns)
    assert "640 × 480" in tab.text() and "image/png" in tab.text()
    tab.shot("uploads-1280")
    tab.go("/admin/ledger/operationoutput/")
    assert_fits(tab, ["key", "operation", *columns[1:]])
    assert "1024 × 1024" in tab.text() and "render:browser-1" in tab.text()
    tab.shot("outputs-1280")

    tab.go(f"/admin/ledger/upload/{source.pk}/change/")
    assert source.sha256 in tab.text()
    assert tab.page.locator("img[src*='up_'], img[src*='content']").count() == 0
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= 1280

    tab.page.click("[data-testid=download-link]")
    tab.page.fill("#id_reason", "Ticket OPS-9: the source looked cropped")
    with tab.page.expect_download() as info:
        tab.page.click("[data-testid=download-submit]")
    path = info.value.path()
    assert path is not None and open(path, "rb").read() == image_bytes(640, 480)
    assert info.value.suggested_filename.startswith(source.key)
    entry = AccessLog.objects.filter(object_type="ledger.upload").get()
    assert entry.reason == "Ticket OPS-9: the source looked cropped" and entry.actor == "user:demo-admin"
