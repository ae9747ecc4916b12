"""Restore fencing (ADR 0012): a restored backup must not forget the keys it lost.

The ledger journals, outside its database, every key whose effect may have happened — at its
sent marker and at its finish, before the database commit of that state (``journal_move``,
called from ``ledger.protocol.transitions``). Its database holds an identity (which journal is
its own) and an epoch it advances (``epoch_advance``), writing each new epoch to the journal as a
mark while it holds the identity row, before that commit.

**The rule.** A database restored from a backup carries the backup's epoch ``E``. Every key
journaled after the backup lies after the journal's first mark of an epoch ≥ ``E - 1`` (mark
``E`` was written before the commit that the backup contains; ``E - 1`` also covers a
transaction that journaled its key just before the mark and committed after the backup). The
database *went back in time* when the journal holds a mark above its epoch. ``view_load`` — run
at a process's start and on the fence schedule — then reads the journal from that mark and
holds every key the database knows neither as an operation nor as a tombstone: a row in
``FenceHold``, not an operation. At a process's start it reads the same stretch even when the
epochs agree, which also catches a restore made within one epoch. Then it advances the epoch
past the journal's, so the restored database's later marks never meet the lost timeline's.

A claim of a new key asks ``hold_refusal`` — one indexed read, and only while this process knows
of unreleased holds (re-read every ``FENCE_EPOCH_SECONDS``); a held key answers ``409
operation_held_after_restore``. A hold lifts when a person resolves it (``fence_hold_resolve``,
audited) or the provider's lookup proves the outcome (``fence_hold_lookup``).

Above ``ledger.providers`` (the lookup) and ``ledger.tenants`` (the audit trail); below the
transitions, which import it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from ledger.models import (
    FENCE_RELEASED,
    ConfigChangeAction,
    FenceHold,
    FenceHoldResolution,
    LedgerIdentity,
    Operation,
    Provider,
    Tenant,
    Tombstone,
)
from ledger.platform.errors import (
    FenceJournalUnavailable,
    OperationHeldAfterRestore,
    OperationNotFound,
    ValidationFailed,
)
from ledger.platform.journal import Entry, Journal, JournalStoreError, LocalJournal, RedisJournal, retention_cutoff
from ledger.providers.reconcile import LookupOutcome, provider_lookup
from ledger.tenants.config_changes import config_change_record

log = logging.getLogger("onceguard.ledger")

# Keys checked against the database per query while a journal stretch is read.
SCAN_BATCH = 500


@dataclass
class _View:
    """This process's view of fencing: its journal, and whether unreleased holds exist."""

    ledger_id: str = ""
    journal: Journal | None = None
    loaded: bool = False
    fenced: bool = False
    read_at: float = 0.0


_view = _View()
_lock = threading.Lock()


def fencing_enabled() -> bool:
    return settings.ONCEGUARD.get("FENCE_JOURNAL", "off") != "off"


def identity() -> LedgerIdentity:
    """The ledger's identity row; created when missing (a database flushed by a test, or one
    the migration's data step did not reach)."""
    found = LedgerIdentity.objects.filter(pk=1).first()
    if found is not None:
        return found
    LedgerIdentity.objects.get_or_create(
        pk=1, defaults={"ledger_id": str(uuid.uuid4()), "epoch": 0, "created_at": timezone.now()}
    )
    return LedgerIdentity.objects.get(pk=1)


def journal_open(ledger_id: str) -> Journal:
    config = settings.ONCEGUARD
    if config["FENCE_JOURNAL"] == "redis":
        return RedisJournal(config["FENCE_REDIS_URL"], ledger_id)
    return LocalJournal(config["FENCE_JOURNAL_DIR"], ledger_id, fsync=bool(config["FENCE_JOURNAL_FSYNC"]))


def journal() -> Journal:
    """This process's journal, named by the database's identity (read once per process; a
    ``view_load`` reads it again, after a restore that brought another identity)."""
    if _view.journal is None:
        with _lock:
            if _view.journal is None:
                ident = identity()
                _view.ledger_id, _view.journal = ident.ledger_id, journal_open(ident.ledger_id)
    return _view.journal


def view_reset() -> None:
    """Forget this process's view (tests; a process that must re-read everything)."""
    with _lock:
        if isinstance(_view.journal, LocalJournal):
            _view.journal.close()
        _view.ledger_id, _view.journal, _view.loaded, _view.fenced, _view.read_at = "", None, False, False, 0.0


# --- Writing: the journal before the commit -----------------------------------------------------


def journal_move(*, tenant_id: int, key: str, provider_id: int | None, state: str) -> None:
    """Journal ``key`` as possibly performed, in the transaction of the move that makes it so
    and before its commit: a journal that cannot be written fails the move (no commit of a sent
    or finished state the journal does not know)."""
    if not fencing_enabled():
        return
    try:
        journal().append(Entry(tenant_id=tenant_id, provider_id=provider_id, state=state, key=key))
    except (OSError, JournalStoreError) as exc:
        # The class only: a path or a URL may be in the text.
        log.error("fence_journal_unavailable error=%s", type(exc).__name__)
        raise FenceJournalUnavailable(
            "The fence journal could not be written; nothing was recorded. Try again shortly.", retry_after=5
        ) from exc


# --- The epoch and the view ------------------------------------------------------------------------


def epoch_advance(*, past: int = 0) -> int:
    """Advance the database's epoch to one above both its own and ``past``; the new epoch's
    mark is written to the journal while the identity row is locked, before the commit (so a
    backup that holds epoch E has its mark before every key journaled after it)."""
    with transaction.atomic():
        ident = LedgerIdentity.objects.select_for_update().filter(pk=1).first() or identity()
        new = max(ident.epoch, past) + 1
        journal().mark(new)
        LedgerIdentity.objects.filter(pk=1).update(epoch=new)
    return new


@dataclass(frozen=True)
class ViewReport:
    database_epoch: int
    journal_epoch: int
    # The journal has a mark above the database's epoch: the database was restored.
    went_back: bool
    new_holds: int
    epoch: int


def view_load(*, at_start: bool = True) -> ViewReport:
    """Compare the database's epoch with the journal's, hold the journaled keys the database
    lost, and advance the epoch. ``at_start`` (a process's first view, a restart, the
    ``fence_check`` command) reads the journal's recent stretch even when the epochs agree;
    the fence schedule reads it only when the database is behind. Runs outside a transaction."""
    if connection.in_atomic_block:
        raise RuntimeError("view_load commits its epoch: call it outside a transaction.")
    with _lock:
        if isinstance(_view.journal, LocalJournal):
            _view.journal.close()
        _view.journal = None
    ident = identity()
    book = journal()
    journal_epoch = book.highest_mark()
    went_back = journal_epoch > ident.epoch
    new_holds = 0
    if went_back or at_start:
        new_holds = _hold_lost_keys(book, database_epoch=ident.epoch)
    epoch = epoch_advance(past=journal_epoch)
    _fenced_read()
    _view.loaded = True
    if went_back or new_holds:
        log.warning(
            "fence_restore_detected database_epoch=%s journal_epoch=%s new_holds=%s",
            ident.epoch,
            journal_epoch,
            new_holds,
        )
    return ViewReport(ident.epoch, journal_epoch, went_back, new_holds, epoch)


def _hold_lost_keys(book: Journal, *, database_epoch: int) -> int:
    created = 0
    batch: dict[tuple[int, str], Entry] = {}
    for entry in book.entries_since_mark(max(0, database_epoch - 1)):
        batch.setdefault((entry.tenant_id, entry.key), entry)
        if len(batch) >= SCAN_BATCH:
            created += _hold_unknown(batch, epoch=database_epoch)
            batch = {}
    if batch:
        created += _hold_unknown(batch, epoch=database_epoch)
    return created


def _hold_unknown(batch: dict[tuple[int, str], Entry], *, epoch: int) -> int:
    by_tenant: dict[int, list[str]] = {}
    for tenant_id, key in batch:
        by_tenant.setdefault(tenant_id, []).append(key)
    known: set[tuple[int, str]] = set()
    for tenant_id, keys in by_tenant.items():
        for model in (Operation, Tombstone):
            known.update(
                (tenant_id, key)
                for key in model.objects.filter(tenant_id=tenant_id, key__in=keys).values_list("key", flat=True)
            )
    lost = [entry for pair, entry in batch.items() if pair not in known]
    if not lost:
        return 0
    # A tenant deleted since the entry was journaled has nothing left to hold.
    live = set(Tenant.objects.filter(pk__in={e.tenant_id for e in lost}).values_list("pk", flat=True))
    now = timezone.now()
    rows = [
        FenceHold(
            tenant_id=e.tenant_id,
            key=e.key,
            provider_id=e.provider_id,
            journaled_state=e.state[:20],
            epoch=epoch,
            found_at=now,
        )
        for e in lost
        if e.tenant_id in live
    ]
    before = FenceHold.objects.count()
    FenceHold.objects.bulk_create(rows, ignore_conflicts=True)
    return FenceHold.objects.count() - before


def _fenced_read() -> None:
    _view.fenced = FenceHold.objects.exclude(resolution__in=FENCE_RELEASED).exists()
    _view.read_at = time.monotonic()


# --- Claims of held keys ------------------------------------------------------------------------------


def hold_refusal(*, tenant_id: int, key: str) -> None:
    """Raise 409 ``operation_held_after_restore`` for a held key. Called for a key the database
    does not know, before its insert. Costs nothing while this process knows of no unreleased
    hold (re-read every ``FENCE_EPOCH_SECONDS``), one indexed read otherwise."""
    if not fencing_enabled():
        return
    if not _view.loaded and not connection.in_atomic_block:
        view_load(at_start=True)
    elif time.monotonic() - _view.read_at > float(settings.ONCEGUARD["FENCE_EPOCH_SECONDS"]):
        _fenced_read()
    if not _view.fenced:
        return
    hold = (
        FenceHold.objects.filter(tenant_id=tenant_id, key=key)
        .exclude(resolution__in=FENCE_RELEASED)
        .only("pk", "resolution", "journaled_state")
        .first()
    )
    if hold is None:
        return
    FenceHold.objects.filter(pk=hold.pk).update(refused_claims=F("refused_claims") + 1)
    if hold.resolution == FenceHoldResolution.OPEN:
        detail = (
            "The database was restored from a backup, and this key may have been performed after it "
            f"(the journal saw it {hold.journaled_state}). It is held until a person resolves it or the "
            "provider's lookup proves the outcome; retrying does not help."
        )
    else:
        detail = "The effect of this key happened before the database was restored; it will not run again."
    raise OperationHeldAfterRestore(detail, extra={"hold_id": hold.pk, "resolution": hold.resolution})


# --- Lifting a hold ---------------------------------------------------------------------------------------

RESOLVE_CHOICES = (FenceHoldResolution.RELEASED, FenceHoldResolution.PERFORMED)


def _open_hold(*, hold_id: int, tenant_ids: list[int] | None) -> FenceHold:
    rows = FenceHold.objects.filter(pk=hold_id)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    hold = rows.first()
    if hold is None:
        raise OperationNotFound("No such hold.")
    if hold.resolution != FenceHoldResolution.OPEN:
        raise ValidationFailed(f"The hold is already resolved ({hold.get_resolution_display()}).")
    return hold


def _resolve(hold: FenceHold, *, resolution: str, actor: str, reason: str) -> FenceHold:
    with transaction.atomic():
        moved = FenceHold.objects.filter(pk=hold.pk, resolution=FenceHoldResolution.OPEN).update(
            resolution=resolution, resolved_at=timezone.now(), resolved_by=actor[:150], reason=reason[:500]
        )
        if not moved:
            raise ValidationFailed("The hold was resolved meanwhile; reload it.")
        config_change_record(
            tenant_id=hold.tenant_id,
            actor=actor,
            action=ConfigChangeAction.UPDATE,
            object_type="fence_hold",
            object_id=hold.pk,
            object_repr=f"hold of {hold.key}"[:200],
            before={"resolution": FenceHoldResolution.OPEN},
            after={"resolution": resolution},
            reason=reason,
        )
    _fenced_read()
    log.info("fence_hold_resolved hold=%s resolution=%s actor=%s", hold.pk, resolution, actor)
    return FenceHold.objects.get(pk=hold.pk)


def fence_hold_resolve(
    *, hold_id: int, resolution: str, actor: str, reason: str, tenant_ids: list[int] | None = None
) -> FenceHold:
    """A person's decision on a hold: ``released`` (the key may run) or ``performed`` (it
    happened; claims stay refused). The reason is required; the decision is in the audit trail."""
    reason = " ".join((reason or "").split())
    if resolution not in RESOLVE_CHOICES:
        raise ValidationFailed("Resolve a hold as released or performed.")
    if not reason:
        raise ValidationFailed("Say why the hold is resolved that way.")
    hold = _open_hold(hold_id=hold_id, tenant_ids=tenant_ids)
    return _resolve(hold, resolution=resolution, actor=actor, reason=reason)


def fence_hold_lookup(
    *, hold_id: int, actor: str, tenant_ids: list[int] | None = None, client: httpx.Client | None = None
) -> FenceHold:
    """Ask the provider's lookup whether the held key's effect exists: found → kept refused
    (it happened), not found → lifted (it may run). An unknown answer leaves the hold open."""
    hold = _open_hold(hold_id=hold_id, tenant_ids=tenant_ids)
    provider = Provider.objects.filter(pk=hold.provider_id, tenant_id=hold.tenant_id).first()
    if provider is None or not provider.lookup_path:
        raise ValidationFailed("The held key's provider has no lookup; a person resolves this hold.")
    # The lookup reads the key and its provider only; the row it is handed is never saved.
    probe = Operation(tenant_id=hold.tenant_id, key=hold.key, provider=provider, reconciliation_handle="")
    result = provider_lookup(provider=provider, operation=probe, client=client)
    if result.outcome == LookupOutcome.FOUND:
        reason = f"the provider's lookup found it (ref {result.provider_ref or 'none'})"
        return _resolve(
            hold, resolution=FenceHoldResolution.LOOKUP_FOUND, actor=f"lookup, asked by {actor}", reason=reason
        )
    if result.outcome == LookupOutcome.NOT_FOUND:
        return _resolve(
            hold,
            resolution=FenceHoldResolution.LOOKUP_NOT_FOUND,
            actor=f"lookup, asked by {actor}",
            reason="the provider's lookup has no such effect",
        )
    raise ValidationFailed(
        f"The provider's lookup did not answer clearly ({result.error or 'unknown'}); the hold stays."
    )


def fence_schedule() -> dict[str, int]:
    """The fence schedule: advance the epoch (reading the journal when the database is
    behind) and prune the journal past its retention."""
    if not fencing_enabled():
        return {}
    report = view_load(at_start=False)
    pruned = journal().prune(older_than=retention_cutoff(int(settings.ONCEGUARD["FENCE_JOURNAL_RETENTION_DAYS"])))
    return {"epoch": report.epoch, "new_holds": report.new_holds, "pruned": pruned}


def open_holds() -> Any:
    return FenceHold.objects.filter(resolution=FenceHoldResolution.OPEN)


__all__ = [
    "RESOLVE_CHOICES",
    "ViewReport",
    "epoch_advance",
    "fence_hold_lookup",
    "fence_hold_resolve",
    "fence_schedule",
    "fencing_enabled",
    "hold_refusal",
    "identity",
    "journal",
    "journal_move",
    "open_holds",
    "view_load",
    "view_reset",
]
