"""Alert seam used by the ledger, sweeper and DLQ. The DLQ work fills in delivery."""

from __future__ import annotations


def alert_raise(*, tenant_id: int, kind: str, ref: str, summary: str) -> None:
    """Record an alert-worthy event (kind e.g. 'dlq_new', 'provider_paused', 'review_needed',
    'operation_stuck'); ``ref`` is an id or key, ``summary`` never carries payload text."""
