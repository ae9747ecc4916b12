"""One masking rule for payloads and recorded responses (DESIGN §8), at the lowest layer that
renders them: the API's serializers (here), the console (review.privacy.payloads, which uses the same
:func:`mask_json`) and exports show the *shape* of a stored value — its keys, each value a
type-and-size placeholder — never the value.

A value is shown in clear in two places only: the answer to a claim or submission that
replays the key (the caller holds a write-scoped key of the same tenant and sent the same
request fingerprint: the protocol owes it the recorded outcome), and a reveal with the
`payload` scope or permission and a reason, which writes an access-log row first
(review.privacy.payloads.payload_reveal).
"""

from __future__ import annotations

from typing import Any

from ledger.platform import crypto

UNREADABLE = "‹sealed with a key that is not configured›"


def mask_json(value: Any, *, depth: int = 0) -> Any:
    """Same shape, no values: keys stay (they say what is there), every scalar becomes a
    type-and-size placeholder. Deep structures are cut off."""
    if depth > 6:
        return "‹…›"
    if isinstance(value, dict):
        return {str(k): mask_json(v, depth=depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list):
        items = [mask_json(v, depth=depth + 1) for v in value[:10]]
        if len(value) > 10:
            items.append(f"‹{len(value) - 10} more›")
        return items
    if value is None:
        return None
    if isinstance(value, bool):
        return "‹bool›"
    if isinstance(value, (int, float)):
        return "‹number›"
    return f"‹text·{len(str(value))}›"


def stored_value_masked(stored: Any) -> Any:
    """The masked shape of a stored (sealed, plain or redacted) value. A redaction marker
    stays as it is: it holds when and why, and a keyed digest, never the value."""
    if stored is None or crypto.is_redacted(stored):
        return stored
    try:
        return mask_json(crypto.open_json(stored))
    except crypto.EncryptionKeyError:
        return UNREADABLE
