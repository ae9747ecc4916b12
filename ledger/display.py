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

from datetime import datetime, timedelta
from typing import Any

from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledger.models import OperationMode, OperationStatus

EMPTY = "—"

# Tones, not colours: console.css says what each looks like.
GOOD, BAD, WARN, BUSY, WAIT, MUTED = "good", "bad", "warn", "busy", "wait", "muted"
STATUS_TONES: dict[str, str] = {
    # operations
    OperationStatus.QUEUED: BUSY,
    OperationStatus.CLAIMED: BUSY,
    OperationStatus.RETRY_WAIT: BUSY,
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


def when(moment: datetime | None) -> str:
    """The exact time, with seconds and zone, in the console's time zone."""
    if moment is None:
        return EMPTY
    return formats.date_format(timezone.localtime(moment), "DATETIME_FORMAT")


def duration_words(value: timedelta | float | int | None) -> str:
    """ "30 days", "1 day 2 h", "5 min 3 s", "0 s" — at most two units."""
    if value is None:
        return EMPTY
    seconds = int(round(value.total_seconds() if isinstance(value, timedelta) else float(value)))
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    units = (("day", 86400), ("h", 3600), ("min", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        n, seconds = divmod(seconds, size)
        if n:
            label = name if name != "day" else ("day" if n == 1 else "days")
            parts.append(f"{n} {label}")
        if len(parts) == 2 or (parts and name == "day" and seconds < 3600):
            break
    return sign + (" ".join(parts) if parts else "0 s")


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


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell a spreadsheet will never run as a formula (console exports and
    a person's trail export)."""
    text = "" if value is None else str(value)
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text
