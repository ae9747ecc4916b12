"""Leads, dead-lettering, replay and execute mode in a real, started n8n (production
executions through webhooks), the templates imported unedited: a voice-AI lead is answered at
once, claimed before the CRM call and completed after, so a lead re-sent while the first
execution still waits on a slow CRM that ignores keys makes one contact; a lead whose CRM
write hits a 429 lands in the DLQ with its fields (masked in the console) and an operator's
signed replay through the replay-receiver template creates exactly one contact with the
original data, while a tampered or stale replay is refused; a batch of three failing leads is
three entries; an Error Trigger workflow reports failures nobody wired; and the
submit-and-wait template continues when Onceguard calls the Wait node back.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from dlq.entries.payloads import open_payload
from dlq.models import FailedEvent, ReplayTarget
from dlq.tasks import n8n_payload_fetch_task
from ledger.models import IdempotencyClass, Operation, OperationStatus, Tenant
from ledger.protocol import services
from ledger.providers.credentials import sealed_credential
from relay.testing import RunningServer, start_mock_provider, start_relay
from tests.dlq.conftest import example
from tests.execute.support import run_due, wait_until
from tests.n8n.conftest import API_SECRET, TIMINGS
from tests.n8n.crm import StrictCrm
from tests.n8n.support import REPLAY_SIGNING_SECRET, N8n, node_named, template, template_env
from tests.support import outbound

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

S = OperationStatus
LEAD_NODE, LEAD_HTTP = "ogLeadToCrmNode1", "ogLeadToCrmHttp1"
UNGUARDED, ERROR_WORKFLOW = "ogLeadNoErrorOut", "ogErrorWorkflow1"
SUBMIT_AND_WAIT, SUBMIT_RETRY = "ogSubmitAndWait1", "ogSubmitRetry001"
VIA_RELAY_CREDENTIAL = "ogCredViaRelay01"
# The guarded charge whose Onceguard nodes talk through the relay (n8n's Retry test).
RETRIED_CHARGE = "ogChargeRetried1"
# The lead workflow without an error output against the strict CRM, its replay receiver, and
# one whose CRM step is a Code node (no request in the error: lead capture fetches the item).
STRICT_LEAD, STRICT_RECEIVER, CODE_FAILS = "ogLeadStrictCrm1", "ogReplayStrict01", "ogLeadCodeFails1"
# The replay receiver with a step that throws before its CRM call and its Respond node (fixed
# in the test by putting the template's nodes back, through n8n's public API).
BROKEN_RECEIVER = "ogReplayBroken01"
LEAD_PATH = {LEAD_NODE: "onceguard-lead", LEAD_HTTP: "onceguard-lead-http"}
CALL = example("voice-call-analyzed.json")
CONTACT = example("crm-create-contact-request.json")["body"]
LEAD_KEY = "call_7f3c2a9e41b04d6f:crm-contact:v1"
PERSONAL = ("Priya", "Raman", "priya.raman", "+61412345678")
N8N_CALLBACK_WAIT = 60


def unguarded_lead_workflow(onceguard_url: str, crm_url: str) -> dict[str, Any]:
    """The plain-HTTP lead workflow without its claim and its error output, with the error
    workflow set: a failure nobody wired, which only the Error Trigger reports (and a re-sent
    lead reaches the CRM again: the Error Trigger path's own guarantee is under test)."""
    workflow = template("lead-to-crm-http")
    workflow["id"], workflow["name"] = UNGUARDED, "lead to CRM, no claim, no error output"
    workflow["settings"]["errorWorkflow"] = ERROR_WORKFLOW
    node_named(workflow, "Call analyzed")["parameters"]["path"] = "onceguard-lead-unguarded"
    crm = node_named(workflow, "CRM: Create Contact")
    crm.pop("onError", None)
    crm["parameters"]["url"] = f"{crm_url}/contacts"
    crm["parameters"]["headerParameters"]["parameters"][0]["value"] = "={{ $json.customFields.call_id }}:crm-contact:v1"
    crm["parameters"]["jsonBody"] = "={{ $json }}"
    connections = workflow["connections"]
    connections["Contact"]["main"] = [[{"node": "CRM: Create Contact", "type": "main", "index": 0}]]
    connections["CRM: Create Contact"]["main"] = [[]]
    return workflow


def strict_lead_workflow(onceguard_url: str, crm_url: str) -> dict[str, Any]:
    workflow = unguarded_lead_workflow(onceguard_url, crm_url)
    workflow["id"], workflow["name"] = STRICT_LEAD, "lead to strict CRM, no error output"
    node_named(workflow, "Call analyzed")["parameters"]["path"] = "onceguard-lead-strict"
    return workflow


def strict_receiver_workflow(onceguard_url: str, crm_url: str) -> dict[str, Any]:
    workflow = template("replay-receiver")
    workflow["id"], workflow["name"] = STRICT_RECEIVER, "replay receiver, strict CRM"
    node_named(workflow, "Replay from Onceguard")["parameters"]["path"] = "onceguard-replay-strict"
    node_named(workflow, "CRM: Create Contact")["parameters"]["url"] = f"{crm_url}/contacts"
    return workflow


def broken_receiver_workflow() -> dict[str, Any]:
    """The replay-receiver template with a Code node that throws between the signature check
    and the CRM call: the workflow stops before its Respond node, so n8n answers on its own."""
    workflow = template("replay-receiver")
    workflow["id"], workflow["name"] = BROKEN_RECEIVER, "replay receiver, throws before the CRM"
    node_named(workflow, "Replay from Onceguard")["parameters"]["path"] = "onceguard-replay-broken"
    workflow["nodes"].append(
        {
            "parameters": {"jsCode": "throw new Error('mapping bug: contact.fullName is undefined');"},
            "id": "0d9c8b7a-6e5f-5a4b-9c3d-2e1f0a9b8c7d",
            "name": "Map the contact",
            "type": "n8n-nodes-base.code",
            "typeVersion": 2,
            "position": [600, 0],
        }
    )
    connections = workflow["connections"]
    connections["One contact?"]["main"][0] = [{"node": "Map the contact", "type": "main", "index": 0}]
    connections["Map the contact"] = {"main": [[{"node": "CRM: Create Contact", "type": "main", "index": 0}]]}
    return workflow


def code_fails_workflow(onceguard_url: str, crm_url: str) -> dict[str, Any]:
    workflow = unguarded_lead_workflow(onceguard_url, crm_url)
    workflow["id"], workflow["name"] = CODE_FAILS, "lead to CRM, failing in a Code node"
    node_named(workflow, "Call analyzed")["parameters"]["path"] = "onceguard-lead-code"
    crm = node_named(workflow, "CRM: Create Contact")
    crm.update(
        type="n8n-nodes-base.code",
        typeVersion=2,
        parameters={"jsCode": "throw new Error('CRM client: too many requests [429]');"},
    )
    return workflow


def submit_retry_workflow() -> dict[str, Any]:
    """Submit and wait with n8n's Retry On Fail on the Submit node, talking to Onceguard
    through a relay (the test makes the relay lose the first 202)."""
    workflow = template("submit-and-wait")
    workflow["id"], workflow["name"] = SUBMIT_RETRY, "submit and wait, Retry On Fail"
    node_named(workflow, "Order webhook")["parameters"]["path"] = "onceguard-submit-retry"
    submit = node_named(workflow, "Submit charge")
    submit.update(retryOnFail=True, maxTries=2, waitBetweenTries=1000)
    submit["credentials"] = {
        "onceguardApi": {"id": VIA_RELAY_CREDENTIAL, "name": "Onceguard API (through a fault relay)"}
    }
    return workflow


def retried_charge_workflow() -> dict[str, Any]:
    """The guarded-charge template with its Onceguard nodes on the credential through the fault
    relay in front of Onceguard (the test loses Complete's request, so the execution fails after
    the charge and its sent marker), keeping its successful executions (the retry's outcome is
    read from n8n)."""
    workflow = template("guarded-charge")
    workflow["id"], workflow["name"] = RETRIED_CHARGE, "guarded charge, Complete lost on the way"
    workflow["settings"]["saveDataSuccessExecution"] = "all"
    node_named(workflow, "Order webhook")["parameters"]["path"] = "onceguard-charge-retried"
    for node in workflow["nodes"]:
        if node["type"] == "n8n-nodes-onceguard.onceguard":
            node["credentials"] = {
                "onceguardApi": {"id": VIA_RELAY_CREDENTIAL, "name": "Onceguard API (through a fault relay)"}
            }
    return workflow


class Servers:
    def __init__(self, onceguard_url: str) -> None:
        # A CRM that dedups on Idempotency-Key (key-enforced), and a charges provider.
        self.crm: RunningServer = start_mock_provider("enforced")
        self.charges: RunningServer = start_mock_provider("enforced")
        # A fault relay in front of Onceguard itself: loses the answer to a submission.
        self.onceguard_relay: RunningServer = start_relay(onceguard_url)
        # A CRM that refuses any other shape or key, and does not dedup: the CRM the n8n's
        # environment names for the lead templates.
        self.strict_crm = StrictCrm().start()

    def reset(self) -> None:
        for server in (self.crm, self.charges, self.onceguard_relay):
            server.reset()
        self.strict_crm.reset()

    def contacts_for(self, key: str) -> dict[str, Any] | None:
        response = httpx.get(f"{self.crm.url}/contacts", params={"idempotency_key": key}, timeout=5, trust_env=False)
        return response.json() if response.status_code == 200 else None

    def stop(self) -> None:
        for server in (self.onceguard_relay, self.crm, self.charges):
            server.stop()
        self.strict_crm.stop()


@pytest.fixture(scope="module")
def servers(onceguard_url: str) -> Iterator[Servers]:
    running = Servers(onceguard_url)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, onceguard_url: str, servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[N8n]:
    """One started n8n with the lead, replay-receiver, error and submit-and-wait templates,
    imported unedited: the n8n's environment names the servers they call and the replay
    receiver's signing secret."""
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-leads"))
    instance.extra_env = template_env(
        onceguard=onceguard_url,
        crm=servers.strict_crm.url,
        charges=servers.charges.url,
        replay_secret=REPLAY_SIGNING_SECRET,
    )
    instance.import_workflows(
        [
            template("lead-to-crm"),
            template("lead-to-crm-http"),
            template("replay-receiver"),
            template("error-workflow"),
            template("submit-and-wait"),
            unguarded_lead_workflow(onceguard_url, servers.crm.url),
            submit_retry_workflow(),
            retried_charge_workflow(),
            strict_lead_workflow(onceguard_url, servers.strict_crm.url),
            strict_receiver_workflow(onceguard_url, servers.strict_crm.url),
            code_fails_workflow(onceguard_url, servers.crm.url),
            broken_receiver_workflow(),
        ]
    )
    instance.import_credentials(
        [
            {
                "id": VIA_RELAY_CREDENTIAL,
                "name": "Onceguard API (through a fault relay)",
                "type": "onceguardApi",
                "data": {"baseUrl": servers.onceguard_relay.url, "apiKey": API_SECRET},
            }
        ]
    )
    active = (
        LEAD_NODE,
        LEAD_HTTP,
        "ogReplayReceivr1",
        UNGUARDED,
        SUBMIT_AND_WAIT,
        SUBMIT_RETRY,
        RETRIED_CHARGE,
        STRICT_LEAD,
        STRICT_RECEIVER,
        CODE_FAILS,
        BROKEN_RECEIVER,
    )
    instance.activate_all(except_ids=[ERROR_WORKFLOW])
    # `n8n execute` runs in its own process: give it its own copy of the database, so it never
    # shares SQLite with the running server.
    instance.spare = instance.copy(tmp_path_factory.mktemp("n8n-leads-spare"))
    instance.start(active=active)
    # Onceguard calls n8n back (replays to the receiver webhook, callbacks to Wait nodes):
    # the deployment's outbound policy must name it, as it names the mock servers.
    outbound.announce(instance.url)
    yield instance
    instance.stop()


@pytest.fixture
def onceguard(tenant: Tenant, api_key: str, servers: Servers, n8n: N8n) -> Tenant:
    from dlq.targets import services as dlq_targets

    servers.reset()
    # The lead templates claim each lead for the CRM before they write it: a CRM that ignores
    # keys, so an unknown outcome goes to a person, never to a second contact.
    services.provider_upsert(
        tenant=tenant,
        slug="demo-crm",
        base_url=servers.strict_crm.url,
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
        timeout_seconds=10,
    )
    # An n8n receiver: a replay is delivered only when it answers Onceguard-Ack (ADR 0007).
    target = dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="n8n-replay",
        url=f"{n8n.url}/webhook/onceguard-replay",
        timeout_seconds=10,
        is_default=True,
        ack="echo",
    )
    signed_with_the_receivers_secret(target)
    return tenant


def signed_with_the_receivers_secret(target: ReplayTarget) -> None:
    """The target signs with the secret the receiver's n8n holds (ONCEGUARD_REPLAY_SIGNING_SECRET),
    as an operator copies a new target's secret into n8n."""
    ReplayTarget.objects.filter(pk=target.pk).update(signing_secret=sealed_credential(REPLAY_SIGNING_SECRET))


def signature(body: bytes, *, at: int | None = None, secret: str = REPLAY_SIGNING_SECRET) -> str:
    """Onceguard-Signature as a replay carries it: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>."""
    stamp = int(time.time()) if at is None else at
    digest = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={digest}"


def replay(onceguard_url: str, event: FailedEvent, *, target: str = "") -> httpx.Response:
    """What an operator does: POST /api/v1/dlq/events/{id}/replay."""
    return httpx.post(
        f"{onceguard_url}/api/v1/dlq/events/{event.pk}/replay",
        json={"note": "CRM is back", **({"target": target} if target else {})},
        headers={"Authorization": f"Bearer {API_SECRET}"},
        timeout=30,
        trust_env=False,
    )


@pytest.mark.parametrize("workflow", [LEAD_NODE, LEAD_HTTP], ids=["onceguard-node", "plain-http"])
def test_a_lead_the_crm_throttled_lands_in_the_dlq_with_its_fields_and_one_replay_creates_one_contact(
    n8n: N8n, onceguard: Tenant, servers: Servers, onceguard_url: str, admin_client: Any, workflow: str
) -> None:
    servers.strict_crm.reset(script=[429])

    # The sender is answered at once, before the CRM is called.
    answer = n8n.webhook(LEAD_PATH[workflow], CALL)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"outcome": "received"}
    assert wait_until(lambda: Operation.objects.filter(key=LEAD_KEY, status=S.RETRY_WAIT).exists(), timeout=60), (
        n8n.start_log()[-3000:]
    )
    assert servers.strict_crm.contacts == []

    entries = list(FailedEvent.objects.values_list("event_id", "shape", "source_node", "error_message"))
    assert len(entries) == 1, entries
    event = FailedEvent.objects.get()
    assert re.fullmatch(rf"n8n:{workflow}:\d+:CRM_ Create Contact:0", event.event_id), event.event_id
    assert event.original_key == LEAD_KEY
    assert event.error_class == "transient" and "429" in event.error_message
    assert event.source_workflow_id == workflow and event.source_node == "CRM: Create Contact"
    # The whole lead, not "workflow 17 failed".
    assert open_payload(event.payload) == CONTACT
    # The claim recorded the CRM's refusal: nothing was created, the lead may be tried again.
    op = Operation.objects.get(key=LEAD_KEY)
    assert op.error_class == "transient" and op.workflow_id == workflow

    # Masked in the console: the keys say what is there, no value shows.
    page = admin_client.get(reverse("admin:dlq_failedevent_change", args=[event.pk])).content.decode()
    assert "customFields" in page and "•••" in page
    for secret in PERSONAL:
        assert secret not in page

    # The operator replays it: Onceguard → the replay-receiver workflow (which checks the
    # replay's signature) → the CRM, with the original key.
    replayed = replay(onceguard_url, event)
    assert replayed.status_code == 201, replayed.text
    assert replayed.json()["outcome"] == "succeeded", replayed.json()
    event.refresh_from_db()
    assert event.status == "replayed"
    assert servers.strict_crm.refused == []
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]

    # A second click is refused without force: still one contact.
    again = replay(onceguard_url, event)
    assert again.status_code == 409 and again.json()["code"] == "replay_needs_force"
    assert len(servers.strict_crm.contacts) == 1


@pytest.mark.parametrize("workflow", [LEAD_NODE, LEAD_HTTP], ids=["onceguard-node", "plain-http"])
def test_a_lead_re_sent_while_the_first_execution_waits_on_a_slow_crm_makes_one_contact(
    n8n: N8n, onceguard: Tenant, servers: Servers, workflow: str
) -> None:
    # A CRM that ignores keys and takes 6 s to answer; the voice platform re-sends the lead
    # meanwhile (its own timeout is far shorter). Both deliveries are answered at once.
    started = time.monotonic()
    servers.strict_crm.reset(delay=6.0)
    first = n8n.webhook(LEAD_PATH[workflow], CALL)
    assert wait_until(lambda: Operation.objects.filter(key=LEAD_KEY, sent_at__isnull=False).exists(), timeout=60)
    second = n8n.webhook(LEAD_PATH[workflow], CALL)
    assert (first.status_code, second.status_code) == (202, 202), (first.text, second.text)
    assert first.json() == second.json() == {"outcome": "received"}

    # The second execution's claim found the lead in flight and went no further.
    assert wait_until(lambda: Operation.objects.filter(key=LEAD_KEY, status=S.SUCCEEDED).exists(), timeout=60), (
        list(Operation.objects.values_list("key", "status")),
        n8n.start_log()[-3000:],
    )
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    # A third delivery, now that it is done: the recorded outcome, still one contact.
    assert n8n.webhook(LEAD_PATH[workflow], CALL).status_code == 202
    assert wait_until(lambda: _finished(n8n, workflow), timeout=30), n8n.executions(workflow)
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    assert not FailedEvent.objects.exists()
    TIMINGS[f"lead re-sent during a slow CRM ({workflow})"] = time.monotonic() - started


def test_the_replay_receiver_refuses_a_tampered_a_stale_and_an_unsigned_replay(
    n8n: N8n, onceguard: Tenant, servers: Servers
) -> None:
    url = f"{n8n.url}/webhook/onceguard-replay"
    body = json.dumps(CONTACT).encode()

    def post(content: bytes, sig: str | None) -> httpx.Response:
        headers = {"Content-Type": "application/json", "Idempotency-Key": LEAD_KEY}
        if sig is not None:
            headers["Onceguard-Signature"] = sig
        return httpx.post(url, content=content, headers=headers, timeout=30, trust_env=False)

    tampered = json.dumps({**CONTACT, "email": "attacker@example.invalid"}).encode()
    assert post(tampered, signature(body)).status_code == 401
    assert post(body, signature(body, at=int(time.time()) - 600)).status_code == 401
    assert post(body, signature(body, secret="another-secret")).status_code == 401
    assert post(body, None).status_code == 401
    assert servers.strict_crm.contacts == [] and servers.strict_crm.refused == []

    # Signed as Onceguard signs, the same body is taken: one contact.
    accepted = post(body, signature(body))
    assert accepted.status_code == 200, accepted.text
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]


def test_a_batch_of_three_failing_leads_is_three_entries_each_with_its_own_lead(
    n8n: N8n, onceguard: Tenant, servers: Servers
) -> None:
    servers.strict_crm.reset(script=[429] * 3)
    assert n8n.spare is not None
    run = n8n.spare.execute(LEAD_NODE)
    assert len(run.output("Dead-letter the lead")) == 3

    events = list(FailedEvent.objects.order_by("event_id"))
    assert [e.event_id.rsplit(":", 1)[1] for e in events] == ["0", "1", "2"]
    payloads = [open_payload(e.payload) for e in events]
    assert [p["firstName"] for p in payloads] == ["Ana", "Ben", "Chloe"]
    assert [e.original_key for e in events] == [f"call_sample_{n}:crm-contact:v1" for n in (1, 2, 3)]
    assert all(p["customFields"]["call_id"] in e.original_key for p, e in zip(payloads, events, strict=True))


def test_the_same_lead_failing_twice_through_the_error_trigger_is_one_entry_and_its_replay_one_contact(
    n8n: N8n, onceguard: Tenant, servers: Servers, onceguard_url: str
) -> None:
    # No error output: only the Error Trigger reports the failures. The caller re-sends the
    # webhook, the CRM throttles both tries; n8n's error report carries the failed request.
    started = time.monotonic()
    servers.strict_crm.reset(script=[429, 429])
    for _ in range(2):
        n8n.webhook("onceguard-lead-strict", CALL)
    failed = n8n.wait_for_executions(STRICT_LEAD, count=2)
    assert [e["status"] for e in failed] == ["error", "error"]
    assert wait_until(lambda: FailedEvent.objects.filter(occurrence_count=2).exists(), timeout=60), (
        list(FailedEvent.objects.values_list("event_id", "key_source", "key_note", "occurrence_count")),
        n8n.start_log()[-3000:],
    )

    (event,) = FailedEvent.objects.all()
    assert event.shape == "n8n_execution" and event.source_node == "CRM: Create Contact"
    assert event.original_key == LEAD_KEY and event.key_source == "request_header"
    assert event.error_class == "transient"
    # The failed item's request body, not the report; its credential headers are not kept.
    assert open_payload(event.payload) == CONTACT
    assert set(event.request_headers) <= {"content-type", "idempotency-key", "x-idempotency-key"}
    assert sorted(event.occurrences.values_list("source_execution_id", flat=True)) == sorted(
        str(e["id"]) for e in failed
    )

    # One replay through the receiver template: exactly one contact, the lead's, under its key.
    from dlq.targets import services as dlq_targets

    signed_with_the_receivers_secret(
        dlq_targets.replay_target_upsert(
            tenant=onceguard, slug="strict-crm", url=f"{n8n.url}/webhook/onceguard-replay-strict", timeout_seconds=10
        )
    )
    replayed = replay(onceguard_url, event, target="strict-crm")
    assert replayed.status_code == 201, replayed.text
    assert replayed.json()["outcome"] == "succeeded", replayed.json()
    assert servers.strict_crm.refused == []
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    # The receiver forwards one contact per request: a body of several items never reaches the CRM.
    items = json.dumps({"items": [CONTACT, CONTACT]}).encode()
    several = httpx.post(
        f"{n8n.url}/webhook/onceguard-replay-strict",
        content=items,
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": LEAD_KEY,
            "Onceguard-Signature": signature(items),
        },
        timeout=30,
        trust_env=False,
    )
    assert several.status_code == 422, several.text
    assert servers.strict_crm.refused == [] and len(servers.strict_crm.contacts) == 1
    TIMINGS["error trigger: one lead, two failures, one contact"] = time.monotonic() - started


@pytest.fixture(scope="module")
def n8n_api_key(n8n: N8n) -> str:
    # Read (lead capture), retry (n8n's Retry button, through n8n 1.123's public API), and
    # workflow read/update (a broken replay receiver fixed in place).
    return n8n.create_api_key(scopes=("execution:read", "execution:retry", "workflow:read", "workflow:update"))


def test_an_error_trigger_entry_of_a_node_that_reports_no_request_holds_the_fetched_failed_item(
    n8n: N8n,
    onceguard: Tenant,
    servers: Servers,
    n8n_api_key: str,
    onceguard_url: str,
    admin_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the tenant's n8n connection configured (n8n_connect: the n8n URL and an n8n API
    # key), ingesting the Error Trigger payload fetches the failed execution and stores the
    # failed node's input items as the entry's payload.
    enqueued: list[tuple[Any, ...]] = []
    # The live server's after-commit enqueue, captured: this test runs the task as the cluster would.
    monkeypatch.setattr("ledger.platform.tasks.enqueue", lambda func, *args: enqueued.append((func, *args)))
    stdin = io.StringIO(n8n_api_key + "\n")
    monkeypatch.setattr("sys.stdin", stdin)
    call_command("n8n_connect", "--tenant", onceguard.slug, "--url", n8n.url, stdout=io.StringIO())

    # A Code node's error names no request: the failed item is fetched from the execution.
    n8n.webhook("onceguard-lead-code", CALL)
    (failed,) = n8n.wait_for_executions(CODE_FAILS, count=1)
    assert failed["status"] == "error"
    assert wait_until(lambda: FailedEvent.objects.exists(), timeout=60), n8n.start_log()[-3000:]
    event = FailedEvent.objects.get()
    assert event.event_id == f"n8n:{CODE_FAILS}:{failed['id']}"
    assert wait_until(lambda: ("dlq.tasks.n8n_payload_fetch_task", event.pk) in enqueued, timeout=10)
    n8n_payload_fetch_task(event.pk)

    event.refresh_from_db()
    assert event.payload_fetch == "fetched", event.payload_fetch_note
    assert event.payload_source == "n8n_execution_fetch" and event.payload_source_ref == str(failed["id"])
    event.refresh_from_db()
    assert open_payload(event.payload) == CONTACT
    # Shown on the entry's page (masked) and in the API.
    page = admin_client.get(reverse("admin:dlq_failedevent_change", args=[event.pk])).content.decode()
    assert f"fetched from n8n execution {failed['id']}" in page
    for secret in PERSONAL:
        assert secret not in page
    api = httpx.get(
        f"{onceguard_url}/api/v1/dlq/events/{event.pk}",
        headers={"Authorization": f"Bearer {API_SECRET}"},
        timeout=10,
        trust_env=False,
    )
    assert api.json()["payload_source"]["source"] == "n8n_execution_fetch"


def submit_setup(tenant: Tenant, servers: Servers, n8n: N8n) -> None:
    services.provider_upsert(
        tenant=tenant,
        slug="demo-charges",
        base_url=servers.charges.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        lookup_path="/charges?idempotency_key={key}",
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=5,
    )
    Tenant.objects.filter(pk=tenant.pk).update(callback_allow_list=[f"{n8n.url}/webhook-waiting/"])


def test_submit_and_wait_continues_when_onceguard_calls_the_wait_node_back(
    n8n: N8n, onceguard: Tenant, servers: Servers
) -> None:
    submit_setup(onceguard, servers, n8n)
    answer = n8n.webhook("onceguard-submit", {"order_id": "order-2001", "amount": 1999, "currency": "eur"})
    assert answer.status_code == 200, answer.text
    assert wait_until(lambda: Operation.objects.filter(key="order-2001:charge:v1").exists(), timeout=60)
    (waiting,) = n8n.wait_for_executions(SUBMIT_AND_WAIT, count=1, statuses=("waiting",))
    op = Operation.objects.get(key="order-2001:charge:v1")
    assert op.callback_url.startswith(f"{n8n.url}/webhook-waiting/{waiting['id']}")

    # A worker charges, then delivers the callback; the Wait node resumes the execution.
    assert wait_until(lambda: _finished(n8n, SUBMIT_AND_WAIT), timeout=N8N_CALLBACK_WAIT, interval=0.5)
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED
    assert servers.charges.effects()["count"] == 1
    callback = Operation.objects.get(key=f"callback:{op.pk}")
    assert callback.status == S.SUCCEEDED

    # The same order again: its operation is finished, so Submit (v2) comes out of Succeeded at
    # once and the execution never waits for a callback (none is sent: the Wait node would
    # hold it "waiting" for an hour).
    started = time.monotonic()
    again = n8n.webhook("onceguard-submit", {"order_id": "order-2001", "amount": 1999, "currency": "eur"})
    assert again.status_code == 200, again.text
    # The template keeps no successful execution (saveDataSuccessExecution "none"): once the
    # answer came, none of its executions is waiting, running or failed.
    assert wait_until(lambda: _finished(n8n, SUBMIT_AND_WAIT), timeout=60), n8n.executions(SUBMIT_AND_WAIT)
    assert Operation.objects.filter(key__startswith="callback:").count() == 1
    assert servers.charges.effects()["count"] == 1
    TIMINGS["submit and wait: a finished key"] = time.monotonic() - started


def test_a_submission_whose_202_was_lost_is_retried_by_n8n_and_still_charges_once(
    n8n: N8n, onceguard: Tenant, servers: Servers
) -> None:
    # Onceguard accepts the submission, the relay loses its 202, the Submit node's Retry On
    # Fail sends the same key again: that must answer 202 (Idempotent-Replayed) with the same
    # operation, so the execution goes on to wait instead of down its error path.
    submit_setup(onceguard, servers, n8n)
    servers.onceguard_relay.script(["forward-then-drop-response", "forward-and-respond"])
    answer = n8n.webhook("onceguard-submit-retry", {"order_id": "order-2002", "amount": 500, "currency": "eur"})
    assert answer.status_code == 200, answer.text
    (waiting,) = n8n.wait_for_executions(SUBMIT_RETRY, count=1, statuses=("waiting",), timeout=60)
    assert Operation.objects.filter(key="order-2002:charge:v1").count() == 1
    assert wait_until(lambda: _finished(n8n, SUBMIT_RETRY), timeout=N8N_CALLBACK_WAIT, interval=0.5)
    assert servers.charges.effects()["count"] == 1


def _finished(n8n: N8n, workflow_id: str) -> bool:
    """Every execution of the workflow ended well: successful ones are not kept by the
    templates (saveDataSuccessExecution "none"), so a finished one is gone or "success"."""
    run_due()
    return all(e["status"] == "success" for e in n8n.executions(workflow_id))


def test_n8n_retry_of_an_execution_that_failed_after_the_sent_marker_completes_the_charge_without_a_second(
    n8n: N8n, onceguard: Tenant, servers: Servers, n8n_api_key: str
) -> None:
    # Claim and Mark sent reach Onceguard, the provider charges, and Complete's request is lost
    # before Onceguard sees it: the execution fails after the sent marker, the charge made.
    submit_setup(onceguard, servers, n8n)
    servers.onceguard_relay.script(["forward-and-respond", "forward-and-respond", "fail-before-forward"])
    n8n.webhook("onceguard-charge-retried", {"order_id": "order-3001", "amount": 700, "currency": "eur"})
    (failed,) = n8n.wait_for_executions(RETRIED_CHARGE, count=1, statuses=("error",), timeout=60)
    op = Operation.objects.get(key="order-3001:charge:v1")
    assert op.status == S.CLAIMED and op.sent_at is not None
    assert servers.charges.effects()["count"] == 1

    # What n8n's Retry button does (Executions → Retry), through its public API: a new
    # execution (retryOf) that starts again at the failed node — Complete, with the lease the
    # claim took — never at the charge.
    retried = httpx.post(
        f"{n8n.url}/api/v1/executions/{failed['id']}/retry",
        json={"loadWorkflow": False},
        headers={"X-N8N-API-KEY": n8n_api_key},
        timeout=60,
        trust_env=False,
    )
    assert retried.status_code == 200, retried.text
    assert wait_until(
        lambda: any(str(e["retryOf"]) == str(failed["id"]) for e in n8n.executions(RETRIED_CHARGE)), timeout=60
    ), n8n.executions(RETRIED_CHARGE)
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED
    assert servers.charges.effects()["count"] == 1

    # Retried again (a second click): the operation is finished, nothing is charged again.
    again = httpx.post(
        f"{n8n.url}/api/v1/executions/{failed['id']}/retry",
        json={"loadWorkflow": False},
        headers={"X-N8N-API-KEY": n8n_api_key},
        timeout=60,
        trust_env=False,
    )
    assert again.status_code in (200, 409), again.text
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED and servers.charges.effects()["count"] == 1


def test_a_replay_whose_receiver_stops_before_its_respond_node_is_not_delivered_and_the_fixed_one_delivers_once(
    n8n: N8n, onceguard: Tenant, servers: Servers, onceguard_url: str, n8n_api_key: str
) -> None:
    # An entry for a lead (as the Dead-letter step posts it), replayed to a receiver whose
    # mapping step throws before its CRM call and its Respond node.
    started = time.monotonic()
    from dlq.targets import services as dlq_targets

    posted = httpx.post(
        f"{onceguard_url}/api/v1/dlq/events",
        json={
            "event_id": "lead-ack-1",
            "idempotency_key": LEAD_KEY,
            "payload": CONTACT,
            "error": {"message": "CRM answered 429", "class": "transient"},
        },
        headers={"Authorization": f"Bearer {API_SECRET}"},
        timeout=30,
        trust_env=False,
    )
    assert posted.status_code == 201, posted.text
    event = FailedEvent.objects.get(pk=posted.json()["id"])
    receiver = dlq_targets.replay_target_upsert(
        tenant=onceguard,
        slug="receiver",
        url=f"{n8n.url}/webhook/onceguard-replay-broken",
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
        ack="echo",
        timeout_seconds=10,
    )
    signed_with_the_receivers_secret(receiver)

    stopped = replay(onceguard_url, event, target="receiver")
    assert stopped.status_code == 201, stopped.text
    # Whatever n8n answered for the stopped workflow, it is not a delivery: no acknowledgement.
    assert stopped.json()["outcome"] == "ambiguous", stopped.json()
    (first,) = n8n.wait_for_executions(BROKEN_RECEIVER, count=1)
    assert first["status"] == "error"
    row = event.replays.get(number=1)
    assert "not acknowledged" in row.error_message, (row.response_status, row.error_message)
    event.refresh_from_db()
    assert event.status == "pending"
    trail = " ".join(event.changes.values_list("note", flat=True))
    assert "replay #1 ambiguous (not acknowledged" in trail
    assert servers.strict_crm.contacts == []
    # The receiver may have acted for all Onceguard knows: to a key-advisory target the next
    # replay waits for a person.
    waits = replay(onceguard_url, event, target="receiver")
    assert waits.status_code == 409 and waits.json()["code"] == "replay_needs_decision"

    # The workflow is fixed in place (the template's nodes, same webhook path), and the
    # operator, who checked the CRM, records that the lead may be sent again.
    fixed = template("replay-receiver")
    node_named(fixed, "Replay from Onceguard")["parameters"]["path"] = "onceguard-replay-broken"
    updated = httpx.put(
        f"{n8n.url}/api/v1/workflows/{BROKEN_RECEIVER}",
        json={k: fixed[k] for k in ("name", "nodes", "connections", "settings")},
        headers={"X-N8N-API-KEY": n8n_api_key},
        timeout=60,
        trust_env=False,
    )
    assert updated.status_code == 200, updated.text
    decided = httpx.post(
        f"{onceguard_url}/api/v1/dlq/events/{event.pk}/resend-decision",
        json={"note": "the receiver stopped before the CRM call; the CRM has no contact for this call"},
        headers={"Authorization": f"Bearer {API_SECRET}"},
        timeout=30,
        trust_env=False,
    )
    assert decided.status_code == 200, decided.text

    delivered = replay(onceguard_url, event, target="receiver")
    assert delivered.status_code == 201, delivered.text
    assert delivered.json()["outcome"] == "succeeded", delivered.json()
    event.refresh_from_db()
    assert event.status == "replayed"
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    again = replay(onceguard_url, event, target="receiver")
    assert again.status_code == 409 and again.json()["code"] == "replay_needs_force"
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    TIMINGS["replay not acknowledged, then delivered once"] = time.monotonic() - started


def test_a_lead_replayed_after_a_crm_429_is_one_contact_even_when_its_workflow_re_sends_it_once_the_retry_is_due(
    n8n: N8n, onceguard: Tenant, servers: Servers, onceguard_url: str
) -> None:
    # The lead's claim waits for its retry after the CRM's 429; its entry is in the DLQ.
    started = time.monotonic()
    servers.strict_crm.reset(script=[429])
    assert n8n.webhook(LEAD_PATH[LEAD_NODE], CALL).status_code == 202
    assert wait_until(lambda: Operation.objects.filter(key=LEAD_KEY, status=S.RETRY_WAIT).exists(), timeout=60), (
        n8n.start_log()[-3000:]
    )
    event = FailedEvent.objects.get()
    assert event.original_key == LEAD_KEY

    # The operator replays the entry through the receiver template: one contact.
    replayed = replay(onceguard_url, event)
    assert replayed.status_code == 201, replayed.text
    assert replayed.json()["outcome"] == "succeeded", replayed.json()
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    # The replay took the lead's claim over: it answers with the replay's outcome now.
    op = Operation.objects.get(key=LEAD_KEY)
    replay_op = Operation.objects.get(key=f"replay:{event.pk}:1")
    assert (op.status, op.superseded_by_id, replay_op.status) == (S.FAILED, replay_op.pk, S.SUCCEEDED)

    # The voice platform re-sends the lead once the retry would be due (its clock moved on).
    Operation.objects.filter(pk=op.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=5))
    assert n8n.webhook(LEAD_PATH[LEAD_NODE], CALL).status_code == 202
    assert wait_until(lambda: _finished(n8n, LEAD_NODE), timeout=60), n8n.executions(LEAD_NODE)
    assert servers.strict_crm.contacts == [(LEAD_KEY, CONTACT)]
    assert servers.strict_crm.refused == []
    assert FailedEvent.objects.count() == 1
    TIMINGS["lead replayed, then re-sent after its retry was due"] = time.monotonic() - started
