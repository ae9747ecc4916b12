"""Corrections (DESIGN §7, quarantine): an entry replayed with corrected fields as the next
version of its key. The entry, its payload and its failed operation stay as they were — the
evidence —, and the history says who changed which fields and why.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from dlq.entries import selectors, transitions
from dlq.entries.payloads import is_redacted, open_payload
from dlq.entries.services import clean_note, not_replayable
from dlq.models import FE, FailedEvent, Replay
from dlq.replays.services import Correction, failed_event_replay
from dlq.rules.errors import FailedEventClosed, NoteRequired
from ledger.execution.submission import operation_submit_version, version_after
from ledger.models import ApprovalKind, Operation, OperationEvent, OperationMode, Tenant
from ledger.platform.crypto import open_json
from ledger.platform.errors import ValidationFailed
from ledger.protocol import approvals
from ledger.protocol import services as ledger_services
from ledger.protocol.inputs import key_version_parts
from ledger.protocol.selectors import provider_slug
from ledger.rules import intents

log = logging.getLogger("onceguard.dlq")


MAX_CORRECTED_FIELDS = 50


@dataclass(frozen=True)
class CorrectionResult:
    event: FailedEvent
    key: str
    version: int
    # Execute mode: the next version, queued for the workers. Guard mode: the replay that sent
    # the corrected payload to the workflow, which claims the next version itself.
    operation: Operation | None
    replay: Replay | None


def next_version_of(*, tenant_id: int, key: str, operation: Operation | None) -> tuple[str, str, int]:
    """(record, action, version) of the next version of a failed key: one more than the newest
    version of its record and action the ledger knows. The key must be versioned — stored as
    parts, or of the form ``{record}:{action}:v{version}``."""
    if operation is not None and operation.record and operation.version is not None:
        parts: tuple[str, str, int] | None = (operation.record, operation.action, operation.version)
    else:
        parts = key_version_parts(key)
    if parts is None:
        raise ValidationFailed(
            "Only a versioned key ({record}:{action}:v{version}) can be corrected: the correction is its next"
            " version. Use a replay re-run as new instead."
        )
    record, action, version = parts
    return record, action, version_after(tenant_id=tenant_id, record=record, action=action, version=version)


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise ValidationFailed(f"Field {path!r} does not lead to a value of the stored payload.")


def apply_corrections(document: Any, fields: dict[str, Any]) -> tuple[Any, list[str]]:
    """A copy of ``document`` with each dotted path of ``fields`` set to its value (the last
    segment may add a key to an existing object); the sorted paths changed. The stored value is
    never edited: it stays as evidence."""
    if not isinstance(fields, dict) or not fields:
        raise ValidationFailed("Send `fields`: an object of dotted paths and their corrected values.")
    if len(fields) > MAX_CORRECTED_FIELDS:
        raise ValidationFailed(f"At most {MAX_CORRECTED_FIELDS} fields can be corrected at once.")
    copy = json.loads(json.dumps(document))
    for path, value in fields.items():
        parts = path.split(".") if isinstance(path, str) and 0 < len(path) <= 200 else []
        if not parts or any(p == "" for p in parts):
            raise ValidationFailed(f"{path!r} is not a dotted path (e.g. body.amount).")
        node = copy
        for part in parts[:-1]:
            node = _child(node, part, path)
        last = parts[-1]
        if isinstance(node, dict):
            node[last] = value
        elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
            node[int(last)] = value
        else:
            raise ValidationFailed(f"Field {path!r} does not lead to a value of the stored payload.")
    return copy, sorted(fields)


def failed_event_correct(
    *, tenant_id: int, event_pk: int, actor: str, fields: dict[str, Any], note: str, target_slug: str = ""
) -> CorrectionResult:
    """Replay a (quarantined) entry with corrected fields as the next version of its key
    (DESIGN §7). The entry, its payload and its failed operation stay as they were — the
    evidence —, and the history says who changed which fields and why.

    Execute mode: the paths apply to the stored request (``body.amount``); the corrected
    request is submitted as the next version (``{record}:{action}:v{n+1}``, same run and step)
    for the workers, the original records it as ``replaced_by``, and the entry is resolved
    pointing at it (``corrected_operation``). Guard mode: the paths apply to the stored payload,
    which is replayed to the replay target under the next version's key (a Replay row with
    ``corrected_fields``); the workflow claims that version itself.
    """
    note = clean_note(note)
    if not note:
        raise NoteRequired("A correction needs a note saying why the fields change.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    if is_redacted(event.payload):
        raise FailedEventClosed("This entry's payload was redacted by retention; there is nothing to correct.")
    if event.status != FE.PENDING:
        raise not_replayable(event.pk, force=False)
    # Four-eyes (ADR 0013): the corrected values wait sealed in the request, not sent.
    approvals.approval_gate(
        tenant_id=tenant_id,
        provider_id=None,
        provider_ids=selectors.entry_provider_ids(tenant_id=tenant_id, event_pks=[event.pk]),
        kind=ApprovalKind.CORRECTED_REPLAY,
        actor=actor,
        reason=note,
        target_ids=[event.pk],
        params={"fields": fields, "note": note, "target_slug": target_slug},
    )
    original = Operation.objects.filter(pk=event.operation_id, tenant_id=tenant_id).first()
    record, action, version = next_version_of(
        tenant_id=tenant_id, key=event.original_key or event.event_id, operation=original
    )
    key = ledger_services.versioned_key(record=record, action=action, version=version)
    if original is not None and original.mode == OperationMode.EXECUTE:
        request, changed = apply_corrections(open_json(original.request), fields)
        # A job keeps the prompt versions it was accepted with (ADR 0009): they go with the
        # corrected intent, not with the newest version published since.
        accepted = intents.stored_intent(request)
        pins = None
        if accepted is not None:
            request, pins = {"intent": accepted[0]}, accepted[1]
        what = f"corrected {', '.join(changed)} and sent again as {key}"
        with transaction.atomic():
            submitted = operation_submit_version(
                original=original,
                tenant=Tenant.objects.get(pk=tenant_id),
                provider=provider_slug(original.provider_id) or "",
                record=record,
                action=action,
                version=version,
                request=request,
                prompt_pins=pins,
                actor=actor,
            )
            if not transitions.failed_event_correct(
                event_pk=event.pk,
                tenant_id=event.tenant_id,
                actor=actor,
                note=f"{what} (operation {submitted.pk}): {note}",
                status_note=f"{what}: {note}",
                corrected_operation=submitted,
            ):
                raise not_replayable(event.pk, force=False)
            # The failed original points at its correction (a key of the versioned form but
            # claimed without parts is not found by the version's own replacement step).
            Operation.objects.filter(pk=original.pk, replaced_by__isnull=True).update(replaced_by=submitted)
            _correction_event(original=original, actor=actor, text=f"{what} (operation {submitted.pk}): {note}")
        event.refresh_from_db()
        log.info("dlq_corrected event=%s operation=%s key=%s", event.pk, submitted.pk, key)
        return CorrectionResult(event=event, key=key, version=version, operation=submitted, replay=None)
    payload, changed = apply_corrections(open_payload(event.payload), fields)
    replay = failed_event_replay(
        tenant_id=tenant_id,
        event_pk=event.pk,
        actor=actor,
        target_slug=target_slug,
        note=note,
        correction=Correction(payload=payload, sent_key=key, fields=changed),
    )
    if original is not None:
        _correction_event(
            original=original,
            actor=actor,
            text=f"corrected {', '.join(changed)} and replayed as {key} (replay #{replay.number}): {note}",
        )
    event.refresh_from_db()
    log.info("dlq_corrected event=%s replay=%s key=%s outcome=%s", event.pk, replay.number, key, replay.outcome)
    return CorrectionResult(event=event, key=key, version=version, operation=None, replay=replay)


def _correction_event(*, original: Operation, actor: str, text: str) -> None:
    """The original operation's history says it was corrected (it stays ``failed``)."""
    OperationEvent.objects.create(
        tenant_id=original.tenant_id,
        operation_id=original.pk,
        from_status=original.status,
        to_status=original.status,
        actor=actor[:150],
        reason=ledger_services.sanitize_message(text),
        attempt=None,
        at=Now(),
    )
