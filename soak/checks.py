"""After the soak: the invariants, checked from the database and the providers' own counters.

Each check returns a :class:`Check` (a name, how many things it looked at, and the
violations it found, a few shown in full). Nothing here trusts what the service answered
during the run; the only client-side facts used are what the callers sent and were told
(:class:`soak.load.Truth`), and those are compared, not believed.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db.models import Q
from django.utils import timezone

from dlq.entries.selectors import failed_event_find
from dlq.models import (
    FE_ALLOWED_TRANSITIONS,
    REPLAY_KEY_PREFIX,
    FailedEvent,
    FailedEventChange,
    FailedEventStatus,
    Replay,
    ReplayOutcome,
)
from ledger.models import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    Operation,
    OperationEvent,
    OperationStatus,
    Tenant,
)
from review.models import AccessLog
from soak.load import Provider, Truth

S = OperationStatus
SHOW = 8
# Events that record something without changing the status: the sent marker on a claimed row,
# and a replay superseding a failed one.
SAME_STATE_EVENTS = frozenset({S.CLAIMED, S.FAILED})


@dataclass
class Check:
    name: str
    looked_at: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, text: str) -> None:
        self.problems.append(text)


def final_states(tenant: Tenant, *, lease_grace: timedelta) -> Check:
    """Every operation terminal or in review; none stuck past its lease plus a sweep."""
    check = Check("every operation terminal or in review (none stuck past its lease + one sweep)")
    rows = Operation.objects.filter(tenant=tenant)
    check.looked_at = rows.count()
    now = timezone.now()
    for op in rows.exclude(status__in=[*TERMINAL_STATES, S.REVIEW]).order_by("id")[:200]:
        late = ""
        if op.lease_expires_at is not None and op.lease_expires_at + lease_grace < now:
            late = f", lease ended {int((now - op.lease_expires_at).total_seconds())}s ago"
        check.fail(f"op {op.pk} {op.key} is {op.status} (mode {op.mode}, attempts {op.attempts}{late})")
    return check


def events(tenant: Tenant) -> Check:
    """Every transition has its event row, and only declared moves happened: per operation,
    the events (in insertion order) form one chain from (new) to the current status, each
    step in ALLOWED_TRANSITIONS, with one claim per attempt and one Attempt row per attempt."""
    check = Check("every transition has its event row; only declared moves (ALLOWED_TRANSITIONS)")
    ops = {op.pk: op for op in Operation.objects.filter(tenant=tenant)}
    check.looked_at = len(ops)
    chains: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for op_id, old, new in (
        OperationEvent.objects.filter(operation__tenant=tenant)
        .order_by("id")
        .values_list("operation_id", "from_status", "to_status")
    ):
        chains[op_id].append((old, new))
    attempt_rows = Counter(
        Attempt.objects.filter(operation__tenant=tenant).values_list("operation_id", flat=True).iterator()
    )
    for op_id, op in ops.items():
        # A guard claim's move is kept on its row, before every event row (ADR 0024).
        chain = ([("", S.CLAIMED)] if op.claim_actor is not None else []) + chains.get(op_id, [])
        where = f"op {op_id} {op.key}"
        if not chain:
            check.fail(f"{where}: no event rows")
            continue
        current: str | None = None
        claims = 0
        for old, new in chain:
            if (old or None) != current:
                check.fail(f"{where}: event {old or '∅'}→{new} follows {current or '∅'} (a move without its event)")
            if old == new:
                if new not in SAME_STATE_EVENTS:
                    check.fail(f"{where}: event {old}→{new} records no move")
            elif new not in ALLOWED_TRANSITIONS.get(old or None, frozenset()):
                check.fail(f"{where}: {old or '∅'}→{new} is not a declared move")
            if new == S.CLAIMED and old != S.CLAIMED:
                claims += 1
            current = new
        if current != op.status:
            check.fail(f"{where}: events end in {current}, the row is {op.status}")
        if claims != op.attempts:
            check.fail(f"{where}: {claims} claim events for {op.attempts} attempts")
        if attempt_rows.get(op_id, 0) != op.attempts:
            check.fail(f"{where}: {attempt_rows.get(op_id, 0)} Attempt rows for {op.attempts} attempts")
        if (op.status in TERMINAL_STATES) != (op.done_at is not None):
            check.fail(f"{where}: {op.status} with done_at {op.done_at}")
    return check


def nothing_left_terminal(tenant: Tenant) -> Check:
    check = Check("nothing leaves a terminal state")
    rows = OperationEvent.objects.filter(operation__tenant=tenant, from_status__in=list(TERMINAL_STATES))
    check.looked_at = rows.count()
    for event in rows.exclude(to_status=S.FAILED, from_status=S.FAILED)[:SHOW]:
        check.fail(f"op {event.operation_id}: {event.from_status}→{event.to_status} ({event.actor}: {event.reason})")
    return check


def no_unresolved_failed(tenant: Tenant) -> Check:
    """An attempt that may have been sent and was never resolved never sits under a failed
    row: a failed row may be replayed, so "maybe sent" must never land there."""
    check = Check("an unresolved sent attempt never lands in failed")
    failed = Operation.objects.filter(tenant=tenant, status=S.FAILED)
    check.looked_at = failed.count()
    unresolved = Attempt.objects.filter(operation__in=failed).filter(
        Q(outcome=AttemptOutcome.AMBIGUOUS) | Q(outcome=AttemptOutcome.PENDING, sent_at__isnull=False)
    )
    for attempt in unresolved.select_related("operation")[:200]:
        check.fail(
            f"op {attempt.operation_id} {attempt.operation.key} failed with attempt {attempt.number} {attempt.outcome}"
        )
    return check


@dataclass
class EffectsReport:
    checks: list[Check]
    histograms: dict[str, Counter[int]]


def effects(tenant: Tenant, providers: dict[str, Provider], sink_effects: dict[str, Any]) -> EffectsReport:
    """From the providers' own counters: no key executed twice at a key-enforced provider, no
    key-advisory effect sent twice, and every final state agrees with what the provider did."""
    twice = Check("no key executed twice at a key-enforced provider; no key-advisory effect sent twice")
    agree = Check("final states agree with the providers: succeeded = 1 effect; failed, abandoned = 0")
    unknown = Check("every effect at a provider belongs to a claimed operation")
    histograms: dict[str, Counter[int]] = {}
    for p in providers.values():
        counters = sink_effects if p.name == "sink" else p.mock.effects()
        by_key: dict[str, int] = counters["by_key"]
        twice.looked_at += len(by_key)
        histograms[f"{p.name} ({'key-enforced' if p.enforced else 'key-advisory'})"] = Counter(by_key.values())
        for key, n in by_key.items():
            if n > 1:
                twice.fail(f"{p.name}: key {key} has {n} effects")
        if p.name == "sink":
            continue
        ops = {
            op.key: op
            for op in Operation.objects.filter(tenant=tenant, provider__slug=p.slug).only("key", "status", "pk")
        }
        unknown.looked_at += len(by_key)
        for key in by_key:
            if key not in ops:
                unknown.fail(f"{p.name}: effect for key {key}, which no operation holds")
        for key, op in ops.items():
            agree.looked_at += 1
            n = by_key.get(key, 0)
            if op.status == S.SUCCEEDED and n != 1:
                agree.fail(f"op {op.pk} {key} succeeded with {n} effects at {p.name}")
            elif op.status in (S.FAILED, S.ABANDONED) and n != 0:
                agree.fail(f"op {op.pk} {key} is {op.status} but {p.name} performed it {n} time(s)")
    return EffectsReport([twice, agree, unknown], histograms)


def replays(tenant: Tenant, sink_effects: dict[str, Any]) -> Check:
    """A replay recorded as succeeded reached the sink; a replayed entry has a succeeded replay."""
    check = Check("DLQ replays: a succeeded replay has its effect at the target; replayed entries have one")
    by_key: dict[str, int] = sink_effects["by_key"]
    rows = Replay.objects.filter(event__tenant=tenant)
    check.looked_at = rows.count()
    for replay in rows.filter(outcome=ReplayOutcome.SUCCEEDED):
        if not by_key.get(replay.sent_key):
            check.fail(f"replay {replay.ledger_key} succeeded but the sink never saw key {replay.sent_key}")
    replayed = FailedEvent.objects.filter(tenant=tenant, status=FailedEventStatus.REPLAYED)
    for event in replayed.exclude(replays__outcome=ReplayOutcome.SUCCEEDED)[:SHOW]:
        check.fail(f"entry {event.pk} is replayed without a succeeded replay")
    for event in FailedEvent.objects.filter(tenant=tenant, status=FailedEventStatus.REPLAYING)[:SHOW]:
        check.fail(f"entry {event.pk} is still replaying")
    return check


def dlq(tenant: Tenant, truth: Truth) -> Check:
    """No DLQ entry lost or duplicated: one entry per failed operation, one per reported
    failure (reposts and n8n retries land on it), and no entry from nowhere."""
    check = Check("no DLQ entry lost or duplicated")
    entries = {e.pk: e for e in FailedEvent.objects.filter(tenant=tenant)}
    check.looked_at = len(entries)
    accounted: set[int] = set()
    by_operation: dict[int, list[FailedEvent]] = defaultdict(list)
    for entry in entries.values():
        if entry.operation_id is not None:
            by_operation[entry.operation_id].append(entry)
    failed_ops = Operation.objects.filter(tenant=tenant, status=S.FAILED)
    for op in failed_ops.exclude(key__startswith=REPLAY_KEY_PREFIX):
        mine = [e for e in by_operation.get(op.pk, []) if e.event_id == f"op:{op.pk}"]
        if len(mine) != 1:
            check.fail(f"failed op {op.pk} {op.key} has {len(mine)} DLQ entries")
        accounted.update(e.pk for e in mine)
    for identity, record in truth.ingests.items():
        if not record.acked:
            continue
        found = failed_event_find(tenant_id=tenant.pk, identity=identity)
        if found is None:
            check.fail(f"reported failure {identity} was acknowledged ({record.acked}×) but has no entry")
            continue
        if record.entry_ids != {found.pk}:
            check.fail(
                f"reported failure {identity} was answered with entries {sorted(record.entry_ids)}, is {found.pk}"
            )
        if identity == record.root:
            if found.event_id != identity:
                check.fail(f"reported failure {identity} landed on entry {found.pk} ({found.event_id})")
            if found.seen_count > record.attempted:
                check.fail(f"entry {found.pk} seen {found.seen_count}× but posted {record.attempted}×")
        accounted.add(found.pk)
    for pk in sorted(set(entries) - accounted):
        # Reported but never acknowledged (every answer was lost) is fine: it must be one we sent.
        if entries[pk].event_id not in truth.ingests:
            check.fail(f"entry {pk} ({entries[pk].event_id}) comes from no failed operation and no report")
    return check


def dlq_changes(tenant: Tenant) -> Check:
    """Every DLQ status change has its change row, along declared moves."""
    check = Check("every DLQ status change has its change row (FE_ALLOWED_TRANSITIONS)")
    entries = dict(FailedEvent.objects.filter(tenant=tenant).values_list("pk", "status"))
    check.looked_at = len(entries)
    chains: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for event_id, old, new in (
        FailedEventChange.objects.filter(event__tenant=tenant)
        .order_by("id")
        .values_list("event_id", "from_status", "to_status")
    ):
        chains[event_id].append((old, new))
    for pk, status in entries.items():
        current = ""
        for old, new in chains.get(pk, []):
            if old != current:
                check.fail(f"entry {pk}: change {old or '∅'}→{new} follows {current or '∅'}")
            # A row whose status stays (old == new) is a note in the entry's history, not a move:
            # an occurrence of its key, an n8n retry, a rolled-back revision, a failed fetch.
            elif old and old != new and new not in FE_ALLOWED_TRANSITIONS.get(old, frozenset()):
                check.fail(f"entry {pk}: {old}→{new} is not a declared move")
            current = new
        if current != status:
            check.fail(f"entry {pk}: changes end in {current or '∅'}, the entry is {status}")
    return check


def access_log(base_dir: Path, env: dict[str, str]) -> Check:
    """``manage.py accesslog_verify`` recomputes every tenant's hash chain."""
    check = Check("the access-log chain verifies (manage.py accesslog_verify)")
    check.looked_at = AccessLog.objects.count()
    result = subprocess.run(
        [sys.executable, "manage.py", "accesslog_verify"],
        cwd=base_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        check.fail(f"accesslog_verify exited {result.returncode}: {(result.stderr or result.stdout).strip()[-600:]}")
    if check.looked_at == 0:
        check.fail("the access log is empty: the soak's payload reveals left no rows")
    return check


def states_table(tenant: Tenant) -> list[tuple[str, str, Counter[str]]]:
    """(mode, provider, {status: n}) rows for the figures."""
    table: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for mode, slug, key_replay, status in (
        Operation.objects.filter(tenant=tenant).values_list("mode", "provider__slug", "key", "status").iterator()
    ):
        name = slug or ("dlq replay" if key_replay.startswith(REPLAY_KEY_PREFIX) else "(none)")
        table[(mode, name)][status] += 1
    return [(mode, name, counts) for (mode, name), counts in sorted(table.items())]
