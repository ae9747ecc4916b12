"""Decisions on one entry, and notes on entries (DESIGN §4). Keyword-only, typed.

Resolve and discard (pending|replayed → closed, a note required), the key a person sets on a
pending entry with none usable (DESIGN §7), the decision "safe to resend" a key-advisory target
waits for, and the note the ledger's rollback hook leaves on the entries of an adapter revision.
Every status change goes through ``dlq.entries.transitions``, its change row in the same
transaction. ``clean_note`` is how every note is stored (masked, bounded); ``not_replayable``
is the named error an entry that cannot be replayed now answers with, on every replay path.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from dlq.entries import selectors, transitions
from dlq.models import FE, FE_OPEN_STATES, FE_TERMINAL_STATES, FailedEvent, KeySource
from dlq.rules.errors import (
    FailedEventBusy,
    FailedEventClosed,
    KeyNotSettable,
    NoteRequired,
    ReplayInProgress,
    ReplayNeedsForce,
)
from ledger.models import ApprovalKind, Tenant
from ledger.platform.errors import DomainError
from ledger.protocol import approvals
from ledger.protocol import services as ledger_services
from ledger.rules.key_rules import key_check

log = logging.getLogger("onceguard.dlq")


MAX_NOTE = 500


def clean_note(note: str | None) -> str:
    return ledger_services.sanitize_message(note)[:MAX_NOTE]


def failed_events_note_rollback(
    *, tenant_id: int, provider_id: int, revision_id: int, number: int, actor: str, reason: str
) -> None:
    """An adapter revision was rolled back (``ledger.platform.hooks.adapter_revision_rolled_back``, in
    the move's transaction): each pending entry that failed under it gets a note naming the
    revision. Nothing is re-sent: the provider received and rejected these; an operator
    replays them, under the revision stable now, once the cause is understood."""
    pending = FailedEvent.objects.filter(
        tenant_id=tenant_id, adapter_revision_id=revision_id, status=FE.PENDING
    ).values_list("pk", flat=True)
    note = f"adapter revision {number} was rolled back by {actor}: not re-sent automatically ({reason})"
    for event_pk in pending[:10_000]:
        transitions.change_row(
            event_pk=event_pk, tenant_id=tenant_id, old=FE.PENDING, new=FE.PENDING, actor=actor, note=note
        )


def failed_event_resend_decide(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """A person's decision that a pending entry whose first try may have acted may be re-sent
    to a key-advisory target: who, when and why, in the entry's trail, in one transaction."""
    note = clean_note(note)
    if not note:
        raise NoteRequired('The decision "safe to resend" needs a reason.')
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    # Four-eyes (ADR 0013): the decision is what lets a key-advisory target be sent to again.
    approvals.approval_gate(
        tenant_id=tenant_id,
        provider_id=None,
        provider_ids=selectors.entry_provider_ids(tenant_id=tenant_id, event_pks=[event.pk]),
        kind=ApprovalKind.SAFE_TO_RESEND,
        actor=actor,
        reason=note,
        target_ids=[event.pk],
        params={"note": note},
    )
    with transaction.atomic():
        moved = FailedEvent.objects.filter(pk=event.pk, tenant_id=tenant_id, status=FE.PENDING).update(
            resend_decided_by=actor[:150], resend_decided_at=timezone.now(), updated_at=timezone.now()
        )
        if not moved:
            raise not_replayable(event.pk, force=False)
        transitions.change_row(
            event_pk=event.pk,
            tenant_id=tenant_id,
            old=FE.PENDING,
            new=FE.PENDING,
            actor=actor,
            note=f'decision "safe to resend": {note}',
        )
    event.refresh_from_db()
    return event


def failed_event_key_set(*, tenant_id: int, event_pk: int, key: str, actor: str, note: str = "") -> FailedEvent:
    """A person sets the key a pending entry with no usable key is replayed under (DESIGN §7):
    without one, its replay would go out under the entry's own identity, which no receiver
    knows. The key is a new key by the key rule (ledger.rules.key_rules, the tenant's waiver for
    personal data included), refused as the claim refuses it; an entry already replayed, or
    that has a key, keeps what it has. Who, which key and why go in the entry's trail, in
    the same transaction as the guarded UPDATE."""
    allowed = Tenant.objects.filter(pk=tenant_id, personal_data_in_keys_allowed=True).exists()
    key = key_check(key, personal_data_allowed=allowed)
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    # Not held by the open-entry constraint (a key set by hand is no report's business key), so
    # looked for here: the same key open in another entry of the target is the same failure.
    held_by = (
        selectors.failed_events_of_key(tenant_id=tenant_id, key=key, target_slug=event.replay_target_slug)
        .filter(status__in=FE_OPEN_STATES)
        .exclude(pk=event.pk)
        .values_list("pk", flat=True)
        .first()
    )
    if held_by is not None:
        raise KeyNotSettable(
            f"Entry {held_by} holds this key open for the same target: replay or close that one instead.",
            extra={"entry": held_by},
        )
    note = clean_note(note)
    with transaction.atomic():
        moved = FailedEvent.objects.filter(
            pk=event.pk, tenant_id=tenant_id, status=FE.PENDING, key_source=KeySource.MISSING, replay_count=0
        ).update(
            original_key=key,
            key_source=KeySource.SET_BY_PERSON,
            key_note=clean_note(f"Set by {actor[:150]}" + (f": {note}" if note else ".")),
            updated_at=timezone.now(),
        )
        if not moved:
            raise KeyNotSettable("Only a pending entry with no usable key, never replayed, takes a key set by hand.")
        transitions.change_row(
            event_pk=event.pk,
            tenant_id=tenant_id,
            old=FE.PENDING,
            new=FE.PENDING,
            actor=actor,
            note=f"key set to {key} (none was usable)" + (f": {note}" if note else ""),
        )
    event.refresh_from_db()
    return event


def not_replayable(event_pk: int, *, force: bool) -> DomainError:
    status = FailedEvent.objects.filter(pk=event_pk).values_list("status", flat=True).first()
    if status == FE.REPLAYED and not force:
        return ReplayNeedsForce(
            "This entry was replayed successfully already; replaying it again needs force=true and a note."
        )
    if status in FE_TERMINAL_STATES:
        return FailedEventClosed(f"This entry is {status}; it cannot be replayed.", extra={"entry_status": status})
    return ReplayInProgress("Another replay of this entry is under way.", retry_after=1, extra={"entry_status": status})


def _close(*, tenant_id: int, event_pk: int, to: str, actor: str, note: str) -> FailedEvent:
    note = clean_note(note)
    if not note:
        raise NoteRequired(f"Marking an entry {to} needs a note saying why.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    for old in (FE.PENDING, FE.REPLAYED):
        if transitions.failed_event_close(
            event_pk=event.pk, tenant_id=event.tenant_id, old=old, to=to, actor=actor, note=note
        ):
            event.refresh_from_db()
            log.info("dlq_closed event=%s to=%s actor=%s", event.pk, to, actor)
            return event
    status = FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).values_list("status", flat=True).first()
    if status == FE.REPLAYING:
        raise FailedEventBusy("A replay of this entry is under way; try again when it has finished.", retry_after=1)
    raise FailedEventClosed(f"This entry is {status} already.", extra={"entry_status": status})


def failed_event_resolve(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """pending|replayed → resolved: an operator fixed it another way. The note is mandatory."""
    return _close(tenant_id=tenant_id, event_pk=event_pk, to=FE.RESOLVED, actor=actor, note=note)


def failed_event_discard(*, tenant_id: int, event_pk: int, actor: str, note: str) -> FailedEvent:
    """pending|replayed → discarded: dropped on purpose. The note is mandatory."""
    return _close(tenant_id=tenant_id, event_pk=event_pk, to=FE.DISCARDED, actor=actor, note=note)
