"""POST /api/v1/operations: the execute-mode envelope, its answers and what it stores."""

from __future__ import annotations

import pytest

from ledger.models import Attempt, Operation, OperationEvent, OperationStatus, ProviderKind
from ledger.platform.crypto import open_json
from tests.execute.support import run_due

S = OperationStatus
URL = "/api/v1/operations"


def submit(api, body, **headers):
    return api.post(URL, body, format="json", **headers)


def test_submit_answers_202_with_location_and_writes_a_queued_row(api, enforced, charge_envelope):
    response = submit(api, {"key": "order-1:charge:v1", "provider": "charges", "request": charge_envelope()})
    assert response.status_code == 202, response.json()
    body = response.json()
    assert response["Location"] == f"/api/v1/operations/{body['id']}"
    assert body["status"] == S.QUEUED and body["mode"] == "execute" and body["attempts"] == 0
    op = Operation.objects.get(pk=body["id"])
    assert op.status == S.QUEUED and op.next_attempt_at is not None and open_json(op.request)["path"] == "/charges"
    assert op.request_bytes > 0
    assert list(OperationEvent.objects.filter(operation=op).values_list("to_status", flat=True)) == [S.QUEUED]
    # Queued is not an attempt: nothing is sent before a worker takes it.
    assert not Attempt.objects.filter(operation=op).exists()


def test_key_may_come_in_the_idempotency_key_header(api, enforced, charge_envelope):
    response = submit(
        api, {"provider": "charges", "request": charge_envelope()}, HTTP_IDEMPOTENCY_KEY="order-2:charge:v1"
    )
    assert response.status_code == 202
    assert response.json()["key"] == "order-2:charge:v1"


def test_same_key_while_queued_answers_202_replayed_and_stores_nothing_new(api, enforced, charge_envelope):
    # Every open state and the races: tests/execute/test_submit_repeat.py.
    body = {"key": "order-3:charge:v1", "provider": "charges", "request": charge_envelope()}
    first = submit(api, body)
    again = submit(api, body)
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert Operation.objects.count() == 1


def test_same_key_with_another_request_is_422(api, enforced, charge_envelope):
    assert submit(api, {"key": "k-422", "provider": "charges", "request": charge_envelope(1000)}).status_code == 202
    response = submit(api, {"key": "k-422", "provider": "charges", "request": charge_envelope(2000)})
    assert response.status_code == 422
    assert response.json()["code"] == "key_reused_with_different_request"


def test_finished_key_replays_200_with_the_recorded_outcome_and_no_second_call(api, enforced, charge_envelope):
    _, mock = enforced
    body = {"key": "order-4:charge:v1", "provider": "charges", "request": charge_envelope()}
    assert submit(api, body).status_code == 202
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    replay = submit(api, body)
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["status"] == S.SUCCEEDED and replay.json()["provider_ref"] == done.provider_ref
    assert run_due() == []
    assert mock.effects()["requests"] == 1


def test_claiming_an_execute_mode_key_through_claims_is_409_managed_by_service(api, enforced, charge_envelope):
    assert submit(api, {"key": "k-managed", "provider": "charges", "request": charge_envelope()}).status_code == 202
    response = api.post("/api/v1/claims", {"key": "k-managed", "provider": "charges"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "operation_managed_by_service"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"provider": "nope"}, "unknown_provider"),
        ({"provider": "_callbacks"}, "reserved_provider"),
        ({"request": {"method": "TRACE", "path": "/charges"}}, "validation_error"),
        ({"request": {"method": "POST", "path": "https://evil.example/x"}}, "validation_error"),
        ({"request": {"method": "POST", "path": "//evil.example/x"}}, "validation_error"),
        ({"request": {"method": "POST", "path": "/charges/../admin"}}, "validation_error"),
        (
            {"request": {"method": "POST", "path": "/charges", "headers": {"Authorization": "Bearer x"}}},
            "validation_error",
        ),
        ({"request": {"method": "POST", "path": "/charges", "headers": {"X-Not-Allowed": "1"}}}, "validation_error"),
        (
            {"request": {"method": "POST", "path": "/charges", "headers": {"Idempotency-Key": "other"}}},
            "validation_error",
        ),
        ({"request": {"method": "POST", "path": "/charges", "surprise": 1}}, "validation_error"),
        ({"request": "POST /charges"}, "validation_error"),
        ({"callback_url": "https://elsewhere.example/hook"}, "validation_error"),
        ({"deadline_seconds": 0}, "validation_error"),
        ({"key": ""}, "invalid_idempotency_key"),
    ],
)
def test_invalid_submissions_are_400_and_store_nothing(api, enforced, charge_envelope, change, code):
    from ledger.protocol.callbacks import callback_provider

    tenant = enforced[0].tenant
    callback_provider(tenant_id=tenant.pk)  # exists, but is not submittable
    body = {"key": "k-invalid", "provider": "charges", "request": charge_envelope(), **change}
    response = submit(api, body)
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert response["Content-Type"] == "application/problem+json"
    assert not Operation.objects.exists()
    # The URL a caller sent is never echoed (it may carry personal data).
    assert "elsewhere.example" not in response.content.decode()


def test_oversize_envelope_is_400_request_too_large(api, enforced, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "EXECUTE_MAX_REQUEST_BYTES": 2000}
    body = {"key": "k-big", "provider": "charges", "request": {"path": "/charges", "body": {"blob": "x" * 3000}}}
    response = submit(api, body)
    assert response.status_code == 400
    assert response.json()["code"] == "request_too_large"
    assert not Operation.objects.exists()


def test_allowed_headers_are_forwarded_and_credentials_come_from_the_environment(
    api, enforced, charge_envelope, monkeypatch
):
    provider, mock = enforced
    provider.forward_headers = ["X-Request-Id"]
    provider.auth_header = "Authorization"
    provider.auth_secret_env = "ONCEGUARD_SECRET_ACME_CHARGES"
    provider.save()
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_CHARGES", "Bearer sk_test_123")
    envelope = {**charge_envelope(), "headers": {"X-Request-Id": "req-1"}}
    assert submit(api, {"key": "k-headers", "provider": "charges", "request": envelope}).status_code == 202
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    stored = Operation.objects.get(pk=done.pk).request
    # The stored envelope never holds the credential.
    assert "sk_test_123" not in str(stored)


def test_the_callback_provider_is_internal(api, enforced):
    from ledger.protocol.callbacks import callback_provider

    provider = callback_provider(tenant_id=enforced[0].tenant_id)
    assert provider.kind == ProviderKind.CALLBACK


def test_a_forwarded_header_outside_printable_ascii_is_refused_at_submission(api, enforced, charge_envelope):
    provider, _ = enforced
    provider.forward_headers = ["X-Request-Id"]
    provider.save()
    for value in ("req-\uff43", "caf\u00e9", "a\tb"):
        envelope = {**charge_envelope(), "headers": {"X-Request-Id": value}}
        response = submit(api, {"key": "k-header-ascii", "provider": "charges", "request": envelope})
        assert response.status_code == 400, value
        assert response.json()["code"] == "validation_error"
    assert not Operation.objects.filter(key="k-header-ascii").exists()
