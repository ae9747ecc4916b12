"""Bulk replay: a dry run freezes the selection (ids, count, digest; nothing is sent), a
confirm starts it (one per tenant at a time), and the runner (``dlq.tasks.bulk_replay_run_task``)
replays exactly the frozen ids, paced and resumable.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlq.entries import selectors
from dlq.entries.services import clean_note
from dlq.models import FE, BulkReplay, BulkReplayStatus, ReplayOutcome, ReplayTrigger
from dlq.replays.services import failed_event_replay
from dlq.rules.conf import dlq_setting
from dlq.rules.errors import (
    BulkReplayNotConfirmable,
    BulkReplayNotFound,
    BulkReplayRateLimited,
    BulkReplayTooLarge,
    NoteRequired,
)
from ledger.models import ApprovalKind, Tenant
from ledger.platform import tasks
from ledger.platform.errors import DomainError
from ledger.protocol import approvals

log = logging.getLogger("onceguard.dlq")


def bulk_replay_prepare(
    *,
    tenant: Tenant,
    filters: dict[str, Any],
    actor: str,
    target_slug: str = "",
    force: bool = False,
    note: str = "",
    event_pks: list[int] | None = None,
) -> BulkReplay:
    """Dry run: freeze the selection (ids + count + digest); nothing is sent.

    Without a status filter the selection is the replayable entries: pending (and replayed
    ones with ``force``). ``event_pks`` (the console's ticked rows) narrows it further.
    """
    note = clean_note(note)
    if force and not note:
        raise NoteRequired("A forced bulk replay needs a note saying why.")
    if target_slug:
        selectors.replay_target_resolve(tenant_id=tenant.pk, slug=target_slug)
    query = dict(filters)
    if not query.get("status"):
        query["status"] = [FE.PENDING, FE.REPLAYED] if force else [FE.PENDING]
    qs = selectors.failed_event_list(tenant_id=tenant.pk, **query)
    if event_pks is not None:
        qs = qs.filter(pk__in=event_pks)
    limit = int(dlq_setting("BULK_MAX_SELECTION"))
    ids = list(qs.order_by("id").values_list("id", flat=True)[: limit + 1])
    if len(ids) > limit:
        raise BulkReplayTooLarge(f"The selection has more than {limit} entries; narrow the filters.")
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    bulk = BulkReplay.objects.create(
        tenant=tenant,
        filters=selectors.filters_as_json(query),
        event_ids=ids,
        count=len(ids),
        digest=digest,
        target_slug=target_slug,
        force=force,
        note=note,
        created_by=actor[:150],
        expires_at=timezone.now() + timedelta(seconds=int(dlq_setting("BULK_DRY_RUN_TTL_SECONDS"))),
    )
    log.info("dlq_bulk_prepared bulk=%s tenant=%s count=%s", bulk.pk, tenant.slug, bulk.count)
    return bulk


def bulk_replay_confirm(
    *,
    tenant: Tenant,
    bulk_id: int,
    actor: str,
    count: int | None = None,
    target_slug: str | None = None,
    note: str | None = None,
) -> BulkReplay:
    """draft → running (guarded); the runner replays exactly the frozen ids, paced.

    ``count`` (what the operator was shown) must match the frozen count. ``target_slug`` and
    ``note`` may still be chosen at confirm time; the selection itself cannot change. One
    bulk replay runs per tenant at a time (a second confirm answers 429).
    """
    options: dict[str, Any] = {}
    if target_slug:
        selectors.replay_target_resolve(tenant_id=tenant.pk, slug=target_slug)
        options["target_slug"] = target_slug
    if note:
        options["note"] = clean_note(note)
    draft = BulkReplay.objects.filter(
        pk=bulk_id, tenant=tenant, status=BulkReplayStatus.DRAFT, expires_at__gt=timezone.now()
    ).first()
    if draft is not None:
        # Four-eyes (ADR 0013): the frozen selection waits for a second person, and lives as
        # long as the request does (a dry run's own hour is shorter than an approver's day).
        try:
            approvals.approval_gate(
                tenant_id=tenant.pk,
                provider_id=None,
                provider_ids=selectors.entry_provider_ids(tenant_id=tenant.pk, event_pks=draft.event_ids),
                kind=ApprovalKind.BULK_REPLAY,
                actor=actor,
                reason=options.get("note") or draft.note,
                target_ids=draft.event_ids,
                target_ref=str(draft.pk),
                params={"count": count, "target_slug": target_slug or "", "note": options.get("note") or draft.note},
            )
        except approvals.ApprovalPending as pending:
            BulkReplay.objects.filter(pk=draft.pk, status=BulkReplayStatus.DRAFT).update(
                expires_at=pending.request.expires_at
            )
            raise
    with transaction.atomic():
        # Serialises confirms of one tenant, so the one-at-a-time check cannot race.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        bulk = BulkReplay.objects.filter(pk=bulk_id, tenant=tenant).first()
        if bulk is None:
            raise BulkReplayNotFound("No such bulk replay.")
        if count is not None and count != bulk.count:
            raise BulkReplayNotConfirmable(
                f"The frozen selection has {bulk.count} entries, not {count}.", extra={"count": bulk.count}
            )
        running = BulkReplay.objects.filter(tenant=tenant, status=BulkReplayStatus.RUNNING).exclude(pk=bulk.pk)
        if running.exists():
            raise BulkReplayRateLimited("Another bulk replay is running for this tenant.", retry_after=30)
        now = timezone.now()
        moved = BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.DRAFT, expires_at__gt=now).update(
            status=BulkReplayStatus.RUNNING, confirmed_by=actor[:150], confirmed_at=now, **options
        )
        if moved:
            transaction.on_commit(lambda: _enqueue_bulk(bulk.pk), robust=True)
    if not moved:
        # Outside the transaction above, so the expiry is recorded even though we refuse.
        if BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.DRAFT).update(status=BulkReplayStatus.EXPIRED):
            raise BulkReplayNotConfirmable("The dry run expired; run it again.", extra={"bulk_status": "expired"})
        bulk.refresh_from_db()
        raise BulkReplayNotConfirmable(f"This bulk replay is {bulk.status}.", extra={"bulk_status": bulk.status})
    bulk.refresh_from_db()
    log.info("dlq_bulk_confirmed bulk=%s count=%s actor=%s", bulk.pk, bulk.count, actor)
    return bulk


def _enqueue_bulk(bulk_id: int) -> None:
    tasks.enqueue("dlq.tasks.bulk_replay_run_task", bulk_id)


def bulk_replay_run(*, bulk_id: int, budget_seconds: float | None = None) -> BulkReplay | None:
    """Work through a confirmed selection at BULK_REPLAY_PER_SECOND, resumably.

    Each position is taken with a guarded UPDATE before its entry is replayed, so two runners
    (a re-delivered task) never replay the same entry twice. Entries that are no longer
    replayable (resolved meanwhile, being replayed) are counted as skipped.
    """
    bulk = BulkReplay.objects.filter(pk=bulk_id).first()
    if bulk is None or bulk.status != BulkReplayStatus.RUNNING:
        return bulk
    rate = max(1.0, float(dlq_setting("BULK_REPLAY_PER_SECOND")))
    budget = float(budget_seconds if budget_seconds is not None else dlq_setting("BULK_TASK_BUDGET_SECONDS"))
    started = time.monotonic()
    sent = 0
    while True:
        position = BulkReplay.objects.filter(pk=bulk.pk).values_list("position", flat=True).get()
        if position >= bulk.count:
            BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.RUNNING).update(
                status=BulkReplayStatus.DONE, finished_at=timezone.now()
            )
            break
        if sent and time.monotonic() - started > budget:
            # Stay under django-q2's task timeout: a fresh task picks up at `position`.
            _enqueue_bulk(bulk.pk)
            break
        wait = started + sent / rate - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 1.0))
        taken = BulkReplay.objects.filter(pk=bulk.pk, status=BulkReplayStatus.RUNNING, position=position).update(
            position=position + 1
        )
        if not taken:
            break
        counter = "skipped"
        try:
            replay = failed_event_replay(
                tenant_id=bulk.tenant_id,
                event_pk=bulk.event_ids[position],
                actor=bulk.confirmed_by,
                target_slug=bulk.target_slug,
                force=bulk.force,
                note=bulk.note or f"bulk replay #{bulk.pk}",
                trigger=ReplayTrigger.BULK,
                bulk_id=bulk.pk,
            )
            counter = "succeeded" if replay.outcome == ReplayOutcome.SUCCEEDED else "failed"
        except DomainError as exc:
            log.info("dlq_bulk_skipped bulk=%s event=%s reason=%s", bulk.pk, bulk.event_ids[position], exc.code)
        BulkReplay.objects.filter(pk=bulk.pk).update(**{counter: F(counter) + 1})
        sent += 1
    bulk.refresh_from_db()
    return bulk
