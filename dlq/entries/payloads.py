"""Payload storage seam of the DLQ: payloads are sealed at rest by the ledger's encryption
(``ledger.platform.crypto``) and opened only where the plaintext is needed (a replay's body, the
search paths). The import is plain on purpose: a tree whose encryption module cannot be
imported must fail to start, not quietly store payloads in clear."""

from __future__ import annotations

from typing import Any

from ledger.platform.crypto import is_redacted, payload_written
from ledger.platform.crypto import open_json as open_payload
from ledger.platform.crypto import seal_json as seal_payload

__all__ = ["index_payload", "is_redacted", "open_payload", "seal_payload"]


def index_payload(*, tenant_id: int, event_pk: int, plain: Any, source: str = "") -> None:
    """Data-subject index (keyed HMACs of identifiers) of an entry's payload. Never raises:
    ``payload_written`` logs an indexing failure and leaves the write alone."""
    payload_written(tenant_id=tenant_id, record_type="failed_events", record_id=event_pk, values=[plain], source=source)
