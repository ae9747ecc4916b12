"""Runs (issue 13 item 1): the steps of one business transaction in five checkpoint states,
and a resume that re-drives only the failed steps through the DLQ replay path — counted by
real loopback providers (one effect per step) and a loopback replay target."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from dlq.models import FailedEvent, Replay, RunResume
from ledger.models import Operation, OperationStatus
from ledger.platform import caching
from ledger.protocol import selectors
from ledger.protocol import services as ledger_services
from ledger.protocol.transitions.claim import guarded_move
from review.decisions.services import review_decision_record
from review.models import ReviewDecision
from tests.execute.conftest import configure_provider
from tests.execute.support import run_due
from tests.support.fixtures import *  # noqa: F403

S = OperationStatus
pytestmark = pytest.mark.django_db

RUN = "checkout-77"


@pytest.fixture(autouse=True)
def _forget_caches() -> Iterator[None]:
    # Per-process caches keyed by id; test databases reuse ids.
    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()
    yield
    selectors._PROVIDER_SLUGS.clear()
    caching.clear_all()


def submit_step(client: Any, n: int, *, run: str = RUN) -> dict[str, Any]:
    body = {
        "key": f"order-1001:step{n}:v1",
        "provider": "charges",
        "action": f"step{n}",
        "run": run,
        "step": n,
        "request": {"method": "POST", "path": "/charges", "body": {"amount": 100 * n}},
    }
    response = client.post("/api/v1/operations", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def get_run(client: Any, run: str = RUN) -> dict[str, Any]:
    response = client.get(f"/api/v1/runs/{quote(run, safe='')}")
    assert response.status_code == 200, response.content
    return response.json()


def resume(client: Any, run: str = RUN, **body: Any) -> Any:
    return client.post(
        f"/api/v1/runs/{quote(run, safe='')}/resume", {"note": "step 2 fixed upstream", **body}, format="json"
    )


def test_a_three_step_run_where_step_2_failed_resumes_only_step_2(client, tenant, mock_enforced):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True, max_attempts=1)
    mock_enforced.script([{}, {"status": 408}, {}])  # step 2's only attempt: refused, no effect
    steps = [submit_step(client, n) for n in (1, 2, 3)]
    run_due()

    view = get_run(client)
    assert [s["checkpoint"] for s in view["steps"]] == ["done", "failed", "done"]
    assert [s["step"] for s in view["steps"]] == [1, 2, 3]
    assert [s["will_resume"] for s in view["steps"]] == [False, True, False]
    assert view["resume"]["operations"] == [steps[1]["id"]]
    assert all(s["safe_to_repeat"] for s in view["steps"])

    preview = resume(client, preview=True)
    assert preview.status_code == 200 and preview.json()["resume"]["operations"] == [steps[1]["id"]]
    assert Replay.objects.count() == 0  # a preview does nothing

    answer = resume(client, operations=[steps[1]["id"]])

    assert answer.status_code == 201, answer.content
    [result] = answer.json()["results"]
    assert result["operation"] == steps[1]["id"] and result["via"] == "provider" and result["outcome"] == "succeeded"
    # Exactly one effect per step, each under its own key: step 2 went to its provider again
    # under its original key; steps 1 and 3 were not touched.
    effects = mock_enforced.effects()
    assert effects["count"] == 3
    assert effects["by_key"] == {f"order-1001:step{n}:v1": 1 for n in (1, 2, 3)}
    # Lineage: the original stays failed and points at the replay, which is the new attempt.
    original = Operation.objects.get(pk=steps[1]["id"])
    assert original.status == S.FAILED and original.superseded_by_id == result["replay_operation"]
    replay = Replay.objects.get()
    assert replay.to_provider and replay.sent_key == original.key and replay.note.startswith(f"resume of run {RUN}")
    assert [s["checkpoint"] for s in get_run(client)["steps"]] == ["done", "done", "done"]
    # The resume is recorded: who, why, the plan and what came of it.
    record = RunResume.objects.get()
    assert record.tenant_id == tenant.pk and record.run == RUN and record.note == "step 2 fixed upstream"
    assert [p["operation"] for p in record.planned] == [steps[1]["id"]]
    # Done steps keep answering with their recorded outcome; nothing is left to resume.
    again = client.post(
        "/api/v1/operations",
        {
            "key": "order-1001:step2:v1",
            "provider": "charges",
            "action": "step2",
            "run": RUN,
            "step": 2,
            "request": {"method": "POST", "path": "/charges", "body": {"amount": 200}},
        },
        format="json",
    )
    assert again.status_code == 200 and again.json()["status"] == S.SUCCEEDED
    assert resume(client).json()["code"] == "run_nothing_to_resume"
    assert mock_enforced.effects()["count"] == 3


def test_a_preview_that_no_longer_matches_is_refused(client, tenant, mock_enforced):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True, max_attempts=1)
    mock_enforced.script([{"status": 408}])
    first = submit_step(client, 1)
    run_due()

    answer = resume(client, operations=[first["id"] + 100])

    assert answer.status_code == 409 and answer.json()["code"] == "run_changed_since_preview"
    assert mock_enforced.effects()["count"] == 0 and not RunResume.objects.exists()


def guard_claim(client: Any, key: str, step: int, **extra: Any) -> dict[str, Any]:
    body = {"key": key, "provider": "crm", "action": "create", "run": RUN, "step": step, "payload": {"lead": step}}
    response = client.post("/api/v1/claims", {**body, **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def report(client: Any, created: dict[str, Any], verb: str, **body: Any) -> dict[str, Any]:
    response = client.post(
        f"/api/v1/operations/{created['id']}/{verb}", {"lease_token": created["lease_token"], **body}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_guard_mode_step_is_re_driven_through_the_replay_target(client, tenant, target, sink):
    ledger_services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced", max_attempts=1
    )
    one = guard_claim(client, "lead-1:crm:v1", 1)
    report(client, one, "complete", provider_ref="c1")
    two = guard_claim(client, "lead-1:crm-note:v1", 2)
    report(client, two, "fail", error_class="transient", message="CRM answered 503")

    answer = resume(client)

    assert answer.status_code == 201, answer.content
    [result] = answer.json()["results"]
    assert result["via"] == "target" and result["outcome"] == "succeeded"
    [request] = sink.received()
    assert request.header("Idempotency-Key") == "lead-1:crm-note:v1" and request.json() == {"lead": 2}
    assert [s["checkpoint"] for s in get_run(client)["steps"]] == ["done", "done"]


def test_uncertain_steps_are_never_re_driven_and_a_resolved_one_is(client, tenant, target, sink):
    ledger_services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_advisory"
    )
    created = guard_claim(client, "mail-1:welcome:v1", 1)
    report(client, created, "sent")
    report(client, created, "fail", error_class="ambiguous", message="timeout after send")

    view = get_run(client)
    [step] = view["steps"]
    assert step["checkpoint"] == "uncertain" and not step["safe_to_repeat"] and not step["will_resume"]
    assert "reviewer" in step["advice"]
    assert resume(client).json()["code"] == "run_nothing_to_resume"
    assert sink.received() == []

    # A reviewer resolves it as not done: its caller may never come back, so a resume sends it.
    op = Operation.objects.get(pk=created["id"])
    op = guarded_move(operation=op, to=S.REVIEW, actor="test", reason="to review")
    review_decision_record(
        operation_id=op.pk, decision=ReviewDecision.SAFE_TO_RETRY, note="provider log shows nothing", actor="user:rita"
    )
    assert get_run(client)["steps"][0]["will_resume"]

    answer = resume(client)

    assert answer.status_code == 201, answer.content
    assert answer.json()["results"][0]["outcome"] == "succeeded"
    assert len(sink.received()) == 1
    original = Operation.objects.get(pk=created["id"])
    assert original.status == S.FAILED and FailedEvent.objects.filter(operation=original).exists()


def test_the_correlation_id_is_the_run_when_none_is_sent_and_runs_are_tenant_scoped(
    client, tenant, other_tenant, make_client
):
    ledger_services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    body = {"key": "lead-5:crm:v1", "provider": "crm", "action": "create", "correlation_id": "n8n-exec-41"}
    created = client.post("/api/v1/claims", body, format="json").json()

    view = get_run(client, "n8n-exec-41")

    assert [s["operation"]["id"] for s in view["steps"]] == [created["id"]]
    assert view["steps"][0]["checkpoint"] == "in_progress" and view["steps"][0]["operation"]["run"] == "n8n-exec-41"
    assert make_client(other_tenant).get("/api/v1/runs/n8n-exec-41").status_code == 404
    assert client.get("/api/v1/runs/no-such-run").json()["code"] == "not_found"
