"""Personal data out of free text: one pattern set for log lines and for stored error text.

Error text is kept in plaintext columns (an operation's ``last_error``, an attempt's
message, event reasons, DLQ error messages and notes) that operators list, filter and
export, and that outlive a payload's retention. A provider's 400 often echoes the contact it
refused, so :func:`scrub` masks e-mail addresses, phone numbers, bearer tokens and API keys,
plus the deployment's own identifier shapes (``ONCEGUARD["ERROR_SCRUB_PATTERNS"]``: regular
expressions, e.g. ``r"\\bCUST-\\d{8}\\b"``) before anything is stored. The log pipeline
(ledger.platform.logs) masks with the same built-in patterns.

This module imports no app and no model, so the settings module (through ledger.platform.logs) and
every layer may import it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from django.conf import settings

REDACTED = "[redacted]"

# An e-mail address (RFC 5322's common shape) and an international phone number (E.164, with
# its `+`): masked in free text below, and refused in new idempotency keys (ledger.rules.key_rules).
EMAIL_ADDRESS = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
PHONE_INTERNATIONAL = re.compile(r"(?<![\w+])\+\d[\d ().-]{6,}\d")

PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer <anything>
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"), "Bearer " + REDACTED),
    # Our API keys (og_<prefix>_<secret>) and common provider secret shapes.
    (re.compile(r"\bog_[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}"), REDACTED),
    # name=value / name: value for credential-looking names inside free text.
    (
        re.compile(r"(?i)\b(api[_-]?key|apikey|secret|password|passwd|token|authorization)(\s*[=:]\s*)[^\s,;&]+"),
        r"\1\2" + REDACTED,
    ),
    (EMAIL_ADDRESS, REDACTED),
    # Phone numbers: international (+61 412 345 678), national with a leading 0
    # (0412 345 678) and E.164 digits without the plus (11-15 digits standing alone).
    (PHONE_INTERNATIONAL, REDACTED),
    (re.compile(r"(?<![\w.:/-])0\d(?:[ -]?\d){7,10}(?![\w.:/-])"), REDACTED),
    (re.compile(r"(?<![\w.:/-])\d{11,15}(?![\w.:/-])"), REDACTED),
)
# A quick screen: text without any of these characters cannot match a pattern above.
SUSPECT = re.compile(r"@|\d{7}|\d[ ().-]\d|(?i:bearer|og_|_live_|_test_|key|secret|passw|token|authoriz)")


def redact_text(text: str) -> str:
    """Mask e-mail addresses, phone numbers, bearer tokens and API keys in ``text``."""
    if not SUSPECT.search(text):
        return text
    for pattern, replacement in PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=8)
def _compiled(sources: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(source) for source in sources)


def configured_patterns() -> tuple[re.Pattern[str], ...]:
    """The deployment's identifier patterns (``ONCEGUARD["ERROR_SCRUB_PATTERNS"]``)."""
    sources: Iterable[str] = getattr(settings, "ONCEGUARD", {}).get("ERROR_SCRUB_PATTERNS", ())
    return _compiled(tuple(sources))


def scrub(text: str) -> str:
    """``text`` with personal data and secrets masked, for storage in a plaintext column."""
    text = redact_text(text)
    for pattern in configured_patterns():
        text = pattern.sub(REDACTED, text)
    return text
