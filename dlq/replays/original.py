"""The entry's original claim, settled by its replay (ADR 0007) in the transaction that hands
out the replay's number, before anything is sent: a claim waiting for its retry is taken over,
one its workflow holds or one being reconciled makes the replay wait, and one that succeeded
meanwhile means there is nothing to send.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from dlq.entries import transitions
from dlq.models import FE, FailedEvent
from dlq.rules.errors import ReplayOriginalInFlight, ReplayOriginalUnsettled
from ledger.models import Operation, OperationStatus
from ledger.platform.errors import DomainError
from ledger.protocol import transitions as ledger_transitions

# The states of an entry's original operation in which its own workflow (or worker) holds it
# or may act on it now, and those whose outcome is being reconciled: a replay waits for both.
_ORIGINAL_IN_FLIGHT = frozenset({OperationStatus.CLAIMED, OperationStatus.QUEUED, OperationStatus.WAITING})
_ORIGINAL_UNSETTLED = frozenset({OperationStatus.UNCERTAIN, OperationStatus.REVIEW})


def _seconds_until(moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, int((moment - timezone.now()).total_seconds() + 0.999))


def _original_of(event: FailedEvent) -> Operation | None:
    """The ledger operation of the entry's business key: the one it was recorded for, else the
    claim of its original key (an entry a workflow posted for a claim it holds)."""
    if event.operation_id:
        return Operation.objects.filter(pk=event.operation_id, tenant_id=event.tenant_id).first()
    if not event.original_key:
        return None
    return Operation.objects.filter(tenant_id=event.tenant_id, key=event.original_key).first()


def original_take(*, event: FailedEvent, number: int, actor: str, force: bool) -> Operation | None:
    """A replay to a target settles the entry's original claim (ADR 0007), in the transaction
    that hands out its number, before anything is sent. A claim waiting for its retry
    (``retry_wait``: after a 429, say) moves to ``failed`` — taken over by this replay — and
    the entry is linked to it, so the replay's outcome answers its key from then on
    (``superseded_by``) and the workflow re-sending the lead is answered from the ledger
    instead of making a second contact. A claim its workflow holds now, or one being
    reconciled, makes the replay wait (409, nothing sent). Returns the original operation when
    it succeeded meanwhile (the workflow's own retry did the work): the replay sends nothing,
    unless forced."""
    op = _original_of(event)
    if op is None:
        return None
    if op.status == OperationStatus.RETRY_WAIT:
        try:
            with transaction.atomic():
                if not FailedEvent.objects.filter(tenant_id=event.tenant_id, operation=op).exists():
                    # Linked before the move: the ledger's failed hook finds this entry instead
                    # of dead-lettering the lead a second time (failed_event_record_for_operation).
                    FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id, operation__isnull=True).update(
                        operation=op
                    )
                ledger_transitions.operation_redrive(
                    operation=op,
                    actor=actor,
                    reason=f"taken over by replay #{number} of DLQ entry {event.pk}: its outcome answers this key",
                )
        except DomainError:
            # Moved since we read it (its workflow re-claimed it): decide on what it is now.
            op = Operation.objects.get(pk=op.pk, tenant_id=op.tenant_id)
        else:
            event.operation_id = FailedEvent.objects.values_list("operation_id", flat=True).get(pk=event.pk)
            transitions.change_row(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                old=FE.REPLAYING,
                new=FE.REPLAYING,
                actor=actor,
                note=f"replay #{number} took over operation {op.pk} ({op.key}), which waited for its retry: the"
                " replay's outcome answers that key from now on",
            )
            return None
    if op.status in _ORIGINAL_IN_FLIGHT:
        raise ReplayOriginalInFlight(
            f"The key's own operation {op.pk} is {op.status}: its workflow holds it now; a replay would"
            " do the work a second time. Nothing was sent; replay after it ends (its outcome answers the key).",
            retry_after=_seconds_until(op.lease_expires_at),
            extra={"operation_id": op.pk, "operation_status": op.status},
        )
    if op.status in _ORIGINAL_UNSETTLED:
        raise ReplayOriginalUnsettled(
            f"The key's own operation {op.pk} is {op.status}: whether its work was done is being decided."
            ' Nothing was sent; settle it in review first ("safe to retry" lets this replay take it over).',
            extra={"operation_id": op.pk, "operation_status": op.status},
        )
    if op.status == OperationStatus.SUCCEEDED and not force:
        return op
    return None
