"""The dead-letter queue (``dlq.rules.conf``) and the alerts (``alerts.conf``)."""

from __future__ import annotations

from ledger.platform.env.declare import (
    INT,
    LIST,
    STR,
    Setting,
    _group,
    _s,
)

DLQ: list[Setting] = _group(
    "Dead-letter queue",
    "dlq.rules.conf (ONCEGUARD_DLQ overrides)",
    _s("DLQ_MAX_EVENT_BYTES", INT, 256 * 1024, "Ingest bodies over this are refused with 413.", minimum=1),
    _s(
        "DLQ_SEARCH_PATHS",
        LIST,
        [
            "event_type",
            "action",
            "source",
            "method",
            "path",
            "workflow.id",
            "workflow.name",
            "execution.mode",
            "execution.lastNodeExecuted",
            "call.agent_id",
            "call.disconnection_reason",
        ],
        """Dotted JSON paths whose scalar values are copied in plain text into
        search_fields. Only non-personal paths belong here.""",
    ),
    _s(
        "DLQ_AUTO_REPLAY_MAX_PER_ROOT",
        INT,
        3,
        "At most this many automatic replays per lineage root …",
        minimum=0,
    ),
    _s(
        "DLQ_AUTO_REPLAY_LIFETIME_SECONDS",
        INT,
        24 * 3600,
        "… and only while the root failed less than this long ago.",
        minimum=0,
    ),
    _s(
        "DLQ_AUTO_REPLAY_BASE_DELAY_SECONDS",
        INT,
        60,
        "Minimum wait after a root's last replay before the schedule tries again (× 2^n).",
        minimum=0,
    ),
    _s("DLQ_AUTO_REPLAY_BATCH", INT, 50, "Entries handled per automatic-replay run.", minimum=1),
    _s("DLQ_BULK_REPLAY_PER_SECOND", INT, 5, "Bulk replays are sent at most this fast.", minimum=1),
    _s("DLQ_BULK_MAX_SELECTION", INT, 10_000, "A dry run freezes at most this many entries.", minimum=1),
    _s(
        "DLQ_BULK_DRY_RUN_TTL_SECONDS",
        INT,
        3600,
        "A dry run's selection must be confirmed within this.",
        minimum=1,
    ),
    _s(
        "DLQ_BULK_TASK_BUDGET_SECONDS",
        INT,
        60,
        "One bulk task run stops after this long and re-enqueues itself (< Q_TIMEOUT).",
        minimum=1,
    ),
    _s(
        "DLQ_REPLAYING_STALE_SECONDS",
        INT,
        300,
        "An entry still replaying after this long (sender died) is settled by the recovery pass.",
        minimum=1,
    ),
    _s(
        "DLQ_RESPONSE_KEEP_BYTES",
        INT,
        16 * 1024,
        "Response bodies of replay targets are kept up to this many bytes.",
        minimum=0,
    ),
    _s(
        "DLQ_REPLAY_ALLOW_HTTP",
        INT,
        0,
        """1: replay targets (and their lookups) may be plain http on other hosts than this
        machine. Off by default: a replay carries the target's credential and the entry's data.""",
        minimum=0,
    ),
    _s(
        "DLQ_REPLAY_SECRET_OVERLAP_SECONDS",
        INT,
        86400,
        "After a target's signing secret is rotated, the previous one also signs this long.",
        minimum=0,
    ),
    _s(
        "DLQ_REPLAY_LOOKUP_TIMEOUT_SECONDS",
        INT,
        5,
        "A target's lookup (a search by the business key before a replay) may take this long.",
        minimum=1,
    ),
)


ALERTS: list[Setting] = _group(
    "Alerts",
    "alerts.conf (ONCEGUARD_ALERTS overrides)",
    _s(
        "ALERT_MAX_ATTEMPTS",
        INT,
        5,
        "Delivery attempts of one alert.",
        minimum=1,
        former_names=("DLQ_ALERT_MAX_ATTEMPTS",),
    ),
    _s(
        "ALERT_RETRY_BASE_SECONDS",
        INT,
        30,
        "First delay between deliveries (doubling).",
        minimum=0,
        former_names=("DLQ_ALERT_RETRY_BASE_SECONDS",),
    ),
    _s(
        "ALERT_CONSOLE_BASE_URL",
        STR,
        "http://127.0.0.1:8000",
        "Alert messages link here (/admin/…).",
        former_names=("DLQ_CONSOLE_BASE_URL",),
    ),
)
