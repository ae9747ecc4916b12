"""Uploads and outputs are tenant data (issue 15 item 6; DESIGN §8, §11): an erasure deletes a
person's operations' published outputs and the uploads those operations name — rows and the
bytes in storage — and leaves everyone else's; the console lists both read-only, tenant-scoped,
with a download that needs view_payload and a reason and is logged before a byte is read."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest

from ledger.execution import objects, uploads
from ledger.models import Operation, OperationOutput, Provider, Tenant, Upload
from ledger.protocol import services
from review.models import AccessLog
from review.privacy import erasure
from review.privacy.subjects import erasure_summary, subject_resolve
from tests.console.support import client_for, enforced_provider, page, staff
from tests.support.objects import image_bytes, stored_files

pytestmark = pytest.mark.django_db

EMAIL = "mei.lin@example.invalid"
OTHER = "omar.haddad@example.invalid"


def upload(tenant: Tenant, color: tuple[int, int, int]) -> Upload:
    return uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(12, 9, color=color))).upload


def render_with_output(tenant: Tenant, key: str, email: str, source: Upload, seed: bytes) -> Operation:
    """A finished render for ``email`` whose intent names ``source``, with its published output."""
    crm = Provider.objects.filter(tenant=tenant, slug="crm").first() or enforced_provider(tenant)
    op = services.operation_claim(
        tenant=tenant,
        key=key,
        provider=crm,
        payload={"customer_email": email, "intent": {"source_key": source.key, "source_sha256": source.sha256}},
    ).operation
    op = services.operation_complete(
        operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"r-{key}"
    )
    content = image_bytes(16, 16, color=(seed[0], 1, 2))
    digest = hashlib.sha256(content).hexdigest()
    name = objects.object_save(
        objects.objects_storage(),
        name=objects.object_name(kind="outputs", tenant_id=tenant.pk, sha256=digest),
        file=io.BytesIO(content),
    )
    OperationOutput.objects.create(
        tenant=tenant,
        operation=op,
        key=f"out_{digest}",
        sha256=digest,
        size=len(content),
        media_type="image/png",
        width=16,
        height=16,
        storage_name=name,
    )
    return op


def test_an_erasure_deletes_the_persons_outputs_and_the_uploads_their_jobs_named_bytes_included(
    tenant: Tenant, object_dirs: dict[str, Any], django_capture_on_commit_callbacks: Any
):
    hers, his, unused = upload(tenant, (10, 20, 30)), upload(tenant, (40, 50, 60)), upload(tenant, (70, 80, 90))
    mine = render_with_output(tenant, "render-1", EMAIL, hers, b"\x01")
    other = render_with_output(tenant, "render-2", OTHER, his, b"\x02")
    before = stored_files(object_dirs["objects"])
    assert len(before) == 5  # three uploads, two outputs
    gone = {Upload.objects.get(pk=hers.pk).storage_name, mine.output.storage_name}

    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": EMAIL}),
        actor="user:ada",
        reason="Erasure request ER-88, verified",
        enqueue=False,
    )
    with django_capture_on_commit_callbacks(execute=True):
        run = erasure.erasure_continue(run_id=run.pk)

    assert (run.operations, run.outputs, run.uploads) == (1, 1, 1)
    assert not OperationOutput.objects.filter(operation=mine).exists()
    assert not Upload.objects.filter(pk=hers.pk).exists()
    # The bytes are gone from the storage; everyone else's stay, as does an upload no job named.
    assert stored_files(object_dirs["objects"]) == sorted(set(before) - gone)
    assert OperationOutput.objects.filter(operation=other).exists()
    assert set(Upload.objects.values_list("pk", flat=True)) == {his.pk, unused.pk}
    assert "1 upload deleted" in erasure_summary(run)


def test_upload_keys_are_found_at_any_depth_and_nothing_else_is(tenant: Tenant):
    key = "up_" + "a" * 64
    value = {"intent": {"sources": [{"source_key": key}]}, "note": f"see {key}.", "bad": "up_" + "a" * 63}
    assert uploads.upload_keys_in(value) == {key}
    assert uploads.upload_keys_in(None) == set() and uploads.upload_keys_in("up_" + "g" * 64) == set()


def test_the_console_lists_uploads_and_outputs_with_their_facts_and_never_their_bytes(
    tenant: Tenant, other_tenant: Tenant
):
    source = upload(tenant, (1, 2, 3))
    op = render_with_output(tenant, "render-9", EMAIL, source, b"\x09")
    theirs = upload(other_tenant, (4, 5, 6))
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    for path, row in (("/admin/ledger/upload/", source), ("/admin/ledger/operationoutput/", op.output)):
        status, html = page(ada, path)
        assert status == 200, path
        assert row.key[:14] in html and "image/png" in html and "download…" in html
        status, html = page(ada, f"{path}{row.pk}/change/")
        assert status == 200 and row.sha256 in html and f"{row.width} × {row.height}" in html
        assert "<img" not in html and "storage_name" not in html and row.storage_name not in html
    assert op.key in page(ada, f"/admin/ledger/operationoutput/{op.output.pk}/change/")[1]
    # The CSV export: the facts in full, no markup, no storage name.
    ada.force_login(staff("exp", role="admin", tenants=[tenant]))
    response = ada.get("/admin/ledger/operationoutput/export.csv")
    text = b"".join(response.streaming_content).decode()
    assert text.splitlines()[0] == "Created at,Tenant,Operation,Key,Sha256,Size,Media type,Width,Height"
    assert f"render-9,{op.output.key},{op.output.sha256},{op.output.size},image/png,16,16" in text
    assert "<" not in text and op.output.storage_name not in text
    # Another tenant's upload is not there, not even by its id.
    assert theirs.key[:14] not in page(ada, "/admin/ledger/upload/")[1]
    assert ada.get(f"/admin/ledger/upload/{theirs.pk}/download/").status_code == 404
    assert ada.get(f"/admin/ledger/upload/{theirs.pk}/change/").status_code in (302, 404)


def test_a_console_download_needs_view_payload_and_a_reason_and_is_logged_first(tenant: Tenant):
    source = upload(tenant, (7, 8, 9))
    url = f"/admin/ledger/upload/{source.pk}/download/"
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))
    assert auditor.get(url).status_code == 403
    assert auditor.post(url, {"reason": "I would like to see it"}).status_code == 403
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    refused = ada.post(url, {"reason": "why"})
    assert refused.status_code == 200 and "Content-Disposition" not in refused
    assert not AccessLog.objects.exists()
    response = ada.post(url, {"reason": "Ticket OPS-7: the render looked wrong"})
    assert response.status_code == 200 and response["Content-Disposition"].startswith("attachment")
    assert b"".join(response.streaming_content) == image_bytes(12, 9, color=(7, 8, 9))
    assert (
        response["Content-Security-Policy"] == "default-src 'none'; sandbox"
        and response["ETag"] == f'"{source.sha256}"'
    )
    entry = AccessLog.objects.get()
    assert (entry.action, entry.object_type, entry.object_id, entry.fields, entry.actor) == (
        "reveal",
        "ledger.upload",
        str(source.pk),
        ["content"],
        "user:ada",
    )
