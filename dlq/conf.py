"""DLQ settings: ``settings.ONCEGUARD_DLQ`` (optional) over these defaults, which come
from the environment (``DLQ_<NAME>``). Read per call, so tests can override them."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings


def _env(name: str, default: Any) -> Any:
    raw = os.environ.get(f"DLQ_{name}")
    if raw in (None, ""):
        return default
    if isinstance(default, list):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(default, int):
        return int(raw)
    return raw


DEFAULTS: dict[str, Any] = {
    # Ingest bodies over this are refused with 413 problem+json.
    "MAX_EVENT_BYTES": 256 * 1024,
    # Dotted JSON paths whose scalar values are copied in plain text into `search_fields`.
    # Only non-personal paths belong here (DESIGN §6): ids, modes, node names, product codes.
    "SEARCH_PATHS": [
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
    # Automatic replay: at most this many automatic replays per lineage root …
    "AUTO_REPLAY_MAX_PER_ROOT": 3,
    # … and only while the root failed less than this long ago.
    "AUTO_REPLAY_LIFETIME_SECONDS": 24 * 3600,
    # Minimum wait after a root's last replay before the schedule tries again (× 2^n).
    "AUTO_REPLAY_BASE_DELAY_SECONDS": 60,
    # Entries handled per schedule run.
    "AUTO_REPLAY_BATCH": 50,
    # Bulk replays are sent at most this fast (per bulk replay), so a target is not flooded.
    "BULK_REPLAY_PER_SECOND": 5,
    # A dry run freezes at most this many entries.
    "BULK_MAX_SELECTION": 10_000,
    # A dry run's selection must be confirmed within this.
    "BULK_DRY_RUN_TTL_SECONDS": 3600,
    # One bulk task run stops after this long and re-enqueues itself (< Q_CLUSTER timeout).
    "BULK_TASK_BUDGET_SECONDS": 60,
    # An entry still `replaying` after this long (sender died) is settled by the recovery pass.
    "REPLAYING_STALE_SECONDS": 300,
    # Response bodies of replay targets are kept up to this many bytes.
    "RESPONSE_KEEP_BYTES": 16 * 1024,
    # 1: replay targets (and their lookups) may be plain http on other hosts than this
    # machine. Off by default: a replay carries the target's credential and the entry's data.
    "REPLAY_ALLOW_HTTP": 0,
    # After a target's signing secret is rotated, the previous one also signs this long.
    "REPLAY_SECRET_OVERLAP_SECONDS": 86400,
    # A target's lookup (a search by the business key before a replay) may take this long.
    "REPLAY_LOOKUP_TIMEOUT_SECONDS": 5,
    # (Alert settings live in alerts.conf.)
}


DEFAULTS = {name: _env(name, value) for name, value in DEFAULTS.items()}


def dlq_setting(name: str) -> Any:
    configured = getattr(settings, "ONCEGUARD_DLQ", {}) or {}
    return configured.get(name, DEFAULTS[name])
