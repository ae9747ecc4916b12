"""A small, clearly labelled demo scenario for a first run (``manage.py demo_seed``).

Built from the example payloads (invented people, ``.invalid`` domains, test phone ranges)
in tenant ``demo``; every key starts with ``demo:`` and every note says ``[demo]``:

* a voice-call lead whose CRM write hit a 429 and now sits in the DLQ (its replay target is
  `make run`'s mock CRM, so replaying it from the console creates the contact there);
* a card charge whose outcome is unknown, waiting for a reviewer;
* an earlier lead's DLQ entry replayed successfully, with its lineage;
* an access-log entry: a support person revealed the stuck lead's payload, with a reason;
* retention policies and one purge run, staff users for each role.

Seeds only an empty database (no operations, no DLQ entries), so it never mixes with real data.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction

from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from ledger.management.commands.bootstrap_demo import demo_outbound_rules
from ledger.models import ErrorClass, IdempotencyClass, Operation, Provider, Tenant
from ledger.platform import env
from ledger.platform.secret_files import write_secret_file
from ledger.protocol import services, transitions
from ledger.rules import outbound
from review.models import RetentionPolicy, StaffTenant
from review.privacy import payloads as privacy
from review.retention.purge import retention_purge_tenant

EXAMPLES = Path(__file__).resolve().parent / "demo_examples"
TENANT = "demo"
NOTE = "[demo]"


def _example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text())


@contextmanager
def _local_crm() -> Iterator[str]:
    """A throwaway loopback receiver for the demo replay (answers 201 with a contact id)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"id": "crm_demo_c_1042", "status": "created"}'
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def demo_port_base() -> int:
    """Where `make run` starts the demo receivers (run_all sets DEMO_PORT_BASE for the seed)."""
    return env.read("DEMO_PORT_BASE")


def demo_crm_url() -> str:
    """The mock CRM: `make run`'s key-enforced mock provider, which creates contacts."""
    return f"http://127.0.0.1:{demo_port_base()}"


def database_is_empty() -> bool:
    return not Operation.objects.exists() and not FailedEvent.objects.exists()


def _ingest(tenant: Tenant, envelope: dict[str, Any]) -> Any:
    return dlq_ingest.failed_event_ingest(tenant=tenant, raw=json.dumps(envelope).encode(), actor="demo_seed").event


def _staff(tenant: Tenant, username: str, role: str) -> str:
    password = secrets.token_urlsafe(10)
    user = User.objects.filter(username=username).first() or User(username=username, is_staff=True)
    user.first_name = f"Demo {role}"
    user.set_password(password)
    user.save()
    user.groups.add(Group.objects.get(name=role))
    StaffTenant.objects.get_or_create(user=user, tenant=tenant)
    return password


def demo_seed() -> dict[str, Any]:
    """Seed the scenario; returns what was made (ids, usernames and passwords)."""
    tenant = Tenant.objects.filter(slug=TENANT).first() or services.tenant_create(
        slug=TENANT, name="Demo tenant (sample data)"
    )
    # The demo's CRM is `make run`'s key-enforced mock provider (DEMO_PORT_BASE, `/contacts`):
    # its own loopback receiver, so the demo lead replays from the console out of the box.
    crm_url = demo_crm_url()
    with outbound.allowing(*demo_outbound_rules(demo_port_base())):
        # Guard mode: the workflow sends, never the service.
        crm = services.provider_upsert(
            tenant=tenant,
            slug="demo-crm",
            base_url=crm_url,
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
            key_ttl_seconds=86400,
        )
    # `bootstrap_demo` points demo-charges at the demo relay `make run` starts: keep that.
    charges = Provider.objects.filter(tenant=tenant, slug="demo-charges").first() or services.provider_upsert(
        tenant=tenant,
        slug="demo-charges",
        base_url="https://demo-charges.invalid",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
    )
    voice = _example("voice-call-analyzed.json")
    contact = _example("crm-create-contact-request.json")
    call_id = voice["call"]["call_id"]
    made: dict[str, Any] = {"tenant": tenant.slug}

    # 1. The call was analysed (the webhook is recorded with its payload, sealed at rest) …
    analysed = transitions.operation_claim(
        tenant=tenant,
        key=f"demo:{call_id}:analysed:v1",
        provider=crm,
        action="record-call",
        payload=voice,
        workflow_id="17",
        workflow_version="3",
        execution_id="4790",
        actor="demo_seed",
    ).operation
    transitions.operation_complete(
        operation_id=analysed.pk,
        tenant_id=analysed.tenant_id,
        lease_token=analysed.lease_token,
        provider_ref="crm_demo_note_77",
        response_body={"id": "crm_demo_note_77"},
        actor="demo_seed",
        reason=f"{NOTE} call recorded",
    )
    # … but the CRM write of the lead answered 429 and the workflow dead-lettered it.
    stuck = _ingest(
        tenant,
        {
            "event_id": "demo:n8n:17:4812",
            "idempotency_key": f"demo:{call_id}:crm-contact:v1",
            "payload": contact,
            "error": {
                "message": "[demo] The service is receiving too many requests from you [429]",
                "class": "transient",
            },
            "source": {
                "workflow_id": "17",
                "workflow_name": "[demo] Voice call analyzed -> CRM lead",
                "execution_id": "4812",
                "execution_url": "https://n8n.example.invalid/workflow/17/executions/4812",
                "node": "CRM: Create Contact",
                "mode": "webhook",
            },
        },
    )
    made["dlq_stuck"] = stuck.pk

    # 2. A charge sent, then the connection reset: outcome unknown, waiting for a human.
    with transaction.atomic():
        charge = transitions.operation_claim(
            tenant=tenant,
            key="demo:order-1001:charge:v1",
            provider=charges,
            action="charge",
            request={"amount": 4900, "currency": "AUD", "customer": "cus_demo_1001"},
            payload={"order": "1001", "amount": 4900, "currency": "AUD"},
            mark_sent=True,
            reconciliation_handle="pi_demo_3NfX1001",
            workflow_id="21",
            execution_id="5120",
            actor="demo_seed",
        ).operation
        charge = transitions.operation_fail(
            operation_id=charge.pk,
            tenant_id=charge.tenant_id,
            lease_token=charge.lease_token,
            error_class=ErrorClass.AMBIGUOUS,
            message="[demo] connection reset after the request was sent",
            actor="demo_seed",
        )
        charge = transitions.operation_hand_to_review(
            operation=charge, actor="demo_seed", reason=f"{NOTE} provider lookup unavailable; a reviewer must decide"
        )
    made["review_item"] = charge.pk

    # 3. An earlier lead hit the same 429; an operator replayed it once the limit lifted.
    earlier = _ingest(
        tenant,
        {
            "event_id": "demo:n8n:17:4790",
            "idempotency_key": "demo:call_1a2b3c4d5e6f7a8b:crm-contact:v1",
            "payload": {
                **contact,
                "body": {
                    **contact["body"],
                    "firstName": "Sam",
                    "lastName": "Okafor",
                    "email": "sam.okafor@example.invalid",
                    "phone": "+61491570006",
                },
            },
            "error": {
                "message": "[demo] The service is receiving too many requests from you [429]",
                "class": "transient",
            },
            "source": {
                "workflow_id": "17",
                "workflow_name": "[demo] Voice call analyzed -> CRM lead",
                "execution_id": "4790",
                "node": "CRM: Create Contact",
                "mode": "webhook",
            },
        },
    )
    # The throwaway receiver is allowed for this replay only, in this thread (ledger.rules.outbound).
    with _local_crm() as url, outbound.allowing(url.removeprefix("http://")):
        # The demo CRMs dedup on the key (key-enforced): a replay with an unknown outcome may go
        # again without a person's decision.
        dlq_targets.replay_target_upsert(
            tenant=tenant,
            slug="demo-crm-webhook",
            url=f"{url}/contacts",
            is_default=True,
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
        )
        replay = dlq_replays.failed_event_replay(
            tenant_id=tenant.pk,
            event_pk=earlier.pk,
            actor="user:demo-operator",
            note=f"{NOTE} CRM rate limit lifted; replaying with the original key",
        )
    # The seeding-only receiver is gone: from now on the demo's replays go to the mock CRM
    # `make run` starts (which is not up yet while this seeds).
    with outbound.allowing(*demo_outbound_rules(demo_port_base())):
        dlq_targets.replay_target_upsert(
            tenant=tenant,
            slug="demo-crm-webhook",
            url=f"{crm_url}/contacts",
            is_default=True,
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
        )
    made["dlq_replayed"] = earlier.pk
    made["replay_outcome"] = replay.outcome

    # 4. Support looked at the stuck lead's payload, with a reason (logged and chained).
    _, entry = privacy.payload_reveal(
        obj=FailedEvent.objects.get(pk=stuck.pk),
        tenant_id=tenant.pk,
        fields=["payload"],
        reason=f"{NOTE} Ticket DEMO-1: caller says the quote never arrived; checking the lead",
        actor="user:demo-admin",
        ip="127.0.0.1",
    )
    made["access_log_seq"] = entry.seq

    # 5. Retention policies and one (harmless: nothing is old yet) purge run.
    for record_type, payload_ttl, record_ttl in (
        ("operations", 30, 365),
        ("failed_events", 30, 90),
        ("access_log", None, 730),
    ):
        RetentionPolicy.objects.get_or_create(
            tenant=tenant,
            record_type=record_type,
            defaults={
                "payload_ttl": timedelta(days=payload_ttl) if payload_ttl else None,
                "record_ttl": timedelta(days=record_ttl),
            },
        )
    retention_purge_tenant(tenant_id=tenant.pk, trigger="demo")

    made["users"] = {
        name: _staff(tenant, name, role)
        for name, role in (
            ("demo-operator", "operator"),
            ("demo-reviewer", "reviewer"),
            ("demo-auditor", "auditor"),
            ("demo-admin", "admin"),
        )
    }
    path = Path(settings.VAR_DIR) / "demo-users.txt"
    # Mode 600 from birth (ledger.platform.secret_files): the demo staff's passwords.
    write_secret_file(path, "".join(f"{u} / {p}\n" for u, p in made["users"].items()), replace=True)
    made["users_file"] = str(path)
    return made
