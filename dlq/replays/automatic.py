"""Automatic replay (``dlq.tasks.auto_replay_task``, on a schedule): pending transient failures
replayed to the targets that opted in, capped per lineage root, with a doubling pause after
each try, never after an outcome that is for a person to judge.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db.models import F
from django.utils import timezone

from dlq.entries import selectors
from dlq.models import FE, FailedEvent, ReplayOutcome, ReplayTrigger
from dlq.replays.services import failed_event_replay
from dlq.rules.conf import dlq_setting
from ledger.models import ErrorClass, Operation
from ledger.platform.errors import DomainError
from ledger.platform.passes import failure_text, row_isolated
from ledger.protocol import approvals


def _root_deadline(event: FailedEvent) -> datetime:
    """A lineage root lives as long as its operation did, else the configured lifetime."""
    lifetime = event.failed_at + timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    if event.operation_id:
        expires = Operation.objects.filter(pk=event.operation_id).values_list("expires_at", flat=True).first()
        if expires is not None:
            return expires
    return lifetime


def auto_replay_due(*, limit: int | None = None) -> dict[str, int]:
    """Replay pending transient failures to targets that opted in, capped per lineage root.

    Never after an ambiguous or non-transient replay outcome (that one is for a human), never
    past the root's lifetime, and with a doubling pause after each automatic try.
    """
    cap = int(dlq_setting("AUTO_REPLAY_MAX_PER_ROOT"))
    base = float(dlq_setting("AUTO_REPLAY_BASE_DELAY_SECONDS"))
    now = timezone.now()
    oldest = now - timedelta(seconds=int(dlq_setting("AUTO_REPLAY_LIFETIME_SECONDS")))
    candidates = FailedEvent.objects.filter(
        status=FE.PENDING, error_class=ErrorClass.TRANSIENT, failed_at__gte=oldest, auto_replay_count__lt=cap
    ).order_by("failed_at")[: limit or int(dlq_setting("AUTO_REPLAY_BATCH"))]
    counts = {"replayed": 0, "failed": 0, "skipped": 0}
    for event in candidates:
        # One entry that raises does not stop the others (ledger.platform.passes): it records the error
        # and spends one of its automatic tries, so it backs off and, at the cap, waits for a
        # human. Replays are HTTP calls: no transaction is held across them (atomic=False).
        with row_isolated(
            job=AUTO_REPLAY_JOB, ref=f"event={event.pk}", on_failure=_auto_replay_failed(event), atomic=False
        ):
            counts[_auto_replay_one(event, now=now, cap=cap, base=base)] += 1
    return counts


AUTO_REPLAY_JOB = "dlq_auto_replay"
AUTO_OFF_NOTE = "automatic replay is off: re-sends of this entry need a second person's approval (four-eyes)"


def _auto_replay_failed(event: FailedEvent) -> Callable[[BaseException], None]:
    def record(exc: BaseException) -> None:
        FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).update(
            auto_replay_count=F("auto_replay_count") + 1,
            status_note=failure_text(AUTO_REPLAY_JOB, exc),
            updated_at=timezone.now(),
        )

    return record


def _auto_replay_one(event: FailedEvent, *, now: datetime, cap: int, base: float) -> str:
    """One candidate: "replayed", "failed" or "skipped"."""
    if _root_deadline(event) <= now:
        return "skipped"
    try:
        target = selectors.replay_target_resolve(tenant_id=event.tenant_id, slug=event.replay_target_slug)
    except DomainError:
        return "skipped"
    last = event.replays.filter(tenant_id=event.tenant_id).order_by("-number").first()
    if not target.auto_replay or (
        last is not None
        and (
            last.outcome != ReplayOutcome.FAILED
            or last.error_class != ErrorClass.TRANSIENT
            or (last.finished_at and now < last.finished_at + timedelta(seconds=base * 2**event.auto_replay_count))
        )
    ):
        return "skipped"
    if approvals.approval_required(
        tenant_id=event.tenant_id,
        provider_ids=selectors.entry_provider_ids(tenant_id=event.tenant_id, event_pks=[event.pk]),
    ):
        # Four-eyes (ADR 0013): no one would be the second person of an automatic replay.
        FailedEvent.objects.filter(pk=event.pk, tenant_id=event.tenant_id).exclude(status_note=AUTO_OFF_NOTE).update(
            status_note=AUTO_OFF_NOTE, updated_at=timezone.now()
        )
        return "skipped"
    try:
        replay = failed_event_replay(
            tenant_id=event.tenant_id,
            event_pk=event.pk,
            actor="auto-replay",
            note=f"automatic replay {event.auto_replay_count + 1} of {cap}",
            trigger=ReplayTrigger.AUTO,
        )
    except DomainError:
        return "skipped"
    return "replayed" if replay.outcome == ReplayOutcome.SUCCEEDED else "failed"
