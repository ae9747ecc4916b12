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
* Work happens in bounded batches, each its own short transaction (no long locks), and every
  pass over a tenant leaves a RetentionRun with counts per record type and policy.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from alerts.services import alert_raise
from dlq.entries.services import failed_event_discard
from dlq.models import FailedEvent, FailedEventStatus, Replay
from dlq.rules.errors import FailedEventBusy, FailedEventClosed
from ledger.execution.outputs import outputs_delete_for
from ledger.execution.uploads import uploads_purge
from ledger.models import TERMINAL_STATES, Attempt, Operation, Tenant, Tombstone, Upload
from ledger.platform import partitions
from ledger.platform.crypto import is_redacted
from ledger.platform.passes import PASS_ROW_FAILURES, failure_text, row_isolated
from ledger.protocol.tombstones import tombstones_create
from ledger.store import sql
from review.accesslog import access_log_min_retention, accesslog_checkpoint, checkpoint_write, lock_chain
from review.models import (
    AccessLog,
    CheckpointKind,
    RecordType,
    RetentionPolicy,
    RetentionRun,
    RetentionRunStatus,
    SubjectIndex,
)
from review.privacy import redaction_marker

log = logging.getLogger("onceguard.retention")
# The label of this pass's failures (ledger.platform.passes).
JOB = "retention_purge"


def retention_setting(name: str, default: Any) -> Any:
    return getattr(settings, "ONCEGUARD_RETENTION", {}).get(name, default)


# --- The purge ----------------------------------------------------------------------------------


@dataclass
class TypeCounts:
    # the policy's id, or "default" (the platform's defaults applied)
    policy: int | str | None = None
    held: bool = False
    redacted: int = 0
    deleted: int = 0
    discarded: int = 0
    skipped_referenced: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PurgeBudget:
    """Bounded work per pass: at most ``max_batches`` batches and ``seconds`` of wall time
    (below django-q2's task timeout); the next pass continues where this one stopped."""

    batch_size: int
    max_batches: int
    seconds: float = 60.0
    used: int = 0
    started: float = field(default_factory=time.monotonic)
    # Wall time between consecutive batches (≈ each batch's transaction), for the bench.
    longest_batch: float = 0.0
    _last: float = 0.0

    def take(self) -> bool:
        now = time.monotonic()
        if self._last:
            self.longest_batch = max(self.longest_batch, now - self._last)
        self._last = now
        if self.used >= self.max_batches or now - self.started > self.seconds:
            return False
        self.used += 1
        return True

    def close(self) -> None:
        if self._last:
            self.longest_batch = max(self.longest_batch, time.monotonic() - self._last)


@dataclass
class TenantPurge:
    run: RetentionRun
    now: datetime
    budget: PurgeBudget
    counts: dict[str, TypeCounts] = field(default_factory=dict)
    exhausted: bool = False
    # Rows (or steps) that raised and were left in place for a later run (ledger.platform.passes).
    failures: int = 0
    failure: str = ""

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.failure = failure_text(JOB, exc)


def _days(value: Any) -> timedelta | None:
    return None if value is None else timedelta(days=int(value))


def retention_defaults(record_type: str) -> tuple[timedelta | None, timedelta | None]:
    """(payload TTL, record TTL) a tenant without a policy for ``record_type`` gets."""
    spec = retention_setting("DEFAULTS", {}).get(record_type, {})
    return _days(spec.get("payload_days")), _days(spec.get("record_days"))


def retention_floor(record_type: str) -> tuple[timedelta | None, timedelta | None]:
    """(payload TTL, record TTL) no tenant's policy may go below; the access log's record
    floor is review.accesslog's."""
    if record_type == RecordType.ACCESS_LOG:
        return None, access_log_min_retention()
    spec = retention_setting("FLOORS", {}).get(record_type, {})
    return _days(spec.get("payload_days")), _days(spec.get("record_days"))


def defaults_apply() -> bool:
    return bool(retention_setting("APPLY_DEFAULTS", False))


def _policies(tenant_id: int) -> dict[str, RetentionPolicy]:
    """The tenant's policies; the platform's defaults (unsaved, pk None) for the record types
    it has none for, when defaults apply."""
    policies = {p.record_type: p for p in RetentionPolicy.objects.filter(tenant_id=tenant_id)}
    if defaults_apply():
        for record_type in RecordType.values:
            payload_ttl, record_ttl = retention_defaults(record_type)
            if record_type not in policies and (payload_ttl or record_ttl):
                policies[record_type] = RetentionPolicy(
                    tenant_id=tenant_id, record_type=record_type, payload_ttl=payload_ttl, record_ttl=record_ttl
                )
    return policies


def _policy_ref(policy: RetentionPolicy) -> int | str:
    return policy.pk or "default"


def _keyset(qs: Any, column: str, last: tuple[Any, int] | None, size: int) -> list[tuple[Any, int]]:
    """The next ``size`` (column, id) pairs after ``last``, in index order: each batch starts
    where the previous one stopped (rows skipped on purpose are never scanned again)."""
    if last is not None:
        value, pk = last
        # (column, id) > (value, pk), spelled so that ``column >= value`` is an index range
        # condition: the plain OR of the two cases would scan from the start every batch.
        qs = qs.filter(Q(**{f"{column}__gte": value}) & (Q(**{f"{column}__gt": value}) | Q(pk__gt=pk)))
    return list(qs.order_by(column, "pk").values_list(column, "pk")[:size])


def _keyset_batches(tp: TenantPurge, rows: Any, column: str) -> Iterator[list[int]]:
    """Ids of ``rows`` in keyset batches of the run's size, while its budget lasts (the run
    is marked exhausted when it runs out, so the next run continues). Every batch loop of the
    purge goes through here: a loop that re-reads from the start would spin on a row it
    leaves in place (a busy DLQ entry) until the budget runs out."""
    last = None
    size = tp.budget.batch_size
    while True:
        page = _keyset(rows, column, last, size)
        if not page:
            return
        if not tp.budget.take():
            tp.exhausted = True
            return
        last = page[-1]
        yield [pk for _, pk in page]
        if len(page) < size:
            return


def _each_batch(
    tp: TenantPurge, rows: Any, column: str, counts: TypeCounts, batch: Callable[[list[int]], None]
) -> None:
    """``batch(ids)`` for each keyset batch, each in its own transaction. A batch that raises
    is rolled back (its counts with it) and its rows tried one by one, each in its own
    transaction: a row that still raises is left for a later run — counted, logged and
    recorded on the run (ledger.platform.passes) — and the others are purged all the same."""
    for ids in _keyset_batches(tp, rows, column):
        if _batch_done(tp, counts, batch, ids, isolated=False):
            continue
        for pk in ids:
            _batch_done(tp, counts, batch, [pk], isolated=True)


def _batch_done(
    tp: TenantPurge, counts: TypeCounts, batch: Callable[[list[int]], None], ids: list[int], *, isolated: bool
) -> bool:
    before, created = dict(counts.__dict__), tp.run.tombstones_created
    try:
        if isolated:
            ok = False
            with row_isolated(job=JOB, ref=f"tenant={tp.run.tenant_id} row={ids[0]}", on_failure=tp.failed):
                batch(ids)
                ok = True
        else:
            with transaction.atomic():
                batch(ids)
            ok = True
    except Exception:
        # The whole batch: each row is tried alone next (the caller), which counts and logs.
        ok = False
    if not ok:
        counts.__dict__.update(before)
        tp.run.tombstones_created = created
    return ok


def _not_redacted(*columns: str) -> Q:
    q = Q()
    for column in columns:
        q |= Q(**{f"{column}__isnull": False}) & ~Q(**{f"{column}__has_key": "_redacted"})
    return q


def _redact_operations(tp: TenantPurge, policy: RetentionPolicy, counts: TypeCounts) -> None:
    cutoff = tp.now - policy.payload_ttl
    columns = ("payload", "request", "response_body")
    # updated_at >= done_at, so updated_at < cutoff implies a payload past its TTL, and the
    # (tenant, updated_at, id) index serves the scan.
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

    _each_batch(tp, rows, "updated_at", counts, batch)


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

    _each_batch(tp, rows, "updated_at", counts, batch)


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
    if not policies and not has_stones:
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
        _expire_gone_links(tp)
        # Every purge leaves the tenant's access-log head signed (review.accesslog).
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


def _operation_cutoffs(now: datetime) -> dict[int, datetime]:
    """Tenant → the time before which its finished operations are past their record TTL, for
    every tenant whose operations may be deleted at all (a TTL, no legal hold)."""
    cutoffs = {}
    for tenant_id in Tenant.objects.values_list("pk", flat=True):
        policy = _policies(tenant_id).get(RecordType.OPERATIONS)
        if policy is not None and policy.record_ttl is not None and not policy.legal_hold:
            cutoffs[tenant_id] = now - policy.record_ttl
    return cutoffs


def _partition_keeps_something(
    part: partitions.Partition, cutoffs: dict[int, datetime], *, bounds: tuple[int, int] | None = None
) -> bool:
    """Whether a row of ``part`` belongs to an operation this purge would keep: one of a tenant
    with no record TTL or on legal hold, not finished, not past its tenant's TTL, or still
    referenced (a DLQ entry, an operation it superseded) — the rules of _delete_operations.

    Only operations whose ids lie between the least and greatest the partition names can have
    a row in it (both ends off its operation_id index; ``bounds`` overrides them for a
    measurement); each candidate kept is probed in the partition's index, newest first, and
    the first hit answers. A month that may be dropped is answered only after every operation
    of its range is read, so the per-operation work is kept to one heap row: the tenant's
    cutoff is a ``CASE`` (no join per row) and the two references are read once for the whole
    range into hashed sets (no index probe per row)."""
    bounds = bounds or partitions.partition_operation_range(part)
    if bounds is None:
        return False
    cutoff = "CASE o.tenant_id " + " ".join(["WHEN %s THEN %s::timestamptz"] * len(cutoffs)) + " END"
    if not cutoffs:
        cutoff = "NULL::timestamptz"
    states = sorted(TERMINAL_STATES)
    low, high = bounds
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM ledger_operation o CROSS JOIN LATERAL (SELECT {cutoff} AS cutoff) r"
            " WHERE o.id BETWEEN %s AND %s"
            " AND (r.cutoff IS NULL OR o.updated_at >= r.cutoff OR o.done_at IS NULL OR o.done_at >= r.cutoff"
            f" OR o.status NOT IN ({', '.join(['%s'] * len(states))})"
            " OR o.id IN (SELECT f.operation_id FROM dlq_failedevent f WHERE f.operation_id BETWEEN %s AND %s)"
            " OR o.id IN (SELECT s.superseded_by_id FROM ledger_operation s"
            " WHERE s.superseded_by_id BETWEEN %s AND %s))"
            f" AND EXISTS (SELECT 1 FROM {part.name} p WHERE p.operation_id = o.id)"
            " ORDER BY o.id DESC LIMIT 1",
            [*[v for item in cutoffs.items() for v in item], low, high, *states, low, high, low, high],
        )
        return cursor.fetchone() is not None


def retention_drop_partitions(*, now: datetime | None = None) -> list[str]:
    """Drop every past month of attempts and events in which nothing may be kept (PostgreSQL;
    DESIGN §12, *Partitions*): every row in it belongs to an operation past the TTL of its
    tenant's policy, on no legal hold, or to none left. Runs before the tenants' batches, which
    then find those rows gone; a month that keeps something is left to them, row by row, as
    before. The policies are locked (SHARE) from the check to the drop, so a legal hold or a
    longer TTL saved meanwhile waits for it and is seen by the next pass."""
    if connection.vendor != "postgresql":
        return []
    now = now or sql.db_now()
    horizon = partitions.month_start(now)
    dropped = []
    for table in partitions.PARTITIONED:
        for part in partitions.partitions(table):
            # Only months wholly past: the current one still takes rows.
            if part.is_default or part.upper is None or part.upper > horizon:
                continue
            # One transaction per partition: DROP locks the partitioned table (every claim
            # writes to it) until the commit right after it, never while the next one is checked.
            # One month that cannot be checked or dropped is left for the next pass (ledger.platform.passes).
            with row_isolated(job=JOB, ref=f"partition={part.name}"):
                with connection.cursor() as cursor:
                    cursor.execute("LOCK TABLE review_retentionpolicy IN SHARE MODE")
                if not _partition_keeps_something(part, _operation_cutoffs(now)) and partitions.partition_drop(part):
                    dropped.append(part.name)
    if dropped:
        log.info("retention_partitions_dropped names=%s", ",".join(dropped))
    return dropped


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
