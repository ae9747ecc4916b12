"""The front page's numbers, attention list and charts, put into the page's words and links.

The reads are review.console.selectors' (bounded counts, the attention rows, each provider's
activity per hour); here each number gets the link to the list it counts — only for a user
who may open that list — and the activity becomes small stacked bar charts drawn as inline SVG.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from review.console.selectors import CHART_SERIES


def _changelist(site: admin.AdminSite, app: str, model: str, query: str = "") -> str | None:
    try:
        url = reverse(f"{site.name}:{app}_{model}_changelist")
    except NoReverseMatch:
        return None
    return f"{url}?{query}" if query else url


def dashboard_context(request: HttpRequest, numbers: dict[str, Any], site: admin.AdminSite) -> dict[str, Any]:
    """The dashboard's numbers, each with the link to the list it counts."""
    ops_url = lambda q="": _changelist(site, "ledger", "operation", q)  # noqa: E731
    dlq_url = lambda q="": _changelist(site, "dlq", "failedevent", q)  # noqa: E731
    user = request.user
    can_ops = user.has_perm("ledger.view_operation")
    can_dlq = user.has_perm("dlq.view_failedevent")
    return {
        **numbers,
        "operations": [
            {
                "state": s,
                "label": label,
                "n": n.n,
                "count": str(n),
                "url": ops_url(f"status__exact={s}") if can_ops else None,
            }
            for s, label, n in numbers["operations"]
        ],
        "operations_url": ops_url() if can_ops else None,
        "eligible_url": ops_url("needs=due") if can_ops else None,
        "caller_url": ops_url("needs=caller") if can_ops else None,
        "alerts_url": _changelist(site, "alerts", "alert", "state=open")
        if user.has_perm("alerts.view_alert")
        else None,
        "dlq": [
            {
                "state": s,
                "label": label,
                "n": n.n,
                "count": str(n),
                "url": dlq_url(f"status__exact={s}") if can_dlq else None,
            }
            for s, label, n in numbers["dlq"]
        ],
        "dlq_url": dlq_url() if can_dlq else None,
        "review_url": _changelist(site, "review", "reviewitem")
        if (user.has_perm("review.view_reviewitem") or user.has_perm("review.decide_reviewitem"))
        else None,
        "paused_url": _changelist(site, "review", "pausedprovider", "paused=yes")
        if user.has_perm("review.view_pausedprovider")
        else None,
        "purge_url": _changelist(site, "review", "retentionrun") if user.has_perm("review.view_retentionrun") else None,
        "sweep_url": _changelist(site, "django_q", "success", "q=ledger.schedules.sweep_task")
        if user.is_superuser
        else None,
        "subjects_url": reverse(f"{site.name}:onceguard_subjects") if user.has_perm("review.search_subjects") else None,
        "accesslog_url": _changelist(site, "review", "accesslog") if user.has_perm("review.view_accesslog") else None,
    }


def attention_context(request: HttpRequest, rows: dict[str, list[Any]]) -> dict[str, Any]:
    """The "needs attention now" list: only the kinds this user may open, each row one click
    from its page."""
    user = request.user
    out: dict[str, Any] = {}
    if user.has_perm("review.view_reviewitem") or user.has_perm("review.decide_reviewitem"):
        out["review"] = rows["review"]
    if user.has_perm("dlq.view_failedevent"):
        out["dlq"] = rows["dlq"]
    if user.has_perm("ledger.view_approvalrequest"):
        out["approvals"] = rows["approvals"]
    if user.has_perm("review.view_pausedprovider") or user.has_perm("ledger.view_provider"):
        out["paused"] = rows["paused"]
    if user.has_perm("ledger.view_operation"):
        out["stuck"] = rows["stuck"]
    out["empty"] = not any(out.values())
    return out


# Colours of the chart series (fill attributes of the SVG; the legend uses console.css).
CHART_COLOURS = {"succeeded": "#3a9a5e", "reviewed": "#7a4fc2", "dead_lettered": "#e08a1e", "failed": "#c0392b"}
CHART_LABELS = {"succeeded": "succeeded", "failed": "failed", "dead_lettered": "dead-lettered", "reviewed": "reviewed"}
CHART_W, CHART_H, BAR = 288, 56, 12


def charts_context(activity: dict[str, Any]) -> dict[str, Any]:
    """Small stacked bar charts, one per provider, one bar per hour: rectangles computed
    here and drawn as inline SVG by the template (no script, nothing from another origin)."""
    hours = activity["hours"]
    charts = []
    for provider, series in activity["providers"]:
        totals = [sum(series[name][h] for name in CHART_SERIES) for h in range(hours)]
        peak = max(totals) or 1
        rects = []
        for h in range(hours):
            y = CHART_H
            # Bottom to top: the good outcome first, then what needed a person, then failures.
            for name in ("succeeded", "reviewed", "dead_lettered", "failed"):
                n = series[name][h]
                if not n:
                    continue
                height = max(1.0, round(n / peak * (CHART_H - 2), 1))
                y -= height
                rects.append(
                    {
                        "x": h * BAR + 1,
                        "y": round(y, 1),
                        "w": BAR - 2,
                        "h": height,
                        "fill": CHART_COLOURS[name],
                        "title": f"{n} {CHART_LABELS[name]}, hour {h - hours + 1:+d} h",
                    }
                )
        charts.append(
            {
                "provider": provider,
                "rects": rects,
                "peak": peak,
                "totals": [
                    {"name": name, "label": CHART_LABELS[name], "n": sum(series[name])} for name in CHART_SERIES
                ],
            }
        )
    return {
        "charts": charts,
        "width": CHART_W,
        "height": CHART_H,
        "since": activity["since"],
        "until": activity["until"],
    }
