"""An erasure reaches n8n (review.privacy.erasure_n8n): the executions Onceguard knows carried the
person's data — their DLQ entry's execution and the one it retried, their operation's — are
deleted through the tenant's n8n connection (a real loopback server standing in for n8n's
public API; the real n8n answers the same in tests/n8n/test_erasure_n8n.py), each deletion an
access-log row, and every execution not deleted is listed on the run with why."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dlq.models import FailedEvent, N8nConnection
from dlq.n8n import client as n8n
from dlq.n8n import connections as dlq_connections
from dlq.n8n.api import Deleted, Deletion
from dlq.tasks import n8n_payload_fetch_task
from ledger.models import Provider, Tenant
from ledger.protocol import services as ledger_services
from review.audit.accesslog import accesslog_verify
from review.models import AccessAction, AccessLog, ErasureRun, ErasureState
from review.privacy import erasure, erasure_n8n
from review.privacy.subjects import erasure_summary, subject_resolve
from tests.console.support import client_for, staff
from tests.dlq.conftest import EXAMPLES, example_bytes, post_raw
from tests.dlq.n8n_api import FakeN8nApi

KEY = "n8n-api-key.eyJhbGciOiJIUzI1NiJ9.erasure-test-only"
EMAIL = "priya.raman@example.invalid"
WHO = {"identifiers": {"email": EMAIL}}
EXECUTION = json.loads((EXAMPLES / "n8n-execution-with-data.json").read_text())
REPORT = example_bytes("n8n-error-trigger-execution.json")


@pytest.fixture
def n8n_api() -> Iterator[FakeN8nApi]:
    api = FakeN8nApi().start()
    # The failed execution the Error Trigger names, and the operation's execution; the one
    # the failure retried (4790) is pruned already.
    api.executions["4812"] = copy.deepcopy(EXECUTION)
    api.executions["4901"] = {"id": "4901", "status": "success"}
    yield api
    api.stop()


@pytest.fixture
def connected(tenant: Tenant, n8n_api: FakeN8nApi) -> N8nConnection:
    return dlq_connections.n8n_connection_save(tenant=tenant, base_url=n8n_api.url, api_key=KEY, actor="test")


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(n8n, "FETCH_PAUSES", (0.0, 0.0))


def lead_entry(client: Any, captured: Any) -> FailedEvent:
    """Priya's lead, dead-lettered by n8n's Error Trigger and fetched from execution 4812."""
    with captured(execute=True):
        response = post_raw(client, REPORT)
    assert response.status_code == 201, response.json()
    n8n_payload_fetch_task(response.json()["id"])
    return FailedEvent.objects.get(pk=response.json()["id"])


def lead_operation(tenant: Tenant, provider: Provider, execution_id: str, n: int = 1) -> None:
    ledger_services.operation_claim(
        tenant=tenant,
        key=f"call-{n}:crm-contact:v1",
        provider=provider,
        payload={"email": EMAIL, "firstName": "Priya"},
        execution_id=execution_id,
        workflow_id="17",
    )


def run_erasure(api: Any, **flag: Any) -> ErasureRun:
    response = api.post("/api/v1/subjects/erasures", {**WHO, "reason": "Erasure request ER-301", **flag}, format="json")
    assert response.status_code == 202, response.json()
    return erasure.erasure_continue(run_id=response.json()["id"])


def deletes(n8n_api: FakeN8nApi) -> list[str]:
    return [path.rsplit("/", 1)[-1] for method, path in n8n_api.calls if method == "DELETE"]


def test_an_erasure_deletes_the_persons_n8n_executions_and_logs_each_deletion(
    tenant, provider, connected, n8n_api, make_client, django_capture_on_commit_callbacks
):
    client = make_client(tenant)
    lead_entry(client, django_capture_on_commit_callbacks)
    lead_operation(tenant, provider, "4901")
    admin = make_client(tenant, scopes=["admin", "audit"])

    # No flag: the tenant has an active n8n connection, so the executions go too.
    run = run_erasure(admin)

    assert run.state == ErasureState.DONE and run.n8n_delete
    assert sorted(ex for _, ex in run.n8n_executions) == ["4790", "4812", "4901"]
    assert sorted(deletes(n8n_api)) == ["4790", "4812", "4901"]
    assert n8n_api.executions == {}
    assert run.n8n_deleted == 2 and run.n8n_cursor == 3
    (left,) = run.n8n_left
    assert (left["execution"], left["workflow"], left["outcome"]) == ("4790", "17", Deleted.NOT_FOUND)
    # Each deletion is a row of the tenant's access-log chain, naming the run and the execution.
    rows = list(AccessLog.objects.filter(tenant=tenant, action=AccessAction.N8N_DELETE).order_by("seq"))
    assert sorted(r.fields[0] for r in rows) == ["n8n execution 4812", "n8n execution 4901"]
    assert {(r.object_type, r.object_id, r.object_ref) for r in rows} == {("subject", str(run.pk), run.subject_ref)}
    checked, problems = accesslog_verify(tenant_ids=[tenant.pk])
    assert checked and problems == []
    assert "2 n8n executions deleted, 1 n8n execution not found in n8n" in erasure_summary(run)
    # The API's report says the same, with the one not deleted.
    body = admin.get(f"/api/v1/subjects/erasures/{run.pk}").json()
    assert body["n8n"]["deleted"] == 2 and body["n8n"]["executions"] == 3
    assert body["n8n"]["left"][0]["execution"] == "4790"
    assert body["n8n"]["left"][0]["action"] == "not found in n8n"
    # The trail shows the deletions among the erasure's events.
    trail = admin.post("/api/v1/subjects/trail", {**WHO, "reason": "check ER-301"}, format="json").json()
    assert [e["event"] for e in trail["events"]].count("n8n execution deleted") == 2


def test_refused_and_unreachable_executions_are_listed_for_removal_by_hand(
    tenant, provider, connected, n8n_api, make_client, monkeypatch
):
    for n, execution in enumerate(["5001", "5002", "5003", "5004", "5005", "5006"], start=1):
        lead_operation(tenant, provider, execution, n)
        n8n_api.executions[execution] = {"id": execution}
    # The key lacks execution:delete for the first; then n8n goes away.
    n8n_api.script = [403]
    real = erasure_n8n.execution_delete
    calls = {"n": 0}

    def then_down(**kwargs: Any) -> Deletion:
        calls["n"] += 1
        if calls["n"] == 2:
            n8n_api.stop()
        return real(**kwargs)

    monkeypatch.setattr(erasure_n8n, "execution_delete", then_down)
    run = run_erasure(make_client(tenant, scopes=["admin"]))

    assert run.state == ErasureState.DONE and run.n8n_deleted == 0
    outcomes = [(item["execution"], item["outcome"]) for item in run.n8n_left]
    assert outcomes[0] == ("5001", Deleted.REFUSED)
    assert "execution:delete" in run.n8n_left[0]["reason"]
    assert [o for _, o in outcomes[1:]] == [Deleted.UNREACHABLE] * 5
    # After three executions n8n did not answer, the rest is listed without a try.
    assert calls["n"] == 4
    assert run.n8n_left[-1]["reason"].startswith("not tried: n8n did not answer")
    assert "6 n8n executions to remove by hand" in erasure_summary(run)
    assert not AccessLog.objects.filter(action=AccessAction.N8N_DELETE).exists()


def test_asked_not_to_the_executions_are_listed_and_n8n_is_not_called(
    tenant, provider, connected, n8n_api, make_client
):
    lead_operation(tenant, provider, "4901")

    run = run_erasure(make_client(tenant, scopes=["admin"]), n8n_executions=False)

    assert run.state == ErasureState.DONE and not run.n8n_delete
    assert deletes(n8n_api) == [] and "4901" in n8n_api.executions
    assert [(i["execution"], i["outcome"]) for i in run.n8n_left] == [("4901", erasure_n8n.NOT_ASKED)]
    assert "1 n8n execution to remove by hand" in erasure_summary(run)


def test_without_an_n8n_connection_the_default_is_off_and_the_executions_are_listed(tenant, provider, make_client):
    lead_operation(tenant, provider, "4901")

    run = run_erasure(make_client(tenant, scopes=["admin"]))

    assert not run.n8n_delete
    assert [i["execution"] for i in run.n8n_left] == ["4901"]


def test_asked_to_but_the_connection_was_switched_off_lists_them(tenant, provider, connected, n8n_api, make_client):
    lead_operation(tenant, provider, "4901")
    response = make_client(tenant, scopes=["admin"]).post(
        "/api/v1/subjects/erasures", {**WHO, "reason": "Erasure request ER-302", "n8n_executions": True}, format="json"
    )
    N8nConnection.objects.filter(pk=connected.pk).update(active=False)

    run = erasure.erasure_continue(run_id=response.json()["id"])

    assert run.n8n_delete and deletes(n8n_api) == []
    assert run.n8n_left[0]["outcome"] == erasure_n8n.NO_CONNECTION


def test_a_pass_that_lost_the_race_records_nothing(tenant, provider, connected, n8n_api):
    lead_operation(tenant, provider, "4901")
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk, subject=subject_resolve({"email": EMAIL}), actor="t", reason="ER-303 race", enqueue=False
    )
    ErasureRun.objects.filter(pk=run.pk).update(n8n_cursor=1)

    # Another pass moved the cursor while this one was calling n8n: its result is dropped.
    recorded = erasure_n8n._record(run.pk, 0, [("17", Deletion("4901", Deleted.DELETED))])

    assert not recorded
    run.refresh_from_db()
    assert run.n8n_deleted == 0 and run.n8n_left == []
    assert not AccessLog.objects.filter(action=AccessAction.N8N_DELETE).exists()


def test_a_repeated_delete_after_a_crash_is_listed_not_counted_twice(tenant, provider, connected, n8n_api):
    lead_operation(tenant, provider, "4901")
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk, subject=subject_resolve({"email": EMAIL}), actor="t", reason="ER-304 crash", enqueue=False
    )
    # The process deleted 4901 in n8n and died before its transaction committed.
    del n8n_api.executions["4901"]

    run = erasure.erasure_continue(run_id=run.pk)

    assert run.state == ErasureState.DONE and run.n8n_deleted == 0
    assert run.n8n_left[0]["outcome"] == Deleted.NOT_FOUND


def test_the_console_ticks_the_n8n_deletion_by_default_and_lists_what_is_left(tenant, provider, connected, n8n_api):
    lead_operation(tenant, provider, "4901")
    n8n_api.script = [403]
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    form = {"tenant": tenant.pk, "email": EMAIL, "reason": "Erasure request ER-305", "action": "trail"}

    # The page as first shown: the box is ticked (a browser sends it on with every later post).
    shown = admin.get("/admin/onceguard/subjects/trail/").content.decode()
    (box,) = [tag for tag in shown.split("<input")[1:] if 'name="delete_n8n_executions"' in tag.split(">")[0]]
    assert "checked" in box.split(">")[0]

    admin.post(
        "/admin/onceguard/subjects/trail/",
        {**form, "action": "erase", "confirm_erase": "on", "delete_n8n_executions": "on"},
    )
    run = ErasureRun.objects.get()
    assert run.n8n_delete
    erasure.erasure_continue(run_id=run.pk)
    page = admin.post("/admin/onceguard/subjects/trail/", form).content.decode()
    assert 'data-testid="n8n-left"' in page and "4901" in page and "to remove by hand" in page
    # The run's own page lists it too.
    run_page = admin.get(f"/admin/review/erasurerun/{run.pk}/change/").content.decode()
    assert "execution 4901 of workflow 17: to remove by hand" in run_page

    # Unticked: not asked.
    ErasureRun.objects.all().delete()
    admin.post("/admin/onceguard/subjects/trail/", {**form, "action": "erase", "confirm_erase": "on"})
    assert not ErasureRun.objects.get().n8n_delete
