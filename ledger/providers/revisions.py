"""Adapter revisions (DESIGN §5, adapter revisions): immutable snapshots of how the service
talks to a provider in execute mode, which one an operation runs under, and what an attempt
says about the revision it ran under.

- :func:`revision_record` writes revision n+1 whenever the adapter fields
  (``models.ADAPTER_FIELDS``) change — ``services.provider_upsert`` and the console's provider
  form call it; nothing updates a revision afterwards.
- :func:`revision_assign` picks a new operation's revision: the provider's stable one, or its
  canary for the canary's share of keys (a hash of tenant, key and canary, so the choice is
  the same every time it is made for one operation).
- :func:`adapter_view` is the provider as a revision sees it: the provider row (credential,
  class, retry policy, pause) with the revision's adapter fields. Every send, lookup and
  request check of an operation uses the view of the operation's revision, never the
  provider row's fields directly, so a cached provider row can never send a revision's
  request with another revision's settings.
- :func:`operation_revision_move` moves a row that nothing is under way for onto another
  revision (at the workers' take when its revision was retired; by a rollback).
- :func:`provider_fault` says whether an attempt's outcome counts against its revision in
  the canary watch (``ledger.providers.canary``).

This module imports nothing of ``ledger.protocol.services`` (which calls it from ``provider_upsert``);
the rollout moves that need the services live in ``ledger.providers.canary``.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Now
from django.utils import timezone

from ledger.models import (
    ADAPTER_FIELDS,
    AdapterRevision,
    ConfigChangeAction,
    ErrorClass,
    Operation,
    OperationEvent,
    Provider,
    ProviderKind,
)
from ledger.platform.caching import TtlCache
from ledger.platform.errors import AdapterRolloutConflict, ValidationFailed
from ledger.platform.redaction import scrub
from ledger.store import sql
from ledger.tenants.config_changes import config_change_record

MAX_REASON_LENGTH = 500
# The provider's rollout pointers: moved by this module and ledger.providers.canary only.
ROLLOUT_FIELDS = (
    "revision_id",
    "canary_revision_id",
    "canary_percent",
    "canary_started_at",
    "canary_paused_at",
    "canary_pause_evidence",
)


def adapter_config(provider: Provider) -> dict[str, Any]:
    """The adapter fields of ``provider`` (a saved row or a form's unsaved instance) as the
    JSON a revision stores."""
    config: dict[str, Any] = {}
    for name in ADAPTER_FIELDS:
        value = getattr(provider, name)
        if name == "timeout_seconds":
            value = float(value)
        elif isinstance(value, (list, tuple)):
            value = list(value)
        config[name] = value
    return config


def config_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The adapter fields whose values differ, in declaration order."""
    return [name for name in ADAPTER_FIELDS if before.get(name) != after.get(name)]


def clean_reason(reason: str | None) -> str:
    """An operator's reason as stored: one line, masked like every error text (it is shown
    to auditors and may quote what a provider answered), cut to the column."""
    return scrub(" ".join((reason or "").split()))[:MAX_REASON_LENGTH]


# --- Reading revisions -------------------------------------------------------------------------

# Revisions never change once written, so this process may keep the ones it used as long
# as it likes (ADAPTER_REVISION_CACHE_SECONDS, default an hour): no staleness to bound.
REVISIONS: TtlCache[AdapterRevision] = TtlCache("ADAPTER_REVISION_CACHE_SECONDS", max_entries=2048)


def revision_get(revision_id: int) -> AdapterRevision:
    revision = REVISIONS.get(revision_id, lambda: AdapterRevision.objects.filter(pk=revision_id).first())
    if revision is None:
        raise AdapterRevision.DoesNotExist(f"No adapter revision {revision_id}.")
    return revision


def adapter_view(provider: Provider, revision: AdapterRevision | None) -> Provider:
    """``provider`` with ``revision``'s adapter fields: a copy for reading, never saved.
    Without a revision (a callback provider, a guard-mode row) the provider as it is."""
    if revision is None:
        return provider
    view = copy.copy(provider)
    for name in ADAPTER_FIELDS:
        if name in revision.config:
            setattr(view, name, copy.deepcopy(revision.config[name]))
        else:
            # A revision written before the field existed (the asynchronous adapter fields of
            # migration 0018): it meant the field's default — a synchronous provider —, never
            # the value the row holds now.
            setattr(view, name, Provider._meta.get_field(name).get_default())
    return view


def operation_adapter_view(operation: Operation, provider: Provider) -> Provider:
    """The provider as ``operation``'s revision sees it: its adapter fields from the revision
    the operation runs under, everything else from the provider row.

    The row's own adapter fields are its stable revision's (services and the console write
    them together), so an operation of the revision the row names uses the row as it is; any
    other revision — a canary, or the new stable one while this process still caches the row
    from before a promotion — is read from its immutable snapshot."""
    return revision_view(provider, operation.adapter_revision_id)


def revision_view(provider: Provider, revision_id: int | None) -> Provider:
    """The provider as revision ``revision_id`` sees it (the rule above)."""
    if revision_id is None or revision_id == provider.revision_id:
        return provider
    return adapter_view(provider, revision_get(revision_id))


def revision_number(revision_id: int | None) -> int | None:
    """The per-provider number of a revision (logs, metrics, answers), or None."""
    return None if revision_id is None else revision_get(revision_id).number


# --- Writing revisions ------------------------------------------------------------------------


def revision_record(
    *,
    provider: Provider,
    config: dict[str, Any],
    actor: str,
    reason: str = "",
    based_on: AdapterRevision | None = None,
) -> AdapterRevision:
    """Append revision n+1 of ``provider`` with ``config`` (its adapter fields), recorded as
    a configuration change naming the fields that differ from ``based_on``. In the caller's
    transaction, which holds the provider row locked (numbers are unique per provider)."""
    highest = AdapterRevision.objects.filter(provider_id=provider.pk).aggregate(n=Max("number"))["n"] or 0
    revision = AdapterRevision.objects.create(
        tenant_id=provider.tenant_id,
        provider_id=provider.pk,
        number=highest + 1,
        config=config,
        based_on=based_on.number if based_on is not None else None,
        created_by=str(actor)[:150],
        created_at=timezone.now(),
        reason=clean_reason(reason),
    )
    changed = config_differences(based_on.config, config) if based_on is not None else list(ADAPTER_FIELDS)
    config_change_record(
        tenant_id=provider.tenant_id,
        actor=actor,
        action=ConfigChangeAction.CREATE,
        object_type="ledger.adapterrevision",
        object_id=revision.pk,
        object_repr=f"{provider} revision {revision.number}",
        before={name: based_on.config.get(name) for name in changed} if based_on is not None else None,
        after={"number": revision.number, "based_on": revision.based_on, **{name: config[name] for name in changed}},
        reason=revision.reason,
    )
    return revision


def revision_first(*, provider: Provider, actor: str, reason: str = "") -> AdapterRevision | None:
    """Revision 1 of a provider just created (in its transaction), made stable."""
    if provider.kind != ProviderKind.HTTP:
        return None
    revision = revision_record(
        provider=provider, config=adapter_config(provider), actor=actor, reason=reason or "provider created"
    )
    Provider.objects.filter(pk=provider.pk).update(revision=revision)
    provider.revision = revision
    return revision


def revision_ensure(provider: Provider) -> int | None:
    """The id of ``provider``'s stable revision, writing revision 1 from its current
    configuration if it has none yet (a provider written without ``provider_upsert``: an
    older row, a test's fixture). Callback providers have no revisions: the service owns
    their configuration. Safe under concurrency: the row is locked and read again."""
    if provider.kind != ProviderKind.HTTP:
        return None
    if provider.revision_id is not None:
        return provider.revision_id
    current = Provider.objects.filter(pk=provider.pk).values_list("revision_id", flat=True).first()
    if current is not None:
        return current
    with transaction.atomic():
        locked = Provider.objects.select_for_update().get(pk=provider.pk)
        if locked.revision_id is not None:
            return locked.revision_id
        revision = revision_record(
            provider=locked, config=adapter_config(locked), actor="system", reason="first use of this provider"
        )
        Provider.objects.filter(pk=locked.pk).update(revision=revision)
    return revision.pk


def rollout_state(provider: Provider) -> dict[str, Any]:
    """Which revisions of ``provider`` run, by number: what the configuration trail records
    for every rollout move (ids would mean nothing to an auditor)."""
    return {
        "revision": revision_number(provider.revision_id),
        "canary_revision": revision_number(provider.canary_revision_id),
        "canary_percent": provider.canary_percent,
        **({"canary_paused": True} if provider.canary_paused_at is not None else {}),
    }


def canary_percent_check(percent: Any) -> int:
    """A canary's share of new operations: a whole percentage from 1 to 100."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise ValidationFailed("`canary_percent` must be a whole number from 1 to 100.")
    return percent


def revision_for_save(
    *, candidate: Provider, stored: Provider, actor: str, reason: str = "", canary_percent: int | None = None
) -> AdapterRevision | None:
    """Before ``candidate`` — the locked row ``stored`` with the new values set — is saved:
    when its adapter fields changed, record the next revision. Without ``canary_percent`` it
    becomes the stable revision at once (``candidate.revision``); with it, the row keeps the
    stable revision's adapter fields and the new revision takes that share of new operations
    as a canary. Refused while a canary runs: promote it or roll it back first."""
    if canary_percent is not None:
        canary_percent = canary_percent_check(canary_percent)
    stable_id = revision_ensure(stored)
    # The rollout pointers are the locked row's, whatever the candidate was loaded with (a
    # form read before a concurrent rollback must not write the old canary back).
    for name in ROLLOUT_FIELDS:
        setattr(candidate, name, getattr(stored, name))
    candidate.revision_id = stable_id
    if stable_id is None:
        if canary_percent is not None:
            raise ValidationFailed("Callback providers have no adapter revisions.")
        return None
    wanted = adapter_config(candidate)
    if not config_differences(adapter_config(stored), wanted):
        if canary_percent is not None:
            raise ValidationFailed("Nothing in the adapter configuration changed: there is no revision to canary.")
        return None
    if stored.canary_revision_id is not None:
        raise AdapterRolloutConflict(
            f"Revision {revision_number(stored.canary_revision_id)} runs as a canary ({stored.canary_percent} %):"
            " promote it or roll it back before changing the adapter again."
        )
    revision = revision_record(
        provider=stored, config=wanted, actor=actor, reason=reason, based_on=revision_get(stable_id)
    )
    if canary_percent is None:
        candidate.revision = revision
    else:
        for name in ADAPTER_FIELDS:
            setattr(candidate, name, getattr(stored, name))
        candidate.canary_revision = revision
        candidate.canary_percent = canary_percent
        # The database's clock, like the attempts' finished_at the watch compares it with.
        candidate.canary_started_at = sql.db_now()
    return revision


# --- Which revision an operation runs under ----------------------------------------------------


def canary_share(*, tenant_id: int, key: str, canary_revision_id: int, percent: int) -> bool:
    """Whether the operation ``key`` belongs to the canary's ``percent`` share: a stable hash
    of tenant, key and canary revision (the same answer every time for one operation; another
    canary draws its own sample)."""
    if percent <= 0:
        return False
    if percent >= 100:
        return True
    digest = hashlib.sha256(f"{tenant_id}\x00{canary_revision_id}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def revision_assign(*, provider: Provider, tenant_id: int, key: str) -> int | None:
    """The revision a new operation of ``provider`` runs under: the canary for its share of
    keys while one runs (and is not paused by a gate: ADR 0020), else the stable revision
    (None for callback providers)."""
    stable = revision_ensure(provider)
    if (
        stable is not None
        and provider.canary_revision_id is not None
        and provider.canary_paused_at is None
        and canary_share(
            tenant_id=tenant_id,
            key=key,
            canary_revision_id=provider.canary_revision_id,
            percent=provider.canary_percent,
        )
    ):
        return provider.canary_revision_id
    return stable


def operation_revision_move(
    *,
    operation_id: int,
    tenant_id: int,
    from_status: str,
    from_revision_id: int | None,
    to_revision_id: int,
    actor: str,
    reason: str,
    changes: dict[str, Any] | None = None,
) -> bool:
    """Move a row nothing is under way for (``queued`` or ``retry_wait``, as read) onto
    another revision, with an event row saying why; ``changes`` are further columns (due now,
    attempts) moved with it. A guarded UPDATE on the state and the revision as read: False
    when the row moved meanwhile (a worker that took it runs under what it was taken with)."""
    with transaction.atomic():
        moved = Operation.objects.filter(
            pk=operation_id, tenant_id=tenant_id, status=from_status, adapter_revision_id=from_revision_id
        ).update(adapter_revision_id=to_revision_id, updated_at=Now(), **(changes or {}))
        if moved:
            OperationEvent.objects.create(
                tenant_id=tenant_id,
                operation_id=operation_id,
                from_status=from_status,
                to_status=from_status,
                actor=str(actor)[:150],
                reason=reason[:500],
                attempt=None,
                at=Now(),
            )
    return bool(moved)


# --- What an attempt says about its revision ---------------------------------------------------

# Answers that say the caller's request was refused on its merits (the caller's own
# invalid_input): the same under every revision, so they say nothing about one.
CALLER_STATUSES = frozenset({400, 402, 422})
# Throttling says the provider is busy, not that the revision is wrong.
THROTTLE_STATUSES = frozenset({429, 503})


def provider_fault(*, error_class: str | None, status: int | None, sent: bool) -> bool | None:
    """How one finished attempt counts in the canary watch: True a provider-side failure
    (5xx, ``ambiguous`` — a timeout or reset after sending, a 2xx the adapter could not read —,
    ``invalid_output`` — an output that failed its checks (ledger.execution.outputs) —, an unexpected 4xx or 3xx, 401/403, a destination the policy refuses,
    the provider unreachable), False a success, None not counted at all (throttling, a
    key-in-use 409, the caller's own invalid input, a row that expired before sending)."""
    if not error_class:
        return False
    if not sent:
        # Taken past its deadline or lifetime: never sent, nothing to say about the revision.
        return None
    if error_class == ErrorClass.TRANSIENT:
        if status in THROTTLE_STATUSES or status == 409:
            return None
        # 408/425, or nothing reached the provider (refused connection, connect timeout).
        return True
    if error_class == ErrorClass.INVALID_INPUT and status in CALLER_STATUSES:
        return None
    return True
