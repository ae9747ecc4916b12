"""Adapter canaries (DESIGN §5, adapter revisions): start, watch, promote and roll back.

A provider has one stable adapter revision and at most one canary. The canary takes its
percentage of *new* operations (``ledger.providers.revisions.revision_assign``); every attempt records
the revision it ran under. The rollout moves:

- :func:`canary_start` — an existing revision that is not stable becomes the canary at a
  percentage (or the running canary's percentage changes).
- :func:`revision_promote` — roll forward: a revision (by default the canary) becomes the
  stable one; the provider row takes its adapter fields.
- :func:`revision_rollback` — roll back: a running canary ends; without one, the stable
  revision goes back to a named earlier one. The rolled-back
  revision's operations that nothing was sent for (``queued``, ``retry_wait``) are re-queued
  under the revision that is stable now, due at once, as new attempts, and the attempts
  they spent under the rolled-back revision are given back. The ones the provider received
  and rejected are ``failed`` already, with their DLQ entry naming the revision (the DLQ
  connects ``hooks.operation_failed`` and ``hooks.adapter_revision_rolled_back``); the ones
  sent with no answer are ``uncertain`` and take the sweeper's usual reconciliation, looked
  up under the revision they were sent with. Nothing is sent twice: a row is moved only by
  a guarded UPDATE on the state and the revision it was read in, so a worker that took it
  first keeps it, and a retired revision's row that a rollback did not reach is moved at the
  workers' take (``ledger.execution.attempts``).
- :func:`canary_watch` — the automatic rollback. It compares the canary's failure rate
  with the stable revision's over ``CANARY_WINDOW_SECONDS`` (never before the canary
  started), once the canary has ``CANARY_MIN_SAMPLE`` counted attempts; attempts count as
  ``ledger.providers.revisions.provider_fault`` says (5xx, ambiguous, unexpected 4xx count;
  throttling and the caller's own invalid input do not). A canary whose rate exceeds the
  stable one's by more than ``CANARY_MAX_EXCESS_PERCENT`` points is rolled back, by the
  actor ``system:canary-watch``, with the figures as the reason.

Where the watch runs, and why: the worker that recorded a canary attempt counting as a
failure evaluates it at once (:func:`canary_watch_after_attempt`) — the only event that can
push a canary over the line, so a failing canary sends at most about one more attempt per
worker thread once it crossed it, and providers without a canary pay nothing — and the
sweeper's schedule evaluates every running canary on each pass (:func:`canary_watch_all`),
which covers what the workers cannot see: a baseline that improved, a worker that died
between recording and evaluating.

Every move is a guarded UPDATE of the provider's pointers as read (zero rows: somebody
moved them first, ``409 adapter_rollout_conflict``) and appends a configuration change with
the revision numbers and the reason (``ledger.tenants.config_changes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from ledger.models import (
    ADAPTER_FIELDS,
    RECALLED_OUTPUT_STATES,
    AdapterRevision,
    Attempt,
    AttemptOutcome,
    ConfigChangeAction,
    Operation,
    OperationMode,
    OperationOutput,
    OperationStatus,
    OutputVerdict,
    Provider,
    VerdictValue,
)
from ledger.platform import hooks
from ledger.platform.errors import AdapterRolloutConflict, OperationNotFound, ValidationFailed
from ledger.providers import revisions
from ledger.providers.lookup import provider_cache_forget
from ledger.store import sql
from ledger.store.open_rows import open_rows_where
from ledger.tenants.config_changes import config_change_record

S = OperationStatus
log = logging.getLogger("onceguard.canary")

WATCH_ACTOR = "system:canary-watch"
# Rows nothing is under way for: what a rollback may move to another revision.
UNSENT_STATES = (S.QUEUED, S.RETRY_WAIT)
# One rollback re-queues at most this many rows in batches; any left over are moved by the
# workers' take when they come due (ledger.execution.attempts), so the bound loses nothing.
REQUEUE_BATCH = 500
REQUEUE_MAX_ROWS = 100_000


# --- Reading -----------------------------------------------------------------------------------


def _provider(*, provider_id: int, tenant_ids: list[int] | None, lock: bool = False) -> Provider:
    rows = Provider.objects.filter(pk=provider_id)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    if lock:
        rows = rows.select_for_update()
    provider = rows.first()
    if provider is None:
        raise OperationNotFound("No such provider.")
    return provider


def _revision(provider: Provider, number: int) -> AdapterRevision:
    revision = AdapterRevision.objects.filter(provider_id=provider.pk, number=number).first()
    if revision is None:
        raise OperationNotFound(f"Provider {provider.slug} has no adapter revision {number}.")
    return revision


@dataclass(frozen=True)
class WatchFigures:
    """What the watch saw for one running canary."""

    canary: int
    stable: int | None
    since: datetime
    window_seconds: int
    canary_attempts: int
    canary_failures: int
    stable_attempts: int
    stable_failures: int
    min_sample: int
    max_excess_percent: float
    # The gates beyond the failure rate (ADR 0020), each with its own figures and verdict.
    gates: tuple[GateFigures, ...] = field(default=())

    @staticmethod
    def _rate(failures: int, attempts: int) -> float:
        return failures / attempts if attempts else 0.0

    @property
    def canary_rate(self) -> float:
        return self._rate(self.canary_failures, self.canary_attempts)

    @property
    def stable_rate(self) -> float:
        return self._rate(self.stable_failures, self.stable_attempts)

    @property
    def baseline(self) -> float:
        """The stable revision's rate once it has a sample of its own; before that 0 — a
        canary is judged strictly rather than not at all (at 100 % the stable revision gets
        no new operations)."""
        return self.stable_rate if self.stable_attempts >= self.min_sample else 0.0

    @property
    def error_verdict(self) -> str:
        """The failure-rate gate: ``collecting`` (below the minimum sample), ``healthy`` or ``failing``."""
        if self.canary_attempts < self.min_sample:
            return "collecting"
        excess = (self.canary_rate - self.baseline) * 100
        return "failing" if excess > self.max_excess_percent else "healthy"

    @property
    def breached(self) -> list[GateFigures]:
        """The gates beyond the failure rate that the canary breaches (a pause, not a rollback)."""
        return [gate for gate in self.gates if gate.verdict == "breached"]

    @property
    def verdict(self) -> str:
        """``failing`` (the failure rate: rolled back), ``breached`` (another gate: paused),
        else the failure-rate gate's ``collecting`` or ``healthy``."""
        error = self.error_verdict
        if error == "failing":
            return error
        return "breached" if self.breached else error

    def sentence(self) -> str:
        stable = f"revision {self.stable}" if self.stable is not None else "the stable revision"
        baseline = (
            f"{stable} {self.stable_failures} of {self.stable_attempts} ({self.stable_rate:.0%})"
            if self.stable_attempts >= self.min_sample
            else f"{stable} had {self.stable_attempts} counted attempts (fewer than {self.min_sample}; baseline 0 %)"
        )
        return (
            f"canary revision {self.canary} failed {self.canary_failures} of {self.canary_attempts} counted attempts"
            f" ({self.canary_rate:.0%}) against {baseline} over the last {self.window_seconds} s;"
            f" limit +{self.max_excess_percent:g} points"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "canary_revision": self.canary,
            "stable_revision": self.stable,
            "since": self.since.isoformat(),
            "window_seconds": self.window_seconds,
            "canary_attempts": self.canary_attempts,
            "canary_failures": self.canary_failures,
            "canary_failure_rate": round(self.canary_rate, 4),
            "stable_attempts": self.stable_attempts,
            "stable_failures": self.stable_failures,
            "stable_failure_rate": round(self.stable_rate, 4),
            "min_sample": self.min_sample,
            "max_excess_percent": self.max_excess_percent,
            "verdict": self.verdict,
            "gates": [
                {"gate": "error_rate", "verdict": self.error_verdict, "summary": self.sentence()},
                *(gate.as_dict() for gate in self.gates),
            ],
        }


@dataclass(frozen=True)
class GateFigures:
    """One canary gate beyond the failure rate (ADR 0020): the canary's figure against the
    stable revision's over the watch's window, the threshold, and the verdict — ``collecting``
    (the canary, or for a ratio the stable revision, has fewer than the minimum sample),
    ``healthy`` or ``breached``."""

    gate: str
    canary_n: int
    stable_n: int
    canary_value: float | None
    stable_value: float | None
    threshold: float
    verdict: str
    summary: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "verdict": self.verdict,
            "canary_n": self.canary_n,
            "stable_n": self.stable_n,
            "canary_value": self.canary_value,
            "stable_value": self.stable_value,
            "threshold": self.threshold,
            "summary": self.summary,
            **self.extra,
        }


# The gates' thresholds a revision may set (``AdapterRevision.gates``) and the setting each
# defaults to: the failure rate's excess in points (rolls back), the p95 latency's ratio to the
# stable revision's, the share of rejected or low-scored outputs' excess in points, and the
# score below which an output counts as low-scored (these three pause).
GATE_SETTINGS = {
    "max_excess_percent": "CANARY_MAX_EXCESS_PERCENT",
    "latency_p95_max_ratio": "CANARY_LATENCY_P95_MAX_RATIO",
    "max_rejected_excess_percent": "CANARY_MAX_REJECTED_EXCESS_PERCENT",
    "min_score": "CANARY_MIN_SCORE",
}
GATE_RANGES = {
    "max_excess_percent": (0.0, 100.0),
    "latency_p95_max_ratio": (1.0, 1000.0),
    "max_rejected_excess_percent": (0.0, 100.0),
    "min_score": (0.0, 1.0),
}
# The newest successful attempts per revision the latency gate reads (a bound on the window).
LATENCY_SAMPLE_MAX = 2000


def gates_check(gates: Any) -> dict[str, float]:
    """Thresholds an operator sets for a revision: known names, numbers within their range."""
    if gates is None:
        return {}
    if not isinstance(gates, dict):
        raise ValidationFailed("`gates` must be an object of thresholds.")
    checked: dict[str, float] = {}
    for name, value in gates.items():
        if name not in GATE_RANGES:
            raise ValidationFailed(f"Unknown canary gate {name!r}; known: {', '.join(GATE_RANGES)}.")
        low, high = GATE_RANGES[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValidationFailed(f"Canary gate {name!r} must be a number from {low:g} to {high:g}.")
        checked[name] = float(value)
    return checked


def revision_gates(revision_id: int) -> dict[str, float]:
    """The thresholds ``revision_id`` is judged by: its own, else the deployment's defaults.
    Read from the row, not the revisions' cache (the gates are the rollout's, set later than
    the snapshot)."""
    own = AdapterRevision.objects.filter(pk=revision_id).values_list("gates", flat=True).first() or {}
    return {name: float(own.get(name, settings.ONCEGUARD[setting])) for name, setting in GATE_SETTINGS.items()}


def _p95(durations: list[float]) -> float | None:
    """The nearest-rank 95th percentile."""
    if not durations:
        return None
    ordered = sorted(durations)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def revision_latencies(*, tenant_id: int, revision_ids: list[int], since: datetime) -> dict[int, list[float]]:
    """Milliseconds from start to finish of each revision's successful attempts in the window
    (the newest ``LATENCY_SAMPLE_MAX``), through the attempts' (revision, started_at) index."""
    out: dict[int, list[float]] = {}
    for revision_id in revision_ids:
        rows = (
            Attempt.objects.filter(
                tenant_id=tenant_id,
                adapter_revision_id=revision_id,
                started_at__gte=since,
                finished_at__isnull=False,
                outcome=AttemptOutcome.SUCCEEDED,
            )
            .order_by("-started_at")
            .values_list("started_at", "finished_at")[:LATENCY_SAMPLE_MAX]
        )
        out[revision_id] = [(finished - started).total_seconds() * 1000 for started, finished in rows]
    return out


def latency_gate(
    *, tenant_id: int, canary_id: int, stable_id: int | None, since: datetime, min_sample: int, max_ratio: float
) -> GateFigures:
    ids = [canary_id] + ([stable_id] if stable_id else [])
    latencies = revision_latencies(tenant_id=tenant_id, revision_ids=ids, since=since)
    canary_ms, stable_ms = latencies[canary_id], latencies.get(stable_id, []) if stable_id else []
    canary_p95, stable_p95 = _p95(canary_ms), _p95(stable_ms)
    if len(canary_ms) < min_sample or len(stable_ms) < min_sample or not stable_p95:
        verdict = "collecting"
    else:
        verdict = "breached" if canary_p95 > stable_p95 * max_ratio else "healthy"  # type: ignore[operator]
    summary = (
        f"p95 latency: canary {canary_p95:.0f} ms over {len(canary_ms)} successful attempts"
        if canary_p95 is not None
        else f"p95 latency: canary has {len(canary_ms)} successful attempts"
    ) + (
        f" against stable {stable_p95:.0f} ms over {len(stable_ms)}; limit ×{max_ratio:g}"
        if stable_p95 is not None
        else f" and the stable revision {len(stable_ms)} (fewer than {min_sample}: not judged)"
    )
    return GateFigures(
        gate="latency_p95",
        canary_n=len(canary_ms),
        stable_n=len(stable_ms),
        canary_value=round(canary_p95, 1) if canary_p95 is not None else None,
        stable_value=round(stable_p95, 1) if stable_p95 is not None else None,
        threshold=max_ratio,
        verdict=verdict,
        summary=summary,
    )


def quality_gate(
    *,
    tenant_id: int,
    canary_id: int,
    stable_id: int | None,
    since: datetime,
    min_sample: int,
    max_excess: float,
    min_score: float,
) -> GateFigures:
    """Rejected or low-scored outputs (consumers' and manifests' verdicts, ADR 0020): the
    canary's share against the stable revision's (0 % until the stable one has a sample)."""
    ids = [canary_id] + ([stable_id] if stable_id else [])
    bad = Q(verdict=VerdictValue.REJECTED) | Q(score__lt=min_score)
    rows = (
        OutputVerdict.objects.filter(tenant_id=tenant_id, adapter_revision_id__in=ids, created_at__gte=since)
        .values_list("adapter_revision_id")
        .annotate(n=Count("id"), bad=Count("id", filter=bad))
        .order_by()
    )
    counts = {revision_id: (n, b) for revision_id, n, b in rows}
    canary_n, canary_bad = counts.get(canary_id, (0, 0))
    stable_n, stable_bad = counts.get(stable_id, (0, 0)) if stable_id else (0, 0)
    canary_rate = canary_bad / canary_n if canary_n else 0.0
    stable_rate = stable_bad / stable_n if stable_n else 0.0
    baseline = stable_rate if stable_n >= min_sample else 0.0
    if canary_n < min_sample:
        verdict = "collecting"
    else:
        verdict = "breached" if (canary_rate - baseline) * 100 > max_excess else "healthy"
    return GateFigures(
        gate="rejected_or_low_score",
        canary_n=canary_n,
        stable_n=stable_n,
        canary_value=round(canary_rate, 4),
        stable_value=round(stable_rate, 4),
        threshold=max_excess,
        verdict=verdict,
        summary=(
            f"rejected or scored below {min_score:g}: canary {canary_bad} of {canary_n} ({canary_rate:.0%})"
            f" against stable {stable_bad} of {stable_n} ({stable_rate:.0%}); limit +{max_excess:g} points"
        ),
        extra={"canary_bad": canary_bad, "stable_bad": stable_bad, "min_score": min_score},
    )


def revision_counts(*, revision_ids: list[int], since: datetime) -> dict[int, tuple[int, int]]:
    """(counted attempts, provider faults) per revision among the attempts started and
    finished since ``since``, counted by ``revisions.provider_fault``. One grouped query
    through the attempts' partial (revision, started_at) index: an attempt finishes after it
    starts, so the window is read off the index (finished_at is not indexed, so that finishing
    an attempt can be a HOT update)."""
    counts = {rid: (0, 0) for rid in revision_ids}
    sent = ExpressionWrapper(Q(sent_at__isnull=False), output_field=BooleanField())
    groups = (
        Attempt.objects.filter(adapter_revision_id__in=revision_ids, started_at__gte=since, finished_at__gte=since)
        # Still running, or not this revision's verdict (a late result, a lease that
        # expired before anything was sent).
        .exclude(outcome__in=(AttemptOutcome.PENDING, AttemptOutcome.FENCED, AttemptOutcome.EXPIRED))
        .annotate(was_sent=sent)
        .values_list("adapter_revision_id", "error_class", "response_status", "was_sent")
        .annotate(n=Count("id"))
        .order_by()
    )
    for revision_id, error_class, status, was_sent, n in groups:
        fault = revisions.provider_fault(error_class=error_class, status=status, sent=bool(was_sent))
        if fault is None:
            continue
        attempts, failures = counts[revision_id]
        counts[revision_id] = (attempts + n, failures + (n if fault else 0))
    return counts


def canary_figures(provider: Provider) -> WatchFigures | None:
    """The watch's figures for ``provider``'s running canary (None without one)."""
    if provider.canary_revision_id is None or provider.canary_started_at is None:
        return None
    window = int(settings.ONCEGUARD["CANARY_WINDOW_SECONDS"])
    since = max(sql.db_now() - timedelta(seconds=window), provider.canary_started_at)
    ids = [provider.canary_revision_id] + ([provider.revision_id] if provider.revision_id else [])
    counts = revision_counts(revision_ids=ids, since=since)
    canary_n, canary_f = counts[provider.canary_revision_id]
    stable_n, stable_f = counts.get(provider.revision_id, (0, 0)) if provider.revision_id else (0, 0)
    gates = revision_gates(provider.canary_revision_id)
    min_sample = max(1, int(settings.ONCEGUARD["CANARY_MIN_SAMPLE"]))
    judged = dict(
        tenant_id=provider.tenant_id,
        canary_id=provider.canary_revision_id,
        stable_id=provider.revision_id,
        since=since,
        min_sample=min_sample,
    )
    return WatchFigures(
        canary=revisions.revision_get(provider.canary_revision_id).number,
        stable=revisions.revision_number(provider.revision_id),
        since=since,
        window_seconds=window,
        canary_attempts=canary_n,
        canary_failures=canary_f,
        stable_attempts=stable_n,
        stable_failures=stable_f,
        min_sample=min_sample,
        max_excess_percent=gates["max_excess_percent"],
        gates=(
            latency_gate(**judged, max_ratio=gates["latency_p95_max_ratio"]),
            quality_gate(**judged, max_excess=gates["max_rejected_excess_percent"], min_score=gates["min_score"]),
        ),
    )


# --- Moves -------------------------------------------------------------------------------------


def _record_move(*, provider: Provider, before: dict[str, Any], actor: str, reason: str) -> None:
    config_change_record(
        tenant_id=provider.tenant_id,
        actor=actor,
        action=ConfigChangeAction.UPDATE,
        object_type=provider._meta.label_lower,
        object_id=provider.pk,
        object_repr=str(provider),
        before=before,
        after=revisions.rollout_state(provider),
        reason=reason,
    )


def _move_pointers(*, provider: Provider, actor: str, reason: str, **values: Any) -> Provider:
    """The guarded UPDATE of a rollout move: the pointers as read (the row is locked by the
    caller), then the trail. Returns the provider as it is now."""
    before = revisions.rollout_state(provider)
    moved = Provider.objects.filter(
        pk=provider.pk, revision_id=provider.revision_id, canary_revision_id=provider.canary_revision_id
    ).update(updated_at=Now(), **values)
    if not moved:  # pragma: no cover - the caller holds the row locked
        raise AdapterRolloutConflict("The provider's rollout moved meanwhile; reload it.")
    current = Provider.objects.get(pk=provider.pk)
    _record_move(provider=current, before=before, actor=actor, reason=reason)
    return current


def _needs_reason(reason: str) -> str:
    reason = revisions.clean_reason(reason)
    if not reason:
        raise ValidationFailed("Say why (a reason is recorded with every rollout move).")
    return reason


def _revision_runs_again(revision: AdapterRevision, *, gates: dict[str, float] | None = None) -> None:
    """A revision that runs again (a canary, or stable) is no longer rolled back: outputs it
    produces from now on are not recalled. ``gates``: new thresholds (the rollout's, ADR 0020)."""
    values: dict[str, Any] = {"rolled_back_at": None}
    if gates:
        values["gates"] = {**revision.gates, **gates}
    AdapterRevision.objects.filter(pk=revision.pk).update(**values)


def canary_start(
    *,
    provider_id: int,
    number: int,
    percent: int,
    actor: str,
    reason: str,
    tenant_ids: list[int] | None = None,
    gates: dict[str, Any] | None = None,
) -> Provider:
    """Revision ``number`` (not the stable one) takes ``percent`` of new operations as the
    canary; for the running canary, its percentage changes — and a paused one resumes.
    Refused while another revision is the canary. ``gates``: the thresholds it is judged by
    (``GATE_SETTINGS``; the ones not named keep theirs, else the deployment's defaults)."""
    reason = _needs_reason(reason)
    percent = revisions.canary_percent_check(percent)
    gates = gates_check(gates)
    with transaction.atomic():
        provider = _provider(provider_id=provider_id, tenant_ids=tenant_ids, lock=True)
        revision = _revision(provider, number)
        if revision.pk == provider.revision_id:
            raise AdapterRolloutConflict(f"Revision {number} is the stable revision already.")
        if provider.canary_revision_id not in (None, revision.pk):
            raise AdapterRolloutConflict(
                f"Revision {revisions.revision_number(provider.canary_revision_id)} is the canary:"
                " promote it or roll it back first."
            )
        values: dict[str, Any] = {
            "canary_revision_id": revision.pk,
            "canary_percent": percent,
            "canary_paused_at": None,
            "canary_pause_evidence": None,
        }
        if provider.canary_revision_id is None:
            values["canary_started_at"] = Now()
        _revision_runs_again(revision, gates=gates)
        current = _move_pointers(provider=provider, actor=actor, reason=reason, **values)
    provider_cache_forget(current)
    log.info("adapter_canary_started provider=%s revision=%s percent=%s actor=%s", current.pk, number, percent, actor)
    return current


def revision_promote(
    *, provider_id: int, actor: str, reason: str, number: int | None = None, tenant_ids: list[int] | None = None
) -> Provider:
    """Roll forward: revision ``number`` (by default the canary) becomes the stable one, and
    the provider row takes its adapter fields; the canary ends. Operations of the revision
    stable before move to the new one as they are next taken (nothing is under way for them
    then); the ones in flight finish under the revision they were sent with."""
    reason = _needs_reason(reason)
    with transaction.atomic():
        provider = _provider(provider_id=provider_id, tenant_ids=tenant_ids, lock=True)
        if number is None:
            if provider.canary_revision_id is None:
                raise AdapterRolloutConflict("No canary runs: name the revision to promote.")
            revision = revisions.revision_get(provider.canary_revision_id)
        else:
            revision = _revision(provider, number)
        if revision.pk == provider.revision_id:
            raise AdapterRolloutConflict(f"Revision {revision.number} is the stable revision already.")
        if provider.canary_revision_id not in (None, revision.pk):
            raise AdapterRolloutConflict(
                f"Revision {revisions.revision_number(provider.canary_revision_id)} is the canary:"
                " promote it or roll it back first."
            )
        current = _make_stable(provider=provider, revision=revision, actor=actor, reason=reason)
    provider_cache_forget(current)
    log.info("adapter_revision_promoted provider=%s revision=%s actor=%s", current.pk, revision.number, actor)
    return current


def _make_stable(*, provider: Provider, revision: AdapterRevision, actor: str, reason: str) -> Provider:
    config = {name: value for name, value in revision.config.items() if name in ADAPTER_FIELDS}
    _revision_runs_again(revision)
    return _move_pointers(
        provider=provider,
        actor=actor,
        reason=reason,
        revision_id=revision.pk,
        canary_revision_id=None,
        canary_percent=0,
        canary_started_at=None,
        canary_paused_at=None,
        canary_pause_evidence=None,
        **config,
    )


@dataclass(frozen=True)
class RollbackResult:
    provider: Provider
    rolled_back: int
    stable: int
    requeued: int
    figures: WatchFigures | None = None


def revision_rollback(
    *,
    provider_id: int,
    actor: str,
    reason: str,
    number: int | None = None,
    canary: int | None = None,
    figures: WatchFigures | None = None,
    tenant_ids: list[int] | None = None,
) -> RollbackResult:
    """Roll back. With a canary running, it ends (``number``, if given, must be the stable
    revision); without one, the stable revision returns to revision ``number``, which must
    be named — so a second click on "roll the canary back" finds no canary and changes
    nothing instead of rolling the stable revision back too. ``canary``: the canary the
    caller means (the watch); refused when that revision is no longer the canary.

    The rolled-back revision's unsent operations are re-queued under the revision stable now
    (module docstring); its rejected ones stay failed with their DLQ entries, which the DLQ
    notes; its uncertain ones take the usual reconciliation."""
    reason = _needs_reason(reason)
    with transaction.atomic():
        provider = _provider(provider_id=provider_id, tenant_ids=tenant_ids, lock=True)
        if provider.canary_revision_id is not None:
            rolled_back = revisions.revision_get(provider.canary_revision_id)
            target = revisions.revision_get(revisions.revision_ensure(provider))  # type: ignore[arg-type]
            if canary is not None and canary != rolled_back.number:
                raise AdapterRolloutConflict(f"Revision {canary} is no longer the canary.")
            if number is not None and number != target.number:
                raise AdapterRolloutConflict(
                    f"Revision {rolled_back.number} is the canary: roll it back (or promote it) first."
                )
            current = _move_pointers(
                provider=provider,
                actor=actor,
                reason=reason,
                canary_revision_id=None,
                canary_percent=0,
                canary_started_at=None,
                canary_paused_at=None,
                canary_pause_evidence=None,
            )
        else:
            if canary is not None:
                raise AdapterRolloutConflict(f"Revision {canary} is no longer the canary (moved meanwhile).")
            if number is None:
                raise AdapterRolloutConflict("No canary runs: name the revision to return the stable one to.")
            if provider.revision_id is None:
                raise AdapterRolloutConflict("This provider has no adapter revision to roll back.")
            rolled_back = revisions.revision_get(provider.revision_id)
            target = _revision(provider, number)
            if target.pk == rolled_back.pk:
                raise AdapterRolloutConflict(f"Revision {number} is the stable revision already.")
            current = _make_stable(provider=provider, revision=target, actor=actor, reason=reason)
        # Its outputs are recalled by ledger.recovery.recall's pass, which reads this (ADR 0020).
        AdapterRevision.objects.filter(pk=rolled_back.pk).update(rolled_back_at=Now())
        hooks.adapter_revision_rolled_back.send(
            tenant_id=current.tenant_id,
            provider_id=current.pk,
            revision_id=rolled_back.pk,
            number=rolled_back.number,
            actor=actor,
            reason=reason,
        )
    provider_cache_forget(current)
    requeued = operations_requeue(
        provider_id=current.pk, from_revision=rolled_back, to_revision=target, actor=actor, reason=reason
    )
    log.warning(
        "adapter_revision_rolled_back provider=%s revision=%s stable=%s requeued=%s actor=%s",
        current.pk,
        rolled_back.number,
        target.number,
        requeued,
        actor,
    )
    return RollbackResult(
        provider=current, rolled_back=rolled_back.number, stable=target.number, requeued=requeued, figures=figures
    )


def operations_requeue(
    *, provider_id: int, from_revision: AdapterRevision, to_revision: AdapterRevision, actor: str, reason: str
) -> int:
    """Re-queue the rows of ``from_revision`` nothing is under way for under ``to_revision``:
    due now, as new attempts, the attempts spent under ``from_revision`` given back. In short
    batches (keyset on id), each row a guarded move (``revisions.operation_revision_move``);
    bounded — what is left is moved at the workers' take."""
    requeued = 0
    after = 0
    why = (
        f"re-queued under adapter revision {to_revision.number}: revision {from_revision.number} was rolled back"
        f" ({reason})"
    )
    for _ in range(REQUEUE_MAX_ROWS // REQUEUE_BATCH):
        rows = list(
            # The unsent rows off the work queue's mirror (ADR 0017).
            Operation.objects.filter(
                open_rows_where(status__in=UNSENT_STATES),
                tenant_id=from_revision.tenant_id,
                provider_id=provider_id,
                mode=OperationMode.EXECUTE,
                adapter_revision_id=from_revision.pk,
                pk__gt=after,
            )
            .order_by("pk")
            .values_list("pk", "status")[:REQUEUE_BATCH]
        )
        if not rows:
            break
        spent = dict(
            Attempt.objects.filter(
                tenant_id=from_revision.tenant_id,
                operation_id__in=[pk for pk, _ in rows],
                adapter_revision_id=from_revision.pk,
            )
            .values_list("operation_id")
            .annotate(n=Count("id"))
            .order_by()
        )
        for pk, status in rows:
            if revisions.operation_revision_move(
                operation_id=pk,
                tenant_id=from_revision.tenant_id,
                from_status=status,
                from_revision_id=from_revision.pk,
                to_revision_id=to_revision.pk,
                actor=actor,
                reason=why,
                changes={"next_attempt_at": Now(), "max_attempts": F("max_attempts") + spent.get(pk, 0)},
            ):
                requeued += 1
        after = rows[-1][0]
    return requeued


# --- The watch ---------------------------------------------------------------------------------


def canary_watch(*, provider_id: int) -> WatchFigures | None:
    """Evaluate ``provider_id``'s running canary and roll it back when it is failing; the
    figures it saw (None without a canary, or when another watch rolled it back first)."""
    provider = Provider.objects.filter(pk=provider_id).first()
    if provider is None:
        return None
    figures = canary_figures(provider)
    if figures is None or figures.verdict not in ("failing", "breached"):
        return figures
    if figures.verdict == "breached":
        canary_pause_on_breach(provider=provider, figures=figures)
        return figures
    try:
        revision_rollback(
            provider_id=provider.pk,
            actor=WATCH_ACTOR,
            reason=f"automatic rollback: {figures.sentence()}",
            canary=figures.canary,
            figures=figures,
        )
    except AdapterRolloutConflict:
        # Another watch (or an operator) moved the rollout first: nothing left to do.
        return figures
    hooks.alert_raised.send(
        tenant_id=provider.tenant_id,
        kind="provider_canary_rolled_back",
        ref=provider.slug,
        summary=f"provider {provider.slug}: {figures.sentence()}; rolled back to revision {figures.stable}",
    )
    return figures


def canary_pause(
    *, provider_id: int, canary: int, actor: str, reason: str, evidence: dict[str, Any] | None = None
) -> Provider | None:
    """Pause the running canary ``canary`` (by number): it takes no new operations
    (``revisions.revision_assign``) and keeps its share, figures and operations under way until
    an operator resumes (``canary_start``), promotes or rolls it back. None when it is paused
    already, or no longer the canary (a guarded move on the pointers as read)."""
    reason = _needs_reason(reason)
    with transaction.atomic():
        provider = _provider(provider_id=provider_id, tenant_ids=None, lock=True)
        if provider.canary_revision_id is None or provider.canary_paused_at is not None:
            return None
        if revisions.revision_number(provider.canary_revision_id) != canary:
            return None
        current = _move_pointers(
            provider=provider, actor=actor, reason=reason, canary_paused_at=Now(), canary_pause_evidence=evidence
        )
    provider_cache_forget(current)
    log.warning("adapter_canary_paused provider=%s revision=%s actor=%s", current.pk, canary, actor)
    return current


def canary_pause_on_breach(*, provider: Provider, figures: WatchFigures) -> Provider | None:
    """The watch's answer to a gate beyond the failure rate: pause the canary and raise an
    alert, the gates' figures as the evidence (shown on the rollout page and in the API)."""
    if provider.canary_paused_at is not None:
        return None
    breached = "; ".join(gate.summary for gate in figures.breached)
    paused = canary_pause(
        provider_id=provider.pk,
        canary=figures.canary,
        actor=WATCH_ACTOR,
        reason=f"automatic pause: {breached}",
        evidence=figures.as_dict(),
    )
    if paused is not None:
        hooks.alert_raised.send(
            tenant_id=provider.tenant_id,
            kind="provider_canary_paused",
            ref=provider.slug,
            summary=f"provider {provider.slug}: canary revision {figures.canary} paused: {breached}",
        )
    return paused


def canary_watch_after_attempt(*, operation: Operation, provider_id: int) -> None:
    """The worker's check after recording an attempt of a revision other than the stable one
    it knows: when the attempt counts as a provider fault, evaluate the canary now. The
    attempt is recorded already: a failure here is logged, never raised into the worker."""
    try:
        attempt = (
            Attempt.objects.filter(operation_id=operation.pk, number=operation.attempts)
            .values_list("adapter_revision_id", "error_class", "response_status", "sent_at")
            .first()
        )
        if attempt is None:
            return
        revision_id, error_class, status, sent_at = attempt
        if not revisions.provider_fault(error_class=error_class, status=status, sent=sent_at is not None):
            return
        if not Provider.objects.filter(pk=provider_id, canary_revision_id=revision_id).exists():
            return
        figures = canary_watch(provider_id=provider_id)
        if figures is not None:
            log.info("adapter_canary_watched provider=%s verdict=%s", provider_id, figures.verdict)
    except Exception as exc:
        # The class only: messages may quote SQL parameters.
        log.error("adapter_canary_watch_error provider=%s error=%s", provider_id, type(exc).__name__)


def canary_watch_all(*, limit: int = 1000) -> dict[str, int]:
    """Every running canary, evaluated (the sweeper's pass); counts by verdict."""
    counts: dict[str, int] = {}
    ids = list(
        Provider.objects.filter(canary_revision__isnull=False).order_by("pk").values_list("pk", flat=True)[:limit]
    )
    for provider_id in ids:
        figures = canary_watch(provider_id=provider_id)
        if figures is not None:
            counts[figures.verdict] = counts.get(figures.verdict, 0) + 1
    return counts


# --- What the console and the API show ---------------------------------------------------------


def revision_role(provider: Provider, revision: AdapterRevision) -> str:
    if revision.pk == provider.revision_id:
        return "stable"
    if revision.pk == provider.canary_revision_id:
        return "canary"
    return "retired"


def provider_rollout(provider: Provider, *, limit: int = 50) -> dict[str, Any]:
    """``provider``'s rollout: which revisions run, the watch's figures, and its newest
    revisions (at most ``limit``), newest first."""
    figures = canary_figures(provider)
    shown = list(AdapterRevision.objects.filter(provider_id=provider.pk).order_by("-number")[:limit])
    outputs = revision_output_counts(tenant_id=provider.tenant_id, revision_ids=[r.pk for r in shown])
    return {
        "provider": provider.slug,
        "stable_revision": revisions.revision_number(provider.revision_id),
        "canary_revision": revisions.revision_number(provider.canary_revision_id),
        "canary_percent": provider.canary_percent,
        "canary_started_at": provider.canary_started_at,
        "canary_paused_at": provider.canary_paused_at,
        "canary_pause_evidence": provider.canary_pause_evidence,
        "watch": figures.as_dict() if figures is not None else None,
        "revisions": [
            {
                "number": r.number,
                "based_on": r.based_on,
                "config": r.config,
                "created_by": r.created_by,
                "created_at": r.created_at,
                "reason": r.reason,
                "role": revision_role(provider, r),
                "gates": r.gates,
                "rolled_back_at": r.rolled_back_at,
                "outputs": outputs.get(r.pk, {}),
            }
            for r in shown
        ],
    }


def revision_output_counts(*, tenant_id: int, revision_ids: list[int]) -> dict[int, dict[str, int]]:
    """Each revision's recalled outputs by state and its verdicts by value (the rollout
    page's counts, ADR 0020): two grouped queries on indexes. Published outputs are not
    counted (a stable revision has millions)."""
    counts: dict[int, dict[str, int]] = {rid: {} for rid in revision_ids}
    by_state = (
        OperationOutput.objects.filter(
            tenant_id=tenant_id, adapter_revision_id__in=revision_ids, state__in=RECALLED_OUTPUT_STATES
        )
        .values_list("adapter_revision_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for revision_id, state, n in by_state:
        counts[revision_id][state] = n
    by_verdict = (
        OutputVerdict.objects.filter(tenant_id=tenant_id, adapter_revision_id__in=revision_ids)
        .values_list("adapter_revision_id", "verdict")
        .annotate(n=Count("id"))
        .order_by()
    )
    for revision_id, verdict, n in by_verdict:
        counts[revision_id][f"verdicts_{verdict}"] = n
    return counts
