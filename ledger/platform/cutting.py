"""A record's own values cut out of free text: the one cutter erasure and failed-attempt
evidence share.

Pattern masking (``ledger.platform.redaction``) finds what *looks* like personal data — an
e-mail address, a phone number, a token. A provider's error often echoes what it was sent in
words no pattern knows: a name, a street, a company. The values of the record itself are the
surest list of what must not survive it, so both erasure (``review.privacy.erasure``: a
person's values out of the texts that stay) and a failed attempt's evidence (ADR 0016: the
job's values out of the error text that outlives the job) read every string of the record's
plaintext and cut each out.

Imports ``ledger.platform.crypto`` (the normalised forms of phone numbers and e-mail addresses)
and nothing above the platform.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ledger.platform import crypto

# Values shorter than this are not cut from free text (a "1", "no" or "AU" would cut
# everywhere); identifiers are always long enough.
MIN_VALUE_LENGTH = 3


def readable_value(stored: Any) -> Any:
    """A stored (sealed, plain or redacted) value as plaintext to cut with; None when there is
    nothing to read: absent, redacted, or sealed under a key no longer configured (then
    unreadable already — nothing of it can be echoed that we could still cut)."""
    if stored is None or crypto.is_redacted(stored):
        return None
    try:
        return crypto.open_json(stored)
    except crypto.EncryptionKeyError:
        return None


def value_strings(value: Any, out: set[str], depth: int = 0) -> None:
    """Every text (and long number) in a plaintext value, and the words of short texts (a
    name is also written as its parts), and the normalised forms of phone numbers and
    e-mail addresses, into ``out``."""
    if depth > 12:
        return
    if isinstance(value, dict):
        for v in value.values():
            value_strings(v, out, depth + 1)
    elif isinstance(value, list):
        for v in value:
            value_strings(v, out, depth + 1)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, (int, float)):
        text = str(value)
        if len(text) >= 6:
            out.add(text)
    elif isinstance(value, str):
        text = value.strip()
        if len(text) >= MIN_VALUE_LENGTH:
            out.add(text)
        if len(text) <= 120:
            out.update(w for w in re.split(r"[\s,;:()<>\"]+", text) if len(w) >= MIN_VALUE_LENGTH)
        for kind in ("phone", "email"):
            normalized = crypto.normalize_identifier(kind, text)
            if normalized and len(normalized) >= 8 and (kind == "email" or re.search(r"\d{6}", text)):
                out.add(normalized)


class ValueCutter:
    """Cuts one record's values out of free text, longest first, ignoring case; counts the
    texts it changed."""

    def __init__(self, values: Iterable[str], *, replacement: str) -> None:
        words = sorted({v for v in values if v}, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE) if words else None
        self.replacement = replacement
        self.changed = 0

    def cut(self, text: str) -> str:
        if not text or self.pattern is None:
            return text
        new = self.pattern.sub(self.replacement, text)
        if new != text:
            self.changed += 1
        return new
