"""Validated outputs: fetched into quarantine, checked, then published — or failed as invalid_output.

The provider is the mock image API on loopback (relay.mock_images); the operation is a real
execute-mode row taken by a worker, whose render request is sent by the adapter with its key.
"""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from dlq.models import FailedEvent
from ledger.execution import outputs
from ledger.execution.attempts import operations_take
from ledger.execution.outputs import InvalidOutput, OutputExpectation, OutputUnavailable, output_fetch_publish
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, ErrorClass, IdempotencyClass, Operation, OperationOutput, OperationStatus
from ledger.platform.errors import LeaseLost
from ledger.protocol.services import operation_complete, provider_upsert
from ledger.providers import adapters
from review.models import RecordType
from review.retention.policies import retention_policy_save
from review.retention.purge import retention_purge_tenant
from tests.support.clocks import TickingClock
from tests.support.fixtures import *  # noqa: F403 - the loopback providers (mock_images)
from tests.support.listener import Listener
from tests.support.objects import image_bytes, stored_files
from tests.support.outbound import announce

S = OperationStatus
ASK = {"width": 64, "height": 40, "prompt": "a red bicycle"}


@pytest.fixture
def render_provider(tenant, mock_images):
    return provider_upsert(
        tenant=tenant,
        slug="images",
        base_url=mock_images.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        timeout_seconds=2.0,
        auth_header="X-Api-Key",
    )


def taken_render(tenant, provider, key: str = "order-7:render:v1") -> Operation:
    """A render operation a worker has taken (claimed, sent marker, lease token)."""
    operation_submit(
        tenant=tenant, key=key, provider=provider.slug, request={"method": "POST", "path": "/v1/renders", "body": ASK}
    )
    (op,) = operations_take(limit=1, actor="test-worker")
    return op


def render_job(op: Operation, provider, mock_images) -> dict:
    """Send the render request as the worker does (its key in Idempotency-Key) and poll the
    job until it is done (what the waiting state will do: issue 15 item 4)."""
    with adapters.http_client() as client:
        outcome = adapters.send(provider=provider, operation=op, client=client)
    assert outcome.status in (200, 202), outcome
    job_id = outcome.body["id"]
    deadline = time.monotonic() + 5
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while True:
            job = http.get(f"{mock_images.url}/v1/renders/{job_id}").json()
            if job["status"] != "queued" or time.monotonic() > deadline:
                return job
            time.sleep(0.02)


def expectation(job: dict) -> OutputExpectation:
    return OutputExpectation(
        media_types=("image/png",), width=ASK["width"], height=ASK["height"], sha256=job["output"]["sha256"]
    )


def assert_nothing_published(object_dirs) -> None:
    assert not OperationOutput.objects.exists()
    assert stored_files(object_dirs["objects"]) == []
    assert stored_files(object_dirs["quarantine"]) == []


def test_a_good_output_is_published_with_its_dimensions_and_digest(
    tenant, render_provider, mock_images, object_dirs, api
):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)

    output = output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    png = httpx.get(mock_images.url + job["output"]["url"], trust_env=False).content
    assert (output.media_type, output.width, output.height) == ("image/png", 64, 40)
    assert output.sha256 == hashlib.sha256(png).hexdigest() and output.size == len(png)
    assert output.key == f"out_{output.sha256}" and output.tenant_id == tenant.pk
    # Published in the objects storage; nothing left in quarantine.
    assert stored_files(object_dirs["objects"]) == [output.storage_name]
    assert (object_dirs["objects"] / output.storage_name).read_bytes() == png
    assert stored_files(object_dirs["quarantine"]) == []
    # The holder goes on to complete the operation; the output is readable through the API.
    operation_complete(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=job["id"],
        response_body=job,
    )
    facts = api.get(f"/api/v1/operations/{op.pk}/output")
    content = api.get(f"/api/v1/operations/{op.pk}/output/content")
    assert facts.status_code == 200
    assert facts.json() | {"created_at": None} == {
        "key": output.key,
        "sha256": output.sha256,
        "size": len(png),
        "media_type": "image/png",
        "width": 64,
        "height": 40,
        "created_at": None,
        "operation": op.pk,
        "content": f"/api/v1/operations/{op.pk}/output/content",
    }
    assert content.status_code == 200 and b"".join(content.streaming_content) == png
    assert content["Content-Type"] == "image/png" and content["ETag"] == f'"{output.sha256}"'
    assert mock_images.effects()["renders"] == 1


def test_another_tenant_cannot_read_an_output(tenant, render_provider, mock_images, other_tenant, make_client):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    intruder = make_client(other_tenant)
    for path in (f"/api/v1/operations/{op.pk}/output", f"/api/v1/operations/{op.pk}/output/content"):
        response = intruder.get(path)
        assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_a_wrong_size_output_is_quarantined_failed_as_invalid_output_and_never_readable(
    tenant, render_provider, mock_images, object_dirs, api
):
    mock_images.set_switches(wrong_size=True)
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    # The provider claims the size asked for; the bytes say otherwise.
    assert (job["output"]["width"], job["output"]["height"]) == (64, 40)

    with pytest.raises(InvalidOutput) as refused:
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    assert "65×41 pixels, expected 64×40" in refused.value.reason
    failed = Operation.objects.get(pk=op.pk)
    assert failed.status == S.FAILED and failed.error_class == ErrorClass.INVALID_OUTPUT
    assert "65×41" in failed.last_error and failed.done_at is not None
    attempt = Attempt.objects.get(operation=op, number=op.attempts)
    assert (attempt.outcome, attempt.error_class) == ("failed", "invalid_output")
    assert failed.events.order_by("-at", "-id").first().reason.startswith("invalid_output: ")
    # Every failed row has its DLQ entry; quarantined: replayed as is, it would fetch the same output.
    entry = FailedEvent.objects.get(operation_id=op.pk)
    assert entry.error_class == "invalid_output"
    assert entry.quarantine_reason.startswith("the output of images failed its checks: the output is 65×41 pixels")
    assert_nothing_published(object_dirs)
    for path in (f"/api/v1/operations/{op.pk}/output", f"/api/v1/operations/{op.pk}/output/content"):
        assert api.get(path).status_code == 404


def test_the_quarantined_bytes_are_what_was_checked_and_are_deleted_after_the_verdict(
    tenant, render_provider, mock_images, object_dirs, monkeypatch
):
    mock_images.set_switches(wrong_size=True)
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    seen: list[list[str]] = []
    real_verdict = outputs._verdict

    def verdict_watching_quarantine(**kwargs):
        seen.append(stored_files(object_dirs["quarantine"]))
        return real_verdict(**kwargs)

    monkeypatch.setattr(outputs, "_verdict", verdict_watching_quarantine)
    with pytest.raises(InvalidOutput):
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    # While it was judged, the output sat in quarantine (and only there); afterwards, nowhere.
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith(f"outputs/{tenant.pk}/")
    assert_nothing_published(object_dirs)


def test_a_wrong_type_output_is_failed_as_invalid_output(tenant, render_provider, mock_images, object_dirs):
    mock_images.set_switches(wrong_type=True)
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)

    with pytest.raises(InvalidOutput) as refused:
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    assert refused.value.reason == "the output is image/jpeg, expected image/png"
    assert Operation.objects.get(pk=op.pk).error_class == ErrorClass.INVALID_OUTPUT
    assert_nothing_published(object_dirs)


def test_an_output_whose_digest_is_not_the_announced_one_is_failed(tenant, render_provider, mock_images, object_dirs):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    announced = OutputExpectation(media_types=("image/png",), width=64, height=40, sha256="0" * 64)

    with pytest.raises(InvalidOutput) as refused:
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=announced)

    assert "the provider announced " + "0" * 64 in refused.value.reason
    assert_nothing_published(object_dirs)


def test_an_output_over_the_byte_limit_is_failed_without_reading_it_all(
    tenant, render_provider, mock_images, object_dirs, settings
):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTPUT_MAX_BYTES": 50}
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)

    with pytest.raises(InvalidOutput) as refused:
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    assert refused.value.reason == "the output is larger than 50 bytes"
    assert_nothing_published(object_dirs)


def test_a_destination_the_deployment_does_not_allow_is_never_fetched(
    tenant, render_provider, mock_images, object_dirs
):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    fetches = mock_images.effects()["fetches"]

    for url in ("http://127.0.0.1:9/v1/x", "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"):
        with pytest.raises(OutputUnavailable):
            output_fetch_publish(operation=op, url=url, expect=expectation(job))

    # Not a verdict on the output: the operation is untouched, still its holder's.
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert mock_images.effects()["fetches"] == fetches
    assert_nothing_published(object_dirs)


def test_an_output_not_ready_is_unavailable_not_invalid(tenant, render_provider, mock_images, object_dirs):
    mock_images.set_switches(delay=30)
    op = taken_render(tenant, render_provider)
    with adapters.http_client() as client:
        job_id = adapters.send(provider=render_provider, operation=op, client=client).body["id"]

    with pytest.raises(OutputUnavailable) as unavailable:
        output_fetch_publish(
            operation=op, url=f"/v1/renders/{job_id}/output", expect=OutputExpectation(width=64, height=40)
        )

    assert unavailable.value.reason == "the output URL answered HTTP 404"
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert_nothing_published(object_dirs)


@pytest.fixture
def png_listeners():
    """Two loopback servers answering a PNG to every request and recording what they got."""
    started = [Listener(body=image_bytes(10, 10), allow=True) for _ in range(2)]
    yield started
    for listener in started:
        listener.close()


def test_the_providers_credential_goes_to_its_own_origin_only(tenant, png_listeners, object_dirs):
    own, other = png_listeners
    provider = provider_upsert(
        tenant=tenant,
        slug="files",
        base_url=own.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        auth_header="X-Api-Key",
        auth_secret="sk_render_secret_4242",
    )
    first = taken_render(tenant, provider, key="order-8:render:v1")
    second = taken_render(tenant, provider, key="order-9:render:v1")
    expect = OutputExpectation(width=10, height=10)

    output_fetch_publish(operation=first, url="/files/out.png", expect=expect)
    output_fetch_publish(operation=second, url=other.url + "/cdn/out.png", expect=expect)

    (seen_own,) = own.seen
    assert seen_own.path == "/files/out.png" and seen_own.headers.get("X-Api-Key") == "sk_render_secret_4242"
    assert len(other.seen) == 1
    assert "sk_render_secret_4242" not in other.everything()
    assert OperationOutput.objects.count() == 2


def test_only_the_lease_holder_publishes(tenant, render_provider, mock_images, object_dirs):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    # Someone else took the row meanwhile (a new attempt: a new token).
    Operation.objects.filter(pk=op.pk).update(lease_token="f" * 32)

    with pytest.raises(LeaseLost):
        output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))
    assert_nothing_published(object_dirs)


def test_an_operation_with_a_published_output_answers_it_without_fetching_again(tenant, render_provider, mock_images):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    first = output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))
    fetches = mock_images.effects()["fetches"]

    again = output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))

    assert again.pk == first.pk
    effects = mock_images.effects()
    assert (effects["fetches"], effects["renders"]) == (fetches, 1)


@pytest.mark.django_db(transaction=True)
def test_retention_deleting_an_operation_deletes_its_published_output(
    tenant, render_provider, mock_images, object_dirs
):
    op = taken_render(tenant, render_provider)
    job = render_job(op, render_provider, mock_images)
    output_fetch_publish(operation=op, url=job["output"]["url"], expect=expectation(job))
    operation_complete(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=job["id"],
        response_body=job,
    )
    # Past the platform's floor for operations (the policy may not go below it).
    Operation.objects.filter(pk=op.pk).update(
        updated_at=op.created_at - timedelta(days=400), done_at=op.created_at - timedelta(days=400)
    )
    retention_policy_save(
        tenant_id=tenant.pk, record_type=RecordType.OPERATIONS, record_ttl=timedelta(days=365), actor="test"
    )

    run = retention_purge_tenant(tenant_id=tenant.pk)

    assert run is not None and run.details[RecordType.OPERATIONS]["deleted"] == 1
    assert not Operation.objects.filter(pk=op.pk).exists()
    assert not OperationOutput.objects.exists()
    assert stored_files(object_dirs["objects"]) == []


class _Drip(BaseHTTPRequestHandler):
    """Answers 200 with a long body, one byte every 0.1 s, until the test is over."""

    stop = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            if self.stop.wait(0.1):
                return
            try:
                self.wfile.write(b"\x89")
                self.wfile.flush()
            except OSError:
                return

    def log_message(self, *args: object) -> None:
        return


def test_an_output_dripping_in_past_the_fetch_time_is_unavailable(tenant, object_dirs, settings, monkeypatch):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTPUT_FETCH_TIMEOUT_SECONDS": 0.5}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    announce(url)
    try:
        provider = provider_upsert(
            tenant=tenant, slug="drip", base_url=url, idempotency_class=IdempotencyClass.KEY_ENFORCED
        )
        op = taken_render(tenant, provider)
        # The fetch's clock: each read of it is a tenth of a second later, as each byte is.
        clock = TickingClock(0.1)
        monkeypatch.setattr(outputs, "time", clock)
        started = clock.now
        with pytest.raises(OutputUnavailable) as unavailable:
            output_fetch_publish(operation=op, url="/slow.png", expect=OutputExpectation())
        elapsed = clock.now - started
    finally:
        _Drip.stop.set()
        server.shutdown()
        server.server_close()
        _Drip.stop.clear()

    assert "took longer" in unavailable.value.reason
    # Each byte came within httpx's read timeout: only the total bound stopped it, once the
    # fetch's own clock had passed it (was: the same bounds on the wall clock).
    assert 0.5 <= elapsed < 5
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
    assert_nothing_published(object_dirs)


@pytest.mark.parametrize("url", ["/v1/renders/x\ty/output", "/v1/\x00", "/" + "a" * 70_000])
def test_an_output_path_httpx_cannot_build_a_url_of_is_unavailable_not_a_crash(
    tenant, render_provider, object_dirs, url
):
    # A status answer is the provider's text: a control character or a path past httpx's
    # length limit raised httpx.InvalidURL (no HTTPError) out of the poll — a 500 to a
    # webhook, and a worker's poll crashing at every lease until someone looked.
    op = taken_render(tenant, render_provider)
    with pytest.raises(OutputUnavailable, match="InvalidURL"):
        output_fetch_publish(operation=op, url=url, expect=OutputExpectation())
    assert_nothing_published(object_dirs)
    assert Operation.objects.get(pk=op.pk).status == S.CLAIMED
