"""A failed attempt's evidence, kept on purpose (ADR 0016): written in the failed attempt's own
transaction, read by the console and the API, expired by the retention pass.

What is kept is what a post-mortem of a failure needs — provider, class, outcome, HTTP status,
timing, adapter revision, a render job's preset version and aspect class — and the error text
with the job's own values cut out: every string of its payload and request, its key, then
e-mail addresses, phone numbers and secrets by pattern (``ledger.platform.cutting`` and
``ledger.platform.redaction``). The key is kept only as a keyed digest, so the evidence of one
job can be told from another's without the key itself. Nothing here is personal data by
construction, which is why it may outlive the operation's retention.

Only failures pay: a success writes nothing here.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from ledger.models import EVIDENCE_ERROR_LENGTH, Attempt, AttemptEvidence, Operation
from ledger.platform import crypto
from ledger.platform.cutting import ValueCutter, readable_value, value_strings
from ledger.platform.redaction import REDACTED, scrub
from ledger.protocol.selectors import provider_slug
from ledger.providers.revisions import revision_number
from ledger.rules.intents import render_labels
from ledger.store import sql


def evidence_error_text(*, message: str, key: str, values: list[object]) -> str:
    """``message`` with the job's own values cut out (every string of ``values``, and ``key``),
    then personal data and secrets masked by pattern, on one line, cut to the column."""
    strings: set[str] = set()
    for value in values:
        value_strings(value, strings)
    if key:
        strings.add(key)
    text = ValueCutter(strings, replacement=REDACTED).cut(" ".join(message.split()))
    return scrub(text)[:EVIDENCE_ERROR_LENGTH]


def key_digest(*, tenant_id: int, key: str) -> tuple[str, str]:
    """(digest key id, keyed digest) of a tenant's key: the same key gives the same digest
    under one encryption key, and cannot be guessed from it without that key."""
    return crypto.digest(f"attempt-evidence-key:{tenant_id}:{key}")


def attempt_evidence_record(
    *,
    op: Operation,
    number: int,
    outcome: str,
    error_class: str,
    message: str,
    response_status: int | None,
) -> AttemptEvidence:
    """One failed attempt's evidence, inside the caller's transaction (the move that records the
    failure: ``ledger.protocol.transitions.holder.operation_fail``). ``op`` is the locked row
    as read before the move (its payload and request are the values cut from the error)."""
    plain_request = readable_value(op.request)
    labels = render_labels(plain_request)
    times = (
        Attempt.objects.filter(tenant_id=op.tenant_id, operation_id=op.pk, number=number)
        .values_list("started_at", "finished_at")
        .first()
    )
    started, finished = times if times is not None else (None, None)
    if finished is None:
        # The attempt row is finished by the statement just before this call; only a failure
        # with no attempt row of that number asks the database for the time.
        finished = sql.db_now()
    started = min(started or finished, finished)
    digest_key_id, digest = key_digest(tenant_id=op.tenant_id, key=op.key)
    return AttemptEvidence.objects.create(
        tenant_id=op.tenant_id,
        provider_slug=provider_slug(op.provider_id) or "",
        operation_id=op.pk,
        key_digest=digest,
        digest_key_id=digest_key_id,
        attempt_number=number,
        outcome=outcome,
        error_class=error_class,
        response_status=response_status if response_status is not None and response_status >= 0 else None,
        started_at=started,
        finished_at=finished,
        duration_ms=_milliseconds(started, finished),
        adapter_revision=revision_number(op.adapter_revision_id),
        preset_version=labels.preset_version,
        aspect_class=labels.aspect_class,
        error=evidence_error_text(message=message, key=op.key, values=[readable_value(op.payload), plain_request]),
    )


def _milliseconds(started: datetime, finished: datetime) -> int:
    return max(0, round((finished - started).total_seconds() * 1000))


# --- Reads ----------------------------------------------------------------------------------------

LIST_ORDERING = ("-finished_at", "-id")


def attempt_evidence_list(
    *,
    tenant_id: int,
    provider: str | None = None,
    error_class: str | None = None,
    finished_after: datetime | None = None,
    finished_before: datetime | None = None,
) -> QuerySet[AttemptEvidence]:
    """A tenant's evidence, newest first, optionally by provider slug, class and time (the
    API's list; the console's page filters the same columns)."""
    rows = AttemptEvidence.objects.filter(tenant_id=tenant_id)
    if provider:
        rows = rows.filter(provider_slug=provider)
    if error_class:
        rows = rows.filter(error_class=error_class)
    if finished_after is not None:
        rows = rows.filter(finished_at__gte=finished_after)
    if finished_before is not None:
        rows = rows.filter(finished_at__lt=finished_before)
    return rows.order_by(*LIST_ORDERING)


# --- Expiry -----------------------------------------------------------------------------------------


def attempt_evidence_expired(*, tenant_id: int, before: datetime) -> QuerySet[AttemptEvidence]:
    """A tenant's evidence finished before ``before``: what the retention pass deletes."""
    return AttemptEvidence.objects.filter(tenant_id=tenant_id, finished_at__lt=before)
