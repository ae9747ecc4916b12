"""Template filters for the console's one way of showing times, ids, states (ledger.web.display)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.template.loader import select_template

from ledger.web import display
from review.console.listing import result_list

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


@register.simple_tag(name="console_result_list")
def console_result_list(cl: Any) -> Any:
    """Django's ``{% result_list cl %}``, its rows rendered by review.console.listing (same HTML), from
    the template Django's tag would pick (a model's or an app's own first). Public template
    API, not the admin's private InclusionAdminNode (docs/adr/0004-private-framework-apis.md)."""
    app_label, model_name = cl.opts.app_label.lower(), cl.opts.model_name
    template = select_template(
        [
            f"admin/{app_label}/{model_name}/change_list_results.html",
            f"admin/{app_label}/change_list_results.html",
            "admin/change_list_results.html",
        ]
    )
    return template.render(result_list(cl))
