"""What the DLQ's console pages share: a payload shown as its masked skeleton (keys say what
is there, never a value), a replay's failure as a sentence with its next step, the acting
user as the services record them.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from django.utils.safestring import SafeString

from dlq.entries.payloads import is_redacted, open_payload
from dlq.models import Replay, ReplayTarget
from ledger.web.failures import failure_html

MASK = "•••"


def mask_skeleton(value: Any, depth: int = 0) -> Any:
    """The payload's shape with every value replaced by •••: keys say what is there."""
    if depth > 8:
        return MASK
    if isinstance(value, dict):
        return {str(k): mask_skeleton(v, depth + 1) for k, v in list(value.items())[:100]}
    if isinstance(value, list):
        items = [mask_skeleton(v, depth + 1) for v in value[:20]]
        if len(value) > 20:
            items.append(f"{MASK} ({len(value) - 20} more)")
        return items
    return None if value is None else MASK


def masked_json(value: Any) -> str:
    if value is None:
        return "—"
    if is_redacted(value):
        return "(redacted by retention)"
    try:
        plain = open_payload(value)
    except Exception:  # a key that is not configured: say so, never break the page
        return "(sealed with a key that is not configured)"
    return json.dumps(mask_skeleton(plain), indent=2, ensure_ascii=False)


def replay_failure(replay: Replay) -> SafeString | str:
    """A failed replay's error as a sentence with its next step, the raw text behind a
    disclosure (ledger.web.failures; the target's URL, if it still exists, names the destination)."""
    if not replay.error_message:
        return ""
    url = (
        ReplayTarget.objects.filter(tenant_id=replay.tenant_id, slug=replay.target_slug)
        .values_list("url", flat=True)
        .first()
    )
    return failure_html(replay.error_message, status=replay.response_status, url=url or "")


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"
