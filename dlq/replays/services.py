"""One replay of an entry (DESIGN §4): the stored payload sent to a replay target with the
original key, once.

Status changes are guarded UPDATEs (zero rows → someone else moved the entry first → a
named error) and each leaves a FailedEventChange row in the same transaction. A replay is
three short commits around the HTTP call, never a transaction held across it:

1. allocate n: the guarded ``pending→replaying`` UPDATE (+ the Replay lineage row);
2. claim ``replay:{event id}:{n}`` in the ledger with the sent marker (we send right after);
3. send; then record the outcome in the ledger, on the Replay row and on the entry
   (``replayed``, or back to ``pending``), and point the original failed operation at the
   replay (``superseded_by``) — one transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from alerts.services import alert_raise
from dlq.entries import selectors, transitions
from dlq.entries.payloads import is_redacted, open_payload, seal_payload
from dlq.entries.services import clean_note, not_replayable
from dlq.models import (
    FE,
    REPLAY_KEY_PREFIX,
    FailedEvent,
    PayloadSource,
    Replay,
    ReplayOutcome,
    ReplayTarget,
    ReplayTrigger,
    replay_ledger_key,
)
from dlq.replays.original import original_take
from dlq.replays.send import LookupAnswer, TargetAnswer, replay_target_lookup, send_to_provider, send_to_target
from dlq.rules.errors import (
    ConfirmationRequired,
    FailedEventClosed,
    NoteRequired,
    ReplayInProgress,
    ReplayNeedsDecision,
)
from ledger.models import (
    TERMINAL_STATES,
    ApprovalKind,
    ErrorClass,
    IdempotencyClass,
    Operation,
    OperationMode,
    OperationStatus,
    Provider,
    ProviderKind,
    Tenant,
)
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.platform.redaction import scrub
from ledger.protocol import approvals
from ledger.protocol import services as ledger_services
from ledger.protocol import transitions as ledger_transitions
from ledger.providers import adapters
from ledger.rules.key_rules import MAX_KEY_LENGTH

log = logging.getLogger("onceguard.dlq")


def derive_new_key(key: str, n: int) -> str:
    """ "Re-run as new": ``{key}~r{n}``, shortened from the left of the suffix to fit 255."""
    suffix = f"~r{n}"
    return key[: MAX_KEY_LENGTH - len(suffix)] + suffix


def _provider_of(event: FailedEvent) -> tuple[Operation, Provider]:
    """The execute-mode operation of an entry and its provider, for a replay to the provider."""
    op = Operation.objects.filter(pk=event.operation_id, tenant_id=event.tenant_id).first()
    if op is None or op.mode != OperationMode.EXECUTE or op.provider_id is None:
        raise ValidationFailed("Only an entry of an execute-mode operation can be replayed to its provider.")
    provider = ledger_services.provider_by_id(op.provider_id)
    if provider.kind != ProviderKind.HTTP:
        raise ValidationFailed("Callbacks are re-sent by their own retries, not replayed to a provider.")
    if adapters.is_asynchronous(provider):
        # A direct send records the provider's answer as the outcome, and an asynchronous
        # provider's answer is a job, not the effect: nothing would poll it or check its output.
        raise ValidationFailed(
            "An asynchronous provider's job is not replayed by a direct send: correct and resubmit it"
            " (the next version goes through the workers, which wait on the job and check its output)."
        )
    return op, provider


@dataclass(frozen=True)
class Correction:
    """A replay with corrected fields (DESIGN §7, quarantine): the payload that is sent instead
    of the stored one, the next version's key it is sent under, and the paths that changed."""

    payload: Any
    sent_key: str
    fields: list[str]


def _replay_begin(
    *,
    event: FailedEvent,
    target: ReplayTarget | None,
    actor: str,
    note: str,
    force: bool,
    as_new: bool,
    trigger: str,
    bulk_id: int | None,
    provider: Provider | None = None,
    correction: Correction | None = None,
    decision: datetime | None = None,
) -> Replay:
    """Allocate n with the guarded pending→replaying UPDATE and write the lineage row, and
    settle the entry's original claim (``original_take``; its succeeded operation, if the
    work was done meanwhile, comes back as the row's ``original_done``).
    ``decision``: the "safe to resend" this replay relies on; the UPDATE requires it still
    there (a replay that raced us used it up) and uses it up — one decision, one send."""
    # A replay goes to a replay target, or (an execute-mode step resumed) to the provider.
    slug, url = (provider.slug, provider.base_url) if provider is not None else (target.slug, target.url)  # type: ignore[union-attr]
    what = "re-run as new" if as_new else "replay"
    if correction is not None:
        what = f"corrected replay ({', '.join(correction.fields)}) as {correction.sent_key}"
    where = f"provider {slug}" if provider is not None else slug
    with transaction.atomic():
        taken = transitions.failed_event_replay_take(
            event=event,
            force=force,
            auto=trigger == ReplayTrigger.AUTO,
            clears_decision=target is not None,
            decision=decision,
            actor=actor,
            what=what,
            where=where,
            note=note,
        )
        if taken is None:
            if decision is not None and FailedEvent.objects.filter(
                pk=event.pk, tenant_id=event.tenant_id, status=FE.PENDING, resend_decided_at__isnull=True
            ):
                raise ReplayNeedsDecision(
                    'The decision "safe to resend" was used by another replay of this entry; record a new one.'
                )
            raise not_replayable(event.pk, force=force)
        old, number = taken
        done = None if target is None else original_take(event=event, number=number, actor=actor, force=force)
        key = event.original_key or event.event_id
        sent_key = derive_new_key(key, number) if as_new else key
        if correction is not None:
            sent_key = correction.sent_key
        replay = Replay.objects.create(
            tenant_id=event.tenant_id,
            event=event,
            number=number,
            trigger=trigger,
            as_new=as_new,
            forced=force and old == FE.REPLAYED,
            ledger_key=replay_ledger_key(event.pk, number),
            sent_key=sent_key,
            target=target,
            target_slug=slug,
            target_url=url,
            to_provider=provider is not None,
            corrected_fields=correction.fields if correction is not None else [],
            bulk_id=bulk_id,
            actor=actor[:150],
            note=note,
            started_at=timezone.now(),
        )
    # Not a column: the succeeded original this replay found (it then sends nothing).
    replay.original_done = done
    return replay


def failed_event_replay(
    *,
    tenant_id: int,
    event_pk: int,
    actor: str,
    target_slug: str = "",
    force: bool = False,
    note: str = "",
    as_new: bool = False,
    confirm: bool = False,
    trigger: str = ReplayTrigger.MANUAL,
    bulk_id: int | None = None,
    to_provider: bool = False,
    correction: Correction | None = None,
) -> Replay:
    """Send the stored payload to a ReplayTarget with the original key, once (DESIGN §4).

    Raises ``ReplayInProgress`` (409) when another replay holds the entry,
    ``ReplayNeedsForce`` for a replayed entry without force and a note. ``as_new`` derives a
    new key ``{key}~r{n}`` and needs ``confirm`` and a note. Returns the Replay row with
    its outcome; a failed replay has put the entry back to ``pending``.

    ``to_provider``: the entry's operation is an execute-mode one (a run's step); its stored
    request goes to its own provider under its original key, as a worker would send it — a
    key-enforced provider dedups it against the first try. ``correction``: the corrected
    payload is sent under the next version's key instead (``failed_event_correct``).
    """
    note = clean_note(note)
    if as_new and not confirm:
        raise ConfirmationRequired(
            "Re-running as new sends a new key ({key}~r{n}), so the receiver cannot dedup it against the first "
            "try; send confirm=true with a note."
        )
    if (as_new or force) and not note:
        raise NoteRequired("This replay needs a note saying why.")
    event = selectors.failed_event_get(tenant_id=tenant_id, event_pk=event_pk)
    if is_redacted(event.payload):
        raise FailedEventClosed("This entry's payload was redacted by retention; there is nothing to replay.")
    if correction is None and not to_provider:
        held_items(event)
    provider: Provider | None = None
    target: ReplayTarget | None = None
    looked: LookupAnswer | None = None
    decision: datetime | None = None
    if to_provider:
        original, provider = _provider_of(event)
    else:
        target = selectors.replay_target_resolve(tenant_id=tenant_id, slug=target_slug or event.replay_target_slug)
        wait = selectors.replay_wait_reason(event=event, target=target)
        if target.idempotency_class != IdempotencyClass.KEY_ENFORCED and selectors.replay_outcome_unknown(event):
            decision = event.resend_decided_at
        if target.lookup_url and not as_new and correction is None:
            # Asked first (DESIGN §4): found → settled without sending; not found → the first
            # try had no effect there, so it is sent even to a key-advisory target.
            looked = replay_target_lookup(target=target, key=event.original_key or event.event_id)
            if looked.state == "not_found":
                wait, decision = "", None
        if wait and (looked is None or looked.state != "found"):
            if looked is not None:
                wait += f" (The target's lookup decided nothing: {looked.message}.)"
            raise ReplayNeedsDecision(
                wait, extra={"waits_for": "resend_decision", "target_class": target.idempotency_class}
            )
    # Four-eyes (ADR 0013): a person's replay of an entry whose tenant or provider requires
    # approval becomes a pending request here (corrections, run resumes and bulk confirms
    # asked at their own door, and run here inside their approved request); a bulk or
    # automatic replay that reaches this point unapproved is refused by the guard.
    provider_ids = selectors.entry_provider_ids(tenant_id=tenant_id, event_pks=[event.pk])
    provider_id = provider.pk if provider is not None else None
    if trigger == ReplayTrigger.MANUAL and correction is None:
        kind = ApprovalKind.REPLAY
        if force or to_provider:
            kind = ApprovalKind.FORCED_REISSUE
        if as_new:
            # A new key: the receiver cannot dedup it at all — the kind the approver must see.
            kind = ApprovalKind.RERUN_AS_NEW
        approvals.approval_gate(
            tenant_id=tenant_id,
            provider_id=provider_id,
            provider_ids=provider_ids,
            kind=kind,
            actor=actor,
            reason=note,
            target_ids=[event.pk],
            params={
                "target_slug": target_slug,
                "force": force,
                "note": note,
                "as_new": as_new,
                "confirm": confirm,
                "to_provider": to_provider,
            },
        )
    else:
        approvals.approval_guard(
            tenant_id=tenant_id,
            provider_id=provider_id,
            provider_ids=provider_ids,
            # A bulk run is a task of its own: its confirm's approved request is its approval.
            approved_otherwise=lambda: (
                trigger == ReplayTrigger.BULK
                and bulk_id is not None
                and approvals.approval_granted_for(
                    tenant_id=tenant_id, kind=ApprovalKind.BULK_REPLAY, target_ref=str(bulk_id)
                )
            ),
        )
    replay = _replay_begin(
        event=event,
        target=target,
        actor=actor,
        note=note,
        force=force,
        as_new=as_new,
        trigger=trigger,
        bulk_id=bulk_id,
        provider=provider,
        correction=correction,
        decision=decision,
    )
    tenant = Tenant.objects.get(pk=tenant_id)
    try:
        claim = ledger_transitions.operation_claim(
            tenant=tenant,
            key=replay.ledger_key,
            provider=None,
            action="dlq.replay",
            request={"event": event.pk, "replay": replay.number, "target": replay.target_slug, "key": replay.sent_key},
            mark_sent=True,
            via_claims=False,
            lease_seconds=(provider or target).timeout_seconds + 10,  # type: ignore[union-attr]
            workflow_id=event.source_workflow_id,
            execution_id=event.source_execution_id,
            correlation_id=f"dlq:{event.pk}",
            actor=actor,
        )
    except DomainError as exc:
        _replay_refused(replay=replay, actor=actor, why=type(exc).__name__)
        raise ReplayInProgress("The ledger refused the replay's key; nothing was sent.") from exc
    if not claim.acquired:
        _replay_refused(replay=replay, actor=actor, why="replay key already taken")
        raise ReplayInProgress("The ledger already holds this replay's key; nothing was sent.")
    op = claim.operation
    Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id).update(operation=op)
    try:
        if provider is not None:
            answer = send_to_provider(provider=provider, operation=original)
        elif (done := replay.original_done) is not None:
            answer = TargetAnswer(
                True,
                done.response_status,
                None,
                "",
                f"not sent: the key's own operation {done.pk} succeeded meanwhile (its workflow's retry)",
                0,
                done.provider_ref or "",
            )
        elif looked is not None and looked.state == "found":
            ref = looked.body.get("id") if isinstance(looked.body, dict) else None
            answer = TargetAnswer(
                True, looked.status, looked.body, "", looked.message, looked.duration_ms, str(ref)[:255] if ref else ""
            )
        else:
            assert target is not None
            answer = send_to_target(
                target=target,
                payload=correction.payload if correction is not None else replay_body(event),
                key=replay.sent_key,
                event_pk=event.pk,
                number=replay.number,
            )
    except Exception as exc:  # anything else mid-send: we cannot know whether it arrived
        answer = TargetAnswer(False, None, None, ErrorClass.AMBIGUOUS, f"send failed: {type(exc).__name__}", 0)
    return _replay_finish(replay=replay, event=event, op=op, answer=answer, actor=actor)


def held_items(event: FailedEvent) -> int:
    """How many fetched items an entry holds together (lead capture stored before the failed
    item was kept alone, or several items the error named none of); 1 for any other entry.
    Several are refused: a replay sends the failed item only, one request per item, and
    re-sending the items that succeeded before the failure would repeat their effects."""
    if event.payload_source != PayloadSource.N8N_EXECUTION_FETCH:
        return 1
    payload = open_payload(event.payload)
    items = payload.get("items") if isinstance(payload, dict) and set(payload) == {"items"} else None
    if isinstance(items, list) and len(items) > 1:
        raise ValidationFailed(
            f"This entry holds {len(items)} input items and the failed one cannot be told apart; replaying would"
            " re-send the items that succeeded. Replay a correction holding the failed item, or resolve it."
        )
    return 1


def replay_body(event: FailedEvent) -> Any:
    """What a replay sends: the failed item's body. An entry of lead capture stored as
    ``{"items": [item]}`` (before the failed item was kept alone) sends its one item."""
    payload = open_payload(event.payload)
    if (
        event.payload_source == PayloadSource.N8N_EXECUTION_FETCH
        and isinstance(payload, dict)
        and set(payload) == {"items"}
        and isinstance(payload["items"], list)
        and len(payload["items"]) == 1
    ):
        return payload["items"][0]
    return payload


def _replay_refused(*, replay: Replay, actor: str, why: str) -> None:
    with transaction.atomic():
        Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.PENDING).update(
            outcome=ReplayOutcome.REFUSED, error_message=why[:500], finished_at=timezone.now()
        )
        settle_entry(replay=replay, to=FE.PENDING, actor=actor, note=f"replay #{replay.number} refused: {why}")


def settle_entry(*, replay: Replay, to: str, actor: str, note: str) -> None:
    """replaying → replayed|pending, only for the replay that holds the entry."""
    if transitions.failed_event_replay_settle(replay=replay, to=to, actor=actor, note=note):
        if to == FE.PENDING:
            # The entry waits for an operator again: a repeat of its open alert, or, once that
            # alert was resolved (the entry had been replayed), a new one (alerts.clearing).
            alert_raise(
                tenant_id=replay.tenant_id,
                kind="dlq_new",
                ref=str(replay.event_id),
                summary=f"DLQ entry {replay.event_id} pending again: replay #{replay.number} did not succeed",
            )


def _ledger_record(*, op: Operation, answer: TargetAnswer, actor: str) -> Operation:
    """Record the target's answer on the replay's ledger operation and return the row."""
    if answer.ok:
        return ledger_transitions.operation_complete(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            provider_ref=answer.provider_ref,
            response_status=answer.status,
            response_body=answer.body,
            actor=actor,
            reason="replay delivered",
        )
    op = ledger_transitions.operation_fail(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=answer.error_class,
        message=answer.message,
        response_status=answer.status,
        actor=actor,
    )
    if op.status == OperationStatus.RETRY_WAIT:
        # Nobody comes back for a replay's key: the next replay is a new n, a new key.
        op = ledger_transitions.operation_replay_not_retried(operation=op, actor=actor)
    return op


def _replay_finish(*, replay: Replay, event: FailedEvent, op: Operation, answer: TargetAnswer, actor: str) -> Replay:
    with transaction.atomic():
        try:
            with transaction.atomic():
                op = _ledger_record(op=op, answer=answer, actor=actor)
        except DomainError as exc:
            # The ledger row moved meanwhile (e.g. swept): the answer is still the evidence.
            log.warning("dlq_replay_ledger_refused replay=%s error=%s", replay.pk, type(exc).__name__)
            op = Operation.objects.get(pk=op.pk, tenant_id=op.tenant_id)
        if answer.ok:
            outcome = ReplayOutcome.SUCCEEDED
        elif answer.error_class == ErrorClass.AMBIGUOUS or op.status not in TERMINAL_STATES:
            outcome = ReplayOutcome.AMBIGUOUS
        else:
            outcome = ReplayOutcome.FAILED
        Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.PENDING).update(
            outcome=outcome,
            error_class=answer.error_class,
            # A success's "HTTP 201" is the target's answer, not an error.
            # Scrubbed as every stored error text is (the operation's is, by operation_fail).
            error_message="" if answer.ok else scrub(answer.message)[:500],
            response_status=answer.status,
            response_body=seal_payload(answer.body),
            duration_ms=answer.duration_ms,
            finished_at=timezone.now(),
            operation=op,
        )
        to = FE.REPLAYED if outcome == ReplayOutcome.SUCCEEDED else FE.PENDING
        settle_entry(replay=replay, to=to, actor=actor, note=f"replay #{replay.number} {outcome} ({answer.message})")
        _supersede_original(event=event, op=op, number=replay.number, actor=actor)
    replay = Replay.objects.get(pk=replay.pk, tenant_id=replay.tenant_id)
    log.info(
        "dlq_replayed event=%s replay=%s outcome=%s status=%s target=%s trigger=%s",
        event.pk,
        replay.number,
        replay.outcome,
        answer.status,
        replay.target_slug,
        replay.trigger,
    )
    return replay


def _supersede_original(*, event: FailedEvent, op: Operation, number: int, actor: str) -> None:
    """The entry's original failed operation now answers with its replay's outcome."""
    if not event.operation_id or op.status not in TERMINAL_STATES:
        return
    try:
        with transaction.atomic():
            ledger_transitions.operation_supersede(
                operation_id=event.operation_id,
                tenant_id=event.tenant_id,
                by_operation_id=op.pk,
                actor=actor,
                reason=f"replay #{number} of DLQ entry {event.pk}: {op.status}",
            )
    except DomainError as exc:
        log.warning("dlq_supersede_refused event=%s error=%s", event.pk, type(exc).__name__)


def replay_settle_for_operation(*, operation: Operation, actor: str) -> None:
    """A replay that came back ambiguous leaves its ledger operation uncertain. When that
    operation is settled later (a reviewer's decision, the sweeper's lookup), its Replay row
    takes the outcome, and a success marks the entry replayed — unless a newer replay of the
    entry has started since, which then owns the entry's state.

    Called by the ledger on every terminal move, in the same transaction; only keys of the
    replay:{entry}:{n} form are looked at, so other completions pay no query.
    """
    if not operation.key.startswith(REPLAY_KEY_PREFIX) or operation.status not in TERMINAL_STATES:
        return
    replay = (
        Replay.objects.filter(
            tenant_id=operation.tenant_id,
            ledger_key=operation.key,
            operation_id=operation.pk,
            outcome=ReplayOutcome.AMBIGUOUS,
            event__tenant_id=operation.tenant_id,
        )
        .select_related("event")
        .first()
    )
    if replay is None:
        return
    succeeded = operation.status == OperationStatus.SUCCEEDED
    outcome = ReplayOutcome.SUCCEEDED if succeeded else ReplayOutcome.FAILED
    note = f"replay #{replay.number} settled {operation.status} after an ambiguous answer"
    with transaction.atomic():
        if not Replay.objects.filter(pk=replay.pk, tenant_id=replay.tenant_id, outcome=ReplayOutcome.AMBIGUOUS).update(
            outcome=outcome
        ):
            return
        if succeeded:
            transitions.failed_event_replay_settled_late(replay=replay, actor=actor, note=note)
        _supersede_original(event=replay.event, op=operation, number=replay.number, actor=actor)
    log.info("dlq_replay_settled event=%s replay=%s outcome=%s", replay.event_id, replay.number, outcome)
