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


@register.tag(name="console_result_list")
def console_result_list_tag(parser: Any, token: Any) -> Any:
    """Django's ``{% result_list cl %}``, its rows rendered by review.listing (same HTML)."""
    from django.contrib.admin.templatetags.base import InclusionAdminNode

    from review.listing import result_list

    return InclusionAdminNode(
        parser, token, func=result_list, template_name="change_list_results.html", takes_context=False
    )
