"""Execute mode under the one masking rule (issue 11 item 6): the submission that replays a
finished key gets the provider's recorded answer in clear; reads of the operation get it
masked; the callback — the submission's asynchronous answer, signed, to the tenant's own
allow-listed receiver — carries it in clear."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationStatus, Tenant
from ledger.platform.masking import mask_json
from tests.execute.support import CallbackReceiver, run_due

S = OperationStatus


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    r = CallbackReceiver()
    yield r
    r.close()


def _submission(key: str, **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "provider": "charges",
        "request": {"method": "POST", "path": "/charges", "body": {"amount": 1200}},
        **extra,
    }


def test_the_replaying_submission_gets_the_answer_in_clear_and_reads_get_it_masked(tenant, enforced, make_client):
    writer = make_client(tenant, ["read", "write"])
    accepted = writer.post("/api/v1/operations", _submission("order-5:charge:v1"), format="json")
    assert accepted.status_code == 202
    (done,) = run_due()
    assert done.status == S.SUCCEEDED
    recorded = Operation.objects.get(pk=done.pk)
    replayed = writer.post("/api/v1/operations", _submission("order-5:charge:v1"), format="json")
    assert replayed.status_code == 200 and replayed["Idempotent-Replayed"] == "true"
    answer = replayed.json()
    assert answer["response"]["masked"] is False and answer["response"]["body"]["id"] == recorded.provider_ref

    reader = make_client(tenant, ["read"])
    detail = reader.get(f"/api/v1/operations/{done.pk}").json()
    assert detail["response"] == {
        "status": answer["response"]["status"],
        "body": mask_json(answer["response"]["body"]),
        "masked": True,
    }
    assert recorded.provider_ref not in json.dumps(detail["response"])


def test_the_callback_carries_the_recorded_answer_in_clear(tenant: Tenant, enforced, receiver, settings):
    # The receiver is a loopback server: the outbound policy allows exactly its host and port.
    allowed = [r for r in str(settings.ONCEGUARD.get("OUTBOUND_ALLOW") or "").split(",") if r]
    host_port = f"{urlsplit(receiver.url).hostname}:{urlsplit(receiver.url).port}"
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": ",".join([*allowed, host_port])}
    tenant.callback_allow_list = [f"{receiver.url}/hooks/"]
    tenant.save()
    op = operation_submit(
        tenant=tenant,
        key="order-6:charge:v1",
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": 1}},
        callback_url=f"{receiver.url}/hooks/x",
    ).operation
    run_due()
    run_due()
    ((_, raw),) = receiver.deliveries
    response = json.loads(raw)["operation"]["response"]
    assert response["masked"] is False and response["body"]["id"] == Operation.objects.get(pk=op.pk).provider_ref
