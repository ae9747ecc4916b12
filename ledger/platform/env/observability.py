"""Log lines, and what health checks and Prometheus metrics read."""

from __future__ import annotations

from ledger.platform.env.declare import (
    CHOICE,
    INT,
    PATH,
    STR,
    Setting,
    _group,
    _s,
)

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


LOGGING: list[Setting] = _group(
    "Logging",
    "settings.{}",
    _s("LOG_LEVEL", CHOICE, "INFO", "Level of the service's log lines.", choices=_LOG_LEVELS),
    _s(
        "LOG_FORMAT",
        CHOICE,
        "kv",
        "json: one JSON object per line; kv: <time> <LEVEL> <logger> <event> key=value ….",
        choices=("kv", "json"),
    ),
    _s(
        "REQUEST_LOG_SLOW_MS",
        INT,
        0,
        "Log only error answers and requests of at least this many ms (0: no request log).",
        minimum=0,
    ),
)


HEALTH_AND_METRICS: list[Setting] = _group(
    "Health and metrics",
    "settings.{}",
    _s(
        "PROMETHEUS_MULTIPROC_DIR",
        PATH,
        "",
        """Folder through which several processes add up their histograms
        (prometheus-client's multi-process mode); set in every process's environment.""",
    ),
    _s(
        "METRICS_TOKEN",
        STR,
        "",
        "/metrics answers only Authorization: Bearer <token> (at least 16 characters). Unset: off.",
        secret=True,
    ),
    _s(
        "METRICS_TOKEN_FILE",
        PATH,
        "",
        "File holding the metrics token, when METRICS_TOKEN is unset.",
        read_as="settings.METRICS_TOKEN",
    ),
    _s(
        "METRICS_TENANT_LABELS",
        INT,
        20,
        "Per-tenant series cover at most this many tenants; the rest are summed.",
        minimum=0,
    ),
    _s(
        "METRICS_PROVIDER_LABELS",
        INT,
        50,
        "Per-provider series cover at most this many providers.",
        minimum=0,
        read_as="ledger.platform.telemetry",
    ),
    _s(
        "METRICS_REVISION_LABELS",
        INT,
        200,
        "Per-revision series cover at most this many revisions.",
        minimum=0,
        read_as="ledger.platform.telemetry",
    ),
    _s(
        "METRICS_PRESET_LABELS",
        INT,
        50,
        """Render jobs' preset versions and aspect classes: at most this many values of each get
        their own series per process; the rest are counted under _other.""",
        minimum=0,
        read_as="ledger.platform.telemetry",
    ),
    _s(
        "SCHEDULER_STALE_SECONDS",
        INT,
        300,
        "No django-q2 task finished for this long: onceguard_scheduler_stale=1 and an alert.",
        minimum=1,
    ),
    _s(
        "SWEEPER_STALE_SECONDS",
        INT,
        0,
        "The same for the sweeper; 0: five sweep intervals, at least 300 s.",
        minimum=0,
    ),
)


TRACES: list[Setting] = _group(
    "Traces (OpenTelemetry)",
    "ledger.platform.tracing",
    _s(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        STR,
        "",
        """Base URL of an OTLP/HTTP receiver (a collector, Tempo, Jaeger, Honeycomb …); spans go
        to <url>/v1/traces. Unset: tracing is off, nothing is recorded or sent (ADR 0015).""",
        pattern=r"https?://\S+",
    ),
    _s(
        "OTEL_EXPORTER_OTLP_HEADERS",
        STR,
        "",
        "Headers sent with every export, as name=value pairs separated by commas (a vendor's API key).",
        secret=True,
    ),
    _s(
        "OTEL_SERVICE_NAME",
        STR,
        "onceguard",
        "The service.name the spans carry.",
    ),
    _s(
        "TRACE_LINK_TEMPLATE",
        STR,
        "",
        """Link from an operation's console page to its trace, with {trace_id} where the id goes
        (e.g. https://tempo.example/trace/{trace_id}). Unset: the id is shown without a link.""",
        read_as="settings.TRACE_LINK_TEMPLATE",
    ),
)
