"""``/metrics`` in the Prometheus text format (DESIGN §7): counts, ages and latencies only,
never payloads or keys.

Two sources, one exposition:

- the database, read at scrape time (backlogs, ages, attempts, DLQ, review, providers held
  back, the scheduler's heartbeat): the same answer from any web node;
- the latency histograms the processes record (``ledger.platform.telemetry``), added up across
  every web and worker process of this node when ``PROMETHEUS_MULTIPROC_DIR`` is set.

Tenant and provider labels appear only where their number is bounded: per-tenant series
cover at most ``METRICS_TENANT_LABELS`` tenants (the largest; the rest are summed under
``tenant="_other"``), provider series list only providers held back right now.
Every port that serves it (the web app's ``/metrics`` and ``manage.py metrics_serve``) answers
through :func:`metrics_answer`: only a scraper sending ``Authorization: Bearer <METRICS_TOKEN>``
gets figures; a wrong or missing token gets 401, and with no token configured the endpoint is
off (404) — the labels name tenants, so nothing is served to anyone by default.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, connections
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from dlq.models import FailedEvent, FailedEventStatus
from ledger.models import OpenOperation, OperationStatus, Provider, Tenant
from ledger.platform import env
from ledger.platform.errors import DomainError
from ledger.protocol import selectors
from ledger.store import sql
from observability.scheduler import scheduler_ages

OTHER = "_other"


def _oldest_age_seconds(states: Iterable[str]) -> float:
    """Age of the oldest row in these states by updated_at (served by the partial indexes)."""
    states = list(states)
    marks = ", ".join(["%s"] * len(states))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MIN(updated_at) FROM ledger_open_operation WHERE status IN ({marks})", states)
        oldest = sql.to_datetime(cursor.fetchone()[0])
    if oldest is None:
        return 0.0
    return max(0.0, (sql.db_now() - oldest).total_seconds())


def _tenant_labels(counts: Counter[int]) -> dict[int, str]:
    """tenant id → label: the slugs of the largest METRICS_TENANT_LABELS tenants, _other else."""
    limit = int(getattr(settings, "METRICS_TENANT_LABELS", 20))
    named = [tenant_id for tenant_id, _ in counts.most_common(limit)] if limit > 0 else []
    slugs = dict(Tenant.objects.filter(pk__in=named).values_list("pk", "slug"))
    return {tenant_id: slugs.get(tenant_id, OTHER) for tenant_id in counts}


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class DatabaseCollector(Collector):
    """Figures read from the database at scrape time (the names predate this module)."""

    def collect(self) -> Iterator[Metric]:
        yield _gauge(
            "onceguard_oldest_eligible_operation_age_seconds",
            "How long the oldest operation a worker could take now has been due.",
            selectors.metrics_oldest_eligible_age_seconds(),
        )
        rejects = CounterMetricFamily(
            "onceguard_admission_rejects", "Execute-mode admissions refused, by reason.", labels=["reason"]
        )
        for reason, n in sorted(selectors.metrics_admissions_refused_by_reason().items()):
            rejects.add_metric([reason], n)
        yield rejects
        yield _gauge("onceguard_active_leases", "Operations held by a live lease.", selectors.metrics_active_leases())
        attempts = CounterMetricFamily("onceguard_attempts", "Attempts by outcome.", labels=["outcome"])
        for outcome, n in sorted(selectors.metrics_attempts_by_outcome().items()):
            attempts.add_metric([outcome], n)
        yield attempts
        yield _gauge(
            "onceguard_reconciliation_lag_seconds",
            "Age of the oldest uncertain operation.",
            _oldest_age_seconds([OperationStatus.UNCERTAIN]),
        )
        yield from self._open_operations()
        yield from self._dlq()
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM ledger_open_operation WHERE status = %s", [OperationStatus.REVIEW])
            review = cursor.fetchone()[0]
        yield _gauge("onceguard_review_backlog", "Operations waiting for a human decision.", review)
        yield _gauge(
            "onceguard_review_oldest_age_seconds",
            "Age of the oldest operation in review.",
            _oldest_age_seconds([OperationStatus.REVIEW]),
        )
        yield from self._providers_held_back()
        yield from self._scheduler()

    def _open_operations(self) -> Iterator[Metric]:
        rows = list(
            # Every open row, off the work queue's mirror (ADR 0017).
            OpenOperation.objects.values_list("tenant_id", "status").annotate(n=Count("operation_id")).order_by()
        )
        per_tenant: Counter[int] = Counter()
        for tenant_id, _, n in rows:
            per_tenant[tenant_id] += n
        labels = _tenant_labels(per_tenant)
        series: Counter[tuple[str, str]] = Counter()
        for tenant_id, status, n in rows:
            series[(labels[tenant_id], status)] += n
        metric = GaugeMetricFamily(
            "onceguard_open_operations",
            "Operations not yet terminal, by tenant and state.",
            labels=["tenant", "status"],
        )
        for (tenant, status), n in sorted(series.items()):
            metric.add_metric([tenant, status], n)
        yield metric

    def _dlq(self) -> Iterator[Metric]:
        backlog = dict.fromkeys(FailedEventStatus.values, 0)
        pending: Counter[int] = Counter()
        for tenant_id, status, n in (
            FailedEvent.objects.values_list("tenant_id", "status").annotate(n=Count("id")).order_by()
        ):
            backlog[status] += n
            if status == FailedEventStatus.PENDING:
                pending[tenant_id] += n
        by_status = GaugeMetricFamily("onceguard_dlq_entries", "Dead-letter entries by status.", labels=["status"])
        for status, n in sorted(backlog.items()):
            by_status.add_metric([status], n)
        yield by_status
        labels = _tenant_labels(pending)
        per_tenant: Counter[str] = Counter()
        for tenant_id, n in pending.items():
            per_tenant[labels[tenant_id]] += n
        by_tenant = GaugeMetricFamily(
            "onceguard_dlq_pending_entries", "Dead-letter entries waiting for a replay, by tenant.", labels=["tenant"]
        )
        for tenant, n in sorted(per_tenant.items()):
            by_tenant.add_metric([tenant], n)
        yield by_tenant

    def _providers_held_back(self) -> Iterator[Metric]:
        now = timezone.now()
        metric = GaugeMetricFamily(
            "onceguard_provider_held_back",
            "1 for each provider workers skip right now: paused (401/403, needs provider_resume) or throttled"
            " (429/503 Retry-After).",
            labels=["tenant", "provider", "reason"],
        )
        held = Provider.objects.filter(paused_at__isnull=False) | Provider.objects.filter(throttled_until__gt=now)
        for tenant, slug, paused_at in held.values_list("tenant__slug", "slug", "paused_at").order_by("tenant", "slug"):
            metric.add_metric([tenant, slug, "paused" if paused_at else "throttled"], 1)
        yield metric

    def _scheduler(self) -> Iterator[Metric]:
        ages = scheduler_ages()
        yield _gauge(
            "onceguard_scheduler_heartbeat_age_seconds",
            "Seconds since the django-q2 cluster last finished a task (schedules fire every minute).",
            ages.heartbeat_age_seconds,
        )
        yield _gauge(
            "onceguard_scheduler_stale",
            "1 when the heartbeat is older than SCHEDULER_STALE_SECONDS.",
            int(ages.heartbeat_stale),
        )
        yield _gauge(
            "onceguard_sweeper_last_run_age_seconds",
            "Seconds since the sweeper last completed a scheduled pass.",
            ages.sweeper_age_seconds,
        )
        yield _gauge(
            "onceguard_sweeper_stale",
            "1 when the sweeper's last run is older than SWEEPER_STALE_SECONDS.",
            int(ages.sweeper_stale),
        )


class _ThisProcess(Collector):
    """The process's own registry (one-process mode): its histograms and process figures."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def metrics_registry() -> CollectorRegistry:
    """A registry for one scrape: the database's figures and the processes' histograms."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    folder = env.read("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        MultiProcessCollector(registry, path=folder)
    else:
        registry.register(_ThisProcess())
    return registry


class MetricsOff(DomainError):
    """No METRICS_TOKEN is configured: the endpoint does not exist (metrics are off by default)."""

    status, code, title = 404, "not_found", "Not found"


class MetricsTokenRequired(DomainError):
    """The scraper sent no bearer token, or not the configured one."""

    status, code, title = 401, "unauthenticated", "Authentication required"


def metrics_refusal(authorization: str) -> DomainError | None:
    """Why a scrape with this ``Authorization`` header is refused, or None when it may read."""
    token = getattr(settings, "METRICS_TOKEN", "")
    if not token:
        # Nothing said about why: an anonymous caller learns no more than from any unknown path.
        return MetricsOff("Not found.")
    scheme, _, sent = authorization.strip().partition(" ")
    # Digests of both sides: compare_digest then compares equal lengths, so the timing shows
    # neither how much of the token matched nor how long it is.
    sent_digest = hashlib.sha256(sent.strip().encode("utf-8", "replace")).digest()
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent_digest, hashlib.sha256(token.encode()).digest()):
        return MetricsTokenRequired("Send the scraper's token as Authorization: Bearer <METRICS_TOKEN>.")
    return None


@dataclass(frozen=True)
class MetricsAnswer:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _refused(refusal: DomainError, instance: str) -> MetricsAnswer:
    # The members config.problems writes for every error (RFC 9457). Built here because
    # metrics_serve answers without Django's request cycle and observability sits below config.
    document = {
        "type": f"https://onceguard.invalid/problems/{refusal.code}",
        "title": refusal.title,
        "status": refusal.status,
        "code": refusal.code,
        "detail": refusal.detail,
        "instance": instance,
    }
    headers = [("Cache-Control", "no-store")]
    if refusal.status == 401:
        headers.append(("WWW-Authenticate", 'Bearer realm="metrics"'))
    return MetricsAnswer(refusal.status, "application/problem+json", json.dumps(document).encode(), tuple(headers))


def metrics_answer(*, authorization: str, accept: str, instance: str = "/metrics") -> MetricsAnswer:
    """One scrape, on whichever port: the exposition, or the problem saying why not."""
    refusal = metrics_refusal(authorization)
    if refusal is not None:
        return _refused(refusal, instance)
    encoder, content_type = choose_encoder(accept)
    return MetricsAnswer(200, content_type, encoder(metrics_registry()), (("Cache-Control", "no-store"),))


def metrics_view(request: HttpRequest) -> HttpResponse:
    answer = metrics_answer(
        authorization=request.headers.get("Authorization", ""),
        accept=request.headers.get("Accept", ""),
        instance=request.path,
    )
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.headers:
        response[name] = value
    return response


def metrics_wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """``/metrics`` for ``metrics_serve`` (no Django request cycle): the same answer as the web
    app's, each scrape on a fresh database connection closed after it."""
    path = environ.get("PATH_INFO") or "/"
    authorization = environ.get("HTTP_AUTHORIZATION", "")
    refusal = metrics_refusal(authorization) if path == "/metrics" else MetricsOff("Only /metrics is served here.")
    if refusal is not None:
        answer = _refused(refusal, path)
    else:
        try:
            answer = metrics_answer(authorization=authorization, accept=environ.get("HTTP_ACCEPT", ""))
        finally:
            # Each scrape runs in its own thread on its own connection (so one broken by a
            # database restart is never reused); it would outlive the thread otherwise.
            connections.close_all()
    status = f"{answer.status} {_REASONS.get(answer.status, '')}".strip()
    start_response(status, [("Content-Type", answer.content_type), *answer.headers])
    return [answer.body]


_REASONS = {200: "OK", 401: "Unauthorized", 404: "Not Found"}
