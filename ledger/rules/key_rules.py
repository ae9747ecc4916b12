"""The idempotency key rule, and how a key is put on the wire (DESIGN §5, "Keys").

A new key is 1–255 characters of printable ASCII (0x20–0x7E, what a Structured Field string
— the IETF draft's ``Idempotency-Key`` — may hold) without surrounding blanks. The rule is a
list of named rules (:data:`KEY_RULES`): a refusal names the one broken in its problem's
``rule`` member, and a rule added later is one more entry.

Keys are logged and shown in clear wherever keys are shown (console lists, exports), while
payloads are masked: a new key holding an e-mail address or an international phone number
(the shapes ledger.platform.redaction masks in free text, the same patterns) breaks the
``personal_data`` rule, unless the tenant allows such keys (``Tenant.personal_data_in_keys_allowed``,
set by the platform). Record ids — long digit runs, a ``+`` inside a token — are not phone
numbers and stay valid; a value that must not be in clear is hashed into the key instead.

The rule is for keys the ledger does not hold yet. A key stored before the rule existed (or
written past it) keeps being answered, so the claim paths look the key up first and apply
the rule only to a fresh one; and whatever puts a stored key on the wire goes through
:func:`key_header_value` or :func:`key_path_segment`, which never raise.

This module imports no app (ledger.platform.redaction imports none either).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ledger.platform.errors import InvalidKey
from ledger.platform.redaction import EMAIL_ADDRESS, PHONE_INTERNATIONAL

MAX_KEY_LENGTH = 255

_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")

# The rule a tenant may waive (Tenant.personal_data_in_keys_allowed).
PERSONAL_DATA = "personal_data"


def _no_personal_data(key: str) -> bool:
    return EMAIL_ADDRESS.search(key) is None and PHONE_INTERNATIONAL.search(key) is None


@dataclass(frozen=True)
class KeyRule:
    """One named rule: ``holds(key)`` is True for a key it lets through; ``message`` is the
    problem's detail when it does not. ``name`` is the problem's ``rule`` member: stable."""

    name: str
    holds: Callable[[str], bool]
    message: str


# In order: the first rule broken is the one reported. A key reaching these is a str.
KEY_RULES: list[KeyRule] = [
    KeyRule(
        "required",
        lambda key: key != "",
        "An idempotency key is required (body `key` or header `Idempotency-Key`).",
    ),
    KeyRule(
        "max_length",
        lambda key: len(key) <= MAX_KEY_LENGTH,
        f"The idempotency key is longer than {MAX_KEY_LENGTH} characters.",
    ),
    KeyRule(
        "printable_ascii",
        lambda key: _PRINTABLE_ASCII.fullmatch(key) is not None,
        "The idempotency key must be printable ASCII characters (0x20–0x7E): no control characters,"
        " no characters beyond ASCII (a fullwidth letter, an accent, an emoji).",
    ),
    KeyRule(
        "no_surrounding_blanks",
        lambda key: key.strip() == key,
        "The idempotency key must not begin or end with a blank.",
    ),
    # Last: a key it refuses breaks no other rule, so a tenant's waiver lets it through whole.
    KeyRule(
        PERSONAL_DATA,
        _no_personal_data,
        "The idempotency key contains an e-mail address or an international phone number: keys are"
        " logged and shown in clear. Use a record id, or hash the value into the key"
        " (POST /api/v1/keys/derive).",
    ),
]


def key_rule_broken(key: Any, *, personal_data_allowed: bool = False) -> KeyRule | None:
    """The first rule ``key`` breaks, or None when it is a valid new key (with
    ``personal_data_allowed``, the tenant's waiver: the ``personal_data`` rule is skipped)."""
    if not isinstance(key, str):
        return KEY_RULES[0]
    return next(
        (
            rule
            for rule in KEY_RULES
            if not (personal_data_allowed and rule.name == PERSONAL_DATA) and not rule.holds(key)
        ),
        None,
    )


def key_refusal(key: Any, *, personal_data_allowed: bool = False) -> InvalidKey | None:
    """The 400 ``invalid_idempotency_key`` a new ``key`` gets (its ``rule`` member names the
    rule broken), or None when the key is valid."""
    rule = key_rule_broken(key, personal_data_allowed=personal_data_allowed)
    if rule is None:
        return None
    return InvalidKey(rule.message, extra={"rule": rule.name})


def key_check(key: Any, *, personal_data_allowed: bool = False) -> str:
    """``key`` when it is a valid new key; raises the refusal otherwise."""
    refusal = key_refusal(key, personal_data_allowed=personal_data_allowed)
    if refusal is not None:
        raise refusal
    return key


def key_lookup_shape(key: Any) -> bool:
    """True when ``key`` may be looked up at all (a non-empty string that fits the column):
    the rules beyond these apply only once the lookup found nothing."""
    return isinstance(key, str) and 0 < len(key) <= MAX_KEY_LENGTH


def key_usable(key: Any, *, personal_data_allowed: bool = False) -> str:
    """``key`` when it is a valid new key, else "" (no usable key): for the DLQ's ingest, which
    never refuses an entry because of the key it reports (``personal_data_allowed``: the
    tenant's waiver, as for a claim)."""
    return key if key_rule_broken(key, personal_data_allowed=personal_data_allowed) is None else ""


# What a header value may hold as is: printable ASCII without surrounding blanks (HTTP strips
# those). Anything else is sent percent-encoded (UTF-8, RFC 3986), the percent sign and blanks
# included, so the value stays printable ASCII and distinct keys stay distinct among the
# encoded ones. A valid key is always sent as is: what providers saw before stays the same.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def key_header_value(key: str) -> str:
    """The value an ``Idempotency-Key`` header carries for ``key``: the key itself when it is
    printable ASCII without surrounding blanks, else its percent-encoded UTF-8 (a stored
    ``order-ｃ`` is sent as ``order-%EF%BD%83``). Never raises."""
    if _PRINTABLE_ASCII.fullmatch(key) and key.strip() == key:
        return key
    return quote(key, safe=_HEADER_SAFE)


def key_path_segment(value: str) -> str:
    """``value`` (a key, a reconciliation handle) as one URL path segment: percent-encoded
    UTF-8, ``/`` included, so it can neither leave its segment nor break the URL."""
    return quote(value, safe="")
