"""Erasure on request: redact one person's payloads everywhere, as a recorded,
resumable run.

``erasure_request`` resolves the person (keyed values only, review.privacy.subjects), snapshots the
ids of every record that holds their data, writes the ``ErasureRun`` and an ``erase`` row in
the access log (who asked, why), and enqueues ``review.tasks.erasure_run_task`` after commit.

``erasure_continue`` works through the snapshot from the run's ``cursor`` in batches. Each
batch is one transaction that redacts its records *and* moves the cursor and the counts, under
the run's row lock: a crash loses at most the batch under way, which rolls back whole, and
running the task again (by hand, by django-q2's retry, or by the purge schedule's recovery of
runs that stopped moving) continues exactly there. Two passes at once serialise on the lock;
the second finds the cursor moved. Per record:

* operations: ``payload``, ``request`` and ``response_body`` become redaction markers (when, the
  erasure, a keyed digest — never the value), ``search_fields`` cleared, the attempts' recorded
  answers dropped, its published output (row and file) deleted and so are the uploads it
  names by key (rows and files: ``up_…`` anywhere in its plaintext); a ``queued`` or
  ``retry_wait`` one is cancelled first, so a redacted request is never sent;
* DLQ entries: the payload becomes a marker, the replays' recorded answers are dropped; a
  ``pending`` or ``replayed`` one is discarded first, so nobody replays a marker;
* free text of the record and what hangs off it (last error, attempt messages, event
  reasons, its search rows' identifiers, DLQ error message, notes, quarantine reason, replay messages and notes): the
  person's own values, read from the payload before it goes, are cut out — the rows, their
  times, actors and states (the audit trail) stay; its failed attempts' evidence (ADR 0016)
  stays too, its error text cut the same way and its keyed digest of the key cleared;
* the record's subject-index entries are deleted (every kind: the payload that named them
  is gone). When the list is done, every index entry left under the person's digests (a
  record retention deleted, one that arrived since) goes too, and the run forgets the digests.

Digests that stay (by design): the redaction markers' keyed digest, the operation's request
fingerprint, the tombstones', and the subject references in the access log and this run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django_q.tasks import async_task

from dlq.entries.services import failed_event_discard
from dlq.models import FailedEvent, FailedEventChange, FailedEventOccurrence, FailedEventStatus, Replay
from dlq.rules.errors import FailedEventBusy, FailedEventClosed
from ledger.execution.manifests import manifest_values, manifests_delete_for
from ledger.execution.outputs import outputs_delete_for
from ledger.execution.uploads import upload_keys_in, uploads_delete_named
from ledger.models import (
    Attempt,
    AttemptEvidence,
    Operation,
    OperationEvent,
    OperationSearch,
    OperationStatus,
    OutputVerdict,
)
from ledger.platform import crypto
from ledger.platform.cutting import ValueCutter, readable_value, value_strings
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.platform.redaction import scrub
from ledger.protocol import transitions as ledger_transitions
from review.audit.accesslog import accesslog_append
from review.models import (
    ERASURE_OPEN_STATES,
    AccessAction,
    ErasureRun,
    ErasureState,
    RecordType,
    SubjectIndex,
)
from review.privacy.erasure_n8n import erasure_n8n_pass, n8n_delete_default, n8n_executions_of
from review.privacy.payloads import MIN_REASON_LENGTH, redaction_marker
from review.privacy.subjects import Subject, subject_record_ids

log = logging.getLogger("onceguard.erasure")

BATCH_SIZE = 50
# A pass stops after this many batches or seconds (well below django-q2's task timeout, 120 s
# by default); the task enqueues the next pass, which continues at the cursor.
MAX_BATCHES = 200
PASS_SECONDS = 60.0
# A running run whose row has not moved for this long is taken to have lost its task.
STALLED_SECONDS = 600
ERASED = "[erased]"
ACTOR = "erasure"
CANCELLABLE = (OperationStatus.QUEUED, OperationStatus.RETRY_WAIT)
DISCARDABLE = (FailedEventStatus.PENDING, FailedEventStatus.REPLAYED)


class ErasureNotFound(DomainError):
    status, code, title = 404, "not_found", "Not found"


def erasure_request(
    *,
    tenant_id: int,
    subject: Subject,
    actor: str,
    reason: str,
    ip: str | None = None,
    user_id: int | None = None,
    enqueue: bool = True,
    delete_n8n_executions: bool | None = None,
) -> tuple[ErasureRun, bool]:
    """Record an erasure of ``subject``'s data in the tenant and enqueue its task: (run,
    created). An open run for the same person is returned instead of a second one.
    ``delete_n8n_executions``: also delete the n8n executions that carried their data
    (review.privacy.erasure_n8n); None: when the tenant has an active n8n connection."""
    reason = " ".join((reason or "").split())
    if len(reason) < MIN_REASON_LENGTH:
        raise ValidationFailed(
            f"Say why (at least {MIN_REASON_LENGTH} characters), e.g. the request's reference.",
            extra={"field": "reason"},
        )
    open_runs = ErasureRun.objects.filter(
        tenant_id=tenant_id, state__in=ERASURE_OPEN_STATES, subject_ref=subject.ref_text
    )
    existing = open_runs.first()
    if existing is not None:
        return existing, False
    try:
        run, targets = _erasure_create(
            tenant_id=tenant_id,
            subject=subject,
            actor=actor,
            reason=reason,
            ip=ip,
            user_id=user_id,
            enqueue=enqueue,
            delete_n8n_executions=delete_n8n_executions,
        )
    except IntegrityError:
        # A concurrent request for the same person won (one open run per person).
        return open_runs.get(), False
    log.info("erasure_requested tenant=%s run=%s records=%s actor=%s", tenant_id, run.pk, len(targets), actor)
    return run, True


def _erasure_create(
    *,
    tenant_id: int,
    subject: Subject,
    actor: str,
    reason: str,
    ip: str | None,
    user_id: int | None,
    enqueue: bool,
    delete_n8n_executions: bool | None,
) -> tuple[ErasureRun, list[Any]]:
    if delete_n8n_executions is None:
        delete_n8n_executions = n8n_delete_default(tenant_id=tenant_id)
    with transaction.atomic():
        targets = subject_record_ids(tenant_id=tenant_id, subject=subject)
        now = timezone.now()
        run = ErasureRun.objects.create(
            tenant_id=tenant_id,
            subject_ref=subject.ref_text,
            actor=actor[:150],
            reason=scrub(reason)[:500],
            targets=[[t.record_type, t.record_id] for t in targets],
            digests=sorted(set(subject.digests)),
            n8n_executions=n8n_executions_of(tenant_id=tenant_id, targets=targets),
            n8n_delete=delete_n8n_executions,
            requested_at=now,
            updated_at=now,
        )
        accesslog_append(
            tenant_id=tenant_id,
            action=AccessAction.ERASE,
            actor=actor,
            user_id=user_id,
            object_type="subject",
            object_id=str(run.pk),
            object_ref=subject.ref_text,
            fields=[*subject.kinds, *(["n8n executions"] if delete_n8n_executions else [])],
            reason=reason,
            ip=ip,
        )
        if enqueue:
            transaction.on_commit(lambda: async_task("review.tasks.erasure_run_task", run.pk))
    return run, targets


# --- The pass ------------------------------------------------------------------------------------


class _Cutter(ValueCutter):
    """Cuts one record's values out of free text (ledger.platform.cutting); counts the texts it
    changed, and rewrites the rows that held them."""

    def __init__(self, values: Iterable[str]) -> None:
        super().__init__(values, replacement=ERASED)

    def rows(self, queryset: Any, *columns: str) -> None:
        """Rewrite ``columns`` of every row of ``queryset`` whose text holds a value."""
        if self.pattern is None:
            return
        for row in queryset.only("pk", *columns):
            changes = {c: self.cut(getattr(row, c) or "") for c in columns}
            changes = {c: v for c, v in changes.items() if v != (getattr(row, c) or "")}
            if changes:
                type(row)._base_manager.filter(pk=row.pk).update(**changes)


def _erase_operation(run: ErasureRun, pk: int, now: datetime) -> bool:
    op = Operation.objects.select_for_update().filter(pk=pk, tenant_id=run.tenant_id).first()
    if op is None:
        return False
    if op.status in CANCELLABLE:
        try:
            ledger_transitions.operation_cancel(
                operation_id=op.pk, actor=ACTOR, reason=f"erased on request (erasure #{run.pk})"
            )
            run.cancelled += 1
        except DomainError:
            # A worker took it meanwhile: it finishes its course with what it already read.
            pass
        op.refresh_from_db()
    values: set[str] = set()
    columns = {"payload": op.payload, "request": op.request, "response_body": op.response_body}
    attempts = list(Attempt.objects.filter(operation_id=op.pk, response_body__isnull=False).only("pk", "response_body"))
    named_uploads: set[str] = set()
    for stored in [*columns.values(), *(a.response_body for a in attempts)]:
        plain = readable_value(stored)
        value_strings(plain, values)
        named_uploads |= upload_keys_in(plain)
    # Its evaluation manifest (what its document was generated to hold, ADR 0022) can name the
    # person too: its values are cut from the texts below, and it goes with the rest.
    value_strings(manifest_values(tenant_id=op.tenant_id, operation_id=op.pk), values)
    changes: dict[str, Any] = {
        c: redaction_marker(value=v, policy_id=None, run_id=None, at=now, erasure_id=run.pk)
        for c, v in columns.items()
        if v is not None and not crypto.is_redacted(v)
    }
    cutter = _Cutter(values)
    if op.last_error:
        changes["last_error"] = cutter.cut(op.last_error)
    # .update(): the row's updated_at (its age for retention) stays as it was.
    Operation.objects.filter(pk=op.pk).update(search_fields=None, **changes)
    run.attempts += Attempt.objects.filter(pk__in=[a.pk for a in attempts]).update(response_body=None)
    cutter.rows(Attempt.objects.filter(operation_id=op.pk).exclude(message=""), "message")
    cutter.rows(OperationEvent.objects.filter(operation_id=op.pk).exclude(reason=""), "reason")
    # Its search rows (ADR 0018) are a copy of its identifiers: a key or handle made of the
    # person's data (a tenant may allow such keys) stops being findable by it.
    cutter.rows(OperationSearch.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk), "text")
    cutter.rows(Replay.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk), "error_message", "note")
    # What a consumer said of its output (ADR 0020) is the consumer's free text: it can quote the
    # output ("wrong name: Mei Lin"). The verdict and score stay (the canary gate counts them).
    cutter.rows(OutputVerdict.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk).exclude(reason=""), "reason")
    # Its failed attempts' evidence stays: it holds no personal data by construction (its
    # error text was cut of these same values when written). The keyed digest of the key goes,
    # since a tenant may allow keys made of personal data (ADR 0016).
    cutter.rows(AttemptEvidence.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk).exclude(error=""), "error")
    AttemptEvidence.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk).exclude(key_digest="").update(
        key_digest="", digest_key_id=""
    )
    run.texts += cutter.changed
    # Its published output (a file it produced for this person) goes: the row now, the bytes
    # once the batch commits (ledger.execution.outputs).
    run.outputs += outputs_delete_for(operation_ids=[op.pk])
    manifests_delete_for(tenant_id=op.tenant_id, operation_ids=[op.pk])
    # The uploads it named (a source photo, a document): an upload a person's job used is
    # taken to be that person's data, whoever else's job names the same bytes (DESIGN §8).
    # Rows now, files once the batch commits (ledger.execution.uploads).
    run.uploads += uploads_delete_named(tenant_id=run.tenant_id, keys=named_uploads)
    run.index_entries += SubjectIndex.objects.filter(record_type=RecordType.OPERATIONS, record_id=op.pk).delete()[0]
    run.operations += 1
    return True


def _erase_failed_event(run: ErasureRun, pk: int, now: datetime) -> bool:
    event = FailedEvent.objects.select_for_update().filter(pk=pk, tenant_id=run.tenant_id).first()
    if event is None:
        return False
    if event.status in DISCARDABLE:
        try:
            failed_event_discard(
                tenant_id=run.tenant_id,
                event_pk=event.pk,
                actor=ACTOR,
                note=f"erased on request (erasure #{run.pk}): nothing left to replay",
            )
            run.discarded += 1
        except (FailedEventBusy, FailedEventClosed):
            # Replaying right now: the replay finishes; the payload goes all the same.
            pass
        event.refresh_from_db()
    values: set[str] = set()
    replays = list(
        Replay.objects.filter(tenant_id=event.tenant_id, event_id=event.pk, response_body__isnull=False).only(
            "pk", "response_body"
        )
    )
    for stored in [event.payload, *(r.response_body for r in replays)]:
        value_strings(readable_value(stored), values)
    cutter = _Cutter(values)
    changes: dict[str, Any] = {"search_fields": {}}
    if event.payload is not None and not crypto.is_redacted(event.payload):
        changes["payload"] = redaction_marker(
            value=event.payload, policy_id=None, run_id=None, at=now, erasure_id=run.pk
        )
    for column in ("error_message", "status_note", "quarantine_reason"):
        text = getattr(event, column)
        if text:
            changes[column] = cutter.cut(text)
    FailedEvent.objects.filter(pk=event.pk).update(**changes)
    run.replays += Replay.objects.filter(tenant_id=event.tenant_id, pk__in=[r.pk for r in replays]).update(
        response_body=None
    )
    cutter.rows(Replay.objects.filter(tenant_id=event.tenant_id, event_id=event.pk), "error_message", "note")
    cutter.rows(FailedEventChange.objects.filter(tenant_id=event.tenant_id, event_id=event.pk).exclude(note=""), "note")
    cutter.rows(
        FailedEventOccurrence.objects.filter(tenant_id=event.tenant_id, event_id=event.pk).exclude(error_message=""),
        "error_message",
    )
    run.texts += cutter.changed
    run.index_entries += SubjectIndex.objects.filter(record_type=RecordType.FAILED_EVENTS, record_id=event.pk).delete()[
        0
    ]
    run.failed_events += 1
    return True


ERASERS = {RecordType.OPERATIONS: _erase_operation, RecordType.FAILED_EVENTS: _erase_failed_event}


def _batch(run_id: int, batch_size: int) -> ErasureRun:
    """One batch in one transaction: the records, the cursor and the counts commit together."""
    with transaction.atomic():
        run = ErasureRun.objects.select_for_update().get(pk=run_id)
        if run.state == ErasureState.DONE:
            return run
        now = timezone.now()
        if run.state == ErasureState.PENDING:
            run.state = ErasureState.RUNNING
            run.started_at = now
        batch = run.targets[run.cursor : run.cursor + batch_size]
        for record_type, pk in batch:
            if not ERASERS[record_type](run, int(pk), now):
                run.missing += 1
        run.cursor += len(batch)
        # Done once the records are, and n8n's copies after them (review.privacy.erasure_n8n).
        if run.cursor >= len(run.targets) and run.n8n_cursor >= len(run.n8n_executions):
            # Whatever the index still holds under the person's digests: links of records
            # retention deleted, records that arrived since the request.
            run.index_entries += SubjectIndex.objects.filter(tenant_id=run.tenant_id, digest__in=run.digests).delete()[
                0
            ]
            run.digests = []
            run.state = ErasureState.DONE
            run.finished_at = now
        run.updated_at = now
        run.error = ""
        run.save()
    return run


def erasure_continue(
    *, run_id: int, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES, seconds: float = PASS_SECONDS
) -> ErasureRun:
    """Work on the run from its cursor until it is done, ``max_batches`` batches ran or
    ``seconds`` passed (then it is still running, and another pass continues)."""
    updated = ErasureRun.objects.filter(pk=run_id).update(passes=F("passes") + 1)
    if not updated:
        raise ErasureNotFound("No such erasure run.")
    run = ErasureRun.objects.get(pk=run_id)
    started = time.monotonic()
    for _ in range(max_batches):
        if time.monotonic() - started > seconds:
            break
        try:
            run = _batch(run_id, batch_size)
            if run.state != ErasureState.DONE and run.cursor >= len(run.targets):
                # The records are erased; n8n's executions next, a few per turn (each a
                # bounded HTTP call outside any transaction), then a batch that finishes.
                erasure_n8n_pass(run_id=run_id)
                run = _batch(run_id, batch_size)
        except Exception as exc:
            # The batch rolled back whole; the cursor is where the last good batch left it.
            ErasureRun.objects.filter(pk=run_id).update(error=type(exc).__name__[:200], updated_at=timezone.now())
            log.error("erasure_stopped run=%s error=%s", run_id, type(exc).__name__)
            raise
        if run.state == ErasureState.DONE:
            break
    log.info(
        "erasure_pass run=%s state=%s cursor=%s/%s operations=%s entries=%s index=%s",
        run.pk,
        run.state,
        run.cursor,
        len(run.targets),
        run.operations,
        run.failed_events,
        run.index_entries,
    )
    return run


def erasures_resume_stalled(*, now: datetime | None = None, limit: int = 20) -> list[int]:
    """Enqueue the task again for open runs whose row has not moved for STALLED_SECONDS (the
    process running them died); their passes continue at the cursor. Returns their ids."""
    now = now or timezone.now()
    stalled = list(
        ErasureRun.objects.filter(
            state__in=ERASURE_OPEN_STATES, updated_at__lt=now - timedelta(seconds=STALLED_SECONDS)
        )
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    for pk in stalled:
        ErasureRun.objects.filter(pk=pk).update(updated_at=now)
        async_task("review.tasks.erasure_run_task", pk)
    return stalled
