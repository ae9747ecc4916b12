"""Callbacks: the terminal outcome POSTed to an allow-listed URL, signed, retried, delivered
through the ledger under the key callback:{operation id}, never inside the worker's attempt."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationStatus, Tenant
from ledger.platform.errors import DestinationNotAllowed, ValidationFailed
from ledger.protocol.callbacks import callback_url_allowed
from ledger.providers.adapters import SIGNATURE_HEADER, verify_signature
from ledger.providers.credentials import secret_open
from tests.execute.support import CallbackReceiver, make_due, run_due

S = OperationStatus


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    r = CallbackReceiver()
    yield r
    r.close()


@pytest.fixture
def allowed(tenant: Tenant, receiver: CallbackReceiver) -> Tenant:
    tenant.callback_allow_list = [f"{receiver.url}/hooks/"]
    tenant.save()
    return tenant


def submit(tenant, key, callback_url, amount=1000):
    return operation_submit(
        tenant=tenant,
        key=key,
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": amount}},
        callback_url=callback_url,
        correlation_id="corr-1",
    ).operation


def test_outcome_is_posted_signed_under_the_callback_key(allowed, enforced, receiver):
    op = submit(allowed, "order-9:charge:v1", f"{receiver.url}/hooks/onceguard")
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    # The callback is its own queued operation, written with the terminal move: the worker
    # that finished the charge did not wait for the receiver.
    callback = Operation.objects.get(tenant=allowed, key=f"callback:{op.pk}")
    assert callback.status == S.QUEUED and receiver.deliveries == []
    (sent,) = run_due()
    assert sent.pk == callback.pk and sent.status == S.SUCCEEDED
    ((headers, raw),) = receiver.deliveries
    assert headers["Idempotency-Key"] == f"callback:{op.pk}"
    allowed.refresh_from_db()
    assert verify_signature(secret=secret_open(allowed.callback_secret), body=raw, header=headers[SIGNATURE_HEADER])
    assert not verify_signature(secret="wrong", body=raw, header=headers[SIGNATURE_HEADER])
    document = json.loads(raw)
    assert document["type"] == "operation.finished"
    assert document["operation"]["id"] == op.pk and document["operation"]["status"] == S.SUCCEEDED
    assert document["operation"]["provider_ref"] == done.provider_ref
    assert "request" not in document["operation"] and "payload" not in document["operation"]


def test_failed_outcomes_are_called_back_too(allowed, enforced, receiver):
    _, mock = enforced
    mock.script([{"status": 422}])
    op = submit(allowed, "k-cb-failed", f"{receiver.url}/hooks/x")
    run_due()
    run_due()
    ((_, raw),) = receiver.deliveries
    assert json.loads(raw)["operation"]["status"] == S.FAILED
    assert Operation.objects.get(pk=op.pk).status == S.FAILED


def test_a_failing_receiver_is_retried_with_backoff_and_the_same_key(allowed, enforced, receiver):
    receiver.statuses = [503, 500]
    op = submit(allowed, "k-cb-retry", f"{receiver.url}/hooks/x")
    run_due()
    callback_key = f"callback:{op.pk}"
    (first,) = run_due()
    assert first.status == S.RETRY_WAIT and first.next_attempt_at is not None
    # One receiver's 503 does not throttle the tenant's other callbacks.
    assert first.provider.throttled_until is None
    make_due(first.pk)
    (second,) = run_due()
    assert second.status == S.UNCERTAIN  # a 500: the receiver may have acted
    from ledger.recovery.sweeper import sweep

    sweep()  # key-enforced, no lookup, execute mode: re-issue with the same key
    make_due(second.pk)
    (third,) = run_due()
    assert third.status == S.SUCCEEDED and third.attempts == 3
    assert [h["Idempotency-Key"] for h, _ in receiver.deliveries] == [callback_key] * 3
    # The bodies are the same document every time (signatures differ only by their time).
    assert len({raw for _, raw in receiver.deliveries}) == 1


def test_one_callback_per_operation_whoever_finishes_it(allowed, enforced, receiver):
    from ledger.protocol.services import callback_enqueue

    op = submit(allowed, "k-cb-once", f"{receiver.url}/hooks/x")
    (done,) = run_due()
    assert callback_enqueue(operation=done) is None  # already queued: no second one
    assert Operation.objects.filter(key__startswith="callback:").count() == 1
    run_due()
    assert len(receiver.deliveries) == 1
    assert Operation.objects.get(pk=op.pk).status == S.SUCCEEDED


def test_a_url_removed_from_the_allow_list_is_not_called(allowed, enforced, receiver):
    submit(allowed, "k-cb-revoked", f"{receiver.url}/hooks/x")
    run_due()
    allowed.callback_allow_list = []
    allowed.save()
    (callback,) = run_due()
    assert callback.status == S.FAILED and receiver.deliveries == []


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://hooks.example.com/onceguard/a", True),
        ("https://hooks.example.com/onceguard", True),
        ("https://hooks.example.com:443/onceguard/a?x=1", True),
        ("https://hooks.example.com/onceguardX", False),
        ("http://hooks.example.com/onceguard/a", False),
        ("https://hooks.example.com.evil.example/onceguard/a", False),
        ("https://user:pw@hooks.example.com/onceguard/a", False),
        ("https://hooks.example.com:8443/onceguard/a", False),
        ("https://other.example.com/onceguard/a", False),
        ("ftp://hooks.example.com/onceguard/a", False),
        ("not a url", False),
        # Normalised before the prefix check (issue 11 item 1): nothing climbs out of it.
        ("https://hooks.example.com/onceguard/../admin", False),
        ("https://hooks.example.com/onceguard/%2e%2e/admin", False),
        ("https://hooks.example.com/onceguard/%2E%2E/%2e%2e/admin", False),
        ("https://hooks.example.com/onceguard/./../admin", False),
        ("https://hooks.example.com/onceguard/x/..", True),
        ("https://hooks.example.com/onceguard/a%2F..%2F..%2Fadmin", False),
        ("https://hooks.example.com/onceguard\\..\\admin", False),
        ("https://hooks.example.com\\@evil.example/onceguard/a", False),
        ("https://hooks.example.com@evil.example/onceguard/a", False),
        ("https://HOOKS.example.COM/onceguard/a", True),
        ("https://hooks.example.com./onceguard/a", True),
        ("https://hooks.example.com/onceguard/a#frag", False),
    ],
)
def test_allow_list_matching(url, ok):
    assert callback_url_allowed(allow_list=["https://hooks.example.com/onceguard"], url=url) is ok


def test_a_dot_dot_callback_url_cannot_escape_its_allowed_prefix_at_submission(enforced, tenant):
    tenant.callback_allow_list = ["https://hooks.example.com/onceguard/"]
    tenant.save()
    for url in (
        "https://hooks.example.com/onceguard/../admin/delete",
        "https://hooks.example.com/onceguard/%2e%2e/admin/delete",
    ):
        with pytest.raises(ValidationFailed):
            submit(tenant, f"k-escape-{len(url)}", url)
    assert not Operation.objects.exists()
    # What is accepted is stored in the form that was checked (and is what is sent).
    op = submit(tenant, "k-normal", "https://HOOKS.example.com:443/onceguard/./a")
    assert op.callback_url == "https://hooks.example.com/onceguard/a"


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/hooks/x",
        "http://127.0.0.1:8080/hooks/x",
        "http://localhost:8080/hooks/x",
        "http://10.0.0.5/hooks/x",
    ],
)
def test_link_local_loopback_and_private_callback_urls_are_refused(tenant, enforced, url):
    """On the allow-list (stored before the policy, or by hand) or not: the deployment did
    not allow the destination, so the submission is refused and nothing is stored."""
    Tenant.objects.filter(pk=tenant.pk).update(callback_allow_list=[url.rsplit("/", 1)[0] + "/"])
    tenant.refresh_from_db()
    with pytest.raises(DestinationNotAllowed):
        submit(tenant, "k-special", url)
    assert not Operation.objects.exists()


def test_the_allow_list_itself_refuses_special_destinations_on_save(tenant):
    from ledger.protocol.services import tenant_update

    for prefix in ("http://169.254.169.254/", "http://127.0.0.1:8080/hooks/", "http://192.168.0.10/"):
        with pytest.raises(ValidationFailed):
            tenant_update(tenant_id=tenant.pk, actor="test", callback_allow_list=[prefix])
    tenant = tenant_update(
        tenant_id=tenant.pk, actor="test", callback_allow_list=["https://Hooks.Example.com:443/a/./b/../onceguard"]
    )
    assert tenant.callback_allow_list == ["https://hooks.example.com/a/onceguard"]


def test_a_callback_whose_destination_becomes_refused_is_not_sent(allowed, enforced, receiver, settings):
    """Checked again when sent: the deployment stopped allowing the receiver's port."""
    submit(allowed, "k-cb-policy", f"{receiver.url}/hooks/x")
    run_due()
    port = receiver.url.rsplit(":", 1)[1]
    rules = [r for r in settings.ONCEGUARD["OUTBOUND_ALLOW"].split(",") if not r.endswith(f":{port}")]
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": ",".join(rules)}
    (callback,) = run_due()
    assert callback.status == S.FAILED and receiver.deliveries == []
    assert "outbound policy" in callback.last_error


# --- The signing secret: rotated with an overlap ---------------------------------------------


def test_after_a_rotation_callbacks_carry_both_signatures_until_the_overlap_ends(allowed, enforced, receiver, settings):
    from datetime import timedelta

    from django.utils import timezone

    from ledger.protocol.callbacks import tenant_callback_secret

    old = tenant_callback_secret(tenant_id=allowed.pk)
    new = tenant_callback_secret(tenant_id=allowed.pk, rotate=True)
    assert new != old
    submit(allowed, "k-rotated", f"{receiver.url}/hooks/x")
    run_due()
    run_due()
    ((headers, raw),) = receiver.deliveries
    header = headers[SIGNATURE_HEADER]
    assert header.count("v1=") == 2
    # A receiver still holding the old secret accepts it, and so does one that switched.
    assert verify_signature(secret=old, body=raw, header=header)
    assert verify_signature(secret=new, body=raw, header=header)
    # Past the overlap only the new secret signs.
    Tenant.objects.filter(pk=allowed.pk).update(callback_secret_rotated_at=timezone.now() - timedelta(days=2))
    submit(allowed, "k-rotated-later", f"{receiver.url}/hooks/x")
    run_due()
    run_due()
    (headers, raw) = receiver.deliveries[-1]
    assert headers[SIGNATURE_HEADER].count("v1=") == 1
    assert verify_signature(secret=new, body=raw, header=headers[SIGNATURE_HEADER])
    assert not verify_signature(secret=old, body=raw, header=headers[SIGNATURE_HEADER])
