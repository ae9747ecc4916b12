"""Asynchronous providers (DESIGN §5, "Asynchronous providers"): a render is accepted as a job,
the operation waits on the provider holding no lease, polls (or the provider's signed webhook)
take it under a short fenced lease, and its output is published only after its checks.

The provider is the mock image API on loopback (relay.mock_images, key-enforced: one render
per key); the worker is ``operations_take`` + ``operation_execute`` in the test's thread. Both
databases.
"""

from __future__ import annotations

import io
import json
import threading
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from rest_framework.test import APIClient

from alerts.models import Alert
from dlq.models import FailedEvent
from dlq.replays.services import failed_event_replay
from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import (
    ASYNC_ADAPTER_FIELDS,
    Attempt,
    AttemptOutcome,
    ErrorClass,
    IdempotencyClass,
    Operation,
    OperationEvent,
    OperationOutput,
    OperationStatus,
    Provider,
)
from ledger.platform.errors import ValidationFailed
from ledger.protocol.services import provider_upsert
from ledger.providers import adapters
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from tests.console.support import client_for, staff, submit_form
from tests.execute.support import make_due, run_due

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

ASK = {"width": 64, "height": 40, "prompt": "a red bicycle"}
WEBHOOK_SECRET = "whsec-test-0123456789"


def render_fields(url: str, **extra: object) -> dict[str, object]:
    """The mock image API as an asynchronous, key-enforced provider."""
    fields: dict[str, object] = dict(
        base_url=url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        lookup_path="/v1/renders?idempotency_key={key}",
        lookup_settle_seconds=0,
        timeout_seconds=2.0,
        max_attempts=3,
        lifetime_seconds=600,
        base_delay_seconds=0.05,
        max_delay_seconds=0.2,
        poll_path="/v1/renders/{provider_ref}",
        poll_status_pointer="/status",
        poll_succeeded_values=["succeeded"],
        poll_failed_values=["failed"],
        poll_pending_values=["queued"],
        poll_initial_seconds=0.5,
        poll_max_seconds=4.0,
        output_url_pointer="/output/url",
        output_sha256_pointer="/output/sha256",
        output_size_pointer="/output/size",
        output_media_types=["image/png"],
        output_width_pointer="/body/width",
        output_height_pointer="/body/height",
    )
    fields.update(extra)
    return fields


@pytest.fixture
def renders(tenant, mock_images) -> Provider:
    return provider_upsert(
        tenant=tenant, slug="images", webhook_secret=WEBHOOK_SECRET, **render_fields(mock_images.url)
    )


def submit(tenant, key: str = "order-7:render:v1", ask: dict | None = None):
    return operation_submit(
        tenant=tenant,
        key=key,
        provider="images",
        request={"method": "POST", "path": "/v1/renders", "body": ask or ASK},
    )


def row(op_id: int) -> Operation:
    return Operation.objects.get(pk=op_id)


def reasons(op_id: int) -> list[str]:
    return list(OperationEvent.objects.filter(operation_id=op_id).order_by("id").values_list("reason", flat=True))


def test_an_accepted_render_waits_on_the_provider_without_a_lease_and_is_published_once_done(
    tenant, renders, mock_images, make_client
):
    mock_images.set_switches(delay=120)  # rendering until released
    op = submit(tenant).operation
    (recorded,) = run_due()
    assert recorded.status == S.WAITING
    waiting = row(op.pk)
    job = waiting.provider_ref
    assert job.startswith("job_")
    assert waiting.lease_expires_at is None and waiting.next_attempt_at is not None and waiting.polls == 0
    attempt = Attempt.objects.get(operation_id=op.pk)
    assert attempt.outcome == AttemptOutcome.PENDING and attempt.provider_ref == job and attempt.response_status == 202
    # Not due yet: nothing is taken.
    assert operations_take(limit=5) == []
    # A poll while the job renders: back to waiting, the same job, one poll more.
    make_due(op.pk)
    (polled,) = run_due()
    assert polled.status == S.WAITING and polled.provider_ref == job and polled.polls == 1
    assert mock_images.effects()["renders"] == 0
    # Done at the provider: the next poll fetches, checks, publishes, completes.
    mock_images.release()
    make_due(op.pk)
    (done,) = run_due()
    assert done.status == S.SUCCEEDED and done.provider_ref == job
    output = OperationOutput.objects.get(operation_id=op.pk)
    assert (output.media_type, output.width, output.height) == ("image/png", 64, 40)
    attempt.refresh_from_db()
    assert attempt.outcome == AttemptOutcome.SUCCEEDED and Attempt.objects.filter(operation_id=op.pk).count() == 1
    effects = mock_images.effects()
    assert effects["renders"] == 1 and effects["submits"] == 1 and effects["fetches"] == 1
    api = make_client(tenant)
    answer = api.get(f"/api/v1/operations/{op.pk}").json()
    assert answer["status"] == "succeeded" and answer["output"]["sha256"] == output.sha256
    content = api.get(f"/api/v1/operations/{op.pk}/output/content")
    assert content.status_code == 200 and b"".join(content.streaming_content).startswith(b"\x89PNG")
    # Every move has its event: claimed → waiting (accepted), waiting → claimed (polls), …
    moves = list(OperationEvent.objects.filter(operation_id=op.pk).values_list("from_status", "to_status"))
    assert moves == [
        ("", S.QUEUED),
        (S.QUEUED, S.CLAIMED),
        (S.CLAIMED, S.WAITING),
        (S.WAITING, S.CLAIMED),
        (S.CLAIMED, S.WAITING),
        (S.WAITING, S.CLAIMED),
        (S.CLAIMED, S.SUCCEEDED),
    ]


def test_polls_back_off_from_the_first_delay_doubling_to_the_cap(tenant, renders, mock_images):
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    delays = []
    for _ in range(6):
        current = row(op.pk)
        assert current.status == S.WAITING
        # next_attempt_at and updated_at come from one statement's now(): their gap is the delay.
        delays.append(round((current.next_attempt_at - current.updated_at).total_seconds(), 2))
        make_due(op.pk)
        run_due()
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert mock_images.effects()["polls"] == 6 and mock_images.effects()["submits"] == 1


def test_a_wrong_size_output_is_quarantined_failed_as_invalid_output_and_never_readable(
    tenant, renders, mock_images, make_client
):
    mock_images.script([{"wrong_size": True}])
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    (failed,) = run_due()
    assert failed.status == S.FAILED and failed.error_class == ErrorClass.INVALID_OUTPUT
    assert "65×41 pixels, expected 64×40" in failed.last_error
    assert not OperationOutput.objects.filter(operation_id=op.pk).exists()
    assert FailedEvent.objects.filter(operation_id=op.pk).count() == 1  # the DLQ entry, via the hook
    api = make_client(tenant)
    assert api.get(f"/api/v1/operations/{op.pk}/output").status_code == 404
    assert api.get(f"/api/v1/operations/{op.pk}/output/content").status_code == 404
    assert api.get(f"/api/v1/operations/{op.pk}").json()["output"] is None
    # Fetched (into quarantine) once, and nothing retried: the same key would answer the same job.
    assert mock_images.effects()["fetches"] == 1 and mock_images.effects()["submits"] == 1
    assert operations_take(limit=5) == []


def test_a_wrong_type_output_fails_as_invalid_output(tenant, renders, mock_images):
    mock_images.script([{"wrong_type": True}])
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    (failed,) = run_due()
    assert failed.status == S.FAILED and failed.error_class == ErrorClass.INVALID_OUTPUT
    assert "image/jpeg" in failed.last_error
    assert not OperationOutput.objects.exists()


def test_a_job_the_provider_failed_fails_the_operation_with_its_dlq_entry(tenant, renders, mock_images):
    mock_images.script([{"fail": True}])
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    (failed,) = run_due()
    assert failed.status == S.FAILED and "ended with status 'failed'" in failed.last_error
    assert FailedEvent.objects.filter(operation_id=op.pk).count() == 1
    assert mock_images.effects()["renders"] == 0


def test_a_render_submitted_twice_renders_once_and_a_replay_answers_the_recorded_output(
    tenant, renders, mock_images, make_client
):
    api = make_client(tenant, ["read", "write"])
    body = {
        "key": "order-9:render:v1",
        "provider": "images",
        "request": {"method": "POST", "path": "/v1/renders", "body": ASK},
    }
    first = api.post("/api/v1/operations", body, format="json")
    again = api.post("/api/v1/operations", body, format="json")
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["id"] == again.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    run_due()
    make_due(first.json()["id"])
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    effects = mock_images.effects()
    # After it finished: the recorded outcome and its output, without rendering or fetching again.
    replay = api.post("/api/v1/operations", body, format="json")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    recorded = OperationOutput.objects.get(operation_id=done.pk)
    assert replay.json()["output"]["key"] == recorded.key and replay.json()["output"]["width"] == 64
    assert mock_images.effects() == effects
    assert effects["renders"] == 1 and effects["submits"] == 1 and effects["by_key"] == {"order-9:render:v1": 1}


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="concurrent transactions: PostgreSQL")
def test_a_render_submitted_twice_at_once_and_taken_by_racing_workers_renders_once(tenant, renders, mock_images):
    barrier = threading.Barrier(4)
    answers: list[str] = []

    def submitter() -> None:
        try:
            barrier.wait(5)
            result = submit(tenant, key="order-10:render:v1")
            answers.append("created" if result.created else "replayed")
        finally:
            connection.close()

    def worker() -> None:
        try:
            barrier.wait(5)
            for _ in range(40):
                if row_status() == S.SUCCEEDED:
                    return
                with adapters.http_client() as client:
                    for op in operations_take(limit=2, actor="racer"):
                        operation_execute(operation=op, client=client, actor="racer")
                Operation.objects.filter(status=S.WAITING).update(next_attempt_at=sql.db_now())
        finally:
            connection.close()

    def row_status() -> str | None:
        return Operation.objects.filter(key="order-10:render:v1").values_list("status", flat=True).first()

    threads = [threading.Thread(target=submitter) for _ in range(2)] + [
        threading.Thread(target=worker) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == ["created", "replayed"]
    assert row_status() == S.SUCCEEDED
    effects = mock_images.effects()
    assert effects["renders"] == 1 and effects["submits"] == 1 and OperationOutput.objects.count() == 1


def test_a_job_still_pending_past_its_lifetime_goes_to_review_not_failed(tenant, renders, mock_images):
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    Operation.objects.filter(pk=op.pk).update(expires_at=sql.db_now() - timedelta(seconds=1))
    make_due(op.pk)
    (reviewed,) = run_due()
    assert reviewed.status == S.REVIEW and "lifetime passed" in reasons(op.pk)[-1]
    assert Alert.objects.filter(kind="review_needed", ref=op.key).exists()
    assert not FailedEvent.objects.filter(operation_id=op.pk).exists()


def test_the_sweeper_returns_an_expired_poll_lease_to_waiting_not_uncertain(tenant, renders, mock_images):
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    (held,) = operations_take(limit=1)  # a poller that dies with its lease
    assert held.status == S.CLAIMED and held.polls == 1
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=sql.db_now() - timedelta(seconds=1))
    report = sweep()
    assert report.counts.get("claimed->waiting") == 1
    back = row(op.pk)
    assert back.status == S.WAITING and back.lease_expires_at is None and back.next_attempt_at <= sql.db_now()
    # The dead poller's token publishes nothing any more; the next poll finishes the job.
    mock_images.release()
    (done,) = run_due()
    assert done.status == S.SUCCEEDED and mock_images.effects()["renders"] == 1


def test_a_crash_between_submit_and_record_is_reconciled_by_lookup_into_waiting(tenant, renders, mock_images):
    op = submit(tenant).operation
    (taken,) = operations_take(limit=1)
    with adapters.http_client() as client:
        outcome = adapters.send(provider=renders, operation=taken, client=client)  # the provider accepts …
    assert outcome.status == 202  # … and the worker dies before recording the job id.
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=sql.db_now() - timedelta(seconds=1))
    sweep()  # claimed → uncertain (lease expired after the marker) → lookup: found → waiting
    found = row(op.pk)
    assert found.status == S.WAITING and found.provider_ref == outcome.body["id"]
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    assert mock_images.effects()["submits"] == 1 and mock_images.effects()["renders"] == 1


def test_a_waiting_row_nobody_polled_past_its_lifetime_goes_to_review(tenant, renders, mock_images, settings):
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    Operation.objects.filter(pk=op.pk).update(
        expires_at=sql.db_now() - timedelta(seconds=1), next_attempt_at=sql.db_now() - timedelta(seconds=3600)
    )
    report = sweep()
    assert report.counts.get("waiting->review") == 1 and row(op.pk).status == S.REVIEW


def _signed(body: bytes, secret: str = WEBHOOK_SECRET) -> dict[str, str]:
    return {"HTTP_ONCEGUARD_SIGNATURE": adapters.sign(secret=secret, body=body)}


def test_a_webhook_with_a_bad_signature_is_refused_and_a_good_one_advances_the_job(tenant, renders, mock_images):
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    job = row(op.pk).provider_ref
    mock_images.release()
    body = json.dumps({"id": job, "status": "succeeded"}).encode()
    client = APIClient()  # the provider holds no API key
    url = f"/api/v1/webhooks/{tenant.slug}/images"
    for headers in (_signed(body, secret="not-the-secret"), {}, {"HTTP_ONCEGUARD_SIGNATURE": "t=1,v1=00"}):
        refused = client.post(url, body, content_type="application/json", **headers)
        assert refused.status_code == 401 and refused["Content-Type"].startswith("application/problem+json")
        assert refused.json()["code"] == "webhook_signature_invalid"
    # Another tenant's path with this tenant's signature: the same refusal.
    assert (
        client.post(
            "/api/v1/webhooks/nobody/images", body, content_type="application/json", **_signed(body)
        ).status_code
        == 401
    )
    assert row(op.pk).status == S.WAITING and mock_images.effects()["polls"] == 0
    accepted = client.post(url, body, content_type="application/json", **_signed(body))
    assert accepted.status_code == 200, accepted.content
    assert accepted.json() == {"operation": op.pk, "status": "succeeded", "applied": True}
    assert OperationOutput.objects.filter(operation_id=op.pk).exists()
    assert [e for e in OperationEvent.objects.filter(operation_id=op.pk) if e.actor == "webhook:images"]
    # A repeat of the note changes nothing.
    again = client.post(url, body, content_type="application/json", **_signed(body))
    assert again.json() == {"operation": op.pk, "status": "succeeded", "applied": False}
    assert mock_images.effects()["renders"] == 1


def test_an_asynchronous_provider_must_say_how_to_read_its_status(tenant, mock_images):
    with pytest.raises(ValidationFailed, match="poll_status_pointer"):
        provider_upsert(tenant=tenant, slug="bad", **render_fields(mock_images.url, poll_status_pointer=""))
    with pytest.raises(ValidationFailed, match="poll_path"):
        provider_upsert(tenant=tenant, slug="bad", **render_fields(mock_images.url, poll_path="/v1/renders/{id}"))


def test_polls_are_calls_a_capped_provider_admits_within_its_caps(tenant, mock_images):
    # First polls a minute out: the test makes them due itself (make_due), so a busy machine
    # taking over half a second between the two runs below cannot turn the first poll due
    # and let it take the one slot before the second submit.
    fields = render_fields(mock_images.url, poll_initial_seconds=60, poll_max_seconds=120)
    provider_upsert(tenant=tenant, slug="images", max_in_flight=1, **fields)
    mock_images.set_switches(delay=120)
    ops = [submit(tenant, key=f"order-{i}:render:v1").operation for i in range(2)]
    run_due()
    run_due()
    assert {row(op.pk).status for op in ops} == {S.WAITING}
    for op in ops:
        make_due(op.pk)
    # One poll in flight at most: the second due poll waits for the first lease to end.
    first = operations_take(limit=5)
    assert len(first) == 1 and first[0].polls == 1
    assert operations_take(limit=5) == []


def test_the_console_sets_the_webhook_secret_write_only_and_the_webhook_verifies_with_it(tenant, renders, mock_images):
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    url = f"/admin/ledger/provider/{renders.pk}/change/"
    assert submit_form(admin, url, new_webhook_secret="whsec-from-the-console").status_code == 302
    page = admin.get(url).content.decode()
    assert "whsec-from-the-console" not in page and "set (stored encrypted; never shown)" in page
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    mock_images.release()
    body = json.dumps({"id": row(op.pk).provider_ref}).encode()
    client = APIClient()
    webhook = f"/api/v1/webhooks/{tenant.slug}/images"
    # The old secret no longer verifies; the one set in the console does.
    assert client.post(webhook, body, content_type="application/json", **_signed(body)).status_code == 401
    signed = _signed(body, secret="whsec-from-the-console")
    assert client.post(webhook, body, content_type="application/json", **signed).json()["status"] == "succeeded"
    # A job no operation has: 404; the box clears the secret: every note is refused.
    other = json.dumps({"id": "job_0000000000000000"}).encode()
    missing = client.post(webhook, other, content_type="application/json", **_signed(other, "whsec-from-the-console"))
    assert missing.status_code == 404
    assert submit_form(admin, url, clear_webhook_secret="on").status_code == 302
    assert client.post(webhook, body, content_type="application/json", **signed).status_code == 401


def test_the_command_declares_an_asynchronous_provider_and_reads_its_webhook_secret_from_stdin(
    tenant, mock_images, tmp_path, monkeypatch
):
    fields = render_fields(mock_images.url)
    declared = {name: fields[name] for name in ASYNC_ADAPTER_FIELDS}
    path = tmp_path / "async.json"
    path.write_text(json.dumps(declared))
    monkeypatch.setattr("sys.stdin", io.StringIO("whsec-from-stdin\n"))
    out = io.StringIO()
    call_command(
        "provider_upsert",
        "--tenant", tenant.slug, "--slug", "cli-images", "--base-url", mock_images.url, "--class", "key_enforced",
        "--ref-pointer", "/id", "--async-file", str(path), "--webhook-secret-stdin", stdout=out,
    )  # fmt: skip
    provider = Provider.objects.get(slug="cli-images")
    assert {name: getattr(provider, name) for name in ASYNC_ADAPTER_FIELDS} == declared
    assert "whsec-from-stdin" not in out.getvalue() and "whsec-from-stdin" not in json.dumps(provider.webhook_secret)
    assert provider.revision.config["poll_path"] == "/v1/renders/{provider_ref}"  # versioned with the revision
    path.write_text(json.dumps({"poll_every": 3}))
    with pytest.raises(CommandError, match="poll_every"):
        call_command(
            "provider_upsert",
            "--tenant", tenant.slug, "--slug", "cli-images", "--base-url", mock_images.url, "--class", "key_enforced",
            "--async-file", str(path),
        )  # fmt: skip


def test_a_failed_render_is_not_replayed_to_its_asynchronous_provider_by_a_direct_send(tenant, renders, mock_images):
    mock_images.script([{"wrong_size": True}])
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    run_due()
    entry = FailedEvent.objects.get(operation_id=op.pk)
    # A direct send would record the job's acceptance as the effect, unpolled and unchecked.
    with pytest.raises(ValidationFailed, match="asynchronous provider"):
        failed_event_replay(tenant_id=tenant.pk, event_pk=entry.pk, actor="test", to_provider=True)
    assert mock_images.effects()["submits"] == 1


def test_a_poll_lease_covers_the_status_call_and_the_output_fetch_and_ends_before_django_q2_gives_up(
    tenant, renders, mock_images, settings
):
    timeout = float(renders.timeout_seconds)
    lease = adapters.poll_lease_seconds(timeout)
    fetch = settings.ONCEGUARD["OUTPUT_FETCH_TIMEOUT_SECONDS"]
    assert timeout + fetch < lease < settings.Q_CLUSTER["timeout"] < settings.Q_CLUSTER["retry"]
    assert lease <= adapters.worker_lease_seconds(timeout)  # no longer than a send's
    mock_images.set_switches(delay=120)
    op = submit(tenant).operation
    run_due()
    make_due(op.pk)
    (held,) = operations_take(limit=1)
    assert (held.lease_expires_at - held.claimed_at).total_seconds() == pytest.approx(lease, abs=0.01)
