"""Health probes for load balancers and orchestrators.

- ``/healthz`` (liveness): the process answers. No database, so a database outage never
  makes an orchestrator restart every web process at once.
- ``/readyz`` (readiness): the database answers and every migration on disk is applied; a
  node failing it is taken out of the load balancer until it passes again.

Both answer ``200`` or ``503`` with a small JSON body and ``Cache-Control: no-store``; a
``503`` for an unreachable database carries the same ``Retry-After`` as the API's
``database_unavailable`` answers (ledger.platform.outage). The
scheduler (django-q2) and the sweeper are *not* readiness: a stalled scheduler must not take
every web node out of the load balancer. Their staleness is a metric and an alert
(``observability.scheduler``).

``HealthProbeMiddleware``, first in ``MIDDLEWARE`` after ``DeadConnectionMiddleware`` (which
only drops database connections the server hung up on), answers the probes before host
validation, sessions, authentication and CSRF run: a load balancer probing by IP address
(a Host header not in ``ALLOWED_HOSTS``) gets the real answer instead of a 400, and no
session or access noise is made for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from ledger.platform.outage import retry_after_seconds

CONTENT_TYPE = "application/json"


def _answer(ok: bool, body: dict[str, object]) -> HttpResponse:
    response = HttpResponse(
        json.dumps({"status": "ok" if ok else "unavailable", **body}),
        status=200 if ok else 503,
        content_type=CONTENT_TYPE,
    )
    response["Cache-Control"] = "no-store"
    return response


def database_check(alias: str = DEFAULT_DB_ALIAS) -> str:
    """ "ok", or why the database cannot be used (the error class only: messages can hold
    host names and user names)."""
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


def migrations_check(alias: str = DEFAULT_DB_ALIAS) -> str:
    """ "ok" when every migration on disk is applied, else how many are not (a node running
    new code against an old schema must not take traffic)."""
    try:
        executor = MigrationExecutor(connections[alias])
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        return f"unknown: {type(exc).__name__}"
    return "ok" if not pending else f"{len(pending)} pending"


@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness: this process answers HTTP. Touches nothing else."""
    return _answer(True, {})


@require_safe
def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness: the database answers and its schema is current."""
    checks = {"database": database_check()}
    if checks["database"] == "ok":
        checks["migrations"] = migrations_check()
    response = _answer(all(v == "ok" for v in checks.values()), {"checks": checks})
    if checks["database"] != "ok":
        response["Retry-After"] = str(retry_after_seconds())
    return response


PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {"/healthz": healthz, "/readyz": readyz}


class HealthProbeMiddleware:
    """Answers GET/HEAD /healthz and /readyz before any other middleware runs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is not None and request.method in ("GET", "HEAD"):
            return probe(request)
        return self.get_response(request)
