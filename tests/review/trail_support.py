"""One person's data spread the way a real deployment spreads it, for the trail and erasure
tests: a failed lead (its DLQ copy, a reveal, a replay whose receiver echoed the data), a
succeeded quote in a run, a review item, an ingested n8n failure, an old operation retention
redacted and one it deleted — and a second person whose records must survive untouched."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent
from dlq.replays import services as dlq_replays
from dlq.targets import services as dlq_targets
from ledger.execution import objects
from ledger.models import ErrorClass, Operation, OperationOutput, Tenant, bytes_to_sealed
from ledger.platform import crypto
from ledger.protocol import services
from review.models import RetentionPolicy
from review.privacy import payloads as privacy
from review.retention.purge import retention_purge_tenant
from tests.console.support import advisory_provider, enforced_provider, example, op_in_review, succeeded_op
from tests.dlq.sinks import Sink

EMAIL = "priya.raman@example.invalid"
PHONE = "+61412345678"
# Everything of hers that must be gone after an erasure (case-insensitive), in any spelling
# the payloads, error texts and receivers used.
MARKERS = ("Priya", "Raman", EMAIL, PHONE, "61412345678", "412 345 678", "Wattle Street")
OTHER_EMAIL = "omar.haddad@example.invalid"
OTHER_MARKERS = ("Omar Haddad", OTHER_EMAIL)


@dataclass
class World:
    lead: Operation
    entry: FailedEvent
    quote: Operation
    review: Operation
    old: Operation
    gone_id: int
    ingested: FailedEvent
    other: Operation


def _age(op: Operation, days: int) -> None:
    past = timezone.now() - timedelta(days=days)
    Operation.objects.filter(pk=op.pk).update(created_at=past, updated_at=past, done_at=past)


def build_world(tenant: Tenant, sink: Sink) -> World:
    crm, mailer = enforced_provider(tenant), advisory_provider(tenant)
    voice = example("voice-call-analyzed.json")
    # 1. A lead the CRM refused, echoing her name and address (the address is masked on
    #    storage; the name is not a pattern anything can know).
    lead = services.operation_claim(tenant=tenant, key="lead:call_7f3c", provider=crm, payload=voice).operation
    lead = services.operation_fail(
        operation_id=lead.pk,
        tenant_id=lead.tenant_id,
        lease_token=lead.lease_token,
        error_class=ErrorClass.INVALID_INPUT,
        message=f"HTTP 422: contact Priya Raman <{EMAIL}> already exists",
    )
    entry = FailedEvent.objects.get(operation=lead)
    # 2. Someone looked at it, with a reason.
    privacy.payload_reveal(
        obj=lead,
        tenant_id=tenant.pk,
        fields=["payload"],
        reason="Ticket OPS-142: why was the lead refused",
        actor="user:ada",
        ip="127.0.0.1",
    )
    # 3. Replayed to the workflow, whose webhook answered with her data.
    sink.answer_body = json.dumps({"received": {"email": EMAIL, "name": "Priya Raman"}}).encode()
    dlq_targets.replay_target_upsert(tenant=tenant, slug="n8n", url=f"{sink.url}/webhook/rerun", is_default=True)
    dlq_replays.failed_event_replay(
        tenant_id=tenant.pk, event_pk=entry.pk, actor="user:ops", note="CRM fixed, replaying"
    )
    # 4. A quote in a run, its response holding her phone number.
    quote = services.operation_claim(
        tenant=tenant,
        key="quote:q-77",
        provider=crm,
        payload={"customer_email": EMAIL, "address": "12 Wattle Street", "full_name": "Priya Raman"},
        run="order-77",
        step=1,
    ).operation
    quote = services.operation_complete(
        operation_id=quote.pk,
        tenant_id=quote.tenant_id,
        lease_token=quote.lease_token,
        provider_ref="q-77",
        response_body={"phone": PHONE},
    )
    # … and the quote document it produced, a published output (a file in the objects storage).
    document = b"%PDF-1.4 Quote q-77 for Priya Raman, 12 Wattle Street"
    digest = hashlib.sha256(document).hexdigest()
    name = objects.object_save(
        objects.objects_storage(),
        name=objects.object_name(kind="outputs", tenant_id=tenant.pk, sha256=digest),
        file=io.BytesIO(document),
    )
    OperationOutput.objects.create(
        tenant=tenant,
        operation=quote,
        key=f"out_{digest}",
        sha256=digest,
        size=len(document),
        media_type="application/pdf",
        storage_name=name,
    )
    # 5. A confirmation e-mail nobody knows was sent: in review.
    review = op_in_review(tenant, mailer, "mail:confirm-77", payload={"email": EMAIL, "name": "Priya Raman"})
    # 6. An n8n failure posted to the DLQ with her call in it.
    ingested = dlq_ingest.failed_event_ingest(
        tenant=tenant,
        raw=json.dumps(
            {"event_id": "n8n:wf-9:exec-31", "payload": voice, "error": {"message": "Priya Raman: mailbox full"}}
        ).encode(),
        actor="apikey:n8n",
    ).event
    # 7. Older work: one past its payload TTL (redacted), one past its record TTL (deleted).
    old = succeeded_op(tenant, crm, "quote:q-12", payload={"phone": "+61 412 345 678"}, response={"ok": True})
    gone = succeeded_op(tenant, crm, "quote:q-3", payload={"email": EMAIL}, response={"ok": True})
    _age(old, 2)
    _age(gone, 200)
    RetentionPolicy.objects.create(
        tenant=tenant, record_type="operations", payload_ttl=timedelta(days=1), record_ttl=timedelta(days=100)
    )
    retention_purge_tenant(tenant_id=tenant.pk, trigger="test")
    # Someone else, who must keep every record.
    other = succeeded_op(
        tenant, crm, "quote:q-88", payload={"email": OTHER_EMAIL, "full_name": "Omar Haddad"}, response={"ok": True}
    )
    return World(lead, entry, quote, review, old, gone.pk, ingested, other)


def _decrypted(value: Any, depth: int = 0) -> Any:
    """``value`` with every sealed envelope inside it opened (a JSON text is parsed first)."""
    if depth > 20:
        return value
    if isinstance(value, (bytes, memoryview)):
        raw = bytes(value)
        try:
            # A sealed column's stored form on PostgreSQL (ledger.models.SealedJSONField).
            return _decrypted(bytes_to_sealed(raw), depth + 1)
        except (ValueError, IndexError, crypto.EncryptionKeyError):
            # Anything else: a digest, a token, a file's bytes.
            value = raw.decode("utf-8", errors="replace")
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if crypto.is_sealed(value):
        return _decrypted(crypto.open_json(value), depth + 1)
    if isinstance(value, dict):
        return {k: _decrypted(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_decrypted(v, depth + 1) for v in value]
    return value


def database_text() -> dict[str, str]:
    """Every table's every column, as text, sealed values decrypted: {table: text}. Raw SQL,
    so no model (and no table without one) is left out."""
    out: dict[str, str] = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            cells = []
            for row in cursor.fetchall():
                for cell in row:
                    cells.append(json.dumps(_decrypted(cell), ensure_ascii=False, default=str))
            out[table] = "\n".join(cells)
    return out


def found(text: str, markers: tuple[str, ...]) -> list[str]:
    low = text.lower()
    return [m for m in markers if m.lower() in low]
