"""A person's data trail: every record that holds their data and every
event on it, in time order, found through the keyed subject index — never by decrypting.

A *subject* is the set of identifiers someone asked about (an e-mail address, a phone number,
another configured kind), normalised as the index normalises them. Two keyed values stand
for it, neither of them plaintext:

* the index digests (``kind:value`` under every configured key): which records name them;
* the **subject references** (``kind:<32 hex>``, HMAC of ``subject-ref:kind:value`` under the
  current key, matched under every key): how the audit trail names the person — the access
  log rows of lookups, exports and erasure requests, and the erasure runs. Domain-separated
  from the index digests, so removing a person's index entries leaves nothing that matches
  them, while the trail of what was done (kept by design: APP 11.2 asks to destroy the data,
  the record that it was destroyed is the proof) can still be found by someone who holds
  both the key and the identifier.

Reads only; the writes are ``review.privacy.erasure`` (erasure) and ``review.audit.accesslog`` (the rows a
lookup or an export appends, written by the callers, which know the actor).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from dlq.models import FailedEvent, FailedEventChange, Replay
from ledger.models import Operation, OperationEvent, OperationStatus, Tombstone
from ledger.platform import crypto
from ledger.platform.errors import ValidationFailed
from ledger.platform.masking import stored_value_masked
from ledger.protocol.callbacks import CALLBACK_TYPES
from ledger.protocol.selectors import claim_event, run_of
from ledger.web.display import csv_cell
from review.models import AccessAction, AccessLog, ErasureRun, RecordType, SubjectIndex
from review.privacy.erasure_n8n import n8n_summary
from review.privacy.payloads import DEFAULT_SUBJECT_KEYS, privacy_setting

REF_HEX = 32
# Records of one person the trail reads at most (each a few queries' worth of rows); a
# person with more is told so, and an erasure still takes every one (it pages by id).
MAX_RECORDS = 2000
MAX_IDENTIFIERS = 5

OPERATION_LABEL = "ledger.operation"
ENTRY_LABEL = "dlq.failedevent"


def subject_kinds() -> list[str]:
    """The identifier kinds the index knows: phone, email and the deployment's own."""
    kinds = set(DEFAULT_SUBJECT_KEYS.values()) | set(privacy_setting("SUBJECT_KEYS", {}).values())
    for rule in privacy_setting("SUBJECT_PATHS", []):
        kinds |= set(rule.get("paths", {}).values())
    return sorted(kinds)


@dataclass(frozen=True)
class Subject:
    """A person as the index and the audit trail know them: keyed values only."""

    kinds: tuple[str, ...]
    # Index digests under every configured key.
    digests: tuple[str, ...]
    # Subject references under the current key (what new audit rows carry) …
    refs: tuple[str, ...]
    # … and under every key (what finds older rows).
    match_refs: tuple[str, ...]

    @property
    def ref_text(self) -> str:
        return " ".join(self.refs)


def _ref(kind: str, normalized: str, key_id: str | None = None) -> str:
    _, hexdigest = crypto.digest(f"subject-ref:{kind}:{normalized}", key_id=key_id)
    return f"{kind}:{hexdigest[:REF_HEX]}"


def subject_resolve(identifiers: dict[str, Any]) -> Subject:
    """The subject named by ``identifiers`` (kind → value). ValidationFailed when none of them
    is a usable identifier of a known kind."""
    known = set(subject_kinds())
    given = {str(k).strip().lower(): v for k, v in (identifiers or {}).items() if v not in (None, "")}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValidationFailed(
            f"Unknown identifier kind(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}.",
            extra={"field": "identifiers"},
        )
    if len(given) > MAX_IDENTIFIERS:
        raise ValidationFailed(f"At most {MAX_IDENTIFIERS} identifiers at once.", extra={"field": "identifiers"})
    normalized: list[tuple[str, str]] = []
    for kind, raw in sorted(given.items()):
        text = crypto.normalize_identifier(kind, raw)
        if not text:
            raise ValidationFailed(f"The {kind} given is not one the index can read.", extra={"field": kind})
        normalized.append((kind, text))
    if not normalized:
        raise ValidationFailed("Give at least one identifier (e.g. email or phone).", extra={"field": "identifiers"})
    ring = crypto.keyring()
    digests = tuple(d for kind, text in normalized for _, d in crypto.digests_all_keys(f"{kind}:{text}"))
    return Subject(
        kinds=tuple(kind for kind, _ in normalized),
        digests=digests,
        refs=tuple(_ref(kind, text) for kind, text in normalized),
        match_refs=tuple(_ref(kind, text, key_id=kid) for kind, text in normalized for kid in ring.ids),
    )


def _ref_match(column: str, refs: Iterable[str]) -> Q:
    q = Q()
    for ref in refs:
        q |= Q(**{f"{column}__contains": ref})
    return q


# --- Records -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordRef:
    """(record type, id): what an erasure works through."""

    record_type: str
    record_id: int


def subject_record_ids(*, tenant_id: int, subject: Subject) -> list[RecordRef]:
    """Every record of the tenant that holds the person's data, ids only, in a stable order:
    the operations and DLQ entries the index names, the DLQ copy of each operation, the
    operations that replayed an entry (their recorded answer), called back an operation
    (the receiver's answer) or corrected it (the next version's request)."""
    rows = SubjectIndex.objects.filter(tenant_id=tenant_id, digest__in=subject.digests, gone_at__isnull=True)
    op_ids = set(rows.filter(record_type=RecordType.OPERATIONS).values_list("record_id", flat=True))
    fe_ids = set(rows.filter(record_type=RecordType.FAILED_EVENTS).values_list("record_id", flat=True))
    # Bounded: each round only adds records linked to the previous round's (an entry's
    # replays and correction, an operation's DLQ copy and callback); three rounds reach a
    # correction of a replayed entry's operation.
    frontier_ops, frontier_fes = set(op_ids), set(fe_ids)
    for _ in range(3):
        new_fes = set(
            FailedEvent.objects.filter(tenant_id=tenant_id, operation_id__in=frontier_ops).values_list("pk", flat=True)
        )
        new_ops = set(
            Replay.objects.filter(event_id__in=frontier_fes | new_fes, operation__isnull=False).values_list(
                "operation_id", flat=True
            )
        )
        new_ops |= set(
            FailedEvent.objects.filter(pk__in=frontier_fes | new_fes, corrected_operation__isnull=False).values_list(
                "corrected_operation_id", flat=True
            )
        )
        new_ops |= set(
            Operation.objects.filter(
                tenant_id=tenant_id,
                # The terminal callback and a recalled output's (ledger.protocol.callbacks.CALLBACK_TYPES).
                key__in=[
                    f"callback:{pk}" + (f":{event}" if event else "")
                    for pk in sorted(frontier_ops)
                    for event in CALLBACK_TYPES
                ],
            ).values_list("pk", flat=True)
        )
        frontier_ops, frontier_fes = new_ops - op_ids, new_fes - fe_ids
        op_ids |= new_ops
        fe_ids |= new_fes
        if not frontier_ops and not frontier_fes:
            break
    op_ids = set(Operation.objects.filter(tenant_id=tenant_id, pk__in=op_ids).values_list("pk", flat=True))
    fe_ids = set(FailedEvent.objects.filter(tenant_id=tenant_id, pk__in=fe_ids).values_list("pk", flat=True))
    return [RecordRef(RecordType.OPERATIONS, pk) for pk in sorted(op_ids)] + [
        RecordRef(RecordType.FAILED_EVENTS, pk) for pk in sorted(fe_ids)
    ]


@dataclass
class TrailRecord:
    record_type: str  # operations | failed_events
    record_id: int
    kind: str  # "operation", "review item", "DLQ entry", "replay", "callback"
    ref: str  # the key or event id (never personal data)
    status: str
    created_at: datetime | None
    run: str = ""
    step: int | None = None
    # sealed | redacted | empty | deleted
    payload: str = "sealed"
    # the masked shape of each payload column (never a value)
    shape: dict[str, Any] = field(default_factory=dict)
    deleted_at: datetime | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.ref}" if self.ref else f"{self.kind} #{self.record_id}"


@dataclass
class TrailEvent:
    at: datetime
    event: str  # ingested, state, revealed, replayed, corrected, redacted, deleted, looked up, exported, …
    actor: str
    detail: str
    record_type: str = ""
    record_id: int | None = None
    record: str = ""  # the record's label, empty for events about the person as a whole


@dataclass
class Trail:
    tenant_id: int
    subject: Subject
    records: list[TrailRecord]
    events: list[TrailEvent]
    erasures: list[ErasureRun]
    truncated: bool = False

    @property
    def erased(self) -> bool:
        return any(run.state == "done" for run in self.erasures)


def _payload_state(values: Iterable[Any]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "empty"
    if all(crypto.is_redacted(v) for v in present):
        return "redacted"
    return "sealed"


def _redactions(values: dict[str, Any]) -> list[tuple[datetime, str, str]]:
    """(at, actor, detail) per redaction: the columns one redaction marked, together."""
    found: dict[str, tuple[str, str, list[str]]] = {}
    for column, value in values.items():
        if not crypto.is_redacted(value):
            continue
        info = value[crypto.REDACTED]
        if info.get("erasure"):
            actor, why = "erasure", f"erasure #{info['erasure']}"
        elif info.get("policy"):
            actor, why = "retention", f"retention policy {info['policy']}, run {info.get('run')}"
        else:
            actor, why = "system", "redacted"
        found.setdefault(str(info.get("at") or ""), (actor, why, []))[2].append(column)
    out = []
    for at, (actor, why, columns) in found.items():
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            continue
        out.append((when, actor, f"{', '.join(sorted(columns))} redacted ({why}); a keyed digest is kept"))
    return out


def _operation_kind(op: Operation) -> str:
    if op.key.startswith("replay:"):
        return "replay"
    if op.key.startswith("callback:"):
        return "callback"
    if op.status == OperationStatus.REVIEW:
        return "review item"
    return "operation"


def subject_trail(*, tenant_id: int, subject: Subject) -> Trail:
    """The person's records and the events on them, oldest first."""
    ids = subject_record_ids(tenant_id=tenant_id, subject=subject)
    truncated = len(ids) > MAX_RECORDS
    ids = ids[:MAX_RECORDS]
    op_ids = [r.record_id for r in ids if r.record_type == RecordType.OPERATIONS]
    fe_ids = [r.record_id for r in ids if r.record_type == RecordType.FAILED_EVENTS]
    records: list[TrailRecord] = []
    events: list[TrailEvent] = []
    labels: dict[tuple[str, int], str] = {}

    claims = []
    for op in Operation.objects.filter(pk__in=op_ids).order_by("created_at", "pk"):
        # A guard claim's move is kept on its row (ADR 0024): listed as its event row was.
        claim = claim_event(op)
        if claim is not None:
            claims.append(claim)
        values = {"payload": op.payload, "request": op.request, "response_body": op.response_body}
        kind = _operation_kind(op)
        rec = TrailRecord(
            record_type=RecordType.OPERATIONS,
            record_id=op.pk,
            kind=kind,
            ref=op.key,
            status=op.status,
            created_at=op.created_at,
            # The service's own operations (replays, callbacks) are no run's steps.
            run=run_of(run=op.run, correlation_id=op.correlation_id) if kind in ("operation", "review item") else "",
            step=op.step,
            payload=_payload_state(values.values()),
            shape={k: stored_value_masked(v) for k, v in values.items() if v is not None},
        )
        records.append(rec)
        labels[(RecordType.OPERATIONS, op.pk)] = rec.label
        for at, actor, detail in _redactions(values):
            events.append(TrailEvent(at, "redacted", actor, detail, RecordType.OPERATIONS, op.pk, rec.label))
    stored = list(OperationEvent.objects.filter(operation_id__in=op_ids).order_by("at", "pk"))
    for ev in sorted([*claims, *stored], key=lambda e: (e.at, e.id is not None, e.id or 0)):
        label = labels[(RecordType.OPERATIONS, ev.operation_id)]
        if not ev.from_status:
            kind, detail = (
                "ingested",
                f"stored, {ev.to_status}" + (f": {ev.reason}" if ev.reason and ev.reason != ev.to_status else ""),
            )
        else:
            kind, detail = "state", f"{ev.from_status} → {ev.to_status}" + (f": {ev.reason}" if ev.reason else "")
        events.append(TrailEvent(ev.at, kind, ev.actor, detail, RecordType.OPERATIONS, ev.operation_id, label))

    # An entry's first history row is its creation: it says who posted it (the ingest event).
    created_by = {
        c.event_id: c
        for c in FailedEventChange.objects.filter(event_id__in=fe_ids, from_status="").order_by("-at", "-pk")
    }
    for fe in FailedEvent.objects.filter(pk__in=fe_ids).order_by("created_at", "pk"):
        rec = TrailRecord(
            record_type=RecordType.FAILED_EVENTS,
            record_id=fe.pk,
            kind="DLQ entry",
            ref=fe.event_id,
            status=fe.status,
            created_at=fe.created_at,
            payload=_payload_state([fe.payload]),
            shape={"payload": stored_value_masked(fe.payload)} if fe.payload is not None else {},
        )
        records.append(rec)
        labels[(RecordType.FAILED_EVENTS, fe.pk)] = rec.label
        source = "from the failed operation" if fe.operation_id else f"posted ({fe.get_shape_display()})"
        creation = created_by.get(fe.pk)
        actor = creation.actor if creation is not None else "dlq"
        events.append(TrailEvent(fe.created_at, "ingested", actor, source, RecordType.FAILED_EVENTS, fe.pk, rec.label))
        for at, actor, detail in _redactions({"payload": fe.payload}):
            events.append(TrailEvent(at, "redacted", actor, detail, RecordType.FAILED_EVENTS, fe.pk, rec.label))
    for change in FailedEventChange.objects.filter(event_id__in=fe_ids).exclude(from_status="").order_by("at", "pk"):
        label = labels[(RecordType.FAILED_EVENTS, change.event_id)]
        detail = f"{change.from_status or '∅'} → {change.to_status}" + (f": {change.note}" if change.note else "")
        events.append(
            TrailEvent(change.at, "state", change.actor, detail, RecordType.FAILED_EVENTS, change.event_id, label)
        )
    for replay in Replay.objects.filter(event_id__in=fe_ids).order_by("started_at", "pk"):
        label = labels[(RecordType.FAILED_EVENTS, replay.event_id)]
        where = "its provider" if replay.to_provider else f"target {replay.target_slug}"
        kind = "corrected" if replay.corrected_fields else "replayed"
        detail = f"replay #{replay.number} to {where} under {replay.sent_key}: {replay.outcome}"
        if replay.corrected_fields:
            detail += f" (fields changed: {', '.join(replay.corrected_fields)})"
        if replay.note:
            detail += f" — {replay.note}"
        events.append(
            TrailEvent(replay.started_at, kind, replay.actor, detail, RecordType.FAILED_EVENTS, replay.event_id, label)
        )

    # Reveals of these records (the access log names records by model and id).
    object_ids = [str(pk) for pk in op_ids]
    reveal_q = Q(object_type__in=(OPERATION_LABEL, "review.reviewitem"), object_id__in=object_ids) | Q(
        object_type=ENTRY_LABEL, object_id__in=[str(pk) for pk in fe_ids]
    )
    subject_q = Q(object_type="subject") & _ref_match("object_ref", subject.match_refs)
    for row in AccessLog.objects.filter(tenant_id=tenant_id).filter(
        (Q(action=AccessAction.REVEAL) & reveal_q) | subject_q
    ):
        if row.object_type == "subject":
            kind = {
                AccessAction.EXPORT: "exported",
                AccessAction.ERASE: "erasure requested",
                AccessAction.N8N_DELETE: "n8n execution deleted",
                AccessAction.SUBJECT_SEARCH: "looked up",
            }.get(row.action, row.action)
            detail = f"{row.reason} (access log #{row.seq})"
            if row.action == AccessAction.EXPORT and row.fields:
                detail = f"{', '.join(row.fields)} — {detail}"
            events.append(TrailEvent(row.at, kind, row.actor, detail))
            continue
        record_type = RecordType.FAILED_EVENTS if row.object_type == ENTRY_LABEL else RecordType.OPERATIONS
        pk = int(row.object_id)
        events.append(
            TrailEvent(
                row.at,
                "revealed",
                row.actor,
                f"{', '.join(row.fields)} — why: {row.reason} (access log #{row.seq})",
                record_type,
                pk,
                labels.get((record_type, pk), ""),
            )
        )

    # Records retention deleted: the index keeps the link (keyed, ids only) until the floor.
    gone = SubjectIndex.objects.filter(tenant_id=tenant_id, digest__in=subject.digests, gone_at__isnull=False)
    gone_pairs = sorted(set(gone.values_list("record_type", "record_id", "gone_at")))
    stones = {
        s.operation_id: s
        for s in Tombstone.objects.filter(
            tenant_id=tenant_id, operation_id__in=[pk for t, pk, _ in gone_pairs if t == RecordType.OPERATIONS]
        )
    }
    seen_gone: set[tuple[str, int]] = set()
    for record_type, pk, gone_at in gone_pairs:
        if (record_type, pk) in seen_gone:
            continue
        seen_gone.add((record_type, pk))
        stone = stones.get(pk) if record_type == RecordType.OPERATIONS else None
        kind = "operation" if record_type == RecordType.OPERATIONS else "DLQ entry"
        ref = stone.key if stone is not None else ""
        rec = TrailRecord(
            record_type=record_type,
            record_id=pk,
            kind=kind,
            ref=ref,
            status=stone.final_status if stone is not None else "deleted",
            created_at=stone.created_at if stone is not None else None,
            payload="deleted",
            deleted_at=gone_at,
        )
        records.append(rec)
        detail = "deleted by retention"
        if stone is not None:
            detail += f"; a tombstone keeps answering its key until {stone.keep_until:%Y-%m-%d %H:%M} UTC"
        events.append(TrailEvent(gone_at, "deleted", "retention", detail, record_type, pk, rec.label))

    erasures = list(
        ErasureRun.objects.filter(tenant_id=tenant_id).filter(_ref_match("subject_ref", subject.match_refs))
    )
    for run in erasures:
        if run.finished_at is not None:
            events.append(
                TrailEvent(
                    run.finished_at,
                    "erased",
                    "erasure",
                    f"erasure #{run.pk} done: {erasure_summary(run)}",
                )
            )
    events.sort(key=lambda e: (e.at, e.record_type, e.record_id or 0))
    return Trail(
        tenant_id=tenant_id,
        subject=subject,
        records=records,
        events=events,
        erasures=erasures,
        truncated=truncated,
    )


def erasure_summary(run: ErasureRun) -> str:
    parts = [
        (run.operations, "operation", "operations"),
        (run.failed_events, "DLQ entry", "DLQ entries"),
        (run.attempts, "attempt answer", "attempt answers"),
        (run.replays, "replay answer", "replay answers"),
        (run.outputs, "output file deleted", "output files deleted"),
        (run.uploads, "upload deleted", "uploads deleted"),
        (run.texts, "text cut", "texts cut"),
        (run.index_entries, "index entry removed", "index entries removed"),
        (run.cancelled, "operation cancelled", "operations cancelled"),
        (run.discarded, "entry discarded", "entries discarded"),
        (run.missing, "record already gone", "records already gone"),
    ]
    done = [f"{n} {one if n == 1 else many}" for n, one, many in parts if n]
    # n8n's copies (review.privacy.erasure_n8n): deleted, and every one not deleted, listed.
    n8n = n8n_summary(run)
    return ", ".join([*done, *([n8n] if n8n else [])]) or "nothing held their data"


# --- Export ---------------------------------------------------------------------------------------

EXPORT_FORMATS = ("json", "csv")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def trail_document(trail: Trail, *, data: dict[tuple[str, int], dict[str, Any]] | None) -> dict[str, Any]:
    """The trail as one JSON-ready document. ``data``: the decrypted values per record (an
    access request by someone allowed to reveal), else only the masked shapes."""
    records = []
    for rec in trail.records:
        item = asdict(rec)
        if data is not None:
            item["data"] = data.get((rec.record_type, rec.record_id))
        records.append(item)
    return json.loads(
        json.dumps(
            {
                "tenant": trail.tenant_id,
                "subject": {"kinds": list(trail.subject.kinds), "refs": list(trail.subject.refs)},
                "decrypted": data is not None,
                "truncated": trail.truncated,
                "records": records,
                "events": [asdict(e) for e in trail.events],
                "erasures": [
                    {
                        "id": run.pk,
                        "state": run.state,
                        "requested_at": run.requested_at,
                        "finished_at": run.finished_at,
                        "summary": erasure_summary(run),
                    }
                    for run in trail.erasures
                ],
            },
            default=_json_default,
            ensure_ascii=False,
        )
    )


def trail_values(trail: Trail) -> dict[tuple[str, int], dict[str, Any]]:
    """The plaintext of each record's payload columns (redacted ones are null). For an access
    request only: the caller checks the permission and writes the access-log row first."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    op_ids = [r.record_id for r in trail.records if r.record_type == RecordType.OPERATIONS and r.payload != "deleted"]
    fe_ids = [
        r.record_id for r in trail.records if r.record_type == RecordType.FAILED_EVENTS and r.payload != "deleted"
    ]
    for op in Operation.objects.filter(pk__in=op_ids).only("pk", "payload", "request", "response_body"):
        out[(RecordType.OPERATIONS, op.pk)] = {
            c: None if crypto.is_redacted(v) else crypto.open_json(v)
            for c, v in (("payload", op.payload), ("request", op.request), ("response_body", op.response_body))
            if v is not None
        }
    for fe in FailedEvent.objects.filter(pk__in=fe_ids).only("pk", "payload"):
        if fe.payload is not None:
            out[(RecordType.FAILED_EVENTS, fe.pk)] = {
                "payload": None if crypto.is_redacted(fe.payload) else crypto.open_json(fe.payload)
            }
    return out


CSV_COLUMNS = ["section", "at", "record_type", "record_id", "record", "event", "actor", "detail", "data"]


def trail_csv(document: dict[str, Any]) -> str:
    """The export document as one CSV table: a row per record (its status, and its data when
    decrypted, as JSON), then a row per event; every cell safe from formula injection."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for rec in document["records"]:
        label = f"{rec['kind']} {rec['ref']}".strip()
        data = rec.get("data") if document["decrypted"] else rec.get("shape")
        writer.writerow(
            [
                csv_cell(v)
                for v in (
                    "record",
                    rec["created_at"],
                    rec["record_type"],
                    rec["record_id"],
                    label,
                    rec["status"],
                    "",
                    f"payload {rec['payload']}",
                    json.dumps(data, ensure_ascii=False, sort_keys=True) if data is not None else "",
                )
            ]
        )
    for ev in document["events"]:
        writer.writerow(
            [
                csv_cell(v)
                for v in (
                    "event",
                    ev["at"],
                    ev["record_type"],
                    ev["record_id"] if ev["record_id"] is not None else "",
                    ev["record"],
                    ev["event"],
                    ev["actor"],
                    ev["detail"],
                    "",
                )
            ]
        )
    return buffer.getvalue()
