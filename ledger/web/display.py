"""How the console shows times, durations, ids, states and yes/no — one way, on every page.

Lives at the floor so every app's console pages (ledger, alerts, dlq, review) format alike:

* a moment is the exact time with seconds and zone (``2026-12-01 18:42:19 UTC``, the
  ``DATETIME_FORMAT`` of ``config/formats``), or a relative age ("12 min ago") carrying the
  exact time on hover;
* a duration is words ("30 days", "1 h 5 min");
* a long id is shortened, the full value on hover and copied by a click (console.js);
* a state is a coloured badge: green only for a good end, red only for a bad one;
* yes/no is neutral text unless the value is really good or bad.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.utils import dateformat, formats, timezone
from django.utils.functional import Promise
from django.utils.safestring import SafeString

from ledger.models import OperationMode, OperationStatus
from ledger.platform.durations import (  # noqa: F401  (the pages format durations through display, as everything else)
    DURATION_HELP,
    DURATION_MAX,
    EMPTY,
    duration_parse,
    duration_words,
)

# Tones, not colours: console.css says what each looks like.
GOOD, BAD, WARN, BUSY, WAIT, MUTED = "good", "bad", "warn", "busy", "wait", "muted"
STATUS_TONES: dict[str, str] = {
    # operations
    OperationStatus.QUEUED: BUSY,
    OperationStatus.CLAIMED: BUSY,
    OperationStatus.RETRY_WAIT: BUSY,
    OperationStatus.WAITING: BUSY,
    OperationStatus.UNCERTAIN: WARN,
    OperationStatus.REVIEW: WARN,
    OperationStatus.SUCCEEDED: GOOD,
    OperationStatus.FAILED: BAD,
    OperationStatus.ABANDONED: MUTED,
    # DLQ entries
    "pending": WARN,
    "replaying": BUSY,
    "replayed": GOOD,
    "resolved": GOOD,
    "discarded": MUTED,
    # replays, attempts
    "ambiguous": WARN,
    "refused": BAD,
    "transient": BUSY,
    "fenced": MUTED,
    "not_found": MUTED,
    "expired": MUTED,
    # alerts, providers
    "open": WARN,
    "acknowledged": BUSY,
    "paused": BAD,
    "throttled": WARN,
    "running": MUTED,
    "waiting_for_caller": WAIT,
}


def escape(value: Any) -> str:
    """django.utils.html.conditional_escape, without its lazy-argument wrapper per call: a
    value with ``__html__`` as it is, anything else escaped (a console list calls
    this some thousand times a page)."""
    if isinstance(value, Promise):
        value = str(value)
    if hasattr(value, "__html__"):
        return value.__html__()
    return html.escape(str(value))


def format_html(format_string: str, *args: Any) -> SafeString:
    """django.utils.html.format_html (positional arguments), the same output at a third of
    its cost: each argument escaped unless it is safe, the result marked safe."""
    return SafeString(format_string.format(*[escape(a) for a in args]))


# DateFormat's specifiers a console format uses, each written as DateFormat writes it.
_DATE_PARTS: dict[str, Callable[[datetime], str]] = {
    "Y": lambda d: f"{d.year:04d}",
    "m": lambda d: f"{d.month:02d}",
    "d": lambda d: f"{d.day:02d}",
    "H": lambda d: f"{d.hour:02d}",
    "i": lambda d: f"{d.minute:02d}",
    "s": lambda d: f"{d.second:02d}",
}


@lru_cache(maxsize=16)
def _compiled(format_string: str) -> tuple[str | Callable[[datetime], str], ...] | None:
    """``format_string`` split as DateFormat splits it, each specifier its writer (``T``:
    None, the zone); None when it uses a specifier not written here (then Django formats)."""
    pieces: list[Any] = []
    for i, piece in enumerate(dateformat.re_formatchars.split(format_string)):
        if i % 2:
            if piece == "T":
                pieces.append(None)
            elif piece in _DATE_PARTS:
                pieces.append(_DATE_PARTS[piece])
            else:
                return None
        elif piece:
            pieces.append(dateformat.re_escaped.sub(r"\1", piece))
    return tuple(pieces)


def when(moment: datetime | None) -> str:
    """The exact time, with seconds and zone, in the console's time zone.

    What ``formats.date_format(localtime(moment), "DATETIME_FORMAT")`` writes, with the
    format parsed once instead of on every call (a list shows two per row: that parse was
    most of a list's per-row time)."""
    if moment is None:
        return EMPTY
    local = timezone.localtime(moment)
    format_string = str(formats.get_format("DATETIME_FORMAT"))
    pieces = _compiled(format_string)
    if pieces is None or local.tzinfo is None:
        return formats.date_format(local, "DATETIME_FORMAT")
    out = []
    for piece in pieces:
        if piece is None:
            # DateFormat.T: the zone's name, empty for a time that is ambiguous or imaginary
            # in it (a DST change).
            if _ambiguous_or_imaginary(local):
                out.append("")
            else:
                out.append(str(local.tzinfo.tzname(local)))
        elif isinstance(piece, str):
            out.append(piece)
        else:
            out.append(piece(local))
    return "".join(out)


def _ambiguous_or_imaginary(local: datetime) -> bool:
    # django.utils.timezone._datetime_ambiguous_or_imaginary, for the moment's own zone.
    tz = local.tzinfo
    assert tz is not None
    return tz.utcoffset(local.replace(fold=not local.fold)) != tz.utcoffset(local)


def age_words(moment: datetime, now: datetime | None = None) -> str:
    """ "12 min ago" or "in 3 min": one unit, rounded down."""
    now = now or timezone.now()
    seconds = int((now - moment).total_seconds())
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 5:
        return "just now"
    for name, size in (("day", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            n = seconds // size
            label = ("day" if n == 1 else "days") if name == "day" else name
            return f"in {n} {label}" if future else f"{n} {label} ago"
    return "just now"


def age(moment: datetime | None, now: datetime | None = None, *, prefix: str = "") -> SafeString | str:
    """A relative age with the exact time on hover (and in ``datetime`` for machines)."""
    if moment is None:
        return EMPTY
    return format_html(
        '<time class="og-age" datetime="{}" title="{}">{}{}</time>',
        moment.isoformat(),
        when(moment),
        prefix,
        age_words(moment, now),
    )


def short_id(value: Any, *, keep: int = 18) -> SafeString | str:
    """A long id shortened to its head and tail; the full value on hover and copied on click."""
    text = "" if value is None else str(value)
    if not text:
        return EMPTY
    if len(text) <= keep + 2:
        shown = text
    else:
        head = max(6, keep - 8)
        shown = f"{text[:head]}…{text[-6:]}"
    return format_html('<span class="og-id" title="{} (click to copy)" data-copy="{}">{}</span>', text, text, shown)


def badge(state: str, label: str | None = None, *, tone: str | None = None, title: str = "") -> SafeString:
    tone = tone or STATUS_TONES.get(state, MUTED)
    return format_html(
        '<span class="og-badge og-tone-{}" data-state="{}"{}>{}</span>',
        tone,
        state,
        format_html(' title="{}"', title) if title else "",
        label if label is not None else str(state).replace("_", " "),
    )


def waits_for_caller(op: Any, now: datetime | None = None) -> bool:
    """A guard-mode row due for another attempt: only its caller can make it happen (by
    claiming the key again); it is not work Onceguard will do."""
    return (
        op.mode == OperationMode.GUARD
        and op.status == OperationStatus.RETRY_WAIT
        and op.next_attempt_at is not None
        and op.next_attempt_at <= (now or timezone.now())
    )


def operation_badge(op: Any, now: datetime | None = None) -> SafeString:
    """The status badge of an operation, saying what a waiting row waits for."""
    now = now or timezone.now()
    if waits_for_caller(op, now):
        return badge(
            "waiting_for_caller",
            "waiting for caller",
            title="Guard mode: the caller must claim the key again; Onceguard does not send it",
        )
    if op.status == OperationStatus.RETRY_WAIT and op.next_attempt_at is not None:
        return badge(op.status, "retry wait", title=f"next attempt {age_words(op.next_attempt_at, now)}")
    return badge(op.status, op.get_status_display())


def yes_no(value: Any) -> str:
    """Neutral yes/no (no green tick, no red cross): most flags are neither good nor bad."""
    if value is None:
        return EMPTY
    return "yes" if value else "no"


def truncate(text: str, length: int = 120) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= length else text[: length - 1] + "…"


# A shortened id's full value (short_id) stands for the element; a block inside a cell
# (a badge's second line) becomes a separator; every other tag goes.
_COPIED = re.compile(r'<span\b[^>]*\bdata-copy="([^"]*)"[^>]*>.*?</span>', re.S)
# An age (``age``) is its exact time, in UTC.
_TIME = re.compile(r'<time\b[^>]*\bdatetime="([^"]*)"[^>]*>.*?</time>', re.S)
_BLOCK = re.compile(r"<(?:div|br|p|li)\b[^>]*>", re.I)
_TAG = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")


def plain_text(markup: str) -> str:
    """The text a person reads in a console cell's HTML (``format_html`` output), no markup."""
    text = _COPIED.sub(lambda m: m.group(1), markup)
    text = _TIME.sub(lambda m: _iso_utc(html.unescape(m.group(1))), text)
    text = _BLOCK.sub(" · ", text)
    text = html.unescape(_TAG.sub("", text))
    return _SPACES.sub(" ", text).strip(" ·")


def _iso_utc(text: str) -> str:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    return csv_value(moment)


def csv_value(value: Any) -> str:
    """``value`` as an export writes it (console exports and a person's trail export): plain
    text, never the console's markup; times in ISO 8601, UTC; numbers as numbers."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, SafeString) or (isinstance(value, str) and "<" in value and _TAG.search(value)):
        # Console markup (format_html); a stored text holding "<" is not markup and stays.
        return plain_text(value) if isinstance(value, SafeString) else value
    return str(value)


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell (``csv_value``) a spreadsheet will never run as a formula: a
    cell beginning with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is prefixed with
    ``'`` (OWASP, *CSV Injection*). A number is left as it is: ``-5`` is not a formula."""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return str(value)
    text = csv_value(value)
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text
