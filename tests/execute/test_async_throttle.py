"""A 429 (or 503) answering a poll or an output fetch of an asynchronous provider's job is a
throttle, as it is to a send (DESIGN §5, asynchronous providers; ``polling.provider_throttled``
beside ``execute.record_outcome``): the provider is held back until its Retry-After, a
rate-capped provider's effective rate is halved, and the job goes back to ``waiting`` with its
next poll no earlier than the Retry-After.

The provider is a real loopback server: it accepts a render as a job, answers each poll and each
output fetch from a script (then ``succeeded`` and a real PNG). Both databases; nothing here
sleeps or times anything: the database clock is read around each step.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from ledger.execution.attempts import operations_take
from ledger.execution.submission import operation_submit
from ledger.models import Operation, OperationOutput, OperationStatus, Provider, ProviderRate
from ledger.protocol.services import provider_upsert
from ledger.store import sql
from relay.mock_images import render_png
from tests.execute.support import make_due, run_due, unthrottle
from tests.execute.test_async_providers import render_fields
from tests.execute.test_provider_caps import move_bucket_clock
from tests.support.loopback import LoopbackServer, QuietHandler

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

JOB = "job_1"
SIZE = {"width": 8, "height": 6}


class ScriptedJobs:
    """Accepts any render as job ``job_1``; each poll and each output fetch answers the next
    scripted (status, headers) of its kind, then ``succeeded`` / the PNG."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.polls: list[tuple[int, dict[str, str]]] = []
        self.fetches: list[tuple[int, dict[str, str]]] = []
        self.seen: Counter[str] = Counter()
        jobs = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with jobs.lock:
                    jobs.seen["submits"] += 1
                self.answer(202, json.dumps({"id": JOB, "status": "queued"}).encode())

            def do_GET(self) -> None:
                kind = "fetches" if self.path.startswith("/files/") else "polls"
                with jobs.lock:
                    jobs.seen[kind] += 1
                    script = jobs.fetches if kind == "fetches" else jobs.polls
                    status, headers = script.pop(0) if script else (200, {})
                if status != 200:
                    self.answer(status, json.dumps({"error": "slow down"}).encode(), headers=headers)
                elif kind == "fetches":
                    self.answer(200, render_png(key=JOB, **SIZE), content_type="image/png")
                else:
                    done = {"status": "succeeded", "output": {"url": f"/files/{JOB}.png"}}
                    self.answer(200, json.dumps(done).encode())

        self.server = LoopbackServer(Handler).start()

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def jobs():
    server = ScriptedJobs()
    yield server
    server.server.stop()


def render_provider(tenant, url: str, **caps: Any) -> Provider:
    fields = render_fields(url, output_sha256_pointer="", output_size_pointer="", **caps)
    return provider_upsert(tenant=tenant, slug="images", **fields)


def waiting_job(tenant) -> Operation:
    """A render submitted and accepted: waiting on the provider, its first poll made due."""
    op = operation_submit(
        tenant=tenant,
        key="render-1",
        provider="images",
        request={"method": "POST", "path": "/v1/renders", "body": SIZE},
    ).operation
    (recorded,) = run_due()
    assert recorded.status == S.WAITING and recorded.provider_ref == JOB
    make_due(op.pk)
    return recorded


def poll_once() -> tuple[Operation, Any, Any]:
    """One take and poll; (the recorded row, the database clock before and after)."""
    before = sql.db_now()
    (recorded,) = run_due()
    return recorded, before, sql.db_now()


def assert_throttled_for(provider: Provider, seconds: float, before, after) -> None:
    """throttled_until is `seconds` past a database time read during the poll."""
    provider.refresh_from_db()
    assert provider.throttled_until is not None
    held = [(provider.throttled_until - t).total_seconds() for t in (before, after)]
    assert held[1] - 0.01 <= seconds <= held[0] + 0.01, held


def next_poll_in(op: Operation) -> float:
    # next_attempt_at and updated_at come from one statement's now(): their gap is the delay.
    current = Operation.objects.get(pk=op.pk)
    assert current.status == S.WAITING and current.lease_expires_at is None
    return round((current.next_attempt_at - current.updated_at).total_seconds(), 2)


def test_a_429_to_a_poll_throttles_the_provider_halves_its_rate_and_delays_the_next_poll(tenant, jobs):
    provider = render_provider(tenant, jobs.url, rate_limit=10, rate_period_seconds=1, rate_burst=4)
    op = waiting_job(tenant)
    jobs.polls = [(429, {"Retry-After": "7"})]

    polled, before, after = poll_once()
    assert polled.status == S.WAITING and polled.provider_ref == JOB and polled.polls == 1
    assert_throttled_for(provider, 7.0, before, after)
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(5.0)
    # Backoff alone would poll again in 0.5 s; the provider asked for 7.
    assert next_poll_in(op) == 7.0
    # Held back: neither this poll nor any other work of the provider is taken meanwhile.
    make_due(op.pk)
    assert operations_take(limit=5) == []

    # A later poll (taken after the lowering) answered 429 again is the next storm: halved again,
    # though the job was submitted before the first lowering.
    unthrottle(provider.pk)
    move_bucket_clock(provider.pk, 1)
    jobs.polls = [(429, {"Retry-After": "3"})]
    polled, before, after = poll_once()
    assert polled.status == S.WAITING and polled.polls == 2
    assert_throttled_for(provider, 3.0, before, after)
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(2.5)
    assert next_poll_in(op) == 3.0

    # Once the provider lets us back in, the job finishes as any other: one submit, one render.
    unthrottle(provider.pk)
    move_bucket_clock(provider.pk, 1)
    make_due(op.pk)
    done, _, _ = poll_once()
    assert done.status == S.SUCCEEDED
    assert OperationOutput.objects.filter(operation_id=op.pk).count() == 1
    assert jobs.seen == Counter(submits=1, polls=3, fetches=1)


def test_a_429_to_the_output_fetch_throttles_and_lowers_like_a_poll_and_nothing_is_published(tenant, jobs):
    provider = render_provider(tenant, jobs.url, rate_limit=10, rate_period_seconds=1, rate_burst=4)
    op = waiting_job(tenant)
    jobs.fetches = [(429, {"Retry-After": "5"})]

    polled, before, after = poll_once()
    assert polled.status == S.WAITING
    assert not OperationOutput.objects.filter(operation_id=op.pk).exists()
    assert_throttled_for(provider, 5.0, before, after)
    assert ProviderRate.objects.get(provider=provider).rate == pytest.approx(5.0)
    assert next_poll_in(op) == 5.0

    unthrottle(provider.pk)
    move_bucket_clock(provider.pk, 1)
    make_due(op.pk)
    done, _, _ = poll_once()
    assert done.status == S.SUCCEEDED and OperationOutput.objects.filter(operation_id=op.pk).count() == 1
    assert jobs.seen == Counter(submits=1, polls=2, fetches=2)


def test_a_503_to_a_poll_without_retry_after_throttles_by_the_base_delay_and_lowers_nothing(tenant, jobs):
    # A provider without a declared rate has no bucket to lower: the throttle only, as for a send.
    provider = render_provider(tenant, jobs.url, base_delay_seconds=2.0, max_delay_seconds=4.0)
    op = waiting_job(tenant)
    jobs.polls = [(503, {})]

    polled, before, after = poll_once()
    assert polled.status == S.WAITING
    assert_throttled_for(provider, 2.0, before, after)
    assert not ProviderRate.objects.filter(provider=provider).exists()
    assert next_poll_in(op) == 2.0
