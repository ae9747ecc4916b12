"""Latency histograms the processes record (prometheus-client), read by ``/metrics``.

Several web and worker processes each record into their own files when
``PROMETHEUS_MULTIPROC_DIR`` names a folder (prometheus-client's multi-process mode;
``make run`` sets it to ``var/prometheus`` and empties it at start); ``/metrics`` adds them
up. Without it each process keeps its own values in memory (one-process servers, tests).

This module imports no app, so the ledger may call :func:`observe_claim` and
:func:`observe_provider_call`. Label values are bounded: outcomes come from fixed sets and
at most ``METRICS_PROVIDER_LABELS`` provider slugs (``METRICS_REVISION_LABELS`` revisions,
``METRICS_PRESET_LABELS`` preset versions and aspect classes) get their own series per process
(the rest are counted under ``_other``), so a tenant creating providers or intent values cannot
grow the series without end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Histogram

from ledger.platform import env

OTHER = "_other"

CLAIM_SECONDS = Histogram(
    "onceguard_claim_duration_seconds",
    "Time to answer a claim (the service call), by outcome: created, replayed or the error code.",
    ["outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
PROVIDER_CALL_SECONDS = Histogram(
    "onceguard_provider_call_duration_seconds",
    "Time of one call to a provider (execute mode, replays, lookups), by provider, outcome"
    " (succeeded or the error class), the adapter revision it ran under (its number; empty"
    " for calls outside a revision) and a render job's preset version and aspect class (empty"
    " for work without an intent).",
    ["provider", "outcome", "revision", "preset_version", "aspect_class"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)


class BoundedLabel:
    """The first ``limit`` distinct values keep their name; later ones become ``_other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


_provider_label = BoundedLabel(env.read("METRICS_PROVIDER_LABELS"))
_outcome_label = BoundedLabel(40)
# Revision numbers grow with every adapter change: the series stay bounded like the slugs'.
_revision_label = BoundedLabel(env.read("METRICS_REVISION_LABELS"))
# A render job's labels are words from its intent (ledger.rules.intents.render_labels): a
# tenant's schema can declare many, so each is capped like the slugs (ADR 0016).
_preset_label = BoundedLabel(env.read("METRICS_PRESET_LABELS"))
_aspect_label = BoundedLabel(env.read("METRICS_PRESET_LABELS"))


def observe_claim(*, seconds: float, outcome: str) -> None:
    """One claim answered in ``seconds``: ``outcome`` is "created", "replayed" or the stable
    error code of the refusal (``operation_in_progress``, …)."""
    CLAIM_SECONDS.labels(outcome=_outcome_label(outcome or "unknown")).observe(max(0.0, seconds))


def observe_provider_call(
    *,
    provider: str,
    seconds: float,
    outcome: str,
    revision: str = "",
    preset_version: str = "",
    aspect_class: str = "",
) -> None:
    """One provider call took ``seconds``: ``provider`` is the slug, ``outcome`` "succeeded"
    or the error class (transient, invalid_input, permission, ambiguous, throttled, …),
    ``revision`` the adapter revision's number ("" outside one), ``preset_version`` and
    ``aspect_class`` a render job's labels ("" for work without an intent)."""
    PROVIDER_CALL_SECONDS.labels(
        provider=_provider_label(provider or "unknown"),
        outcome=_outcome_label(outcome or "unknown"),
        revision=_revision_label(revision),
        # "" is not a value a tenant chose: it never takes one of the capped places.
        preset_version=_preset_label(preset_version) if preset_version else "",
        aspect_class=_aspect_label(aspect_class) if aspect_class else "",
    ).observe(max(0.0, seconds))


class _ClaimTimer:
    outcome = "unknown"


@contextmanager
def claim_timer() -> Iterator[_ClaimTimer]:
    """Times the block as one claim: set ``timer.outcome`` inside it; a domain error leaving
    the block is recorded under its ``code`` (any other exception as ``error``)."""
    timer = _ClaimTimer()
    started = time.perf_counter()
    try:
        yield timer
    except Exception as exc:
        timer.outcome = str(getattr(exc, "code", "") or "error")
        raise
    finally:
        observe_claim(seconds=time.perf_counter() - started, outcome=timer.outcome)
