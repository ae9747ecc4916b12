"""Payload storage seam: sealed at rest when the tree has encryption (ledger.crypto), plain
otherwise; opened only where the plaintext is needed (a replay's body, the search paths)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("onceguard.dlq")


def seal_payload(value: Any) -> Any:
    try:
        from ledger.crypto import seal_json
    except ImportError:  # encryption at rest is not part of this tree
        return value
    return seal_json(value)


def open_payload(value: Any) -> Any:
    try:
        from ledger.crypto import open_json
    except ImportError:
        return value
    return open_json(value)


def is_redacted(value: Any) -> bool:
    try:
        from ledger.crypto import is_redacted as redacted
    except ImportError:
        return False
    return redacted(value)


def index_payload(*, tenant_id: int, event_pk: int, plain: Any, source: str = "") -> None:
    """Data-subject index (keyed HMACs of identifiers), if the tree has one. Never raises."""
    try:
        from ledger.crypto import payload_written
    except ImportError:
        return
    payload_written(tenant_id=tenant_id, record_type="failed_events", record_id=event_pk, values=[plain], source=source)
