"""The ledger as a state machine (hypothesis ``RuleBasedStateMachine``), against the real database.

Several callers and workers interleave at random: guard-mode claims (duplicates included),
execute-mode submissions and worker takes, sent markers, effects at modelled providers with
every kind of fault, complete and fail of each class (late, fenced and repeated reports too),
heartbeats, lease expiry and the clock moving (stored times shifted into the past on the
database's clock, as tests/ledger/support.py does), sweeper passes with lookups, truthful
review decisions, DLQ replays (one whose sender dies half-way, then the recovery pass) and
paused providers resumed.

The providers are modelled here: a key-enforced one dedups on the key and remembers it for
its key TTL (then forgets it, like Stripe's 24 h), a key-advisory one performs every request.
After every step:

- only declared moves happen (ALLOWED_TRANSITIONS, read off the event rows), every
  transition has its event row, one claim event and one Attempt row per attempt;
- nothing leaves a terminal state: a finished row never changes (all but ``updated_at`` and
  ``superseded_by``, which a DLQ replay of a failed row moves), and a replayed claim returns
  it byte for byte (its JSON rendering);
- an unresolved sent attempt never lands in ``failed``, and a failed, abandoned or succeeded
  row agrees with what its provider did (0, 0 and 1 effects);
- at most one effect per key at a key-enforced provider, and at a key-advisory one;
- every failed row has its DLQ entry.

``HYPOTHESIS_PROFILE=long`` explores much further (a few minutes to tens of minutes).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from rest_framework.renderers import JSONRenderer

from dlq.entries import services as dlq_entries
from dlq.ingest import fetch as dlq_fetch
from dlq.ingest import services as dlq_ingest
from dlq.models import FailedEvent, FailedEventStatus, Replay
from dlq.n8n import connections as dlq_connections
from dlq.replays import automatic as dlq_automatic
from dlq.replays import bulk as dlq_bulk
from dlq.replays import original as dlq_original
from dlq.replays import recovery as dlq_recovery
from dlq.replays import services as dlq_replays
from dlq.replays.send import TargetAnswer
from dlq.targets import services as dlq_targets
from ledger.execution.attempts import operation_execute, operations_take
from ledger.execution.submission import operation_submit
from ledger.models import (
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    IdempotencyClass,
    OpenOperation,
    Operation,
    OperationStatus,
    Provider,
)
from ledger.platform.errors import DomainError
from ledger.protocol import services
from ledger.protocol.representation import ReplayedOperationOutputSerializer
from ledger.protocol.transitions import holder as transitions_holder
from ledger.recovery.sweeper import sweep
from ledger.store import sql
from review.decisions.services import review_decision_record
from soak import checks

S = OperationStatus
pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db]

KEY_TTL_SECONDS = 100
PROVIDER_TIMEOUT_SECONDS = 5.0
# (slug, key-enforced, lookup by key): one of each kind of receiver.
PROVIDERS = (("enf", True, True), ("nolookup", True, False), ("adv", False, False))
KEYS = 6
# Faults drawn for an effect; "ok" twice as likely as each other.
FAULTS = ("ok", "ok", "decline", "throttle", "unavailable", "commit_500", "lost", "refused", "forbidden", "in_use")
CLOCK_STEPS = (1, 7, 31, 97, 251)
# Fields a DLQ replay moves on a failed row on purpose (its lineage), never its outcome.
LINEAGE_FIELDS = ("updated_at", "superseded_by")

PROFILES = {
    "ci": settings(
        max_examples=int(os.environ.get("STATEFUL_EXAMPLES", "60")),
        stateful_step_count=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ),
    "long": settings(
        max_examples=int(os.environ.get("STATEFUL_EXAMPLES", "600")),
        stateful_step_count=80,
        deadline=None,
        database=DirectoryBasedExampleDatabase("var/hypothesis-stateful"),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ),
}


class SenderDied(BaseException):
    """The process sending a DLQ replay dies half-way (not an Exception: nothing catches it)."""


# --- the modelled providers -------------------------------------------------------------------


@dataclass
class Answer:
    status: int | None = None
    body: Any = None
    lost: bool = False
    refused: bool = False
    retry_after: float | None = None


@dataclass
class Record:
    ref: str | None  # None: a decline, replayed as a decline
    created: float


@dataclass
class ModelProvider:
    """A receiver: key-enforced ones dedup on the key for ``ttl`` seconds of the model's clock."""

    slug: str
    enforced: bool
    lookup: bool
    ttl: float = KEY_TTL_SECONDS
    effects: Counter[str] = field(default_factory=Counter)
    records: dict[str, Record] = field(default_factory=dict)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def remembered(self, key: str, clock: float) -> Record | None:
        record = self.records.get(key)
        if record is not None and clock - record.created > self.ttl:
            del self.records[key]
            return None
        return record

    def handle(self, key: str, fault: str, clock: float) -> Answer:
        if fault == "refused":
            return Answer(refused=True)
        pre = {"throttle": 429, "unavailable": 503, "forbidden": 403, "in_use": 409}
        if fault in pre:
            return Answer(pre[fault], {"error": fault}, retry_after=1.0 if fault != "forbidden" else None)
        record = self.remembered(key, clock) if self.enforced else None
        if record is not None:
            answer = Answer(200, {"id": record.ref, "status": "succeeded"}) if record.ref else Answer(402, {})
        elif fault == "decline":
            if self.enforced:
                self.records[key] = Record(None, clock)
            answer = Answer(402, {"status": "failed"})
        else:
            self.effects[key] += 1
            ref = f"{self.slug}_{next(self.numbers)}"
            if self.enforced:
                self.records[key] = Record(ref, clock)
            answer = Answer(201, {"id": ref, "status": "succeeded"})
        if fault == "commit_500":
            return Answer(500, {"error": "after commit"})
        if fault == "lost":
            return Answer(lost=True)
        return answer

    def find(self, key: str, clock: float) -> Answer:
        record = self.remembered(key, clock) if self.enforced and self.lookup else None
        if record is None:
            return Answer(404, {"error": "not_found"})
        return Answer(200, {"id": record.ref or "declined", "status": "succeeded" if record.ref else "failed"})


def classify(answer: Answer) -> tuple[str, str]:
    """What a careful guard-mode caller reports: ("complete", ref) or ("fail", error class)."""
    if answer.refused:
        return "fail", "transient"
    if answer.lost:
        return "fail", "ambiguous"
    status = answer.status or 0
    if 200 <= status < 300:
        return "complete", str(answer.body["id"])
    if status in (429, 503, 409):
        return "fail", "transient"
    if status in (401, 403):
        return "fail", "permission"
    if status >= 500:
        return "fail", "ambiguous"
    return "fail", "invalid_input"


@dataclass
class Holder:
    """A caller or worker holding a lease (or believing it does)."""

    op_id: int
    tenant_id: int
    token: str
    worker: bool
    uses_marker: bool
    operation: Operation | None = None
    marked: bool = False
    answer: Answer | None = None
    reported: bool = False


def representation(op: Operation) -> bytes:
    """How the API answers a claim or submission that replays a finished key (the recorded
    response in clear), without the lineage fields."""
    data = dict(ReplayedOperationOutputSerializer(op).data)
    for name in LINEAGE_FIELDS:
        data.pop(name, None)
    return JSONRenderer().render(data)


# --- the machine ----------------------------------------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    tenants = itertools.count(1)

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0.0
        self.holders: list[Holder] = []
        self.snapshots: dict[int, bytes] = {}
        self.next_fault = "ok"
        self.lookup_fault = "answer"
        self.models: dict[str, ModelProvider] = {}
        self.target = ModelProvider("target", enforced=True, lookup=False, ttl=10**9)
        self.ready = False

    # --- set-up ---

    @initialize()
    def set_up(self) -> None:
        # Each example starts from the same database and leaves nothing behind: the sweeper,
        # the workers' take and the replay recovery look at every tenant, so rows left by an
        # earlier example would be swept, taken and sent inside this one.
        self.savepoint = transaction.savepoint()
        self.tenant = services.tenant_create(slug=f"sm{next(self.tenants)}")
        self.providers: dict[str, Provider] = {}
        for slug, enforced, lookup in PROVIDERS:
            self.models[slug] = ModelProvider(slug, enforced, lookup)
            self.providers[slug] = services.provider_upsert(
                tenant=self.tenant,
                slug=slug,
                base_url=f"http://{slug}.provider.test",
                idempotency_class=IdempotencyClass.KEY_ENFORCED if enforced else IdempotencyClass.KEY_ADVISORY,
                lookup_path="/charges?idempotency_key={key}" if lookup else "",
                ref_pointer="/id",
                status_pointer="/status" if enforced else "",
                success_values=["succeeded"] if enforced else [],
                lookup_settle_seconds=0,
                timeout_seconds=PROVIDER_TIMEOUT_SECONDS,
                key_ttl_seconds=KEY_TTL_SECONDS,
                max_attempts=3,
                lifetime_seconds=400,
                base_delay_seconds=1.0,
                max_delay_seconds=4.0,
            )
        # The model target dedups on the key (enforced=True above): declared key-enforced. A
        # target off this machine must be https.
        dlq_targets.replay_target_upsert(
            tenant=self.tenant,
            slug="target",
            url="https://target.test/in",
            is_default=True,
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
        )
        self.client = httpx.Client(transport=httpx.MockTransport(self._transport))
        self.ready = True

    def teardown(self) -> None:
        if self.ready:
            self.client.close()
            transaction.savepoint_rollback(self.savepoint)

    def _transport(self, request: httpx.Request) -> httpx.Response:
        model = self.models[request.url.host.split(".")[0]]
        if request.method == "GET":
            if self.lookup_fault == "error":
                return httpx.Response(500, json={"error": "lookup failed"})
            key = request.url.params.get("idempotency_key", "")
            answer = model.find(key, self.clock)
        else:
            answer = model.handle(request.headers.get("Idempotency-Key", ""), self.next_fault, self.clock)
        if answer.refused:
            raise httpx.ConnectError("connection refused", request=request)
        if answer.lost:
            raise httpx.ReadTimeout("answer lost", request=request)
        headers = {"Retry-After": str(int(answer.retry_after))} if answer.retry_after else {}
        return httpx.Response(answer.status or 500, json=answer.body, headers=headers)

    def _key(self, index: int) -> tuple[str, str]:
        slug = PROVIDERS[index % len(PROVIDERS)][0]
        return f"order-{index}:{slug}:v1", slug

    def _ops(self) -> Any:
        return Operation.objects.filter(tenant=self.tenant)

    def _pick(self, rows: list[Any], index: int) -> Any:
        return rows[index % len(rows)]

    # --- guard mode: callers ---

    @rule(index=st.integers(0, KEYS - 1), uses_marker=st.booleans())
    def claim(self, index: int, uses_marker: bool) -> None:
        key, slug = self._key(index)
        try:
            result = services.operation_claim(
                tenant=self.tenant,
                key=key,
                provider=self.providers[slug],
                action="charge",
                request={"amount": 100 + index},
                uses_sent_marker=uses_marker,
                lease_seconds=10,
            )
        except DomainError:
            return
        if result.acquired:
            self.holders.append(
                Holder(
                    result.operation.pk, result.operation.tenant_id, result.operation.lease_token, False, uses_marker
                )
            )
        elif result.replayed:
            self._check_replay(result.operation, how=f"claim of {key}")

    def _check_replay(self, op: Operation, *, how: str) -> None:
        # Not seen finished before: this very call finished it (a retry past its lifetime is
        # failed by the claim that finds it) — the row as stored is its record.
        recorded = self.snapshots.setdefault(op.pk, representation(Operation.objects.get(pk=op.pk)))
        assert representation(op) == recorded, f"{how} answered {representation(op)!r}, recorded {recorded!r}"

    def _guard_holders(self) -> list[Holder]:
        return [h for h in self.holders if not h.worker and not h.reported]

    def _unmarked(self) -> list[Holder]:
        return [h for h in self._guard_holders() if not h.marked]

    def _free_to_send(self) -> list[Holder]:
        # A caller sends once per attempt: without the marker only if it never promised it.
        return [h for h in self._guard_holders() if not h.uses_marker and not h.marked and h.answer is None]

    def _reported(self) -> list[Holder]:
        return [h for h in self.holders if h.reported and not h.worker]

    def _taken(self) -> list[Holder]:
        return [h for h in self.holders if h.worker and not h.reported]

    @precondition(lambda self: bool(self._unmarked()))
    @rule(pick=st.integers(0, 50), fault=st.sampled_from(FAULTS), then_send=st.booleans())
    def mark_sent(self, pick: int, fault: str, then_send: bool) -> None:
        """The sent marker, then the effect right away (or the caller dies in between)."""
        holder = self._pick(self._unmarked(), pick)
        try:
            services.operation_mark_sent(
                operation_id=holder.op_id, tenant_id=holder.tenant_id, lease_token=holder.token
            )
        except DomainError:
            # Refused (lease expired or lost): a careful caller never sends then.
            holder.reported = True
            return
        holder.marked = True
        if then_send and holder.answer is None:
            self._send(holder, fault)
        elif not then_send:
            # Died between the marker and the effect: it never sends nor reports.
            holder.reported = True

    @precondition(lambda self: bool(self._free_to_send()))
    @rule(pick=st.integers(0, 50), fault=st.sampled_from(FAULTS))
    def send_without_marker(self, pick: int, fault: str) -> None:
        """A caller that never promised the marker may send without it — while its lease runs."""
        holder = self._pick(self._free_to_send(), pick)
        if not self._lease_runs(holder):
            # Its lease ran out first (the clock moved, the sweeper took over): it gives up.
            holder.reported = True
            return
        self._send(holder, fault)

    def _lease_runs(self, holder: Holder) -> bool:
        """The protocol every sender keeps: an effect starts only within the sender's lease
        (a worker sends right after its take; a caller right after its claim or marker). A
        sender stalled past it is taken as dead before sending; the ledger cannot stop one
        that sends anyway, and the reviewer cannot see an effect that has not happened yet."""
        return (
            self._ops()
            .filter(pk=holder.op_id, status=S.CLAIMED, lease_token=holder.token, lease_expires_at__gt=Now())
            .exists()
        )

    def _send(self, holder: Holder, fault: str) -> None:
        op = Operation.objects.get(pk=holder.op_id)
        holder.answer = self.models[op.provider.slug].handle(op.key, fault, self.clock)

    @precondition(lambda self: bool(self._guard_holders()))
    @rule(pick=st.integers(0, 50), unsent_class=st.sampled_from(["transient", "invalid_input", "permission"]))
    def report(self, pick: int, unsent_class: str) -> None:
        """The caller reports what it saw; one that sent nothing may fail it by any class but
        ambiguous (nothing can have happened)."""
        holder = self._pick(self._guard_holders(), pick)
        holder.reported = True
        if holder.answer is not None:
            verdict, detail = classify(holder.answer)
        else:
            verdict, detail = "fail", unsent_class
        try:
            if verdict == "complete":
                services.operation_complete(
                    operation_id=holder.op_id,
                    tenant_id=holder.tenant_id,
                    lease_token=holder.token,
                    provider_ref=detail,
                    response_status=holder.answer.status if holder.answer else 200,
                    response_body=holder.answer.body if holder.answer else None,
                )
            else:
                services.operation_fail(
                    operation_id=holder.op_id,
                    tenant_id=holder.tenant_id,
                    lease_token=holder.token,
                    error_class=detail,
                    message="caller report",
                    retry_after=holder.answer.retry_after if holder.answer else None,
                )
        except DomainError:
            pass

    @precondition(lambda self: bool(self._reported()))
    @rule(pick=st.integers(0, 50))
    def report_again(self, pick: int) -> None:
        """A caller repeats its report (its first answer was lost): never a second move."""
        holder = self._pick(self._reported(), pick)
        if holder.answer is None:
            return
        verdict, detail = classify(holder.answer)
        try:
            if verdict == "complete":
                services.operation_complete(
                    operation_id=holder.op_id, tenant_id=holder.tenant_id, lease_token=holder.token, provider_ref=detail
                )
            else:
                services.operation_fail(
                    operation_id=holder.op_id, tenant_id=holder.tenant_id, lease_token=holder.token, error_class=detail
                )
        except DomainError:
            pass

    @precondition(lambda self: bool(self._guard_holders()))
    @rule(pick=st.integers(0, 50))
    def heartbeat(self, pick: int) -> None:
        holder = self._pick(self._guard_holders(), pick)
        try:
            services.operation_heartbeat(
                operation_id=holder.op_id, tenant_id=holder.tenant_id, lease_token=holder.token, lease_seconds=10
            )
        except DomainError:
            pass

    # --- execute mode: submissions and workers ---

    @rule(index=st.integers(0, KEYS - 1), deadline=st.sampled_from([None, None, 60.0]))
    def submit(self, index: int, deadline: float | None) -> None:
        key, slug = self._key(index)
        try:
            result = operation_submit(
                tenant=self.tenant,
                key=key,
                provider=slug,
                action="charge",
                request={"method": "POST", "path": "/charges", "body": {"amount": 100 + index}},
                deadline_seconds=deadline,
            )
        except DomainError:
            return
        if result.replayed:
            self._check_replay(result.operation, how=f"submit of {key}")

    @rule(limit=st.integers(1, 3))
    def take(self, limit: int) -> None:
        for op in operations_take(limit=limit, actor="worker"):
            self.holders.append(
                Holder(op.pk, op.tenant_id, op.lease_token, True, True, operation=op, marked=op.sent_at is not None)
            )

    @precondition(lambda self: bool(self._taken()))
    @rule(pick=st.integers(0, 50), fault=st.sampled_from(FAULTS), crash=st.sampled_from([False, False, False, True]))
    def execute(self, pick: int, fault: str, crash: bool) -> None:
        """A worker sends and records (the real worker code), or dies after sending."""
        holder = self._pick(self._taken(), pick)
        holder.reported = True
        assert holder.operation is not None
        if not self._lease_runs(holder):
            return  # stalled past its lease: died before sending
        self.next_fault = fault
        if crash:
            if holder.marked:
                self._send(holder, fault)
            return
        operation_execute(operation=holder.operation, client=self.client, actor="worker")

    @rule()
    def resume_paused_providers(self) -> None:
        for provider in Provider.objects.filter(tenant=self.tenant, paused_at__isnull=False):
            services.provider_resume(provider_id=provider.pk, actor="operator")

    # --- time, the sweeper, reviewers ---

    @precondition(lambda self: self._ops().filter(status=S.CLAIMED).exists())
    @rule(pick=st.integers(0, 50))
    def expire_lease(self, pick: int) -> None:
        op = self._pick(list(self._ops().filter(status=S.CLAIMED).order_by("id")), pick)
        Operation.objects.filter(pk=op.pk).update(lease_expires_at=F("lease_expires_at") - timedelta(days=1))

    @rule(step=st.sampled_from(CLOCK_STEPS))
    def advance_clock(self, step: int) -> None:
        """Everything stored moves ``step`` seconds into the past: time passes for the ledger,
        and the providers' memory of keys ages with it."""
        self.clock += step
        delta = timedelta(seconds=step)
        op_columns = (
            "claimed_at",
            "lease_expires_at",
            "sent_at",
            "next_attempt_at",
            "deadline",
            "expires_at",
            "reconcile_until",
            "created_at",
            "updated_at",
            "done_at",
        )
        self._ops().update(**{c: F(c) - delta for c in op_columns})
        Attempt.objects.filter(operation__tenant=self.tenant).update(
            **{c: F(c) - delta for c in ("started_at", "lease_expires_at", "sent_at", "finished_at")}
        )
        Provider.objects.filter(tenant=self.tenant).update(
            throttled_until=F("throttled_until") - delta, paused_at=F("paused_at") - delta
        )
        # The same instants, now written further in the past: a finished row's record moves with them.
        for op in self._ops().filter(pk__in=list(self.snapshots)).select_related("provider"):
            self.snapshots[op.pk] = representation(op)

    @rule(lookup=st.sampled_from(["answer", "answer", "error"]))
    def sweep(self, lookup: str) -> None:
        self.lookup_fault = lookup
        sweep(client=self.client)

    @precondition(lambda self: self._ops().filter(status=S.REVIEW).exists())
    @rule(pick=st.integers(0, 50), retry=st.booleans())
    def review(self, pick: int, retry: bool) -> None:
        """A truthful reviewer: confirms what the provider shows, else retries or abandons."""
        op = self._pick(list(self._ops().filter(status=S.REVIEW).order_by("id")), pick)
        if op.provider_id is None:
            replay = Replay.objects.get(ledger_key=op.key, event__tenant=self.tenant)
            happened = self.target.effects[replay.sent_key] > 0
            decision = "confirm_succeeded" if happened else "abandon"
        else:
            happened = self.models[op.provider.slug].effects[op.key] > 0
            decision = "confirm_succeeded" if happened else ("safe_to_retry" if retry else "abandon")
        review_decision_record(operation_id=op.pk, decision=decision, note="checked at the provider", actor="reviewer")

    # --- the DLQ ---

    def _send_to_target(self, *, target: Any, payload: Any, key: str, event_pk: int, number: int) -> TargetAnswer:
        if self.next_fault == "die":
            raise SenderDied()
        answer = self.target.handle(key, self.next_fault, self.clock)
        if answer.refused:
            return TargetAnswer(False, None, None, "transient", "not delivered", 1)
        if answer.lost:
            return TargetAnswer(False, None, None, "ambiguous", "sent, no answer", 1)
        verdict, detail = classify(answer)
        if verdict == "complete":
            return TargetAnswer(True, answer.status, answer.body, "", "ok", 1, detail)
        return TargetAnswer(False, answer.status, answer.body, detail, f"HTTP {answer.status}", 1)

    @precondition(
        lambda self: FailedEvent.objects.filter(
            tenant=self.tenant, status__in=[FailedEventStatus.PENDING, FailedEventStatus.REPLAYED]
        ).exists()
    )
    @rule(pick=st.integers(0, 50), fault=st.sampled_from((*FAULTS, "die")), force=st.booleans())
    def replay(self, pick: int, fault: str, force: bool) -> None:
        entries = list(
            FailedEvent.objects.filter(
                tenant=self.tenant, status__in=[FailedEventStatus.PENDING, FailedEventStatus.REPLAYED]
            ).order_by("id")
        )
        entry = self._pick(entries, pick)
        self.next_fault = fault
        original = dlq_replays.send_to_target
        dlq_replays.send_to_target = self._send_to_target
        try:
            dlq_replays.failed_event_replay(
                tenant_id=self.tenant.pk,
                event_pk=entry.pk,
                actor="operator",
                force=force,
                note="again" if force else "",
            )
        except (DomainError, SenderDied):
            pass
        finally:
            dlq_replays.send_to_target = original

    @rule()
    def recover_replays(self) -> None:
        dlq_recovery.replays_recover(stale_seconds=0)

    # --- invariants ---

    @invariant()
    def ledger_holds(self) -> None:
        if not self.ready:
            return
        for check in (
            checks.events(self.tenant),
            checks.nothing_left_terminal(self.tenant),
            checks.no_unresolved_failed(self.tenant),
        ):
            assert check.ok, f"{check.name}: {check.problems}"
        for op in self._ops().filter(status__in=list(TERMINAL_STATES)).select_related("provider").order_by("id"):
            seen = representation(op)
            recorded = self.snapshots.setdefault(op.pk, seen)
            assert seen == recorded, f"finished op {op.pk} changed: {recorded!r} → {seen!r}"

    @invariant()
    def open_rows_are_mirrored(self) -> None:
        """The work queue's mirror (ADR 0017) holds exactly the open rows, as they are."""
        if not self.ready:
            return
        columns = ("tenant_id", "status", "mode", "provider_id", "lease_expires_at", "next_attempt_at", "updated_at")
        rows = {
            r[0]: r[1:] for r in Operation.objects.exclude(status__in=list(TERMINAL_STATES)).values_list("id", *columns)
        }
        mirror = {r[0]: r[1:] for r in OpenOperation.objects.values_list("operation_id", *columns)}
        assert mirror == rows

    @invariant()
    def providers_agree(self) -> None:
        if not self.ready:
            return
        problems = []
        for slug, model in self.models.items():
            for key, n in sorted(model.effects.items()):
                if n > 1:
                    kind = "key-enforced" if model.enforced else "key-advisory"
                    problems.append(f"{key} has {n} effects at {slug} ({kind})")
        for key, n in sorted(self.target.effects.items()):
            if n > 1:
                problems.append(f"replay key {key} has {n} effects at the replay target")
        for op in self._ops().exclude(provider__isnull=True).select_related("provider").order_by("id"):
            n = self.models[op.provider.slug].effects[op.key]
            if op.status == S.SUCCEEDED and n != 1:
                problems.append(f"op {op.key} succeeded with {n} effects at {op.provider.slug}")
            elif op.status in (S.FAILED, S.ABANDONED) and n != 0:
                problems.append(f"op {op.key} is {op.status} but {op.provider.slug} performed it {n}×")
        assert not problems, problems

    @invariant()
    def failed_rows_have_their_dlq_entry(self) -> None:
        if not self.ready:
            return
        failed = self._ops().filter(status=S.FAILED).exclude(key__startswith="replay:")
        entries = set(
            FailedEvent.objects.filter(tenant=self.tenant, operation__in=failed).values_list("operation_id", flat=True)
        )
        missing = set(failed.values_list("id", flat=True)) - entries
        assert not missing, f"failed ops without a DLQ entry: {sorted(missing)}"
        assert not Attempt.objects.filter(
            Q(operation__tenant=self.tenant), ~Q(outcome__in=AttemptOutcome.values)
        ).exists()


class DatabaseClock:
    """``timezone`` for the DLQ's services: the database's clock, which the machine moves.
    (Inside the test's transaction PostgreSQL's now() stands still; the app server's clock
    would not, and a replay's lease would expire in real time, differently on every run.)"""

    @staticmethod
    def now() -> Any:
        return sql.db_now()


def _backoff_ceiling(*, attempt: int, base: float, cap: float, rng: Any = None) -> float:
    return min(cap, base * (2 ** max(0, attempt - 1)))


def _transaction_time(self: Now, compiler: Any, connection: Any, **extra: Any) -> Any:
    return self.as_sql(compiler, connection, template="CURRENT_TIMESTAMP", **extra)


def test_the_ledger_holds_its_invariants_under_random_interleavings(monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("one clock the machine moves: PostgreSQL's transaction time")
    # The whole run is one transaction: the ledger's statements read now(), its start, while
    # Django's Now() is STATEMENT_TIMESTAMP() and runs on in real time, so a lease would expire
    # on its own and each replay of an example would behave differently. One clock for both,
    # moved only by advance_clock.
    monkeypatch.setattr(Now, "as_postgresql", _transaction_time)
    # The DLQ's writes read the clock in each module of its rooms that they were split into.
    for module in (
        dlq_entries,
        dlq_ingest,
        dlq_fetch,
        dlq_connections,
        dlq_replays,
        dlq_original,
        dlq_bulk,
        dlq_automatic,
        dlq_recovery,
        dlq_targets,
    ):
        monkeypatch.setattr(module, "timezone", DatabaseClock)
    # The sweeper visits rows whose times tie in whatever order the table returns them; with
    # jittered backoff each row's delay would depend on that order. The ceiling, no jitter.
    monkeypatch.setattr(transitions_holder, "backoff_seconds", _backoff_ceiling)
    # Alerts and DLQ notifications would be handed to django-q2 after commit: not here.
    monkeypatch.setattr("ledger.platform.tasks.enqueue", lambda *args: None)
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    run_state_machine_as_test(LedgerMachine, settings=PROFILES.get(profile, PROFILES["ci"]))
