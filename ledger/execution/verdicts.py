"""Verdicts on outputs (ADR 0020): what a consumer — or the service's scoring against an
evaluation manifest — says about an output it received: accepted or rejected, a score from 0
to 1, and why.

:func:`output_verdict_record` is the one write. One verdict per output, source and caller:
the same one again answers the stored row (an idempotent retry), another one is refused with
``409 verdict_conflict`` — a consumer that changes its mind is a new fact the canary gate
must not silently lose or double-count. The row carries the output's adapter revision, which
the canary's quality gate counts by (``ledger.providers.canary.quality_gate``). A verdict that
counts against a running canary has the watch look at it at once, as a failing attempt does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.models import Operation, OperationOutput, OutputVerdict, Provider, VerdictSource, VerdictValue
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.protocol.inputs import sanitize_message
from ledger.providers import canary

log = logging.getLogger("onceguard.verdicts")

MAX_REASON = 500


class VerdictConflict(DomainError):
    """This caller recorded another verdict on this output already."""

    status, code, title = 409, "verdict_conflict", "A different verdict on this output was recorded already"


@dataclass(frozen=True)
class VerdictResult:
    verdict: OutputVerdict
    created: bool


def _checked(*, score: Any, verdict: Any, reason: Any, source: Any) -> tuple[float | None, str, str, str]:
    if source not in VerdictSource.values:
        raise ValidationFailed(f"`source` must be one of {', '.join(VerdictSource.values)}.")
    if verdict not in VerdictValue.values:
        raise ValidationFailed("`verdict` must be accepted or rejected.", extra={"field": "verdict"})
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValidationFailed("`score` must be a number from 0 to 1.", extra={"field": "score"})
        if not 0 <= score <= 1:
            raise ValidationFailed("`score` must be a number from 0 to 1.", extra={"field": "score"})
        score = float(score)
    if reason is not None and not isinstance(reason, str):
        raise ValidationFailed("`reason` must be text.", extra={"field": "reason"})
    return score, verdict, sanitize_message(reason or "")[:MAX_REASON], source


def _same(row: OutputVerdict, *, score: float | None, verdict: str, reason: str) -> bool:
    return row.verdict == verdict and row.score == score and row.reason == reason


def output_verdict_record(
    *,
    output: OperationOutput | Operation,
    score: float | None,
    verdict: str,
    reason: str = "",
    source: str = VerdictSource.CONSUMER,
    actor: str,
) -> VerdictResult:
    """Record ``actor``'s verdict on ``output`` (module docstring): created, or the same one
    answered again; :class:`VerdictConflict` for a different one. ``output``: a stored file
    (the API), or the operation whose output is judged — an extraction job whose output is its
    JSON answer (evaluation manifests' scoring, ``source="manifest"``). The verdict counts for
    the adapter revision the output was produced under. The caller scopes it to its tenant."""
    score, verdict, reason, source = _checked(score=score, verdict=verdict, reason=reason, source=source)
    actor = str(actor)[:150]
    if isinstance(output, Operation):
        operation_id, stored = output.pk, None
        revision_id = output.adapter_revision_id
    else:
        operation_id, stored = output.operation_id, output
        revision_id = output.adapter_revision_id
    mine = {"tenant_id": output.tenant_id, "operation_id": operation_id, "source": source, "actor": actor}
    existing = OutputVerdict.objects.filter(**mine).first()
    if existing is None:
        try:
            with transaction.atomic():
                existing = OutputVerdict.objects.create(
                    **mine,
                    output=stored,
                    adapter_revision_id=revision_id,
                    verdict=verdict,
                    score=score,
                    reason=reason,
                    created_at=timezone.now(),
                )
        except IntegrityError:
            # A concurrent first verdict of the same caller won: answer against it.
            existing = OutputVerdict.objects.get(**mine)
        else:
            log.info("output_verdict operation=%s verdict=%s score=%s source=%s", operation_id, verdict, score, source)
            _watch_if_canary(existing)
            return VerdictResult(verdict=existing, created=True)
    if not _same(existing, score=score, verdict=verdict, reason=reason):
        raise VerdictConflict(
            f"{actor} recorded {existing.verdict} (score {existing.score}) on this output already;"
            " a verdict is recorded once per caller."
        )
    return VerdictResult(verdict=existing, created=False)


def _watch_if_canary(row: OutputVerdict) -> None:
    """A verdict on a running canary's output may breach its quality gate: evaluate it once the
    verdict has committed (a failure there is logged; the verdict stands)."""
    if row.adapter_revision_id is None:
        return
    provider_id = (
        Provider.objects.filter(
            tenant_id=row.tenant_id, canary_revision_id=row.adapter_revision_id, canary_paused_at__isnull=True
        )
        .values_list("pk", flat=True)
        .first()
    )
    if provider_id is None:
        return

    def watch() -> None:
        try:
            canary.canary_watch(provider_id=provider_id)
        except Exception as exc:
            log.error("adapter_canary_watch_error provider=%s error=%s", provider_id, type(exc).__name__)

    # After the commit, in the watch's own transactions: a breach of the error gate rolls the
    # canary back and re-queues its rows in short batches, which must not run inside the
    # caller's transaction — a worker's completion, when a manifest's score is the verdict —
    # nor be undone with it after its alert went out.
    transaction.on_commit(watch)
