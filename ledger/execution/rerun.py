"""Re-running a rolled-back revision's recalled outputs under the good revision (ADR 0020).

:func:`recalled_outputs_rerun` submits, for each operation whose output was recalled
(quarantined or flagged) and that no newer version replaced yet, the next version of its key
— ``{record}:{action}:v{n+1}``, the versioned-key mechanics a correction uses; a key that was
not versioned becomes the record of its own version 2 — with the same request (and the prompt
versions it was accepted with, ADR 0009), callback and run. The new row runs under the
provider's stable revision (moved there while still queued if a canary's share drew it), and
the original records it as ``replaced_by``, so a second bulk re-run finds nothing left to do.

A tenant or provider that requires four eyes for re-sends (ADR 0013) turns the call into a
pending approval request (``ApprovalPending``); the approved request runs this same function
in the approver's name (the executor is registered in ``ledger.apps``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models.functions import Now

from ledger.execution.submission import operation_submit_version, version_after
from ledger.models import (
    RECALLED_OUTPUT_STATES,
    AdapterRevision,
    ApprovalKind,
    ApprovalRequest,
    Operation,
    OperationEvent,
    OperationOutput,
    Provider,
    Tenant,
)
from ledger.platform.crypto import open_json
from ledger.platform.errors import AdapterRolloutConflict, OperationNotFound, ValidationFailed
from ledger.protocol import approvals
from ledger.protocol.inputs import key_version_parts, sanitize_message, versioned_key
from ledger.providers import revisions
from ledger.rules import intents

log = logging.getLogger("onceguard.rerun")

# One call re-runs at most this many operations (the next call takes the rest).
RERUN_MAX = 500


@dataclass(frozen=True)
class RerunResult:
    revision: int
    stable: int | None
    # (original operation id, new operation id, new key)
    rerun: list[tuple[int, int, str]] = field(default_factory=list)


def next_key_version(op: Operation) -> tuple[str, str, int]:
    """(record, action, version) of the version after ``op``'s: its parts, or its key's
    versioned form, else its key as the record of version 2 (the original is version 1)."""
    if op.record and op.version is not None:
        record, action, version = op.record, op.action, op.version
    else:
        record, action, version = key_version_parts(op.key) or (op.key, op.action or "output", 1)
    return record, action, version_after(tenant_id=op.tenant_id, record=record, action=action, version=version)


def _rerun_one(
    *, op: Operation, tenant: Tenant, provider: Provider, stable_id: int | None, actor: str, why: str
) -> tuple[int, str] | None:
    """The re-run of one original, or None when another re-run replaced it first."""
    record, action, version = next_key_version(op)
    key = versioned_key(record=record, action=action, version=version)
    request = open_json(op.request)
    pins = None
    accepted = intents.stored_intent(request)
    if accepted is not None:
        request, pins = {"intent": accepted[0]}, accepted[1]
    with transaction.atomic():
        # The original, locked while it is still not replaced: two re-runs at once (a double
        # click, an approval beside a direct call) submit one; the other waits here, then finds
        # it replaced and sends nothing.
        still_original = (
            Operation.objects.select_for_update()
            .filter(pk=op.pk, tenant_id=op.tenant_id, replaced_by__isnull=True)
            .exists()
        )
        if not still_original:
            return None
        submitted = operation_submit_version(
            original=op,
            tenant=tenant,
            provider=provider.slug,
            record=record,
            action=action,
            version=version,
            request=request,
            prompt_pins=pins,
            actor=actor,
        )
        if stable_id is not None and submitted.adapter_revision_id not in (None, stable_id):
            # A canary's share drew it: the re-run is under the good revision.
            revisions.operation_revision_move(
                operation_id=submitted.pk,
                tenant_id=tenant.pk,
                from_status=submitted.status,
                from_revision_id=submitted.adapter_revision_id,
                to_revision_id=stable_id,
                actor=actor,
                reason=why,
            )
        Operation.objects.filter(pk=op.pk, replaced_by__isnull=True).update(replaced_by=submitted)
        OperationEvent.objects.create(
            tenant_id=op.tenant_id,
            operation_id=op.pk,
            from_status=op.status,
            to_status=op.status,
            actor=actor[:150],
            reason=f"{why}: re-run as {key} (operation {submitted.pk})"[:500],
            attempt=None,
            at=Now(),
        )
    return submitted.pk, key


def recalled_outputs_rerun(
    *,
    tenant_id: int,
    provider_id: int,
    number: int,
    actor: str,
    reason: str,
    limit: int = RERUN_MAX,
    tenant_ids: list[int] | None = None,
) -> RerunResult:
    """Re-run revision ``number``'s recalled outputs as the next versions of their keys
    (module docstring); at most ``limit`` per call. The revision must have been rolled back."""
    reason = sanitize_message(reason)[:500]
    if not reason:
        raise ValidationFailed("Say why (a reason is recorded with every re-run).")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= RERUN_MAX:
        raise ValidationFailed(f"`limit` must be a whole number from 1 to {RERUN_MAX}.")
    provider = Provider.objects.filter(pk=provider_id, tenant_id=tenant_id)
    if tenant_ids is not None:
        provider = provider.filter(tenant_id__in=tenant_ids)
    provider = provider.first()
    if provider is None:
        raise OperationNotFound("No such provider.")
    revision = AdapterRevision.objects.filter(provider_id=provider.pk, number=number).first()
    if revision is None:
        raise OperationNotFound(f"Provider {provider.slug} has no adapter revision {number}.")
    if revision.rolled_back_at is None:
        raise AdapterRolloutConflict(f"Revision {number} was not rolled back: its outputs stand.")
    approvals.approval_gate(
        tenant_id=tenant_id,
        provider_id=provider.pk,
        kind=ApprovalKind.RECALLED_RERUN,
        actor=actor,
        reason=reason,
        target_ref=f"{provider.slug}@r{number}",
        params={"provider_id": provider.pk, "number": number, "limit": limit, "reason": reason},
    )
    stable_id = revisions.revision_ensure(provider)
    tenant = Tenant.objects.get(pk=tenant_id)
    why = (
        f"output recalled with adapter revision {number}; re-run under revision {revisions.revision_number(stable_id)}"
    )
    why = f"{why} ({reason})"
    # Two single-table reads (a join by operation id alone would not stay on one tenant's node).
    recalled = OperationOutput.objects.filter(
        tenant_id=tenant_id, adapter_revision_id=revision.pk, state__in=RECALLED_OUTPUT_STATES
    ).values_list("operation_id", flat=True)
    originals = list(
        Operation.objects.filter(tenant_id=tenant_id, pk__in=list(recalled), replaced_by__isnull=True).order_by("pk")[
            :limit
        ]
    )
    done = []
    for op in originals:
        rerun = _rerun_one(op=op, tenant=tenant, provider=provider, stable_id=stable_id, actor=actor, why=why)
        if rerun is not None:
            done.append((op.pk, *rerun))
    log.info("recalled_outputs_rerun provider=%s revision=%s count=%s actor=%s", provider.pk, number, len(done), actor)
    return RerunResult(revision=number, stable=revisions.revision_number(stable_id), rerun=done)


def recalled_rerun_approved(request: ApprovalRequest, approver: str) -> str:
    """The approved request's re-run, in the approver's name (``approvals.approval_executor_register``)."""
    params = approvals.approval_params(request)
    result = recalled_outputs_rerun(
        tenant_id=request.tenant_id,
        provider_id=int(params["provider_id"]),
        number=int(params["number"]),
        actor=approver,
        reason=f"{params.get('reason', '')} (approved by {approver})",
        limit=int(params.get("limit") or RERUN_MAX),
    )
    return f"{len(result.rerun)} recalled outputs re-run under revision {result.stable}"
