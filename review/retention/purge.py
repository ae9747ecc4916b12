"""Retention: redact payloads past their TTL, delete records past theirs, keep tombstones.

Rules (DESIGN §6):
* Only terminal operations (succeeded, failed, abandoned) and resolved/discarded DLQ entries
  are redacted or deleted. A DLQ entry still pending past its record TTL is first discarded
  with an alert; it is deleted by a later run, once ``DISCARD_GRACE`` has passed.
* Legal hold on a policy: nothing of that record type is touched.
* Uploads (``ledger.Upload``): the bytes are the record, so the earlier of the two TTLs
  deletes the row and, once that commits, its object — not while an accepted job that names
  it can still run (its ``retain_until``); a later run deletes it once that has passed.
* A deleted operation leaves a tombstone (``ledger.protocol.tombstones``: kept for the longest of 24 h
  and the provider's key TTL); operations something still references (a living DLQ entry, an
  operation superseded by it) are not deleted until the reference is gone. ``operation_claim``
  never re-creates a tombstoned key (a NOT EXISTS guard inside its INSERT) and answers from
  the tombstone.
* Work happens in bounded batches, each its own short transaction (no long locks:
  review.retention.batches), and every pass over a tenant leaves a RetentionRun with counts per
  record type and policy. The pass starts by dropping the months nothing in which may be kept
  (review.retention.partitions); the policies it applies are review.retention.policies'.
* Failed attempts' evidence (ADR 0016) holds no personal data and is not part of the operation:
  deleting operations and dropping months leave it; its own period,
  ``FAILED_ATTEMPT_EVIDENCE_DAYS``, expires it in the same pass.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from alerts.services import alert_raise
from dlq.entries.services import failed_event_discard
from dlq.models import FailedEvent, FailedEventStatus, Replay
from dlq.rules.errors import FailedEventBusy, FailedEventClosed
from ledger.execution.outputs import outputs_delete_for
from ledger.execution.uploads import uploads_purge
from ledger.models import (
    TERMINAL_STATES,
    Attempt,
    AttemptEvidence,
    Operation,
    OutputVerdict,
    Tenant,
    Tombstone,
    Upload,
)
from ledger.platform.crypto import is_redacted
from ledger.platform.passes import PASS_ROW_FAILURES, row_isolated
from ledger.protocol.evidence import attempt_evidence_expired
from ledger.protocol.tombstones import tombstones_create
from ledger.store import sql
from review.audit.accesslog import access_log_min_retention, accesslog_checkpoint, checkpoint_write, lock_chain
from review.models import (
    AccessLog,
    CheckpointKind,
    RecordType,
    RetentionPolicy,
    RetentionRun,
    RetentionRunStatus,
    SubjectIndex,
)
from review.privacy.payloads import redaction_marker
from review.retention.batches import JOB, PurgeBudget, TenantPurge, TypeCounts, _each_batch, _keyset_batches
from review.retention.partitions import retention_drop_partitions
from review.retention.policies import _policies, defaults_apply, retention_setting

log = logging.getLogger("onceguard.retention")


def _policy_ref(policy: RetentionPolicy) -> int | str:
    return policy.pk or "default"


def _not_redacted(*columns: str) -> Q:
    q = Q()
    for column in columns:
        q |= Q(**{f"{column}__isnull": False}) & ~Q(**{f"{column}__has_key": "_redacted"})
    return q


def _redact_operations(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.payload_ttl
    columns = ("payload", "request", "response_body")
    # updated_at >= done_at, so updated_at < cutoff implies a payload past its TTL. Read in id
    # order on the tenant's id index (no index leads with updated_at since ADR 0017).
    rows = Operation.objects.filter(
        tenant_id=tp.run.tenant_id, updated_at__lt=cutoff, status__in=TERMINAL_STATES, done_at__lt=cutoff
    ).filter(_not_redacted(*columns))

    def batch(ids: list[int]) -> None:
        changed: list[tuple[int, list[Any]]] = []
        for op in (
            Operation.objects.select_for_update().filter(pk__in=ids, status__in=TERMINAL_STATES).only("pk", *columns)
        ):
            values = []
            for column in columns:
                value = getattr(op, column)
                if value is not None and not is_redacted(value):
                    value = redaction_marker(value=value, policy_id=_policy_ref(policy), run_id=tp.run.pk, at=tp.now)
                values.append(value)
            changed.append((op.pk, values))
        # One statement per chunk; updated_at is left alone (the record's age for its TTL).
        _update_json_columns(Operation, columns, changed)
        Attempt.objects.filter(operation_id__in=ids, response_body__isnull=False).update(response_body=None)
        counts.redacted += len(changed)

    _each_batch(tp, rows, "pk", counts, batch)


def _delete_operation_rows(ids: list[int]) -> None:
    """Delete operations and what hangs off them without loading them: cascades are deleted,
    SET_NULL references cleared, set-wise (the ORM collector would fetch every row)."""
    for rel in Operation._meta.related_objects:
        if rel.many_to_many or rel.related_model is Operation and rel.field.name != "superseded_by":
            continue
        manager = rel.related_model._base_manager
        lookup = {f"{rel.field.name}__in": ids}
        if rel.on_delete is models.CASCADE:
            manager.filter(**lookup).delete()
        elif rel.on_delete is models.SET_NULL:
            manager.filter(**lookup).update(**{rel.field.name: None})
    # Verdicts on an operation's output (ADR 0020) reach it by a hidden relation (related_name
    # "+"), which related_objects leaves out: a manifest's verdict names the operation only.
    OutputVerdict._base_manager.filter(operation_id__in=ids).delete()
    states = sorted(TERMINAL_STATES)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM ledger_operation WHERE id IN ({', '.join(['%s'] * len(ids))})"
            f" AND status IN ({', '.join(['%s'] * len(states))})",
            [*ids, *states],
        )


def _update_json_columns(model: Any, columns: tuple[str, ...], rows: list[tuple[int, list[Any]]]) -> None:
    """Set JSON ``columns`` of many rows of ``model`` by id, one statement per chunk: each value
    in its column's stored form (on PostgreSQL, bytes: ledger.models.SealedJSONField), None as
    NULL."""
    if not rows:
        return
    fields = [model._meta.get_field(c) for c in columns]

    def stored(field: Any, value: Any) -> Any:
        if value is None:
            return None
        if connection.vendor == "postgresql":
            return field.get_db_prep_value(value, connection)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    sets = ", ".join(f"{c} = %s" for c in columns)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {model._meta.db_table} SET {sets} WHERE id = %s",
            [[*(stored(f, v) for f, v in zip(fields, values, strict=True)), pk] for pk, values in rows],
        )


def _delete_operations(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.record_ttl
    rows = Operation.objects.filter(
        tenant_id=tp.run.tenant_id, updated_at__lt=cutoff, status__in=TERMINAL_STATES, done_at__lt=cutoff
    )

    def batch(ids: list[int]) -> None:
        # Lock the batch (two columns only), then drop what is still referenced (a living
        # DLQ entry, an operation it superseded): those wait for a later run.
        locked = dict(
            Operation.objects.select_for_update()
            .filter(pk__in=ids, status__in=TERMINAL_STATES)
            .values_list("pk", "superseded_by_id")
        )
        referenced = set(FailedEvent.objects.filter(operation_id__in=ids).values_list("operation_id", flat=True))
        referenced |= set(Operation.objects.filter(superseded_by_id__in=ids).values_list("superseded_by_id", flat=True))
        counts.skipped_referenced += len(referenced & set(locked))
        op_ids = [pk for pk in locked if pk not in referenced]
        if not op_ids:
            return
        superseded = [pk for pk in op_ids if locked[pk]]
        plain = [pk for pk in op_ids if not locked[pk]]
        made = tombstones_create(plain_ids=plain, superseded_ids=superseded, deleted_at=tp.now)
        # The person's trail keeps the link (keyed digest, id) to say the record was deleted.
        SubjectIndex.objects.filter(
            record_type=RecordType.OPERATIONS, record_id__in=op_ids, gone_at__isnull=True
        ).update(gone_at=tp.now)
        # Published outputs go with their operation: rows here, bytes once this commits.
        outputs_delete_for(operation_ids=op_ids)
        _delete_operation_rows(op_ids)
        counts.deleted += len(op_ids)
        tp.run.tombstones_created += made

    _each_batch(tp, rows, "pk", counts, batch)


def _redact_failed_events(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.payload_ttl
    closed = [FailedEventStatus.RESOLVED, FailedEventStatus.DISCARDED]
    rows = (
        FailedEvent.objects.filter(tenant_id=tp.run.tenant_id, status__in=closed, updated_at__lt=cutoff)
        .filter(payload__isnull=False)
        .exclude(payload__has_key="_redacted")
    )

    def batch(ids: list[int]) -> None:
        for event in (
            FailedEvent.objects.select_for_update().filter(pk__in=ids, status__in=closed).only("pk", "payload")
        ):
            marker = redaction_marker(value=event.payload, policy_id=_policy_ref(policy), run_id=tp.run.pk, at=tp.now)
            # .update(): the row's updated_at (its age for the record TTL) stays as it was.
            FailedEvent.objects.filter(pk=event.pk).update(payload=marker)
            Replay.objects.filter(event_id=event.pk, response_body__isnull=False).update(response_body=None)
            counts.redacted += 1

    _each_batch(tp, rows, "updated_at", counts, batch)


def _discard_stale_pending(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.record_ttl
    stale = FailedEvent.objects.filter(
        tenant_id=tp.run.tenant_id, status=FailedEventStatus.PENDING, failed_at__lt=cutoff
    )
    for ids in _keyset_batches(tp, stale, "failed_at"):
        for event in FailedEvent.objects.filter(pk__in=ids, status=FailedEventStatus.PENDING).only("pk", "event_id"):
            with row_isolated(job=JOB, ref=f"tenant={tp.run.tenant_id} event={event.pk}", on_failure=tp.failed):
                # The alert first, in the same transaction: nobody loses an entry unannounced.
                alert_raise(
                    tenant_id=tp.run.tenant_id,
                    kind="retention_discarded",
                    ref=event.event_id,
                    summary=f"DLQ entry {event.pk} was pending past its retention period and was discarded",
                )
                try:
                    failed_event_discard(
                        tenant_id=tp.run.tenant_id,
                        event_pk=event.pk,
                        actor="retention",
                        note=f"retention: pending past the record TTL (policy {policy.pk}, run {tp.run.pk})",
                    )
                except (FailedEventBusy, FailedEventClosed):
                    # An operator (or a replay) got to it first: theirs is the better decision,
                    # and the alert goes with the discard that did not happen.
                    transaction.set_rollback(True)
                    continue
                counts.discarded += 1


def _delete_failed_events(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.record_ttl
    grace = timedelta(seconds=int(retention_setting("DISCARD_GRACE_SECONDS", 7 * 86400)))
    closed = [FailedEventStatus.RESOLVED, FailedEventStatus.DISCARDED]
    rows = FailedEvent.objects.filter(tenant_id=tp.run.tenant_id, status__in=closed, failed_at__lt=cutoff).filter(
        # Entries retention itself discarded stay visible for the grace period first.
        ~Q(status_note__startswith="retention:") | Q(updated_at__lt=tp.now - grace)
    )

    def batch(ids: list[int]) -> None:
        gone = list(FailedEvent.objects.filter(pk__in=ids, status__in=closed).values_list("pk", flat=True))
        SubjectIndex.objects.filter(
            record_type=RecordType.FAILED_EVENTS, record_id__in=gone, gone_at__isnull=True
        ).update(gone_at=tp.now)
        FailedEvent.objects.filter(pk__in=gone, status__in=closed).delete()
        counts.deleted += len(ids)

    _each_batch(tp, rows, "failed_at", counts, batch)


def _delete_access_log(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    # The platform's floor holds whatever the policy says (a policy below it is refused on
    # save, but one written straight into the table must not shorten the log either).
    cutoff = tp.now - max(policy.record_ttl, access_log_min_retention())
    rows = AccessLog.objects.filter(tenant_id=tp.run.tenant_id, at__lt=cutoff)

    # A prefix of the chain, oldest first: the chain stays verifiable from the anchor.
    def batch(ids: list[int]) -> None:
        lock_chain(tp.run.tenant_id)
        last_seq, last_hash = AccessLog.objects.filter(pk=ids[-1]).values_list("seq", "hash").get()
        AccessLog.objects.filter(tenant_id=tp.run.tenant_id, seq__lte=last_seq).delete()
        # The new anchor is a signed checkpoint written in the same transaction as the
        # cut, so the chain can always be verified from what is left; the run shows it.
        checkpoint_write(tenant_id=tp.run.tenant_id, kind=CheckpointKind.PURGE, seq=last_seq, hash=last_hash)
        tp.run.accesslog_anchor_seq = last_seq
        tp.run.accesslog_anchor_hash = last_hash
        tp.run.save(update_fields=["accesslog_anchor_seq", "accesslog_anchor_hash"])
        counts.deleted += len(ids)

    _each_batch(tp, rows, "seq", counts, batch)


def _delete_uploads(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    # An upload's bytes are its payload and its record at once: the earlier TTL deletes both
    # (the rows in the batch's transaction, the objects once it commits: ledger.execution.uploads).
    ttls = [ttl for ttl in (policy.payload_ttl, policy.record_ttl) if ttl is not None]
    if not ttls:
        return
    cutoff = tp.now - min(ttls)
    rows = Upload.objects.filter(tenant_id=tp.run.tenant_id, created_at__lt=cutoff)

    def batch(ids: list[int]) -> None:
        # Not one a job that can still run names (its retain_until, read under the row's
        # lock): that one waits for a later run (ledger.execution.uploads.uploads_purge).
        deleted, kept = uploads_purge(tenant_id=tp.run.tenant_id, upload_ids=ids, now=tp.now)
        counts.deleted += deleted
        counts.skipped_referenced += kept

    _each_batch(tp, rows, "created_at", counts, batch)


def _expire_gone_links(tp: TenantPurge) -> None:
    """Index links of deleted records go once the access log's floor has passed: the trail
    can say "deleted" as long as it can say who looked."""
    rows = SubjectIndex.objects.filter(tenant_id=tp.run.tenant_id, gone_at__lt=tp.now - access_log_min_retention())
    for ids in _keyset_batches(tp, rows, "gone_at"):
        SubjectIndex.objects.filter(pk__in=ids).delete()


# The key of a run's counts for failed attempts' evidence (not a record type: no tenant policy
# applies to it; its period is the platform's, ADR 0016).
EVIDENCE = "attempt_evidence"


def evidence_days() -> int:
    """How long failed attempts' evidence is kept (FAILED_ATTEMPT_EVIDENCE_DAYS, by default the
    access log's record retention)."""
    return int(retention_setting("EVIDENCE_DAYS", 2555))


def _expire_evidence(tp: TenantPurge) -> None:
    """Failed attempts' evidence past its own period (ADR 0016): neither the operations' record
    TTL nor a dropped month of attempts touches it, and a legal hold on operations keeps it."""
    counts = tp.counts.setdefault(EVIDENCE, TypeCounts(policy="setting"))
    operations = _policies(tp.run.tenant_id).get(RecordType.OPERATIONS)
    if operations is not None and operations.legal_hold:
        counts.held = True
        return
    rows = attempt_evidence_expired(tenant_id=tp.run.tenant_id, before=tp.now - timedelta(days=evidence_days()))

    def batch(ids: list[int]) -> None:
        deleted, _ = AttemptEvidence.objects.filter(tenant_id=tp.run.tenant_id, pk__in=ids).delete()
        counts.deleted += deleted

    _each_batch(tp, rows, "finished_at", counts, batch)


def _expire_tombstones(tp: TenantPurge) -> None:
    rows = Tombstone.objects.filter(tenant_id=tp.run.tenant_id, keep_until__lt=tp.now)
    for ids in _keyset_batches(tp, rows, "keep_until"):
        deleted, _ = Tombstone.objects.filter(pk__in=ids).delete()
        tp.run.tombstones_expired += deleted


def retention_purge_tenant(
    *,
    tenant_id: int,
    now: datetime | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    trigger: str = "schedule",
    pass_id: str | None = None,
) -> RetentionRun | None:
    """One purge pass over one tenant; None when the tenant has no retention policy."""
    policies = _policies(tenant_id)
    has_stones = Tombstone.objects.filter(tenant_id=tenant_id).exists()
    has_evidence = AttemptEvidence.objects.filter(tenant_id=tenant_id).exists()
    if not policies and not has_stones and not has_evidence:
        return None
    now = now or sql.db_now()
    run = RetentionRun.objects.create(
        tenant_id=tenant_id, pass_id=pass_id or uuid.uuid4().hex, trigger=trigger, started_at=timezone.now()
    )
    tp = TenantPurge(
        run=run,
        now=now,
        budget=PurgeBudget(
            batch_size=batch_size or int(retention_setting("BATCH_SIZE", 500)),
            max_batches=max_batches or int(retention_setting("MAX_BATCHES", 200)),
            seconds=float(retention_setting("TIME_BUDGET_SECONDS", 60)),
        ),
    )
    started = time.monotonic()
    try:
        for record_type in RecordType.values:
            policy = policies.get(record_type)
            counts = tp.counts.setdefault(record_type, TypeCounts(policy=_policy_ref(policy) if policy else None))
            if policy is None:
                continue
            if policy.legal_hold:
                counts.held = True
                continue
            # One record type's failure (its rows are isolated in _each_batch; this covers the
            # rest of the step) leaves the other types to be purged.
            with row_isolated(
                job=JOB, ref=f"tenant={tenant_id} type={record_type}", on_failure=tp.failed, atomic=False
            ):
                _purge_type(tp, record_type, policy, counts)
        _expire_tombstones(tp)
        _expire_evidence(tp)
        _expire_gone_links(tp)
        # Every purge leaves the tenant's access-log head signed (review.audit.accesslog).
        accesslog_checkpoint(tenant_id=tenant_id)
        run.status = RetentionRunStatus.PARTIAL if tp.exhausted or tp.failures else RetentionRunStatus.DONE
        if tp.failures:
            run.error = f"{tp.failures} rows or steps left for a later run; the last: {tp.failure}"[:500]
    except Exception as exc:
        PASS_ROW_FAILURES.labels(job=JOB).inc()
        run.status = RetentionRunStatus.FAILED
        run.error = f"{type(exc).__name__}"[:500]
        log.exception("retention_failed tenant=%s run=%s", tenant_id, run.pk)
    run.redacted = sum(c.redacted for c in tp.counts.values())
    run.deleted = sum(c.deleted for c in tp.counts.values())
    run.discarded = sum(c.discarded for c in tp.counts.values())
    run.batches = tp.budget.used
    tp.budget.close()
    run.details = {k: v.as_dict() for k, v in tp.counts.items()}
    run.details["longest_batch_ms"] = round(tp.budget.longest_batch * 1000, 1)
    run.finished_at = timezone.now()
    run.save()
    log.info(
        "retention_run tenant=%s run=%s status=%s redacted=%s deleted=%s discarded=%s tombstones=%s/%s batches=%s ms=%d",
        tenant_id,
        run.pk,
        run.status,
        run.redacted,
        run.deleted,
        run.discarded,
        run.tombstones_created,
        run.tombstones_expired,
        run.batches,
        (time.monotonic() - started) * 1000,
    )
    return run


def _purge_type(tp: TenantPurge, record_type: str, policy: RetentionPolicy, counts: TypeCounts) -> None:
    # Deletes before redactions: a row about to go is not worth redacting first, and a
    # row that cannot go yet (still referenced) is redacted all the same.
    if record_type == RecordType.OPERATIONS:
        if policy.record_ttl is not None:
            _delete_operations(tp, policy, counts)
        if policy.payload_ttl is not None:
            _redact_operations(tp, policy, counts)
    elif record_type == RecordType.FAILED_EVENTS:
        if policy.record_ttl is not None:
            _discard_stale_pending(tp, policy, counts)
            _delete_failed_events(tp, policy, counts)
        if policy.payload_ttl is not None:
            _redact_failed_events(tp, policy, counts)
    elif record_type == RecordType.ACCESS_LOG and policy.record_ttl is not None:
        _delete_access_log(tp, policy, counts)
    elif record_type == RecordType.UPLOADS:
        _delete_uploads(tp, policy, counts)


def retention_purge(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    trigger: str = "schedule",
) -> list[RetentionRun]:
    """One pass over every tenant with a policy (or tombstones), after dropping the months of
    attempts and events nothing in which may be kept."""
    retention_drop_partitions(now=now)
    pass_id = uuid.uuid4().hex
    tenant_ids = set(RetentionPolicy.objects.values_list("tenant_id", flat=True)) | set(
        Tombstone.objects.values_list("tenant_id", flat=True).distinct()
    )
    # Tenants with failed attempts' evidence (ADR 0016): one index probe per tenant.
    tenant_ids |= set(
        Tenant.objects.filter(Exists(AttemptEvidence.objects.filter(tenant_id=OuterRef("pk")))).values_list(
            "pk", flat=True
        )
    )
    if defaults_apply():
        tenant_ids |= set(Tenant.objects.values_list("pk", flat=True))
    runs = []
    for tenant_id in sorted(tenant_ids & set(Tenant.objects.values_list("pk", flat=True))):
        # A tenant whose run cannot even be recorded does not stop the others. Not one
        # transaction around the tenant's run: its batches commit one by one.
        with row_isolated(job=JOB, ref=f"tenant={tenant_id}", atomic=False):
            run = retention_purge_tenant(
                tenant_id=tenant_id,
                now=now,
                batch_size=batch_size,
                max_batches=max_batches,
                trigger=trigger,
                pass_id=pass_id,
            )
            if run is not None:
                runs.append(run)
    return runs


def connection_vendor() -> str:
    return connection.vendor
