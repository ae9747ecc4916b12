"""Every move of a DLQ entry between states, one named function each (STYLE.md: one place for
every state change).

Each checks its move against ``dlq.models.FE_ALLOWED_TRANSITIONS`` (where each state says who
moves entries out of it), runs one guarded UPDATE — the entry must still be in the state it
was read in, and whatever else the move names — and writes the move's change row in the same
transaction. Zero rows matched means someone else moved the entry first: the function says
so (False or None) and the caller answers with its named error; nothing is overwritten.
Nothing outside this module writes an entry's status (tests/test_state_writes.py).

Where does an entry become …

==========  =================================================================================
pending     (ingest, the default); ``failed_event_replay_settle`` (a replay that did not succeed)
replaying   ``failed_event_replay_take`` (from pending; from replayed with ``force``)
replayed    ``failed_event_replay_settle``; ``failed_event_replay_settled_late`` (an ambiguous
            replay's ledger operation later found succeeded)
resolved    ``failed_event_close``; ``failed_event_correct`` (an operator's correction sent
            as a new submission)
discarded   ``failed_event_close``
==========  =================================================================================

Same-state change rows (a note: an occurrence of the key, an n8n retry …) are written by
``change_row`` too, from the services that record them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from dlq.models import FE, FE_ALLOWED_TRANSITIONS, FailedEvent, FailedEventChange, Replay
from dlq.rules.errors import KeyOpenInNewerEntry
from ledger.models import Operation
from ledger.platform.errors import IllegalTransition
from ledger.protocol.inputs import sanitize_message


def change_row(*, event_pk: int, tenant_id: int, old: str, new: str, actor: str, note: str) -> None:
    """An entry's change row: a move (old ≠ new) or a note (old = new)."""
    # Notes quote operators and targets' answers: masked and cut to the column (a prefix
    # such as "replay #3 to crm: " plus a 500-character note would overflow it).
    FailedEventChange.objects.create(
        tenant_id=tenant_id,
        event_id=event_pk,
        from_status=old,
        to_status=new,
        actor=actor[:150],
        note=sanitize_message(note),
    )


def check_move(old: str, new: str) -> None:
    if new not in FE_ALLOWED_TRANSITIONS.get(old, frozenset()):
        raise IllegalTransition(f"{old} → {new} is not an allowed move for a dead-letter entry.")


def _move(*, event_pk: int, tenant_id: int, old: str, new: str, actor: str, note: str, **columns: Any) -> bool:
    """One guarded UPDATE old→new plus its change row; False when the entry was not in ``old``."""
    check_move(old, new)
    with transaction.atomic():
        moved = FailedEvent.objects.filter(pk=event_pk, tenant_id=tenant_id, status=old).update(
            status=new, updated_at=timezone.now(), **columns
        )
        if moved:
            change_row(event_pk=event_pk, tenant_id=tenant_id, old=old, new=new, actor=actor, note=note)
    return bool(moved)


def failed_event_close(*, event_pk: int, tenant_id: int, old: str, to: str, actor: str, note: str) -> bool:
    """pending|replayed → resolved|discarded by an operator (or retention), with its note."""
    return _move(event_pk=event_pk, tenant_id=tenant_id, old=old, new=to, actor=actor, note=note, status_note=note)


def failed_event_correct(
    *, event_pk: int, tenant_id: int, actor: str, note: str, status_note: str, corrected_operation: Operation
) -> bool:
    """pending → resolved: an operator's correction went out as a new submission
    (``corrected_operation``), which now carries the entry's work."""
    return _move(
        event_pk=event_pk,
        tenant_id=tenant_id,
        old=FE.PENDING,
        new=FE.RESOLVED,
        actor=actor,
        note=note,
        status_note=status_note,
        corrected_operation=corrected_operation,
    )


def failed_event_replay_take(
    *,
    event: FailedEvent,
    force: bool,
    auto: bool,
    clears_decision: bool,
    decision: datetime | None,
    actor: str,
    what: str,
    where: str,
    note: str,
) -> tuple[str, int] | None:
    """pending (or, with ``force``, replayed) → replaying: the guarded UPDATE allocates the
    replay's number (``replay_count``) — zero rows means a double click, a second operator or
    the schedule got here first (None). ``decision``: the "safe to resend" the replay relies
    on; the UPDATE requires it still there and ``clears_decision`` uses it up (one decision,
    one send). Returns the state left and the replay's number."""
    columns: dict[str, Any] = {"replay_count": F("replay_count") + 1, "updated_at": timezone.now()}
    if auto:
        columns["auto_replay_count"] = F("auto_replay_count") + 1
    if clears_decision:
        columns.update(resend_decided_by="", resend_decided_at=None)
    guard: dict[str, Any] = {} if decision is None else {"resend_decided_at": decision}
    for state in (FE.PENDING, FE.REPLAYED) if force else (FE.PENDING,):
        check_move(state, FE.REPLAYING)
        try:
            with transaction.atomic():
                moved = FailedEvent.objects.filter(
                    pk=event.pk, tenant_id=event.tenant_id, status=state, **guard
                ).update(status=FE.REPLAYING, **columns)
        except IntegrityError:
            # replayed → replaying would make two open entries of one business key
            # (failedevent_one_open_per_key): a newer failure of the key is open.
            raise KeyOpenInNewerEntry("A newer entry of this business key is open; replay that one instead.") from None
        if moved:
            number = (
                FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id)
                .values_list("replay_count", flat=True)
                .get()
            )
            change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=state,
                new=FE.REPLAYING,
                actor=actor,
                note=f"{what} #{number} to {where}" + (f": {note}" if note else ""),
            )
            return state, number
    return None


def failed_event_replay_settle(*, replay: Replay, to: str, actor: str, note: str) -> bool:
    """replaying → replayed (the replay succeeded) or pending (it did not), only for the replay
    that holds the entry (its number is the entry's replay_count)."""
    check_move(FE.REPLAYING, to)
    moved = FailedEvent.objects.filter(
        pk=replay.event_id, tenant_id=replay.tenant_id, status=FE.REPLAYING, replay_count=replay.number
    ).update(status=to, updated_at=timezone.now())
    if moved:
        change_row(
            event_pk=replay.event_id, tenant_id=replay.tenant_id, old=FE.REPLAYING, new=to, actor=actor, note=note
        )
    return bool(moved)


def failed_event_replay_settled_late(*, replay: Replay, actor: str, note: str) -> bool:
    """pending → replayed: the replay's answer was ambiguous (the entry went back to pending)
    and its ledger operation was later found succeeded; only while no newer replay took it."""
    check_move(FE.PENDING, FE.REPLAYED)
    moved = FailedEvent.objects.filter(
        pk=replay.event_id, tenant_id=replay.tenant_id, status=FE.PENDING, replay_count=replay.number
    ).update(status=FE.REPLAYED, updated_at=timezone.now())
    if moved:
        change_row(
            event_pk=replay.event_id,
            tenant_id=replay.tenant_id,
            old=FE.PENDING,
            new=FE.REPLAYED,
            actor=actor,
            note=note,
        )
    return bool(moved)
