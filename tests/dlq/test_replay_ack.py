"""A replay is delivered only on the receiver's positive acknowledgement (ADR 0007): to an
``echo`` target a 2xx counts only with ``Onceguard-Ack: v1=<HMAC(signing secret, "ack." +
replay id)>``; without it (what n8n answers for a workflow that stopped before its Respond
node) the outcome is unknown — the entry stays pending with the reason in words, never
"succeeded". A ``status`` target counts a 2xx, as every target did before; migrated targets
keep that, unconfirmed and listed."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from dlq.models import FailedEvent, Replay, ReplayTarget
from dlq.targets import services as dlq_targets
from ledger.models import Operation
from ledger.platform.errors import ValidationFailed
from review.decisions.services import review_decision_record

pytestmark = pytest.mark.django_db

ENVELOPE = {
    "event_id": "lead-91",
    "idempotency_key": "lead-91:crm:create:v1",
    "payload": {"firstName": "Ana", "customFields": {"call_id": "lead-91"}},
    "error": {"message": "CRM answered 429", "class": "transient"},
}


def ingest(client, body=None) -> int:
    response = client.post("/api/v1/dlq/events", body or ENVELOPE, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def replay(client, event_id, **body):
    return client.post(f"/api/v1/dlq/events/{event_id}/replay", body, format="json")


def secret_of(target: ReplayTarget) -> str:
    return dlq_targets.replay_target_signing_secret(target_id=target.pk)[0]


@pytest.fixture
def echo(tenant, sink) -> ReplayTarget:
    return dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="n8n",
        url=f"{sink.url}/webhook/replay",
        idempotency_class="key_enforced",
        ack="echo",
        timeout_seconds=2.0,
        is_default=True,
    )


def test_a_2xx_without_the_acknowledgement_is_not_a_delivery_and_the_entry_stays_pending(client, echo, sink):
    event_id = ingest(client)
    response = replay(client, event_id)
    assert response.status_code == 201, response.content
    assert response.json()["outcome"] == "ambiguous"
    [request] = sink.received()
    # The replay names itself; the acknowledgement is over that id.
    assert request.header("Onceguard-Replay-Id") == f"replay:{event_id}:1"
    row = Replay.objects.get(event_id=event_id)
    assert (row.outcome, row.error_class, row.response_status) == ("ambiguous", "ambiguous", 200)
    assert row.error_message.startswith("not acknowledged: HTTP 200 without Onceguard-Ack")
    event = FailedEvent.objects.get(pk=event_id)
    assert event.status == "pending"
    assert "replay #1 ambiguous (not acknowledged: HTTP 200" in event.changes.order_by("-id").first().note
    # The replay's own ledger operation is unsettled, as for an answer that was lost.
    assert Operation.objects.get(key=f"replay:{event_id}:1").status not in ("succeeded", "failed")


def test_the_receivers_acknowledgement_of_this_replay_makes_it_a_delivery(client, echo, sink):
    sink.ack_secret = secret_of(echo)
    event_id = ingest(client)
    response = replay(client, event_id)
    assert response.json()["outcome"] == "succeeded", response.json()
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"
    assert Operation.objects.get(key=f"replay:{event_id}:1").status == "succeeded"


@pytest.mark.parametrize("wrong", ["another-replay", "another-secret"])
def test_an_acknowledgement_of_another_replay_or_under_another_secret_is_not_one(client, echo, sink, wrong):
    event_id = ingest(client)
    if wrong == "another-replay":
        sink.ack_secret, sink.ack_for = secret_of(echo), f"replay:{event_id}:2"
    else:
        sink.ack_secret = "a-secret-the-target-never-had"
    assert replay(client, event_id).json()["outcome"] == "ambiguous"
    message = Replay.objects.get(event_id=event_id).error_message
    assert "with an Onceguard-Ack that is not over this replay's id" in message
    assert FailedEvent.objects.get(pk=event_id).status == "pending"


def test_during_a_rotation_an_acknowledgement_under_the_previous_secret_counts(client, echo, sink):
    old = secret_of(echo)
    dlq_targets.replay_target_signing_secret(target_id=echo.pk, rotate=True)
    sink.ack_secret = old
    assert replay(client, ingest(client)).json()["outcome"] == "succeeded"


def test_an_unacknowledged_replay_settled_by_a_reviewer_marks_the_entry_replayed(client, echo, sink):
    event_id = ingest(client)
    replay(client, event_id)
    op = Operation.objects.get(key=f"replay:{event_id}:1")
    if op.status != "review":
        from ledger.protocol.transitions.claim import guarded_move

        op = guarded_move(operation=op, to="review", actor="sweeper", reason="no lookup")
    review_decision_record(operation_id=op.pk, decision="confirm_succeeded", note="CRM shows lead 91", actor="rita")
    assert FailedEvent.objects.get(pk=event_id).status == "replayed"


def test_a_status_target_counts_a_2xx_as_before(client, tenant, sink):
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="api", url=f"{sink.url}/in", ack="status", timeout_seconds=2.0, is_default=True
    )
    assert replay(client, ingest(client)).json()["outcome"] == "succeeded"


def test_an_echo_targets_lookup_finds_only_with_its_acknowledgement(client, tenant, sink):
    target = dlq_targets.replay_target_upsert(
        tenant=tenant,
        slug="n8n",
        url=f"{sink.url}/webhook/replay",
        lookup_url=f"{sink.url}/webhook/find/{{key}}",
        idempotency_class="key_advisory",
        ack="echo",
        timeout_seconds=2.0,
        is_default=True,
    )
    # A 2xx without the acknowledgement decides nothing: the entry is sent (and acknowledged).
    sink.ack_secret, sink.lookup_status, sink.ack_lookups = secret_of(target), 200, False
    assert replay(client, ingest(client)).json()["outcome"] == "succeeded"
    assert len(sink.received()) == 1 and sink.lookups[0].header("Onceguard-Replay-Id").startswith("lookup:")
    # Acknowledged, "found" settles the next entry without sending it.
    sink.ack_lookups = True
    second = ingest(client, {**ENVELOPE, "event_id": "lead-92", "idempotency_key": "lead-92:crm:create:v1"})
    assert replay(client, second).json()["outcome"] == "succeeded"
    assert len(sink.received()) == 1 and len(sink.lookups) == 2


def test_a_target_made_without_declaring_it_keeps_status_and_is_listed_and_one_on_the_tenants_n8n_gets_echo(
    tenant, sink, admin_client
):
    plain = dlq_targets.replay_target_upsert(tenant=tenant, slug="api", url=f"{sink.url}/in")
    assert (plain.ack, plain.ack_confirmed) == ("status", False)
    ReplayTarget.objects.filter(pk=plain.pk).update(ack_confirmed=True)
    from dlq.models import N8nConnection

    N8nConnection.objects.create(tenant=tenant, base_url=sink.url)
    on_n8n = dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n", url=f"{sink.url}/webhook/replay")
    assert (on_n8n.ack, on_n8n.ack_confirmed) == ("echo", False)
    declared = dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n", url=f"{sink.url}/webhook/r", ack="echo")
    assert (declared.ack, declared.ack_confirmed) == ("echo", True)
    with pytest.raises(ValidationFailed) as refused:
        dlq_targets.replay_target_upsert(tenant=tenant, slug="api", url=f"{sink.url}/in", ack="2xx")
    assert refused.value.extra == {"field": "ack"}

    ReplayTarget.objects.filter(pk=plain.pk).update(ack_confirmed=False)
    page = admin_client.get(reverse("admin:dlq_replaytarget_changelist")).content.decode()
    assert "status (not confirmed)" in page
    listed = admin_client.get(reverse("admin:dlq_replaytarget_changelist") + "?ack_state=unconfirmed")
    assert "api" in listed.content.decode()


def test_the_console_and_the_command_declare_it(tenant, sink, admin_client):
    form = admin_client.get(reverse("admin:dlq_replaytarget_add")).content.decode()
    assert '<option value="echo">echo (the receiver signs the replay id back)</option>' in form
    fields = {
        "tenant": tenant.pk,
        "slug": "n8n",
        "url": f"{sink.url}/webhook/r",
        "idempotency_header": "Idempotency-Key",
    }
    fields.update(idempotency_class="key_advisory", ack="echo", timeout_seconds="5", active="on", _save="Save")
    assert admin_client.post(reverse("admin:dlq_replaytarget_add"), fields).status_code == 200
    assert ReplayTarget.objects.filter(slug="n8n", ack="echo", ack_confirmed=True).exists()
    out = io.StringIO()
    call_command(
        "replaytarget_upsert",
        "--tenant=acme",
        "--slug=crm",
        f"--url={sink.url}/in",
        "--idempotency-class=key_enforced",
        "--ack=status",
        stdout=out,
    )
    assert "ack status," in out.getvalue()
    assert ReplayTarget.objects.get(slug="crm").ack_confirmed


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_existing_targets_on_status_unconfirmed() -> None:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate([("dlq", "0015_key_set_by_person")]).apps
        old_tenant = old.get_model("ledger", "Tenant")
        has_namespace = any(f.name == "secret_namespace" for f in old_tenant._meta.fields)
        tenant = old_tenant.objects.create(
            slug="ack-mig", name="", **({"secret_namespace": "ACKMIG"} if has_namespace else {})
        )
        old.get_model("dlq", "ReplayTarget").objects.create(
            tenant=tenant, slug="n8n", url="http://127.0.0.1:9/webhook/r"
        )
        executor.loader.build_graph()
        executor.migrate(leaves)
        migrated = ReplayTarget.objects.get(slug="n8n")
        assert (migrated.ack, migrated.ack_confirmed) == ("status", False)
        assert ReplayTarget(tenant_id=migrated.tenant_id, slug="x", url="http://127.0.0.1:9/").ack_confirmed
    finally:
        executor.loader.build_graph()
        executor.migrate(leaves)
