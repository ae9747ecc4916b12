"""The crash window, on purpose, in guard mode (issue 4's table): a real service
(live_server), a real fault relay and real mock providers on loopback.

The "workflow" here is what an n8n HTTP node or a Python worker does: claim through the
API, write the sent marker, call the provider through the relay with the key as its
idempotency key, then complete — or report `ambiguous` when it never saw an answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.protocol import services
from ledger.recovery.sweeper import sweep
from relay.testing import RunningServer
from tests.e2e.support import ADVISORY, ENFORCED, EXPECTED, TIMEOUT, Stack, effects, settle
from tests.ledger.support import expire_lease

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

CALL_TIMEOUT = TIMEOUT


@pytest.fixture(params=[ENFORCED, ADVISORY])
def stack(request: Any, tenant: Any) -> Iterator[tuple[Stack, Any]]:
    s = Stack(tenant, request.param)
    yield s, s.ledger_provider
    s.stop()


class Workflow:
    """A guard-mode caller speaking HTTP to the service."""

    def __init__(self, base: str, api_key: str) -> None:
        self.api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {api_key}"}, timeout=10)

    def claim(self, key: str, **extra: Any) -> httpx.Response:
        body = {"provider": "pay", "action": "charge", "request": {"amount": 4200}, "uses_sent_marker": True, **extra}
        return self.api.post("/api/v1/claims", json=body, headers={"Idempotency-Key": key})

    def run(self, key: str, provider_url: str, relay_mode: str) -> str:
        """One attempt of the effect; returns what the caller saw."""
        claimed = self.claim(key)
        assert claimed.status_code == 201, claimed.text
        op = claimed.json()
        token = op["lease_token"]
        sent = self.api.post(f"/api/v1/operations/{op['id']}/sent", json={"lease_token": token})
        assert sent.status_code == 200, sent.text
        try:
            answer = httpx.post(
                f"{provider_url}/charges",
                json={"amount": 4200},
                headers={"Idempotency-Key": key, "X-Relay-Mode": relay_mode},
                timeout=CALL_TIMEOUT,
            )
        except httpx.HTTPError:
            self.fail(op["id"], token, "ambiguous", "no answer from the provider")
            return "no_answer"
        if answer.status_code in (200, 201) and answer.json().get("id"):
            done = self.api.post(
                f"/api/v1/operations/{op['id']}/complete",
                json={"lease_token": token, "provider_ref": answer.json()["id"], "response": answer.json()},
            )
            assert done.status_code == 200, done.text
            return "completed"
        # 500/502/504 after a send: the outcome is unknown (DESIGN §3 failure classes).
        self.fail(op["id"], token, "ambiguous", f"HTTP {answer.status_code}")
        return f"http_{answer.status_code}"

    def fail(self, op_id: int, token: str, error_class: str, message: str) -> None:
        r = self.api.post(
            f"/api/v1/operations/{op_id}/fail",
            json={"lease_token": token, "error_class": error_class, "message": message},
        )
        assert r.status_code == 200, r.text


@pytest.fixture
def workflow(live_server: Any, tenant: Any) -> Workflow:
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write"])
    return Workflow(live_server.url, secret)


def _op(key: str) -> Operation:
    return Operation.objects.get(key=key)


def _effects(server: RunningServer) -> int:
    return effects(server)


@pytest.mark.parametrize("relay_mode", list(EXPECTED))
def test_each_relay_mode_ends_as_the_provider_class_allows(stack, workflow, relay_mode):
    s, provider = stack
    key = f"order-1001:charge:{relay_mode}"
    want_status, want_effects = EXPECTED[relay_mode][provider.idempotency_class]

    seen = workflow.run(key, s.relay.url, relay_mode)
    op = _op(key)
    if relay_mode == "forward-and-respond":
        assert seen == "completed" and op.status == S.SUCCEEDED
        before = op.updated_at
        sweep()
        op.refresh_from_db()
        assert op.updated_at == before, "the sweeper must not touch a finished row"
    else:
        assert op.status == S.UNCERTAIN, (seen, op.status)
        settle(op.pk)
        sweep()
        op.refresh_from_db()
        if op.status == S.RETRY_WAIT:
            # Lookup said "not found" (the provider never saw it): the normal send path
            # re-issues with the SAME key.
            assert relay_mode == "fail-before-forward"
            assert workflow.run(key, s.relay.url, "forward-and-respond") == "completed"
            op.refresh_from_db()
            assert op.attempts == 2
    assert (op.status, _effects(s.provider)) == (want_status, want_effects)
    if want_status == S.SUCCEEDED:
        assert op.provider_ref.startswith("ch_")
    if provider.idempotency_class == IdempotencyClass.KEY_ADVISORY:
        # Never re-sent: every forward the relay journaled is the one attempt.
        assert sum(1 for e in s.relay.journal() if e["forwarded"]) == want_effects


def test_reconciled_ref_is_the_one_the_provider_stored(stack, workflow):
    s, provider = stack
    if provider.idempotency_class != IdempotencyClass.KEY_ENFORCED:
        pytest.skip("lookup only exists for key-enforced providers")
    key = "order-2002:charge:v1"
    assert workflow.run(key, s.relay.url, "forward-then-drop-response") == "no_answer"
    sweep()
    stored = httpx.get(f"{s.provider.url}/charges", params={"idempotency_key": key}, timeout=5).json()
    op = _op(key)
    assert op.status == S.SUCCEEDED and op.provider_ref == stored["id"]


def test_crash_before_the_marker_is_retried_only_for_marker_honouring_senders(stack, workflow):
    s, provider = stack
    honest = workflow.claim("k:marker", uses_sent_marker=True).json()
    unknown = workflow.claim("k:nomarker", uses_sent_marker=False).json()
    for op in (honest, unknown):
        expire_lease(op["id"])  # the caller "crashed" before writing sent
        settle(op["id"])
    sweep()
    assert _op("k:marker").status == S.RETRY_WAIT
    expected_unknown = S.REVIEW if provider.idempotency_class == IdempotencyClass.KEY_ADVISORY else S.RETRY_WAIT
    # Key-enforced with lookup: "possibly sent" → uncertain → looked up → not found → retry.
    assert _op("k:nomarker").status == expected_unknown
    assert _effects(s.provider) == 0


def test_late_complete_from_the_last_holder_after_the_sweep_still_lands(stack, workflow):
    s, provider = stack
    op = workflow.claim("k:late").json()
    workflow.api.post(f"/api/v1/operations/{op['id']}/sent", json={"lease_token": op["lease_token"]})
    expire_lease(op["id"])
    from ledger.recovery.sweeper import sweep_expired_leases

    sweep_expired_leases()
    assert _op("k:late").status == S.UNCERTAIN
    done = workflow.api.post(
        f"/api/v1/operations/{op['id']}/complete", json={"lease_token": op["lease_token"], "provider_ref": "ch_late"}
    )
    assert done.status_code == 200 and done.json()["status"] == S.SUCCEEDED
    assert done.json()["provider_ref"] == "ch_late"


def test_two_identical_submissions_at_once_make_one_row_and_one_effect(stack, workflow):
    s, provider = stack
    key = "order-3003:charge:v1"
    barrier = threading.Barrier(2)
    seen: list[str] = []

    def submit() -> None:
        barrier.wait()
        claimed = workflow.claim(key)
        if claimed.status_code != 201:
            seen.append(str(claimed.status_code))
            return
        op = claimed.json()
        workflow.api.post(f"/api/v1/operations/{op['id']}/sent", json={"lease_token": op["lease_token"]})
        answer = httpx.post(
            f"{s.relay.url}/charges", json={"amount": 4200}, headers={"Idempotency-Key": key}, timeout=5
        )
        workflow.api.post(
            f"/api/v1/operations/{op['id']}/complete",
            json={"lease_token": op["lease_token"], "provider_ref": answer.json()["id"]},
        )
        seen.append("201")

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(seen) == ["201", "409"]
    assert Operation.objects.filter(key=key).count() == 1
    assert _effects(s.provider) == 1
