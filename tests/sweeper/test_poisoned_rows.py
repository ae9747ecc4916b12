"""One bad row never stops a sweeper pass (ledger.platform.passes): a row whose key is not ASCII
(stored past the key rule) is looked up with its key encoded, a row whose lookup raises
records the error and backs off, and another tenant's stale row is reconciled in the same
pass. Before, the first such row raised UnicodeEncodeError and every pass failed, for every
tenant."""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import unquote

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from ledger.models import IdempotencyClass, Operation, OperationStatus
from ledger.platform.passes import JOBS
from ledger.protocol import services
from ledger.recovery import sweeper
from ledger.recovery.sweeper import sweep
from tests.ledger.support import expire_lease
from tests.support.loopback import LoopbackServer, QuietHandler

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

FULLWIDTH = "order-\uff43:charge:v1"


def failures(job: str) -> float:
    return REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": job}) or 0.0


class LookupProvider(LoopbackServer):
    """Answers every lookup ``200 {"id": …}``; records each path and Idempotency-Key header."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                with lock:
                    outer.seen.append((self.path, self.headers.get("Idempotency-Key", "")))
                self.answer(200, json.dumps({"id": "ch_found"}).encode())

        super().__init__(Handler)


@pytest.fixture
def lookups() -> Any:
    server = LookupProvider().start()
    yield server
    server.stop()


def _uncertain(tenant: Any, provider: Any, key: str) -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, mark_sent=True).operation
    expire_lease(op.pk)
    return op


def _provider(tenant: Any, url: str) -> Any:
    return services.provider_upsert(
        tenant=tenant,
        slug="stripe",
        base_url=url,
        lookup_path="/lookup/{key}",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
    )


def test_a_non_ascii_key_and_a_raising_lookup_do_not_stop_a_pass_that_handles_another_tenants_row(
    tenant, other_tenant, lookups, monkeypatch
):
    acme, globex = _provider(tenant, lookups.url), _provider(other_tenant, lookups.url)
    poisoned = _uncertain(tenant, acme, "order-1:charge:v1")
    # Stored past the key rule, as a key accepted before it existed.
    Operation.objects.filter(pk=poisoned.pk).update(key=FULLWIDTH)
    raising = _uncertain(tenant, acme, "order-2:charge:v1")
    stale = _uncertain(other_tenant, globex, "order-3:charge:v1")
    real_lookup = sweeper.provider_lookup

    def lookup(*, provider: Any, operation: Operation, client: Any = None) -> Any:
        if operation.pk == raising.pk:
            raise RuntimeError("a bug in one row's lookup")
        return real_lookup(provider=provider, operation=operation, client=client)

    monkeypatch.setattr(sweeper, "provider_lookup", lookup)
    before = failures("sweeper")

    report = sweep()

    assert Operation.objects.get(pk=stale.pk).status == S.SUCCEEDED
    # The non-ASCII key went out percent-encoded, in the path and the header, and was answered.
    assert Operation.objects.get(pk=poisoned.pk).status == S.SUCCEEDED
    sent = {unquote(path): header for path, header in lookups.seen}
    assert sent[f"/lookup/{FULLWIDTH}"] == "order-%EF%BD%83:charge:v1"
    # The raising row recorded its error and backs off; it is counted once.
    row = Operation.objects.get(pk=raising.pk)
    assert row.status == S.UNCERTAIN
    assert row.lookup_failures == 1
    assert row.last_error == "sweeper failed on this row: RuntimeError"
    assert row.reconcile_until is not None and row.reconcile_until > timezone.now()
    assert failures("sweeper") == before + 1
    assert report.counts["uncertain->succeeded"] == 2

    # Backing off: the next pass leaves it alone.
    sweep()
    assert failures("sweeper") == before + 1


def test_a_row_that_raises_while_its_lease_expires_does_not_stop_the_others(tenant, monkeypatch):
    provider = services.provider_upsert(
        tenant=tenant, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    ops = [
        services.operation_claim(tenant=tenant, key=f"k:{i}", provider=provider, mark_sent=True).operation
        for i in range(3)
    ]
    for op in ops:
        expire_lease(op.pk)
    real_move = sweeper._move

    def move(op: Operation, *args: Any, **kwargs: Any) -> Any:
        if op.pk == ops[0].pk:
            raise RuntimeError("poisoned")
        return real_move(op, *args, **kwargs)

    monkeypatch.setattr(sweeper, "_move", move)
    before = failures("sweeper")

    sweeper.sweep_expired_leases()

    statuses = dict(Operation.objects.filter(pk__in=[op.pk for op in ops]).values_list("pk", "status"))
    assert statuses == {ops[0].pk: S.CLAIMED, ops[1].pk: S.UNCERTAIN, ops[2].pk: S.UNCERTAIN}
    assert failures("sweeper") == before + 1


def test_every_job_has_its_failure_series_from_the_start():
    assert all(REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": job}) is not None for job in JOBS)
