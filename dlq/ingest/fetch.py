"""Lead capture: the failed items of an n8n Error Trigger entry, fetched after its ingestion
commits (``dlq.tasks.n8n_payload_fetch_task``).

The failed execution is read from the tenant's n8n (``dlq.n8n.client``, bounded, no
transaction held across it) and the failed node's input items become the entry's payload —
sealed, with its search paths and subject index, as ingestion stores one — with where it came
from; the failed item's key fills in an entry that had none. Any failure leaves the payload as
it was and says why on the entry. Once per entry: ``payload_fetch`` pending → fetched | failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from dlq.entries import selectors, transitions
from dlq.entries.payloads import index_payload, open_payload, seal_payload
from dlq.entries.services import MAX_NOTE, clean_note
from dlq.ingest.parsing import failed_item_index, failed_request_key
from dlq.models import (
    BUSINESS_KEY_SOURCES,
    FE,
    FE_OPEN_STATES,
    FailedEvent,
    KeySource,
    N8nConnection,
    PayloadFetch,
    PayloadSource,
)
from dlq.n8n import client as n8n
from dlq.rules.conf import dlq_setting
from ledger.platform import storable
from ledger.protocol import services as ledger_services
from ledger.providers.credentials import stored_credential_value
from ledger.rules.search import search_values

log = logging.getLogger("onceguard.dlq")

# The actor of lead capture's notes in an entry's trail.
N8N_ACTOR = "n8n lead capture"


def failed_event_n8n_fetch(*, event_pk: int, sleep: Callable[[float], None] = time.sleep) -> FailedEvent | None:
    """Lead capture, the after-commit task of an n8n Error Trigger entry (``dlq.tasks``):
    fetch the failed execution from the tenant's n8n and store the failed node's input items
    as the entry's payload (sealed, search paths, subject index — as ingestion stores one),
    recording where it came from. Any failure leaves the entry's payload as it was and says
    why on the entry. Runs once per entry (``payload_fetch`` pending → fetched | failed); no
    transaction is held across the HTTP calls, which are bounded (dlq.n8n.client)."""
    event = FailedEvent.objects.filter(pk=event_pk).first()
    if event is None or event.payload_fetch != PayloadFetch.PENDING:
        return event
    connection = N8nConnection.objects.filter(tenant_id=event.tenant_id).first()
    if connection is None or not connection.active:
        return _payload_fetch_failed(event, "the tenant's n8n connection was removed or switched off before the fetch")
    api_key, why = stored_credential_value(connection.api_key_secret)
    if api_key is None:
        return _payload_fetch_failed(event, f"the stored n8n API key cannot be used: {why or 'none is stored'}")
    try:
        found = n8n.fetch_failed_items(
            base_url=connection.base_url,
            api_key=api_key,
            execution_id=event.source_execution_id,
            node_hint=event.source_node,
            timeout=connection.timeout_seconds,
            sleep=sleep,
        )
    except n8n.FetchFailed as exc:
        return _payload_fetch_failed(event, exc.reason)
    held = n8n.items_payload(found, item_index=failed_item_index(open_payload(event.payload)))
    payload = held.payload
    if storable.nul_problem(payload) is not None:
        return _payload_fetch_failed(event, "the failed node's input items hold a NUL character, which is not stored")
    size, limit = n8n.payload_bytes(payload), int(dlq_setting("MAX_EVENT_BYTES"))
    if size > limit:
        return _payload_fetch_failed(
            event,
            f"the failed node's input items are {size} bytes; an entry holds at most {limit} (DLQ_MAX_EVENT_BYTES)",
        )
    return _payload_fetched(event, found, held)


def _fetched_key(event: FailedEvent, held: n8n.HeldItems) -> dict[str, Any]:
    """The key columns once the failed item is known: the declared field's value in it (an
    entry whose report named no request had no key to look for); unchanged when none is found
    or the key is held open by another entry of the key (the console links them)."""
    if event.key_source != KeySource.MISSING:
        return {}
    if held.item is None:
        return {"key_note": clean_note(held.note)}
    if not event.key_field:
        return {}
    derived = failed_request_key(
        headers={},
        body=held.item,
        key_field=event.key_field,
        personal_data_allowed=event.tenant.personal_data_in_keys_allowed,
    )
    if not derived.key:
        return {"key_note": clean_note(derived.note)}
    held_open = (
        selectors.failed_events_of_key(tenant_id=event.tenant_id, key=derived.key, target_slug=event.replay_target_slug)
        .filter(status__in=FE_OPEN_STATES, key_source__in=BUSINESS_KEY_SOURCES)
        .exclude(pk=event.pk)
        .values_list("pk", flat=True)
        .first()
    )
    if held_open is not None:
        return {"key_note": clean_note(f"The fetched item's key is held open by entry {held_open}: the same failure.")}
    return {"original_key": derived.key, "key_source": derived.source, "key_note": clean_note(derived.note)}


def _payload_fetched(event: FailedEvent, found: n8n.FailedItems, held: n8n.HeldItems) -> FailedEvent:
    payload = held.payload
    binary = f"; {found.with_binary} carried binary data, which is not fetched" if found.with_binary else ""
    count = len(found.items)
    note = ledger_services.sanitize_message(
        f"{count} input item{'s' if count != 1 else ''} of node “{found.node[:100]}”{binary}."
    )[:MAX_NOTE]
    # The report's search values stay (workflow, execution, node); the first item's are added.
    searchable = {**search_values(found.items[0], dlq_setting("SEARCH_PATHS")), **(event.search_fields or {})}
    now = timezone.now()
    sets: dict[str, Any] = {
        "payload": seal_payload(payload),
        "search_fields": searchable,
        "payload_source": PayloadSource.N8N_EXECUTION_FETCH,
        "payload_source_ref": found.execution_id[:255],
        "payload_fetch": PayloadFetch.FETCHED,
        "payload_fetch_note": note,
        "payload_fetched_at": now,
        "updated_at": now,
    }
    key = _fetched_key(event, held)
    with transaction.atomic():
        # Only an entry nobody has acted on yet: a replay or a decision was made on what the
        # entry held then, which must stay the evidence.
        pending = FailedEvent.objects.filter(
            pk=event.pk, payload_fetch=PayloadFetch.PENDING, status=FE.PENDING, replay_count=0
        )
        try:
            with transaction.atomic():
                moved = pending.update(**sets, **key)
        except IntegrityError:
            # A report of the same key opened its entry since _fetched_key looked
            # (failedevent_one_open_per_key): this one keeps no key of its own.
            held_by = "The fetched item's key is held open by another entry since: the same failure."
            moved = pending.update(**sets, key_note=clean_note(held_by))
        if moved:
            index_payload(
                tenant_id=event.tenant_id, event_pk=event.pk, plain=payload, source=PayloadSource.N8N_EXECUTION_FETCH
            )
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=FE.PENDING,
                new=FE.PENDING,
                actor=N8N_ACTOR,
                note=f"payload fetched from n8n execution {found.execution_id}: {note}",
            )
    if not moved:
        return _payload_fetch_failed(
            event,
            "the entry was replayed, resolved or discarded before the fetch finished; its payload stays as it was",
        )
    log.info("dlq_n8n_fetched event=%s execution=%s items=%s", event.pk, found.execution_id, count)
    event.refresh_from_db()
    return event


def _payload_fetch_failed(event: FailedEvent, reason: str) -> FailedEvent:
    """The entry keeps its payload; why the fetch failed is recorded on it (our words, masked)."""
    reason = ledger_services.sanitize_message(reason)[:MAX_NOTE]
    now = timezone.now()
    with transaction.atomic():
        moved = FailedEvent.objects.filter(
            pk=event.pk, tenant_id=event.tenant_id, payload_fetch=PayloadFetch.PENDING
        ).update(payload_fetch=PayloadFetch.FAILED, payload_fetch_note=reason, payload_fetched_at=now, updated_at=now)
        if moved:
            status = (
                FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id)
                .values_list("status", flat=True)
                .get()
            )
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=status,
                new=status,
                actor=N8N_ACTOR,
                note=f"payload not fetched from n8n: {reason}",
            )
    log.warning("dlq_n8n_fetch_failed event=%s execution=%s reason=%s", event.pk, event.source_execution_id, reason)
    event.refresh_from_db()
    return event
