"""Every write to the dead-letter queue."""

from __future__ import annotations

from django.utils import timezone

from dlq.models import FailedEvent
from ledger.models import Operation


def failed_event_record_for_operation(*, operation: Operation) -> FailedEvent:
    """The DLQ entry of a terminally failed operation, written in the caller's transaction.

    The payload is the operation's payload (execute mode: its request), so an operator can
    inspect and replay it; the identity is the ledger key, so a second call is a no-op.
    """
    now = timezone.now()
    event, _ = FailedEvent.objects.get_or_create(
        tenant_id=operation.tenant_id,
        event_id=f"op:{operation.pk}",
        defaults={
            "payload": operation.payload if operation.payload is not None else operation.request,
            "error_message": operation.last_error,
            "error_class": operation.error_class,
            "failed_at": now,
            "last_seen_at": now,
            "retry_count": max(0, operation.attempts - 1),
            "original_key": operation.key,
            "operation": operation,
            "source_execution_id": operation.execution_id,
            "source_workflow_id": operation.workflow_id,
        },
    )
    return event
