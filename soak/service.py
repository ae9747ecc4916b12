"""What the soak does through Django itself: set-up, the operator's and reviewer's database
reads, the drain's progress, and the checks.

Imported only after ``django.setup()`` (soak/run.py): Django's settings read ``DATABASE_URL``
when they are imported, and the private cluster's address exists only once the soak has
created it. Every read here may meet the database restarting: it drops the broken connection
and says so, and the caller tries again next round.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from django.db import DatabaseError, close_old_connections, connection, connections
from django_q.models import Schedule

from dlq.models import FailedEvent, FailedEventStatus, Replay
from dlq.targets.services import replay_target_upsert
from ledger.models import TERMINAL_STATES, IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from ledger.protocol import services
from soak import checks
from soak.load import Provider as SoakProvider
from soak.load import Recorder, Truth

S = OperationStatus
# Open states the drain waits for (review is a final answer for the soak: a human decides it).
DRAINING = [s for s in S.values if s not in TERMINAL_STATES and s != S.REVIEW]


def configure(
    providers: dict[str, SoakProvider], *, provider_timeout: float, sink_timeout: float
) -> tuple[Tenant, str, str]:
    """The tenant, its providers (pointing at the relays), the replay sink as the default
    replay target, an API key for the callers and one with the payload scope for reveals."""
    tenant = services.tenant_create(slug="soak", name="Soak")
    for p in providers.values():
        if p.name == "sink":
            # The sink's mock dedups on the key (an "enforced" mock): replays of ambiguous
            # entries go to it without a decision, as the soak's replayers expect.
            replay_target_upsert(
                tenant=tenant,
                slug=p.slug,
                url=p.relay.url + p.path,
                timeout_seconds=sink_timeout,
                is_default=True,
                idempotency_class=IdempotencyClass.KEY_ENFORCED,
            )
            continue
        services.provider_upsert(
            tenant=tenant,
            slug=p.slug,
            base_url=p.relay.url,
            idempotency_class=IdempotencyClass.KEY_ENFORCED if p.enforced else IdempotencyClass.KEY_ADVISORY,
            lookup_path="/charges?idempotency_key={key}" if p.enforced else "",
            ref_pointer="/id",
            status_pointer="/status" if p.enforced else "",
            success_values=["succeeded"] if p.enforced else [],
            lookup_settle_seconds=2,
            timeout_seconds=provider_timeout,
            forward_headers=["X-Mock-Outcome"],
            max_attempts=6,
            lifetime_seconds=150,
            base_delay_seconds=0.5,
            max_delay_seconds=4.0,
        )
    _, key = services.apikey_create(tenant=tenant, scopes=["read", "write"], name="soak clients")
    _, auditor = services.apikey_create(tenant=tenant, scopes=["read", "payload"], name="soak auditor")
    return tenant, key, auditor


def install_schedules(*, base_dir: Path, env: dict[str, str]) -> None:
    """django-q2's schedules as `make run` installs them; the DLQ's recovery of interrupted
    replays every minute instead of five, so the drain stays bounded."""
    subprocess.run(
        [sys.executable, "manage.py", "schedules_install"],
        cwd=base_dir,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    Schedule.objects.filter(func="dlq.tasks.replays_recover_task").update(minutes=1)


def _fresh() -> None:
    close_old_connections()


def resume_paused(*, after_seconds: float = 3.0) -> int:
    """The operator answering a provider_paused alert: resume what was paused a while ago."""
    _fresh()
    try:
        resumed = 0
        cutoff = time.time() - after_seconds
        for provider in Provider.objects.filter(paused_at__isnull=False):
            if provider.paused_at.timestamp() <= cutoff:
                resumed += services.provider_resume(provider_id=provider.pk, actor="soak operator")
        return resumed
    except DatabaseError:
        connection.close()
        return 0


def sent_key_of(tenant: Tenant, ledger_key: str) -> str | None:
    """The key a DLQ replay sent, or None when it cannot be read now."""
    _fresh()
    try:
        return (
            Replay.objects.filter(ledger_key=ledger_key, event__tenant=tenant)
            .values_list("sent_key", flat=True)
            .first()
        )
    except DatabaseError:
        connection.close()
        return None


def still_open(tenant: Tenant) -> dict[str, int] | None:
    """Operations the drain still waits for, by status, and entries still replaying; None
    when the database cannot be read now."""
    _fresh()
    try:
        counts = dict(
            Counter(Operation.objects.filter(tenant=tenant, status__in=DRAINING).values_list("status", flat=True))
        )
        replaying = FailedEvent.objects.filter(tenant=tenant, status=FailedEventStatus.REPLAYING).count()
    except DatabaseError:
        connection.close()
        return None
    if replaying:
        counts["dlq replaying"] = replaying
    return counts


def due_guard_retries(tenant: Tenant, *, limit: int) -> list[tuple[str, str]]:
    """(key, provider slug) of guard-mode rows waiting for their caller to come back."""
    _fresh()
    try:
        return list(
            Operation.objects.filter(
                tenant=tenant, mode="guard", status=S.RETRY_WAIT, provider__isnull=False
            ).values_list("key", "provider__slug")[:limit]
        )
    except DatabaseError:
        connection.close()
        return []


def run_checks(
    *,
    tenant: Tenant,
    providers: dict[str, SoakProvider],
    truth: Truth,
    recorder: Recorder,
    base_dir: Path,
    env: dict[str, str],
    lease_grace: timedelta,
) -> tuple[list[checks.Check], dict[str, Counter[int]]]:
    """Every invariant (soak/checks.py), with the effects histograms for the figures."""
    _fresh()
    sink_effects = providers["sink"].mock.effects()
    effects = checks.effects(tenant, providers, sink_effects)
    results = [
        checks.final_states(tenant, lease_grace=lease_grace),
        *effects.checks,
        checks.events(tenant),
        checks.nothing_left_terminal(tenant),
        checks.no_unresolved_failed(tenant),
        checks.dlq(tenant, truth),
        checks.dlq_changes(tenant),
        checks.replays(tenant, sink_effects),
        checks.access_log(base_dir, env),
    ]
    answers = checks.Check("a finished key's every answer repeats its recorded outcome, field for field")
    answers.looked_at = len(truth.finished)
    answers.problems = list(recorder.violations)
    results.append(answers)
    return results, effects.histograms


def states_table(tenant: Tenant) -> list[tuple[str, str, Counter[str]]]:
    return checks.states_table(tenant)


def close_all() -> None:
    connections.close_all()
