"""POST /api/v1/uploads: files by digest, checked by content and size before anything is stored."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from ledger.execution import objects, uploads
from ledger.models import Upload
from review.models import RecordType
from review.retention.policies import retention_policy_save
from review.retention.purge import retention_purge_tenant
from tests.support.objects import image_bytes, noisy_png, stored_files

URL = "/api/v1/uploads"


def upload(client, data: bytes, content_type: str = "application/octet-stream"):
    return client.generic("POST", URL, data, content_type=content_type)


def test_an_upload_answers_201_with_its_key_digest_and_the_facts_read_from_its_content(api, object_dirs):
    png = image_bytes(12, 7)

    # The client's Content-Type says text: the content says PNG, and the content decides.
    response = upload(api, png, content_type="text/plain")

    assert response.status_code == 201, response.json()
    body = response.json()
    sha = hashlib.sha256(png).hexdigest()
    assert body["key"] == f"up_{sha}" and body["sha256"] == sha
    assert (body["size"], body["media_type"], body["width"], body["height"]) == (len(png), "image/png", 12, 7)
    assert response["Location"] == f"/api/v1/uploads/{body['key']}"
    assert body["content"] == f"/api/v1/uploads/{body['key']}/content"
    row = Upload.objects.get()
    assert (row.key, row.sha256, row.size, row.media_type) == (body["key"], sha, len(png), "image/png")
    files = stored_files(object_dirs["objects"])
    assert len(files) == 1 and files[0] == row.storage_name
    assert (object_dirs["objects"] / row.storage_name).read_bytes() == png


def test_the_same_bytes_uploaded_twice_answer_the_same_key_and_are_stored_once(api, object_dirs):
    png = image_bytes(5, 5, fmt="PNG")
    first = upload(api, png)
    again = upload(api, png, content_type="image/png")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Upload.objects.count() == 1
    assert len(stored_files(object_dirs["objects"])) == 1


def test_other_bytes_get_another_key(api):
    keys = {upload(api, image_bytes(4, 4, color=color)).json()["key"] for color in ((1, 2, 3), (3, 2, 1))}
    assert len(keys) == 2


@pytest.mark.parametrize("fmt,media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_each_accepted_image_type_is_recognised_by_its_content(api, fmt, media_type):
    response = upload(api, image_bytes(9, 3, fmt=fmt))
    assert response.status_code == 201, response.json()
    assert (response.json()["media_type"], response.json()["width"], response.json()["height"]) == (media_type, 9, 3)


def test_an_upload_is_read_back_byte_for_byte_by_its_tenant(api):
    png = image_bytes(6, 6)
    key = upload(api, png).json()["key"]

    detail = api.get(f"{URL}/{key}")
    content = api.get(f"{URL}/{key}/content", HTTP_ACCEPT="image/png")

    assert detail.status_code == 200 and detail.json()["sha256"] == hashlib.sha256(png).hexdigest()
    assert content.status_code == 200
    assert b"".join(content.streaming_content) == png
    assert content["Content-Type"] == "image/png"
    assert content["ETag"] == f'"{hashlib.sha256(png).hexdigest()}"'
    assert content["Content-Disposition"] == f'attachment; filename="{key}.png"'
    assert "sandbox" in content["Content-Security-Policy"]
    assert "private" in content["Cache-Control"]


def test_another_tenant_cannot_read_an_upload_nor_learn_that_it_exists(api, other_tenant, make_client):
    key = upload(api, image_bytes()).json()["key"]
    intruder = make_client(other_tenant)

    for path in (f"{URL}/{key}", f"{URL}/{key}/content"):
        response = intruder.get(path)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "not_found"
    # Nor with no key at all.
    assert api.__class__().get(f"{URL}/{key}/content").status_code == 401


def test_another_tenant_uploading_the_same_bytes_gets_its_own_upload(api, other_tenant, make_client, object_dirs):
    png = image_bytes()
    mine = upload(api, png)
    theirs = upload(make_client(other_tenant), png)

    assert (mine.status_code, theirs.status_code) == (201, 201)
    # Content addressed per tenant: the same key, two rows and two objects, each tenant's own.
    assert mine.json()["key"] == theirs.json()["key"]
    assert Upload.objects.count() == 2
    assert len(stored_files(object_dirs["objects"])) == 2


def test_uploading_needs_a_write_scope_and_reading_a_read_scope(tenant, make_client):
    reader = make_client(tenant, scopes=["read"])
    refused = upload(reader, image_bytes())
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert not Upload.objects.exists()


# --- Refused before admission: nothing stored -------------------------------------------------


def assert_nothing_stored(object_dirs) -> None:
    assert not Upload.objects.exists()
    assert stored_files(object_dirs["objects"]) == []
    assert stored_files(object_dirs["quarantine"]) == []


def test_an_upload_over_the_limit_is_refused_413_by_its_length_and_nothing_is_stored(api, settings, object_dirs):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "UPLOAD_MAX_BYTES": 1000}
    big = noisy_png(40, 40)
    assert len(big) > 1000

    response = upload(api, big)

    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "payload_too_large" and response.json()["limit"] == 1000
    assert_nothing_stored(object_dirs)


class CountingStream:
    """A request body that says nothing of its length, counting what was read from it."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.read_bytes = 0

    def read(self, size: int = -1, /) -> bytes:
        chunk = self._data.read(size)
        self.read_bytes += len(chunk)
        return chunk


def test_a_stream_passing_the_limit_is_refused_as_soon_as_it_passes_it(tenant, settings, object_dirs, tmp_path):
    limit = 1536 * 1024
    settings.ONCEGUARD = {**settings.ONCEGUARD, "UPLOAD_MAX_BYTES": limit}
    stream = CountingStream(b"\x89PNG\r\n\x1a\n" + b"x" * (4 * 1024 * 1024))
    spill = tmp_path / "tmp"
    spill.mkdir()
    before, tempfile.tempdir = tempfile.tempdir, str(spill)
    try:
        with pytest.raises(uploads.UploadTooLarge):
            uploads.upload_store(tenant=tenant, stream=stream, declared_length=None)
    finally:
        tempfile.tempdir = before

    # Reading stopped one byte past the limit (the body was 4 MiB).
    assert stream.read_bytes == limit + 1
    # Past 1 MiB the body had spilled to a temporary file: it never had a name, and is gone.
    assert list(spill.iterdir()) == []
    assert_nothing_stored(object_dirs)


@pytest.mark.parametrize(
    "body,content_type",
    [
        (b"just some text, not an image", "image/png"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n", "image/png"),
        (image_bytes(30, 30)[:-40], "image/png"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 200, "image/png"),
        (image_bytes(4, 4, fmt="BMP"), "image/png"),
    ],
    ids=["text", "pdf-not-accepted", "truncated-png", "png-magic-then-garbage", "bmp"],
)
def test_a_wrong_type_upload_is_refused_415_and_nothing_is_stored(api, object_dirs, body, content_type):
    response = upload(api, body, content_type=content_type)

    assert response.status_code == 415, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "upload_media_type_not_allowed"
    assert "image/png" in response.json()["allowed"]
    assert_nothing_stored(object_dirs)


def test_an_image_declaring_more_pixels_than_allowed_is_refused_before_it_is_decoded(api, settings, object_dirs):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "IMAGE_MAX_PIXELS": 100}
    response = upload(api, image_bytes(20, 20))
    assert response.status_code == 415
    assert "20×20" in response.json()["detail"]
    assert_nothing_stored(object_dirs)


def test_the_accepted_types_are_the_deployments_choice(api, settings, object_dirs):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "UPLOAD_MEDIA_TYPES": ["image/png"]}
    refused = upload(api, image_bytes(fmt="JPEG"), content_type="image/png")
    assert refused.status_code == 415 and refused.json()["detected"] == "image/jpeg"
    assert_nothing_stored(object_dirs)


def test_an_empty_upload_is_refused_400(api, object_dirs):
    response = upload(api, b"")
    assert response.status_code == 400 and response.json()["code"] == "upload_empty"
    assert_nothing_stored(object_dirs)


# --- Concurrency and retention ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_same_bytes_uploaded_twice_at_once_keep_one_row_and_one_object(tenant, monkeypatch, object_dirs):
    png = image_bytes(7, 7)
    # Both uploads pass the "already stored?" check before either writes: the insert decides.
    barrier = threading.Barrier(2, timeout=10)
    real_save = objects.object_save

    def save_together(*args, **kwargs):
        barrier.wait()
        return real_save(*args, **kwargs)

    monkeypatch.setattr(objects, "object_save", save_together)
    results: list[uploads.UploadResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(uploads.upload_store(tenant=tenant, stream=io.BytesIO(png)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)

    assert errors == []
    assert sorted(r.created for r in results) == [False, True]
    assert {r.upload.pk for r in results} == {Upload.objects.get().pk}
    # The loser deleted its own object.
    assert stored_files(object_dirs["objects"]) == [Upload.objects.get().storage_name]


@pytest.mark.django_db(transaction=True)
def test_retention_deletes_uploads_past_their_ttl_with_their_objects(tenant, object_dirs):
    old = uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(3, 3))).upload
    new = uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(4, 4))).upload
    Upload.objects.filter(pk=old.pk).update(created_at=old.created_at - timedelta(days=10))
    retention_policy_save(
        tenant_id=tenant.pk, record_type=RecordType.UPLOADS, record_ttl=timedelta(days=5), actor="test"
    )

    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert run is not None and run.details[RecordType.UPLOADS]["deleted"] == 1
    assert list(Upload.objects.values_list("pk", flat=True)) == [new.pk]
    assert stored_files(object_dirs["objects"]) == [new.storage_name]


def test_the_objects_sweep_deletes_what_crashes_left_and_nothing_else(tenant, object_dirs):
    kept = uploads.upload_store(tenant=tenant, stream=io.BytesIO(image_bytes(3, 3))).upload
    storage, quarantine = objects.objects_storage(), objects.quarantine_storage()
    # A process killed between writing an object and inserting its row, long ago and just now;
    # one killed while an output sat in quarantine.
    old_orphan = objects.object_save(storage, name=f"uploads/{tenant.pk}/ab/{'ab' * 32}-dead", file=io.BytesIO(b"x"))
    young_orphan = objects.object_save(storage, name=f"outputs/{tenant.pk}/cd/{'cd' * 32}-busy", file=io.BytesIO(b"y"))
    stale = objects.object_save(quarantine, name=f"outputs/{tenant.pk}/ef/{'ef' * 32}-left", file=io.BytesIO(b"z"))
    long_ago = time.time() - 2 * objects.SWEEP_GRACE_SECONDS
    for folder, name in ((object_dirs["objects"], kept.storage_name), (object_dirs["objects"], old_orphan)):
        os.utime(folder / name, (long_ago, long_ago))
    os.utime(object_dirs["quarantine"] / stale, (long_ago, long_ago))

    counts = objects.objects_sweep()

    assert (counts["orphans_deleted"], counts["quarantined_deleted"]) == (1, 1)
    assert stored_files(object_dirs["objects"]) == sorted([kept.storage_name, young_orphan])
    assert stored_files(object_dirs["quarantine"]) == []
