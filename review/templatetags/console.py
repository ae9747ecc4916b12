"""Template filters for the console's one way of showing times, ids, states (ledger.display)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template

from ledger import display

register = template.Library()


@register.filter
def og_age(moment: datetime | None) -> Any:
    """ "12 min ago", the exact time on hover."""
    return display.age(moment)


@register.filter
def og_when(moment: datetime | None) -> str:
    return display.when(moment)


@register.filter
def og_duration(value: Any) -> str:
    """ "30 days", "1 h 5 min"."""
    return display.duration_words(value)


@register.filter
def og_short(value: Any, keep: int = 18) -> Any:
    return display.short_id(value, keep=int(keep))


@register.filter
def og_badge(state: str, label: str | None = None) -> Any:
    return display.badge(state, label)
