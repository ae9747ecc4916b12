"""Rollbacks recall their outputs, canary gates beyond the failure rate, consumers' verdicts
(ADR 0020).

Outputs are published by the real path (a worker's take, ``output_fetch_publish`` fetching the
bytes through an in-process transport, the holder's ``operation_complete``); latencies are
attempt rows with injected start and finish times — nothing sleeps.
"""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from alerts.models import Alert
from ledger.execution.attempts import operations_take
from ledger.execution.outputs import OutputExpectation, output_fetch_publish
from ledger.execution.submission import operation_submit
from ledger.execution.verdicts import output_verdict_record
from ledger.models import (
    AdapterRevision,
    ApprovalRequest,
    Attempt,
    AttemptOutcome,
    IdempotencyClass,
    Operation,
    OperationOutput,
    OutputVerdict,
    Provider,
)
from ledger.protocol import approvals
from ledger.protocol.callbacks import callback_body
from ledger.protocol.services import operation_complete, provider_upsert
from ledger.providers import canary, revisions
from ledger.recovery import recall
from ledger.recovery.recall import outputs_recall_due
from ledger.store import sql
from tests.console.support import client_for, page, staff
from tests.support.objects import image_bytes

BASE = "http://127.0.0.1:9"
HOOK = f"{BASE}/hooks/onceguard"
PNG = image_bytes(8, 6)


@pytest.fixture
def gates(settings):
    """Gates judged after three of each: small samples for a test."""
    settings.ONCEGUARD = {
        **settings.ONCEGUARD,
        "CANARY_MIN_SAMPLE": 3,
        "CANARY_WINDOW_SECONDS": 900,
        "CANARY_LATENCY_P95_MAX_RATIO": 2.0,
        "CANARY_MAX_REJECTED_EXCESS_PERCENT": 10.0,
        "CANARY_MIN_SCORE": 0.5,
    }


@pytest.fixture
def images(tenant, outbound_allow):
    """A render provider at revision 1, its revision 2 a canary for every new key; the tenant
    takes callbacks at HOOK."""
    outbound_allow(BASE)
    tenant.callback_allow_list = [f"{BASE}/hooks/"]
    tenant.save()
    provider_upsert(tenant=tenant, slug="images", base_url=BASE, idempotency_class=IdempotencyClass.KEY_ENFORCED)
    return provider_upsert(
        tenant=tenant, slug="images", base_url=BASE + "/v2", canary_percent=100, reason="v2 renderer", actor="user:a"
    )


def _transport(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=PNG, headers={"Content-Type": "image/png"})


def published(tenant, keys: list[str], *, callback: bool = True) -> list[Operation]:
    """Submit ``keys``, take them as a worker, publish each one's output and complete it."""
    for key in keys:
        operation_submit(
            tenant=tenant,
            key=key,
            provider="images",
            action="render",
            request={"method": "POST", "path": "/renders", "body": {"prompt": "a bicycle"}},
            callback_url=HOOK if callback else "",
        )
    taken = operations_take(limit=len(keys), actor="test-worker")
    assert sorted(op.key for op in taken) == sorted(keys)
    with httpx.Client(transport=httpx.MockTransport(_transport)) as client:
        for op in taken:
            output_fetch_publish(operation=op, url="/out/1.png", expect=OutputExpectation(), client=client)
            operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref=f"job-{op.pk}"
            )
    return sorted(taken, key=lambda op: op.key)


def problem(response) -> str:
    assert response["Content-Type"].startswith("application/problem+json"), response.content
    return response.json()["code"]


def test_a_rollback_quarantines_unconsumed_outputs_and_flags_consumed_ones_in_the_api_and_a_callback(
    tenant, images, make_client
):
    consumed, unconsumed = published(tenant, ["order-1:render:v1", "order-2:render:v1"])
    canary_rev = images.canary_revision_id
    assert OperationOutput.objects.get(operation_id=consumed.pk).adapter_revision_id == canary_rev
    api, admin = make_client(tenant), make_client(tenant, scopes=["admin"])
    assert api.get(f"/api/v1/operations/{consumed.pk}/output/content").status_code == 200
    before = api.get(f"/api/v1/operations/{unconsumed.pk}/output").json()
    assert "recall" not in before  # an output that stands says nothing of recalls

    rolled = admin.post(
        "/api/v1/providers/images/revisions/rollback", {"reason": "v2 draws wheels square"}, format="json"
    )
    assert rolled.status_code == 200, rolled.content
    assert rolled.json()["recalled"] == {"quarantined": 1, "flagged": 1}

    # The unconsumed output's bytes are no longer served; its facts say why.
    gone = api.get(f"/api/v1/operations/{unconsumed.pk}/output/content")
    assert gone.status_code == 410 and problem(gone) == "output_quarantined"
    recall = api.get(f"/api/v1/operations/{unconsumed.pk}").json()["output"]["recall"]
    assert recall["state"] == "quarantined" and recall["produced_by_rolled_back_revision"] is True
    assert recall["adapter_revision"] == 2 and recall["consumed_at"] is None
    assert "v2 draws wheels square" in recall["reason"]
    # The consumed one is still served, marked.
    assert api.get(f"/api/v1/operations/{consumed.pk}/output/content").status_code == 200
    flagged = api.get(f"/api/v1/operations/{consumed.pk}/output").json()["recall"]
    assert flagged["state"] == "flagged" and flagged["consumed_at"] is not None

    # Each submitter is told, once, by a callback of its own.
    for op, state in ((unconsumed, "quarantined"), (consumed, "flagged")):
        told = Operation.objects.get(tenant=tenant, key=f"callback:{op.pk}:output_recalled")
        document = json.loads(callback_body(callback_operation=told))
        assert document["type"] == "operation.output_recalled"
        assert document["operation"]["output"]["recall"]["state"] == state
    # The revision's page counts them; the sweeper's pass finds nothing left to recall.
    revisions_page = admin.get("/api/v1/providers/images/revisions").json()["revisions"]
    assert revisions_page[0]["number"] == 2 and revisions_page[0]["outputs"] == {"quarantined": 1, "flagged": 1}
    assert revisions_page[0]["rolled_back_at"] is not None
    assert outputs_recall_due() == {"quarantined": 0, "flagged": 0}
    assert not AdapterRevision.objects.filter(pk=canary_rev, rolled_back_at__isnull=True).exists()


def test_the_automatic_watchs_rollback_is_recalled_by_the_sweepers_pass(tenant, images):
    (op,) = published(tenant, ["order-3:render:v1"], callback=False)
    canary.revision_rollback(provider_id=images.pk, actor=canary.WATCH_ACTOR, reason="automatic rollback", canary=2)
    assert OperationOutput.objects.get(operation_id=op.pk).state == "published"
    assert outputs_recall_due() == {"quarantined": 1, "flagged": 0}
    assert OperationOutput.objects.get(operation_id=op.pk).state == "quarantined"


def test_the_sweepers_pass_reaches_an_older_rollbacks_outputs_past_newer_rollbacks_with_none(
    tenant, images, monkeypatch
):
    (op,) = published(tenant, ["order-4:render:v1"], callback=False)
    canary.revision_rollback(provider_id=images.pk, actor=canary.WATCH_ACTOR, reason="automatic rollback", canary=2)
    # A newer rollback with nothing published (revision 1 served none of these), and a pass
    # that looks at one revision: the one it looks at is the one with outputs left.
    AdapterRevision.objects.filter(provider_id=images.pk, number=1).update(
        rolled_back_at=timezone.now() + timedelta(minutes=1)
    )
    monkeypatch.setattr(recall, "RECALL_MAX_REVISIONS", 1)
    assert outputs_recall_due() == {"quarantined": 1, "flagged": 0}
    assert OperationOutput.objects.get(operation_id=op.pk).state == "quarantined"


def test_an_output_published_after_its_revisions_rollback_is_recalled_as_it_is_published(tenant, images, api):
    operation_submit(
        tenant=tenant,
        key="order-5:render:v1",
        provider="images",
        action="render",
        request={"method": "POST", "path": "/renders", "body": {"prompt": "a bicycle"}},
    )
    (op,) = operations_take(limit=1, actor="test-worker")
    # Rolled back while the worker rendered: the operator's recall found nothing published yet.
    canary.revision_rollback(provider_id=images.pk, actor="user:a", reason="bad renders", canary=2)
    with httpx.Client(transport=httpx.MockTransport(_transport)) as client:
        output = output_fetch_publish(operation=op, url="/out/1.png", expect=OutputExpectation(), client=client)
    assert output.state == "quarantined"
    operation_complete(operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="job-5")
    content = api.get(f"/api/v1/operations/{op.pk}/output/content")
    assert content.status_code == 410 and problem(content) == "output_quarantined"


def test_a_bulk_rerun_submits_the_next_key_versions_under_the_stable_revision_once_and_asks_four_eyes(
    tenant, images, make_client
):
    first, second = published(tenant, ["order-4:render:v1", "sku-77"], callback=False)
    admin = make_client(tenant, scopes=["admin"])
    assert (
        admin.post("/api/v1/providers/images/revisions/rollback", {"reason": "bad"}, format="json").status_code == 200
    )
    stable = Provider.objects.get(pk=images.pk).revision_id

    # Four eyes (ADR 0013): the provider requires a second person for re-sends.
    Provider.objects.filter(pk=images.pk).update(resend_approval_required=True)
    pending = admin.post("/api/v1/providers/images/revisions/2/rerun", {"reason": "re-render under r1"}, format="json")
    assert pending.status_code == 202, pending.content
    request = ApprovalRequest.objects.get(tenant=tenant, kind="recalled_rerun")
    assert not Operation.objects.filter(tenant=tenant, record__in=["order-4", "sku-77"]).exists()
    approvals.approval_request_approve(tenant_id=tenant.pk, request_id=request.pk, actor="user:bob", reason="ok")

    rerun = {op.replaced_by_id: op for op in Operation.objects.filter(pk__in=[first.pk, second.pk])}
    assert None not in rerun
    news = {op.key: op for op in Operation.objects.filter(pk__in=list(rerun))}
    assert set(news) == {"order-4:render:v2", "sku-77:render:v2"}
    assert {op.adapter_revision_id for op in news.values()} == {stable}
    assert news["order-4:render:v2"].version == 2 and news["order-4:render:v2"].record == "order-4"
    # Done once: a second bulk re-run finds nothing left (approval no longer required).
    Provider.objects.filter(pk=images.pk).update(resend_approval_required=False)
    again = admin.post("/api/v1/providers/images/revisions/2/rerun", {"reason": "again"}, format="json")
    assert again.status_code == 200 and again.json()["count"] == 0
    # Only a rolled-back revision's outputs are re-run.
    refused = admin.post("/api/v1/providers/images/revisions/1/rerun", {"reason": "r1"}, format="json")
    assert refused.status_code == 409 and problem(refused) == "adapter_rollout_conflict"


def _attempts(op: Operation, revision_id: int, durations_ms: list[int], *, first: int = 1) -> None:
    """Finished successful attempts of ``revision_id`` with these durations (injected times)."""
    start = sql.db_now()
    for number, ms in enumerate(durations_ms, start=first):
        Attempt.objects.create(
            tenant_id=op.tenant_id,
            operation=op,
            number=number,
            started_at=start,
            sent_at=start,
            finished_at=start + timedelta(milliseconds=ms),
            outcome=AttemptOutcome.SUCCEEDED,
            adapter_revision_id=revision_id,
        )


def test_a_latency_gated_canary_pauses_on_a_slow_revision_and_alerts_with_the_evidence(
    tenant, images, gates, make_client
):
    provider = canary.canary_start(
        provider_id=images.pk, number=2, percent=50, actor="user:a", reason="half", gates={"latency_p95_max_ratio": 3}
    )
    op = operation_submit(tenant=tenant, key="a-1", provider="images", request={"method": "POST", "path": "/r"})
    _attempts(op.operation, provider.revision_id, [100, 110, 120])
    _attempts(op.operation, provider.canary_revision_id, [250, 260, 300], first=4)
    assert canary.canary_watch(provider_id=images.pk).verdict == "healthy"  # 300 ms < 3 × 120 ms
    _attempts(op.operation, provider.canary_revision_id, [900, 950, 1000], first=7)

    figures = canary.canary_watch(provider_id=images.pk)
    assert figures.verdict == "breached" and figures.error_verdict == "healthy"
    paused = Provider.objects.get(pk=images.pk)
    assert paused.canary_paused_at is not None and paused.canary_revision_id == provider.canary_revision_id
    # No new operation goes to the paused canary.
    assert {revisions.revision_assign(provider=paused, tenant_id=tenant.pk, key=f"k-{i}") for i in range(20)} == {
        paused.revision_id
    }
    alert = Alert.objects.get(tenant=tenant, kind="provider_canary_paused")
    assert "p95 latency" in alert.summary
    rollout = make_client(tenant).get("/api/v1/providers/images/revisions").json()
    latency = next(g for g in rollout["canary_pause_evidence"]["gates"] if g["gate"] == "latency_p95")
    assert latency["verdict"] == "breached" and latency["canary_value"] == 1000.0 and latency["threshold"] == 3.0
    # Resuming (the canary's share set again) clears the pause.
    canary.canary_start(provider_id=images.pk, number=2, percent=50, actor="user:a", reason="fixed the cache")
    assert Provider.objects.get(pk=images.pk).canary_paused_at is None


def test_verdicts_are_idempotent_refuse_a_different_second_one_validate_and_stay_within_the_tenant(
    tenant, other_tenant, images, make_client
):
    (op,) = published(tenant, ["v-1"], callback=False)
    api = make_client(tenant)
    url = f"/api/v1/operations/{op.pk}/output/verdict"
    body = {"verdict": "rejected", "score": 0.2, "reason": "wrong vendor name"}
    first = api.post(url, body, format="json")
    assert first.status_code == 201, first.content
    assert first.json()["adapter_revision"] == 2 and first.json()["source"] == "consumer"
    again = api.post(url, body, format="json")
    assert again.status_code == 200 and again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    changed = api.post(url, {**body, "verdict": "accepted"}, format="json")
    assert changed.status_code == 409 and problem(changed) == "verdict_conflict"
    for bad in ({"verdict": "meh"}, {"verdict": "accepted", "score": 1.5}, {"score": 0.5}):
        refused = api.post(url, bad, format="json")
        assert refused.status_code == 400 and problem(refused) == "validation_error", bad
    foreign = make_client(other_tenant).post(url, body, format="json")
    assert foreign.status_code == 404 and problem(foreign) == "not_found"
    assert OutputVerdict.objects.count() == 1
    # Evaluation manifests score an extraction job, whose output is its answer (no stored file).
    scored = output_verdict_record(output=op, score=0.4, verdict="accepted", source="manifest", actor="manifests")
    assert scored.created and scored.verdict.output_id is None
    assert scored.verdict.adapter_revision_id == op.adapter_revision_id


def test_low_scored_outputs_of_the_canary_breach_its_quality_gate_and_pause_it(
    tenant, images, gates, make_client, django_capture_on_commit_callbacks
):
    ops = published(tenant, ["q-1", "q-2", "q-3"], callback=False)
    api = make_client(tenant)
    # The watch runs once a verdict has committed (each request's own commit, here the test's
    # transaction stands in for it).
    with django_capture_on_commit_callbacks(execute=True):
        for op in ops[:2]:
            api.post(f"/api/v1/operations/{op.pk}/output/verdict", {"verdict": "accepted", "score": 0.3}, format="json")
    assert Provider.objects.get(pk=images.pk).canary_paused_at is None  # two of three: still collecting
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/api/v1/operations/{ops[2].pk}/output/verdict", {"verdict": "accepted", "score": 0.9}, format="json")

    paused = Provider.objects.get(pk=images.pk)
    assert paused.canary_paused_at is not None
    quality = next(g for g in paused.canary_pause_evidence["gates"] if g["gate"] == "rejected_or_low_score")
    assert quality["verdict"] == "breached" and quality["canary_bad"] == 2 and quality["canary_n"] == 3
    assert Alert.objects.filter(tenant=tenant, kind="provider_canary_paused", ref="images").exists()


def test_the_console_rolls_back_shows_the_recalled_outputs_and_the_pause_evidence_and_reruns_them(tenant, images):
    (op,) = published(tenant, ["c-1:render:v1"], callback=False)
    olga = client_for(staff("olga", role="operator", tenants=[tenant]))
    rollout = f"/admin/ledger/provider/{images.pk}/rollout/"
    done = olga.post(rollout, {"verb": "rollback", "reason": "blurry renders"}, follow=True)
    assert "outputs recalled: 1 quarantined, 0 flagged" in done.content.decode()
    status, body = page(olga, rollout)
    assert status == 200 and "quarantined 1" in body and "rolled back" in body
    status, body = page(olga, f"/admin/ledger/operation/{op.pk}/change/")
    assert status == 200 and 'data-testid="output-recalled"' in body and "blurry renders" in body

    rerun = olga.post(rollout, {"verb": "rerun", "number": "2", "reason": "render again"}, follow=True)
    assert "1 recalled output(s) of revision 2 re-run" in rerun.content.decode()
    assert Operation.objects.filter(tenant=tenant, key="c-1:render:v2").exists()
