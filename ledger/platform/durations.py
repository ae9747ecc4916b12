"""Durations in words and back: how a delay, a retention period or a window is written ("30 days", "1 day 12 h") and read from what a person types. Below everything, so the trail (ledger.tenants.config_changes) words a change as the console shows it; ledger.web.display offers both to the pages."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from django.utils.dateparse import parse_duration

_WORD_UNITS = (("day", 86400), ("h", 3600), ("min", 60), ("s", 1))


# What a page shows for no value (ledger.web.display shows the same).
EMPTY = "—"


def duration_words(value: timedelta | float | int | None, *, exact: bool = False) -> str:
    """ "30 days", "1 day 2 h", "5 min 3 s", "0 s" — at most two units, or with ``exact`` every
    unit down to the second (what a form shows back, so that saving it changes nothing)."""
    if value is None:
        return EMPTY
    seconds = int(round(value.total_seconds() if isinstance(value, timedelta) else float(value)))
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    parts: list[str] = []
    for name, size in _WORD_UNITS:
        n, seconds = divmod(seconds, size)
        if n:
            label = name if name != "day" else ("day" if n == 1 else "days")
            parts.append(f"{n} {label}")
        if not exact and (len(parts) == 2 or (parts and name == "day" and seconds < 3600)):
            break
    return sign + (" ".join(parts) if parts else "0 s")


# What a person types for a duration: every spelling of a unit, in seconds.
_UNIT_SECONDS: dict[str, int] = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * 86400),
}
# Refused with a reason: "m" is minutes to some and months to others, and a month or a year
# has no fixed length (a retention period that silently loses a leap day is not "7 years").
_UNCLEAR_UNITS = frozenset({"m", "mo", "mos", "mon", "month", "months", "y", "yr", "yrs", "year", "years"})
_TERM = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_TERMS = re.compile(r"(?:\d+(?:\.\d+)?\s*[a-z]+\s*)+")
DURATION_MAX = timedelta(days=36500)
DURATION_HELP = '"30 days", "12 hours", "90d", "2 weeks", "1 day 12 h" or a number of days'


def duration_parse(text: str) -> timedelta | None:
    """A duration as a person types it: "30 days", "12 hours", "90d", "2 weeks", "1 day 12 h",
    "1 day, 6 hours and 30 min", "1.5 days", or a plain number of days ("30"); also Django's and
    ISO 8601's forms ("30 00:00:00", "30 days, 0:00:00", "P30D"). Empty text is None.

    Raises ValueError with a message for a person: for anything else, months and years (no
    fixed length), a bare "m" (minutes or months?), a negative duration, one finer than a
    second or one longer than 100 years."""
    if len(text) > 100:
        raise ValueError(f"Too long for a duration: enter one such as {DURATION_HELP}.")
    words = " ".join(text.lower().replace(",", " ").split())
    words = re.sub(r"\band\b", " ", words).strip()
    if not words:
        return None
    if words.isdigit():
        seconds = Decimal(words) * 86400
    elif _TERMS.fullmatch(words):
        seconds = Decimal(0)
        for number, unit in _TERM.findall(words):
            if unit == "m":
                raise ValueError(
                    'Is "m" minutes or months? Say "min" for minutes; give months as days, e.g. "180 days".'
                )
            if unit in _UNCLEAR_UNITS:
                raise ValueError(
                    'Months and years vary in length: give months or years as days or weeks, e.g. "180 days",'
                    ' "52 weeks".'
                )
            if unit not in _UNIT_SECONDS:
                raise ValueError(f'Unknown unit "{unit}": use seconds, min, hours, days or weeks ({DURATION_HELP}).')
            seconds += Decimal(number) * _UNIT_SECONDS[unit]
    else:
        # (ISO 8601's designators are capitals: "P30D", "PT12H".)
        try:
            parsed = parse_duration(words) or parse_duration(words.upper())
        except (OverflowError, ValueError):  # e.g. "99999999999 00:00:00": past timedelta's range
            raise ValueError(f"At most {DURATION_MAX.days} days (100 years); leave it empty to keep forever.") from None
        if parsed is None:
            raise ValueError(f"Enter a duration such as {DURATION_HELP}.")
        seconds = Decimal(parsed.days) * 86400 + parsed.seconds + Decimal(parsed.microseconds) / 1_000_000
    if seconds < 0:
        raise ValueError("A duration cannot be negative.")
    if seconds != seconds.to_integral_value():
        raise ValueError("Give the duration in whole seconds at the finest.")
    if seconds > Decimal(DURATION_MAX.days) * 86400:
        raise ValueError(f"At most {DURATION_MAX.days} days (100 years); leave it empty to keep forever.")
    return timedelta(seconds=int(seconds))
