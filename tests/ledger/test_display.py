"""The console's one way of reading and writing durations (ledger.web.display): typed as people
say them, shown as "30 days", and what is shown reads back as the same duration."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.platform.durations import DURATION_MAX, duration_parse, duration_words

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("30 days", 30 * DAY),
        ("30 Days", 30 * DAY),
        ("1 day", DAY),
        ("12 hours", 12 * HOUR),
        ("12h", 12 * HOUR),
        ("90d", 90 * DAY),
        ("2 weeks", 14 * DAY),
        ("2w", 14 * DAY),
        ("30", 30 * DAY),  # a plain number is days
        ("  7  ", 7 * DAY),
        ("1 day 12 h", DAY + 12 * HOUR),
        ("1d12h", DAY + 12 * HOUR),
        ("1 day, 6 hours and 30 min", DAY + 6 * HOUR + timedelta(minutes=30)),
        ("45 mins", timedelta(minutes=45)),
        ("90 seconds", timedelta(seconds=90)),
        ("1.5 days", DAY + 12 * HOUR),
        ("0", timedelta(0)),  # (the policy's own rule refuses zero, with its message)
        # Django's own forms and ISO 8601 still read: what the form used to take, what APIs send.
        ("30 00:00:00", 30 * DAY),
        ("30 days, 0:00:00", 30 * DAY),
        ("12:00:00", 12 * HOUR),
        ("P30D", 30 * DAY),
        ("pt12h", 12 * HOUR),
    ],
)
def test_a_duration_is_read_as_people_type_it(typed, meant):
    assert duration_parse(typed) == meant


@pytest.mark.parametrize("typed", ["", "   ", " , and "])
def test_empty_text_is_no_duration(typed):
    assert duration_parse(typed) is None


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("6 months", 'Months and years vary in length: give months or years as days or weeks, e.g. "180 days"'),
        ("1 year", "Months and years vary in length"),
        ("7y", "Months and years vary in length"),
        ("5m", 'Is "m" minutes or months? Say "min" for minutes'),
        ("3 fortnights", 'Unknown unit "fortnights": use seconds, min, hours, days or weeks'),
        ("thirty days", 'Enter a duration such as "30 days", "12 hours", "90d", "2 weeks"'),
        ("30 days ago", "Enter a duration such as"),
        ("1e5 days", 'Unknown unit "e"'),
        ("-5 days", "cannot be negative"),
        ("-1", "cannot be negative"),
        ("1.5 s", "whole seconds"),
        ("36501", "At most 36500 days (100 years); leave it empty to keep forever"),
        ("99999999999 00:00:00", "At most 36500 days"),
        ("P99999999999D", "At most 36500 days"),
        ("9" * 101, "Too long for a duration"),
    ],
)
def test_anything_else_is_refused_with_a_message_saying_what_to_type(typed, says):
    with pytest.raises(ValueError) as refused:
        duration_parse(typed)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("value", "shown", "exact"),
    [
        (30 * DAY, "30 days", "30 days"),
        (DAY, "1 day", "1 day"),
        (12 * HOUR, "12 h", "12 h"),
        (DAY + 2 * HOUR + timedelta(minutes=3), "1 day 2 h", "1 day 2 h 3 min"),
        (timedelta(days=3, minutes=5), "3 days", "3 days 5 min"),
        (timedelta(minutes=5, seconds=3), "5 min 3 s", "5 min 3 s"),
        (timedelta(0), "0 s", "0 s"),
    ],
)
def test_a_duration_is_shown_in_words_at_a_glance_or_exactly(value, shown, exact):
    assert duration_words(value) == shown
    assert duration_words(value, exact=True) == exact


@given(st.integers(min_value=0, max_value=int(DURATION_MAX.total_seconds())))
def test_what_is_shown_exactly_reads_back_as_the_same_duration(seconds):
    value = timedelta(seconds=seconds)
    assert duration_parse(duration_words(value, exact=True)) == value
