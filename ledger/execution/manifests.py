"""Evaluation manifests (ADR 0022): what a generated test document holds, written when it is
generated, and the score of an extraction job's output against it.

**Written at generation time only.** A generating job's manifest (a JSON object: vendor names,
invoice ids, currency, totals, line items) comes with its submission (``manifest``) or by
``PUT …/operations/{id}/manifest`` while the job has no output: once an output is published,
or the job has finished, a manifest is refused (409 ``manifest_after_output``) — one derived
from the output would score the extraction against itself. The same manifest again answers
the stored one (idempotent); another one is a 409 ``manifest_conflict``. A preset (a prompt
template version the job is pinned to, ADR 0009) may declare a JSON Schema its manifests must
match (422 ``manifest_invalid``). Stored immutable, sealed like a payload, identified by the
sha256 of its canonical JSON; linked to its job's output when that is published.

**Scored when the extraction finishes.** An extraction job names the generating job it reads
(``evaluates``: ``{"operation": id, "pointer": "/fields"}``) at submission; when it succeeds,
its JSON answer (at the pointer) is compared field by field with the manifest
(:func:`manifest_compare`), in the transaction that finishes it, and the score goes to
:func:`manifest_score_feed` — the one place the canary gate reads extraction quality from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from ledger.execution import verdicts
from ledger.models import (
    MANIFEST_SCORE_MOVES,
    ManifestScore,
    ManifestScoreStatus,
    Operation,
    OperationEvent,
    OperationManifest,
    OperationMode,
    OperationOutput,
    OperationStatus,
    PromptTemplate,
    Tenant,
    VerdictSource,
    VerdictValue,
)
from ledger.platform.crypto import EncryptionKeyError, open_json, seal_json
from ledger.platform.errors import DomainError, IllegalTransition, OperationNotFound
from ledger.providers.reconcile import json_pointer
from ledger.rules import intents
from ledger.rules import manifests as rules
from ledger.rules.manifests import manifest_compare

log = logging.getLogger("onceguard.manifests")

MAX_POINTER_LENGTH = 200
# Details kept per score: the score counts every field, the row keeps the first ones.
MAX_DETAILS = 500


class ManifestAfterOutput(DomainError):
    """The job has an output (or has finished): a manifest now could be derived from it."""

    status, code, title = 409, "manifest_after_output", "Manifest written after the output"


class ManifestConflict(DomainError):
    """Another manifest is stored for this job; a manifest never changes."""

    status, code, title = 409, "manifest_conflict", "A different manifest is stored"


class ManifestNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


class EvaluatesInvalid(DomainError):
    """``evaluates`` is not ``{"operation": id, "pointer": "/…"}``, or names a job without a manifest."""

    status, code, title = 422, "evaluates_invalid", "Not an evaluation of a generated document"


# --- The manifest -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedManifest:
    content: dict[str, Any]
    sha256: str
    preset_id: int | None


def job_presets(*, tenant_id: int, request: Any) -> list[PromptTemplate]:
    """The presets (prompt template versions) a job is pinned to that declare a manifest schema."""
    try:
        stored = intents.stored_intent(open_json(request))
    except EncryptionKeyError:
        stored = None
    if not stored or not stored[1]:
        return []
    found = []
    for name, version in sorted(stored[1].items()):
        preset = PromptTemplate.objects.filter(
            tenant_id=tenant_id, name=name, version=version, manifest_schema__isnull=False
        ).first()
        if preset is not None:
            found.append(preset)
    return found


def manifest_check(*, manifest: Any, presets: list[PromptTemplate]) -> CheckedManifest:
    """``manifest`` checked (an object, bounded, matching every declared schema), with its digest."""
    sha256 = rules.manifest_digest(manifest, [(str(p), p.manifest_schema) for p in presets])
    return CheckedManifest(content=manifest, sha256=sha256, preset_id=presets[0].pk if presets else None)


def _event(*, op: Operation, actor: str, reason: str) -> None:
    """An event row on ``op`` that moves nothing: its history says what was written."""
    OperationEvent.objects.create(
        tenant_id=op.tenant_id,
        operation_id=op.pk,
        from_status=op.status,
        to_status=op.status,
        actor=str(actor)[:150],
        reason=reason[:500],
        attempt=None,
        at=Now(),
    )


def manifest_store(
    *, operation_id: int, tenant_id: int, checked: CheckedManifest, actor: str
) -> tuple[OperationManifest, bool]:
    """Store ``checked`` as the manifest of the operation (locked first: a publish locks it too,
    so a manifest and an output never pass each other). Returns (the manifest, created)."""
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(pk=operation_id, tenant_id=tenant_id).first()
        if op is None:
            raise OperationNotFound("No such operation.")
        existing = OperationManifest.objects.filter(tenant_id=tenant_id, operation_id=operation_id).first()
        if existing is not None:
            if existing.sha256 == checked.sha256:
                return existing, False
            raise ManifestConflict(
                "This job already has a manifest, and a manifest never changes.", extra={"sha256": existing.sha256}
            )
        if op.is_terminal or OperationOutput.objects.filter(tenant_id=tenant_id, operation_id=operation_id).exists():
            raise ManifestAfterOutput(
                "A manifest is written when the document is generated: this job already has its output"
                f" (it is {op.status})."
            )
        manifest = OperationManifest.objects.create(
            tenant_id=tenant_id,
            operation_id=operation_id,
            sha256=checked.sha256,
            content=seal_json(checked.content),
            preset_id=checked.preset_id,
            created_by=str(actor)[:150],
            created_at=timezone.now(),
        )
        _event(op=op, actor=actor, reason=f"evaluation manifest stored (sha256 {checked.sha256[:12]}…)")
    return manifest, True


def manifest_put(*, tenant: Tenant, operation_id: int, manifest: Any, actor: str) -> tuple[OperationManifest, bool]:
    """``PUT …/operations/{id}/manifest``: check against the job's presets, then store."""
    op = Operation.objects.filter(pk=operation_id, tenant_id=tenant.pk).only("pk", "request").first()
    if op is None:
        raise OperationNotFound("No such operation.")
    checked = manifest_check(manifest=manifest, presets=job_presets(tenant_id=tenant.pk, request=op.request))
    return manifest_store(operation_id=op.pk, tenant_id=tenant.pk, checked=checked, actor=actor)


def manifest_get(*, tenant: Tenant, operation_id: int) -> OperationManifest:
    manifest = (
        OperationManifest.objects.select_related("preset", "output")
        .filter(tenant_id=tenant.pk, operation_id=operation_id)
        .first()
    )
    if manifest is None:
        raise ManifestNotFound("This operation has no manifest.")
    return manifest


def manifest_of(*, tenant_id: int, operation_id: int) -> OperationManifest | None:
    """An operation's manifest row (the console's page; the caller scoped the operation)."""
    return (
        OperationManifest.objects.select_related("preset")
        .filter(tenant_id=tenant_id, operation_id=operation_id)
        .first()
    )


def manifest_score_of(*, tenant_id: int, operation_id: int) -> ManifestScore | None:
    return ManifestScore.objects.filter(tenant_id=tenant_id, operation_id=operation_id).first()


def manifest_content(manifest: OperationManifest) -> Any:
    """The manifest in clear."""
    return open_json(manifest.content)


def manifest_output_link(*, tenant_id: int, operation_id: int, output_id: int) -> None:
    """Link the job's manifest to its output, in the transaction that publishes it."""
    OperationManifest.objects.filter(tenant_id=tenant_id, operation_id=operation_id).update(output_id=output_id)


def manifest_values(*, tenant_id: int, operation_id: int) -> Any:
    """The manifest of an operation in clear (None without one): what an erasure cuts elsewhere."""
    stored = (
        OperationManifest.objects.filter(tenant_id=tenant_id, operation_id=operation_id)
        .values_list("content", flat=True)
        .first()
    )
    if stored is None:
        return None
    try:
        return open_json(stored)
    except EncryptionKeyError:
        return None


def manifests_delete_for(*, tenant_id: int, operation_ids: list[int]) -> int:
    """Delete the manifests of these operations (an erasure; retention's cascade does the same
    when it deletes the operations). The scores of extractions against them stay: they hold
    no value of the document (their details name fields only)."""
    if not operation_ids:
        return 0
    return OperationManifest.objects.filter(tenant_id=tenant_id, operation_id__in=operation_ids).delete()[0]


# --- Evaluations: an extraction job against a generating job's manifest ---------------------------


@dataclass(frozen=True)
class EvaluatesLink:
    operation_id: int
    pointer: str


def evaluates_check(*, tenant_id: int, evaluates: Any) -> EvaluatesLink:
    """A submission's ``evaluates``: the generating job (this tenant's, with a manifest) and
    where the extracted fields are in the extraction's answer. Another tenant's job is a 404,
    as every read of it is."""
    if isinstance(evaluates, int) and not isinstance(evaluates, bool):
        evaluates = {"operation": evaluates}
    if not isinstance(evaluates, dict) or not set(evaluates) <= {"operation", "pointer"}:
        raise EvaluatesInvalid('evaluates must be {"operation": <id of the generating job>, "pointer": "/…"}.')
    target, pointer = evaluates.get("operation"), evaluates.get("pointer", "")
    if isinstance(target, bool) or not isinstance(target, int) or target <= 0:
        raise EvaluatesInvalid("evaluates.operation must be the id of the job that generated the document.")
    if not isinstance(pointer, str) or len(pointer) > MAX_POINTER_LENGTH or (pointer and not pointer.startswith("/")):
        raise EvaluatesInvalid(f'evaluates.pointer must be a JSON pointer ("/…", at most {MAX_POINTER_LENGTH}).')
    if not Operation.objects.filter(pk=target, tenant_id=tenant_id).exists():
        raise OperationNotFound("No such operation (evaluates.operation).")
    if not OperationManifest.objects.filter(tenant_id=tenant_id, operation_id=target).exists():
        raise EvaluatesInvalid(f"Operation {target} has no manifest: there is nothing to score an extraction against.")
    return EvaluatesLink(operation_id=target, pointer=pointer)


def manifest_score_open(*, operation: Operation, link: EvaluatesLink) -> ManifestScore:
    """The extraction's pending evaluation, in its submission's transaction (once per job)."""
    score, _ = ManifestScore.objects.get_or_create(
        tenant_id=operation.tenant_id,
        operation_id=operation.pk,
        defaults={
            "evaluates_id": link.operation_id,
            "pointer": link.pointer,
            "created_at": timezone.now(),
        },
    )
    return score


def _move(*, score: ManifestScore, to: str, changes: dict[str, Any]) -> ManifestScore:
    """The guarded move of a pending evaluation to a final state; zero rows: someone else won."""
    if to not in MANIFEST_SCORE_MOVES[ManifestScoreStatus.PENDING]:
        raise IllegalTransition(f"pending → {to} is not an allowed move.")
    moved = ManifestScore.objects.filter(
        pk=score.pk, tenant_id=score.tenant_id, status=ManifestScoreStatus.PENDING
    ).update(status=to, scored_at=timezone.now(), **changes)
    if not moved:
        raise IllegalTransition("This evaluation was already settled.")
    score.refresh_from_db()
    return score


def manifest_score_unscorable(*, score: ManifestScore, operation: Operation, reason: str, actor: str) -> ManifestScore:
    """pending → unscorable, with the reason on the extraction's history."""
    with transaction.atomic():
        settled = _move(score=score, to=ManifestScoreStatus.UNSCORABLE, changes={"reason": reason[:500]})
        _event(op=operation, actor=actor, reason=f"not scored against a manifest: {reason}")
    log.info("manifest_unscorable operation=%s reason=%s", operation.pk, reason)
    return settled


def manifest_score_feed(
    *, output: Operation, score: float, details: list[dict[str, Any]], manifest_sha256: str, actor: str = "worker"
) -> ManifestScore:
    """The score of an extraction's output (``output``: the extraction job, whose JSON answer it
    is, under its adapter revision) against its document's manifest: recorded (pending →
    scored, an event on its history) and given to the canary gate — the one place extraction
    quality leaves this module."""
    row = ManifestScore.objects.get(tenant_id=output.tenant_id, operation_id=output.pk)
    with transaction.atomic():
        settled = _move(
            score=row,
            to=ManifestScoreStatus.SCORED,
            changes={"score": score, "details": details[:MAX_DETAILS], "manifest_sha256": manifest_sha256},
        )
        matched = sum(1 for d in details if d["result"] == "match")
        _event(
            op=output,
            actor=actor,
            reason=f"scored {score:.3f} against the manifest of operation {row.evaluates_id}"
            f" ({matched} of {len(details)} fields matched)",
        )
        # The canary's quality gate (ADR 0020) counts the score as the extraction's verdict, under
        # the revision it ran on: a low score is what the gate's minimum score judges.
        verdicts.output_verdict_record(
            output=output,
            score=score,
            verdict=VerdictValue.ACCEPTED,
            reason=f"scored against the manifest of operation {row.evaluates_id}",
            source=VerdictSource.MANIFEST,
            actor="manifests",
        )
    log.info("manifest_scored operation=%s score=%.3f fields=%s", output.pk, score, len(details))
    return settled


def manifest_score_settle(*, score: ManifestScore, operation: Operation, actor: str) -> ManifestScore:
    """Score a finished extraction (or say why it cannot be scored)."""
    if operation.status != OperationStatus.SUCCEEDED:
        return manifest_score_unscorable(
            score=score, operation=operation, reason=f"the extraction {operation.status}", actor=actor
        )
    manifest = OperationManifest.objects.filter(tenant_id=operation.tenant_id, operation_id=score.evaluates_id).first()
    if manifest is None:
        return manifest_score_unscorable(
            score=score, operation=operation, reason="the document's manifest is gone", actor=actor
        )
    body = (
        Operation.objects.filter(pk=operation.pk, tenant_id=operation.tenant_id)
        .values_list("response_body", flat=True)
        .first()
    )
    try:
        expected, answer = open_json(manifest.content), open_json(body)
    except EncryptionKeyError:
        return manifest_score_unscorable(
            score=score, operation=operation, reason="the manifest or the answer cannot be read", actor=actor
        )
    extracted = json_pointer(answer, score.pointer) if score.pointer else answer
    if not isinstance(extracted, dict):
        return manifest_score_unscorable(
            score=score, operation=operation, reason="the extraction's answer holds no JSON object there", actor=actor
        )
    preset = manifest.preset
    value, details = manifest_compare(
        expected, extracted, schema=preset.manifest_schema if preset is not None else None
    )
    if not details:
        return manifest_score_unscorable(
            score=score, operation=operation, reason="the manifest holds no fields", actor=actor
        )
    return manifest_score_feed(
        output=operation, score=value, details=details, manifest_sha256=manifest.sha256, actor=actor
    )


def manifest_score_after_finish(*, operation: Operation, actor: str) -> None:
    """``hooks.operation_finished``: a finished extraction is scored in its finishing
    transaction, under a savepoint — a scoring that fails leaves the evaluation pending (its
    read scores it later) and never the finish undone."""
    if operation.mode != OperationMode.EXECUTE:
        return
    score = ManifestScore.objects.filter(
        tenant_id=operation.tenant_id, operation_id=operation.pk, status=ManifestScoreStatus.PENDING
    ).first()
    if score is None:
        return
    try:
        with transaction.atomic():
            manifest_score_settle(score=score, operation=operation, actor=actor)
    except (DomainError, DatabaseError, ValueError, TypeError) as exc:
        log.warning("manifest_score_deferred operation=%s error=%s", operation.pk, type(exc).__name__)


def manifest_score_get(*, tenant: Tenant, operation_id: int) -> ManifestScore:
    """An extraction's evaluation; a finished one still pending (its scoring failed) is scored now."""
    score = ManifestScore.objects.filter(tenant_id=tenant.pk, operation_id=operation_id).first()
    if score is None:
        raise ManifestNotFound("This operation evaluates no manifest.")
    if score.status == ManifestScoreStatus.PENDING:
        op = Operation.objects.filter(pk=operation_id, tenant_id=tenant.pk).first()
        if op is not None and op.is_terminal:
            try:
                score = manifest_score_settle(score=score, operation=op, actor="api")
            except IllegalTransition:
                score.refresh_from_db()
    return score
