"""Prometheus text at /metrics (DESIGN §7): counts and ages only, never payloads or keys.

Set METRICS_TOKEN to require `Authorization: Bearer <token>` from the scraper.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable

from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse

from ledger import selectors, sql
from ledger.models import OperationStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _oldest_age_seconds(states: Iterable[str]) -> float:
    """Age of the oldest row in these states by updated_at (served by the partial indexes)."""
    states = list(states)
    marks = ", ".join(["%s"] * len(states))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MIN(updated_at) FROM ledger_operation WHERE status IN ({marks})", states)
        oldest = sql.to_datetime(cursor.fetchone()[0])
    if oldest is None:
        return 0.0
    return max(0.0, (sql.db_now() - oldest).total_seconds())


def _lines() -> list[str]:
    from dlq.models import FailedEvent, FailedEventStatus

    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            out.append(f"{name}{labels} {value:g}")

    metric(
        "onceguard_oldest_eligible_operation_age_seconds",
        "gauge",
        "How long the oldest operation a worker could take now has been due.",
        [("", selectors.metrics_oldest_eligible_age_seconds())],
    )
    metric(
        "onceguard_admission_rejects_total",
        "counter",
        "Execute-mode admissions refused, by reason.",
        [(f'{{reason="{r}"}}', n) for r, n in sorted(selectors.metrics_admissions_refused_by_reason().items())],
    )
    metric(
        "onceguard_active_leases",
        "gauge",
        "Operations held by a live lease.",
        [("", selectors.metrics_active_leases())],
    )
    metric(
        "onceguard_attempts_total",
        "counter",
        "Attempts by outcome.",
        [(f'{{outcome="{o}"}}', n) for o, n in sorted(selectors.metrics_attempts_by_outcome().items())],
    )
    metric(
        "onceguard_reconciliation_lag_seconds",
        "gauge",
        "Age of the oldest uncertain operation.",
        [("", _oldest_age_seconds([OperationStatus.UNCERTAIN]))],
    )
    backlog = {s: 0 for s in FailedEventStatus.values}
    for row in FailedEvent.objects.values("status").annotate(n=Count("id")):
        backlog[row["status"]] = row["n"]
    metric(
        "onceguard_dlq_entries",
        "gauge",
        "Dead-letter entries by status.",
        [(f'{{status="{s}"}}', n) for s, n in sorted(backlog.items())],
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM ledger_operation WHERE status = %s", [OperationStatus.REVIEW])
        review = cursor.fetchone()[0]
    metric("onceguard_review_backlog", "gauge", "Operations waiting for a human decision.", [("", review)])
    metric(
        "onceguard_review_oldest_age_seconds",
        "gauge",
        "Age of the oldest operation in review.",
        [("", _oldest_age_seconds([OperationStatus.REVIEW]))],
    )
    return out


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = os.environ.get("METRICS_TOKEN", "")
    if token:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return HttpResponse("unauthorized\n", status=401, content_type=CONTENT_TYPE)
    return HttpResponse("\n".join(_lines()) + "\n", content_type=CONTENT_TYPE)
