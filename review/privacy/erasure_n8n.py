"""An erasure reaches n8n: the executions that carried the person's data, deleted through the
tenant's n8n connection (``DELETE /api/v1/executions/{id}``, dlq.n8n.api), each deletion
recorded in the access log in the same transaction that moves the run on.

Which executions: the ones Onceguard knows for the person's records — a DLQ entry's execution
and every occurrence's (each report of the same failure, n8n retries included) and the
executions those retried (``retryOf``, its aliases), an operation's execution and each
attempt's. They are snapshotted with the records when the
erasure is requested (``ErasureRun.n8n_executions``) and worked through after the records,
from ``n8n_cursor``, one execution at a time: the HTTP call outside any transaction (bounded
by the connection's timeout), then one transaction that locks the run, checks the cursor is
still where the call started (a second pass at once loses, and its call was a harmless
repeat: a deleted execution answers 404), writes the access-log row (deleted) or the report
line (not deleted), and moves the cursor. A crash between the call and the commit repeats
the call on the next pass; the 404 it meets is listed, never counted as a deletion twice.

Never silently dropped: every execution not deleted is listed on the run (``n8n_left``) with
why — not asked (the request's flag), no usable connection, refused (the key lacks
``execution:delete``, a running execution), n8n unreachable, or not found (pruned or deleted
already, or of a workflow the key's user cannot see). The erasure report (API, console)
lists them for a person to remove by hand.

The default (``n8n_delete`` when the request does not say): on when the tenant has an active
n8n connection with a key — an erasure exists to remove the person's data, and n8n's
execution history is a full copy of it (docs/adr/0005-erasure-reaches-n8n.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from dlq.entries.selectors import n8n_connection_active
from dlq.models import FailedEvent, FailedEventAlias, FailedEventOccurrence, N8nConnection
from dlq.n8n.api import Deleted, Deletion, execution_delete
from ledger.models import Attempt, Operation
from ledger.providers.credentials import stored_credential_value
from review.audit.accesslog import accesslog_append
from review.models import AccessAction, ErasureRun, ErasureState, RecordType

log = logging.getLogger("onceguard.erasure")

ACTOR = "erasure"
# Executions deleted per call of erasure_n8n_pass (the erasure's pass calls it again).
N8N_BATCH = 20
# After this many executions in a row n8n did not answer, the rest of the pass is listed
# without being tried (each try could wait the connection's whole timeout).
UNREACHABLE_STOP = 3
ID_CHUNK = 500
# What an execution not deleted is listed as (besides dlq.n8n.api.Deleted's outcomes).
NOT_ASKED = "not_asked"
NO_CONNECTION = "no_connection"
OUTCOME_WORDS = {
    NOT_ASKED: "to remove by hand",
    NO_CONNECTION: "to remove by hand",
    Deleted.REFUSED: "to remove by hand",
    Deleted.UNREACHABLE: "to remove by hand",
    Deleted.NOT_FOUND: "not found in n8n",
}


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), ID_CHUNK):
        yield ids[start : start + ID_CHUNK]


def n8n_executions_of(*, tenant_id: int, targets: Iterable[Any]) -> list[list[str]]:
    """[[workflow_id, execution_id], …] of the executions the records carry, each once,
    in the order first seen (operations, then DLQ entries)."""
    op_ids = [int(t.record_id) for t in targets if t.record_type == RecordType.OPERATIONS]
    fe_ids = [int(t.record_id) for t in targets if t.record_type == RecordType.FAILED_EVENTS]
    found: dict[str, str] = {}

    def add(workflow_id: str, execution_id: str) -> None:
        execution_id = (execution_id or "").strip()
        if execution_id and execution_id not in found:
            found[execution_id] = (workflow_id or "").strip()

    for chunk in _chunks(op_ids):
        workflows = dict(Operation.objects.filter(tenant_id=tenant_id, pk__in=chunk).values_list("pk", "workflow_id"))
        for pk, execution_id in (
            Operation.objects.filter(tenant_id=tenant_id, pk__in=chunk)
            .exclude(execution_id="")
            .order_by("pk")
            .values_list("pk", "execution_id")
        ):
            add(workflows.get(pk, ""), execution_id)
        for op_id, execution_id in (
            Attempt.objects.filter(tenant_id=tenant_id, operation_id__in=chunk)
            .exclude(execution_id="")
            .order_by("operation_id", "started_at")
            .values_list("operation_id", "execution_id")
        ):
            add(workflows.get(op_id, ""), execution_id)
    for chunk in _chunks(fe_ids):
        for model in (FailedEvent, FailedEventOccurrence):
            key = "pk" if model is FailedEvent else "event_id"
            for workflow_id, execution_id in (
                model.objects.filter(tenant_id=tenant_id, **{f"{key}__in": chunk})
                .exclude(source_execution_id="")
                .order_by(key, "pk")
                .values_list("source_workflow_id", "source_execution_id")
            ):
                add(workflow_id, execution_id)
        # The executions an n8n retry (``retryOf``) retried: the same item, an earlier copy.
        for identity in (
            FailedEventAlias.objects.filter(tenant_id=tenant_id, event_id__in=chunk, identity__startswith="n8n:")
            .order_by("pk")
            .values_list("identity", flat=True)
        ):
            parts = identity.split(":")
            if len(parts) == 3:
                add(parts[1], parts[2])
    return [[workflow_id, execution_id] for execution_id, workflow_id in found.items()]


def n8n_delete_default(*, tenant_id: int) -> bool:
    return n8n_connection_active(tenant_id=tenant_id)


def _left(workflow_id: str, deletion: Deletion) -> dict[str, str]:
    return {
        "workflow": workflow_id,
        "execution": deletion.execution_id,
        "outcome": deletion.outcome,
        "reason": deletion.reason[:300],
    }


def _record(run_id: int, index: int, results: list[tuple[str, Deletion]]) -> bool:
    """Record ``results`` (the executions from ``index`` on) in one transaction under the
    run's lock; False when another pass moved the cursor meanwhile (nothing written)."""
    with transaction.atomic():
        run = ErasureRun.objects.select_for_update().get(pk=run_id)
        if run.state == ErasureState.DONE or run.n8n_cursor != index:
            return False
        left = list(run.n8n_left)
        for workflow_id, deletion in results:
            if deletion.outcome == Deleted.DELETED:
                run.n8n_deleted += 1
                where = f" of workflow {workflow_id}" if workflow_id else ""
                accesslog_append(
                    tenant_id=run.tenant_id,
                    action=AccessAction.N8N_DELETE,
                    actor=ACTOR,
                    object_type="subject",
                    object_id=str(run.pk),
                    object_ref=run.subject_ref,
                    fields=[f"n8n execution {deletion.execution_id}"],
                    reason=f"erasure #{run.pk}: n8n execution {deletion.execution_id}{where} deleted through n8n's API",
                )
            else:
                left.append(_left(workflow_id, deletion))
        run.n8n_left = left
        run.n8n_cursor = index + len(results)
        run.updated_at = timezone.now()
        run.save(update_fields=["n8n_left", "n8n_cursor", "n8n_deleted", "updated_at"])
    return True


@dataclass(frozen=True)
class _Connection:
    base_url: str
    api_key: str
    timeout: float


def _connection(run: ErasureRun) -> tuple[_Connection | None, str, str]:
    """The connection to delete with, or (None, outcome, why) when the executions are listed."""
    if not run.n8n_delete:
        return (
            None,
            NOT_ASKED,
            "this erasure did not delete n8n executions (the request said no, or the tenant had no active"
            " n8n connection then)",
        )
    connection = N8nConnection.objects.filter(tenant_id=run.tenant_id).first()
    if connection is None or not connection.active:
        return None, NO_CONNECTION, "the tenant has no active n8n connection"
    api_key, why = stored_credential_value(connection.api_key_secret)
    if api_key is None:
        return None, NO_CONNECTION, f"the stored n8n API key cannot be used: {why or 'none is stored'}"
    return _Connection(connection.base_url, api_key, float(connection.timeout_seconds)), "", ""


def erasure_n8n_pass(*, run_id: int, limit: int = N8N_BATCH) -> ErasureRun:
    """Delete (or list) up to ``limit`` of the run's n8n executions from its ``n8n_cursor``."""
    run = ErasureRun.objects.get(pk=run_id)
    start = run.n8n_cursor
    pending = [list(pair) for pair in run.n8n_executions[start : start + limit]]
    if run.state == ErasureState.DONE or not pending:
        return run
    connection, outcome, reason = _connection(run)
    if connection is None:
        # Nothing to call: the whole remainder is listed at once.
        rest = [list(pair) for pair in run.n8n_executions[start:]]
        _record(run_id, start, [(wf, Deletion(ex, outcome, reason)) for wf, ex in rest])
        return ErasureRun.objects.get(pk=run_id)
    unreachable = 0
    for offset, (workflow_id, execution_id) in enumerate(pending):
        if unreachable >= UNREACHABLE_STOP:
            deletion = Deletion(
                execution_id,
                Deleted.UNREACHABLE,
                f"not tried: n8n did not answer for the {UNREACHABLE_STOP} executions before it",
            )
        else:
            deletion = execution_delete(
                base_url=connection.base_url,
                api_key=connection.api_key,
                execution_id=execution_id,
                timeout=connection.timeout,
            )
        unreachable = unreachable + 1 if deletion.outcome == Deleted.UNREACHABLE else 0
        if not _record(run_id, start + offset, [(workflow_id, deletion)]):
            break
    run = ErasureRun.objects.get(pk=run_id)
    log.info(
        "erasure_n8n_pass run=%s cursor=%s/%s deleted=%s left=%s",
        run.pk,
        run.n8n_cursor,
        len(run.n8n_executions),
        run.n8n_deleted,
        len(run.n8n_left),
    )
    return run


def n8n_summary(run: ErasureRun) -> str:
    """ "3 n8n executions deleted, 1 to remove by hand, 1 not found in n8n" ("" when none)."""
    parts: list[str] = []
    if run.n8n_deleted:
        parts.append(f"{run.n8n_deleted} n8n execution{'s' if run.n8n_deleted != 1 else ''} deleted")
    counts: dict[str, int] = {}
    for item in run.n8n_left:
        words = OUTCOME_WORDS.get(str(item.get("outcome")), "to remove by hand")
        counts[words] = counts.get(words, 0) + 1
    for words, n in counts.items():
        parts.append(f"{n} n8n execution{'s' if n != 1 else ''} {words}")
    waiting = len(run.n8n_executions) - run.n8n_cursor
    if waiting > 0 and run.state != ErasureState.DONE:
        parts.append(f"{waiting} n8n execution{'s' if waiting != 1 else ''} still to delete")
    return ", ".join(parts)


def n8n_report(run: ErasureRun) -> dict[str, Any]:
    """The run's n8n part, for the API and the console."""
    return {
        "delete": run.n8n_delete,
        "executions": len(run.n8n_executions),
        "cursor": run.n8n_cursor,
        "deleted": run.n8n_deleted,
        "left": [
            {**item, "action": OUTCOME_WORDS.get(str(item.get("outcome")), "to remove by hand")}
            for item in run.n8n_left
        ],
    }
