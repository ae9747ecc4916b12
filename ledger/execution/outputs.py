"""Validated outputs: nothing a provider produced is published unchecked.

:func:`output_fetch_publish` is called by the holder of an operation's lease once the
provider says its output is ready (an image API's job ``succeeded`` with an output URL):

1. **Fetch into quarantine.** The URL is a path under the provider's base URL (sent with the
   provider's credential) or an absolute URL (sent without it: a credential never travels to
   another origin). Either way it goes through the outbound policy (ledger.rules.outbound): checked
   on its form here, and at connect time after DNS by the client — a destination the
   deployment does not allow is never fetched. The body is read in chunks, counted and hashed,
   and stops one byte past ``OUTPUT_MAX_BYTES``; what arrived is written to the
   ``onceguard_quarantine`` storage, which nobody reads.
2. **Check** the quarantined bytes: the announced size and sha256 (when the provider
   announced them), the media type from the content (magic bytes, a full Pillow decode: the
   ``Content-Type`` header is a claim, not evidence) against the accepted types, and the
   image's width and height against the ones asked for.
3. **Publish or fail.** All checks passed: under a lock on the operation row, still held by
   this lease, the bytes are copied to the ``onceguard_objects`` storage and an
   ``OperationOutput`` row records them (key ``out_<sha256>``, sha256, size, media type,
   width, height) — readable from then on through the tenant-scoped API. A check failed: the
   operation is failed as ``invalid_output`` with the reason (an event row, its DLQ entry),
   and nothing is published. Either way the quarantined copy is deleted.

A fetch that did not complete (no connection, a timeout, a non-200 answer, a refused
destination) is not a verdict on the output: :class:`OutputUnavailable` is raised, nothing is
stored, and the operation is left to its holder (a later poll tries again). An operation that
already has a published output answers it without fetching again: a replay never renders or
downloads twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import httpx
from django.db import transaction
from django.db.models.functions import Now

from ledger.execution import manifests, objects
from ledger.models import (
    REPORTABLE_STATES,
    AdapterRevision,
    Operation,
    OperationOutput,
    OutputState,
    Provider,
    Tenant,
)
from ledger.platform import crypto
from ledger.platform.errors import DestinationNotAllowed, DomainError, LeaseLost
from ledger.protocol.services import provider_by_id, sanitize_message
from ledger.protocol.transitions import operation_output_reject
from ledger.providers import adapters
from ledger.recovery.recall import outputs_recall
from ledger.rules.outbound import outbound_check, outbound_client

log = logging.getLogger("onceguard.outputs")

KEY_PREFIX = "out_"
PURPOSE = "output fetch"


class OutputNotFound(DomainError):
    """No published output for this operation of this tenant (another tenant's: the same)."""

    status, code, title = 404, "not_found", "Not found"


class OutputQuarantined(DomainError):
    """The output was recalled before anyone consumed it: its adapter revision was rolled back
    (ADR 0020). Its facts stay readable; its bytes are not served."""

    status, code, title = 410, "output_quarantined", "The output was recalled"


class OutputUnavailable(Exception):
    """The output could not be fetched (nothing was checked, nothing stored); try again later.
    ``status`` and ``headers``: the answer of an output URL that answered (a 429's
    Retry-After is the caller's to apply: ``ledger.execution.polling``)."""

    def __init__(self, reason: str, *, status: int | None = None, headers: httpx.Headers | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.headers = headers


class OutputErased(Exception):
    """The operation's request was destroyed (an erasure on request, DESIGN §8) while its job
    ran: its output is not fetched, or not published — it would be the person's data stored
    after their erasure finished."""


def _request_destroyed(request: object) -> bool:
    return crypto.is_redacted(request)


class InvalidOutput(Exception):
    """The output failed a check: the operation was failed as ``invalid_output``."""

    def __init__(self, reason: str, operation: Operation) -> None:
        super().__init__(reason)
        self.reason = reason
        self.operation = operation


@dataclass(frozen=True)
class OutputExpectation:
    """What the output must be. ``width``/``height``: the size asked for (None: any);
    ``sha256``/``size``: what the provider announced, when it did."""

    media_types: tuple[str, ...] = ("image/png",)
    width: int | None = None
    height: int | None = None
    sha256: str | None = None
    size: int | None = None


def output_key(sha256: str) -> str:
    return KEY_PREFIX + sha256


def output_max_bytes() -> int:
    return int(objects.setting("OUTPUT_MAX_BYTES"))


def output_get(*, tenant: Tenant, operation_id: int) -> OperationOutput:
    output = OperationOutput.objects.filter(tenant_id=tenant.pk, operation_id=operation_id).first()
    if output is None:
        raise OutputNotFound("No published output for this operation.")
    return output


def _quarantined(output: OperationOutput) -> OutputQuarantined:
    return OutputQuarantined(
        f"Output {output.key} was recalled: {output.recall_reason or 'its adapter revision was rolled back'}."
        " Its facts stay readable; a re-run under the good revision is the next version of its key.",
        extra={"recalled_at": output.recalled_at.isoformat() if output.recalled_at else None},
    )


def output_consume(*, tenant: Tenant, operation_id: int) -> OperationOutput:
    """The output whose bytes the tenant's caller is about to download, its first download
    recorded as ``consumed_at`` (ADR 0020: what a rollback's recall tells apart). A recalled,
    unconsumed output raises :class:`OutputQuarantined`. The record is a guarded UPDATE on the
    state as read: against a recall that committed first it matches nothing, and the row read
    again says quarantined — the bytes are never served after their recall, and an output
    that was served is never quarantined behind its caller's back (the recall locks its rows
    and reads ``consumed_at`` under the lock)."""
    output = output_get(tenant=tenant, operation_id=operation_id)
    if output.state == OutputState.QUARANTINED:
        raise _quarantined(output)
    if output.consumed_at is None:
        recorded = OperationOutput.objects.filter(
            pk=output.pk, tenant_id=output.tenant_id, state=output.state, consumed_at__isnull=True
        ).update(consumed_at=Now())
        if not recorded:
            output = OperationOutput.objects.get(pk=output.pk, tenant_id=output.tenant_id)
            if output.state == OutputState.QUARANTINED:
                raise _quarantined(output)
    return output


def _fetch_target(*, provider: Provider, url: str) -> tuple[str, dict[str, str]]:
    """The absolute URL to fetch and the headers to send with it."""
    if url.startswith("/") and not url.startswith("//"):
        # The provider's own origin: its credential goes along, as with its other calls.
        return adapters.join_url(provider.base_url, url), adapters.credential_headers(provider)
    # Another origin (a CDN, a signed storage URL): allowed only where the deployment allows
    # the service to send, and never with the provider's credential.
    return outbound_check(url, purpose=PURPOSE).url, {}


def _until(chunks: Iterator[bytes], *, deadline: float) -> Iterator[bytes]:
    """``chunks`` while the fetch's time lasts: httpx bounds each read, not their sum, so a
    server dripping a byte at a time would otherwise hold the lease holder for ever."""
    for chunk in chunks:
        if time.monotonic() > deadline:
            raise OutputUnavailable("the output took longer than OUTPUT_FETCH_TIMEOUT_SECONDS to arrive")
        yield chunk


def _fetch(*, client: httpx.Client, url: str, headers: dict[str, str], limit: int, timeout: float) -> objects.Received:
    """GET ``url`` into an unnamed temporary file, refusing past ``limit`` bytes."""
    deadline = time.monotonic() + timeout
    # The bytes as stored: a compressed answer is inflated a whole network read at a time,
    # before the limit counts it.
    headers = {**headers, "Accept-Encoding": "identity"}
    with client.stream("GET", url, headers=headers, timeout=timeout) as response:
        if response.status_code != 200:
            raise OutputUnavailable(
                f"the output URL answered HTTP {response.status_code}",
                status=response.status_code,
                headers=response.headers,
            )
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise objects.ObjectTooLarge(limit)
        # As they arrive (a chunk size would buffer them, out of the deadline's sight).
        chunks = _until(response.iter_bytes(), deadline=deadline)
        return objects.receive_bounded(chunks, limit=limit)


def _verdict(*, file: IO[bytes], received: objects.Received, expect: OutputExpectation) -> tuple[str, objects.Facts]:
    """("", facts) when every check passes, else (why not, facts so far)."""
    none = objects.Facts(media_type="")
    if expect.size is not None and received.size != expect.size:
        return f"the output is {received.size} bytes, the provider announced {expect.size}", none
    if expect.sha256 is not None and received.sha256 != expect.sha256.lower():
        return f"the output's sha256 is {received.sha256}, the provider announced {expect.sha256}", none
    try:
        facts = objects.inspect(file)
    except objects.NotRecognised as exc:
        return f"{exc}; expected {', '.join(expect.media_types)}", none
    if facts.media_type not in expect.media_types:
        return f"the output is {facts.media_type}, expected {', '.join(expect.media_types)}", facts
    if (expect.width is not None and facts.width != expect.width) or (
        expect.height is not None and facts.height != expect.height
    ):
        wanted = f"{expect.width or 'any'}×{expect.height or 'any'}"
        return f"the output is {facts.width}×{facts.height} pixels, expected {wanted}", facts
    return "", facts


def output_fetch_publish(
    *,
    operation: Operation,
    url: str,
    expect: OutputExpectation,
    actor: str = "worker",
    client: httpx.Client | None = None,
    provider: Provider | None = None,
) -> OperationOutput:
    """Fetch, check and publish ``operation``'s output (module docstring). ``operation`` is
    the row as its lease holder read it (its ``lease_token`` fences every write); ``provider``
    the provider as the operation's adapter revision sees it (ledger.providers.revisions.operation_adapter_view:
    a path is under that revision's base URL, as its submit and polls were), by default the
    provider row. Returns the published output; raises :class:`InvalidOutput` (the operation
    failed as ``invalid_output``), :class:`OutputUnavailable` (nothing happened) or ``LeaseLost``."""
    published = OperationOutput.objects.filter(tenant_id=operation.tenant_id, operation_id=operation.pk).first()
    if published is not None:
        return published
    if _request_destroyed(operation.request):
        raise OutputErased("the operation was erased on request; its output is not kept")
    if provider is None:
        provider = provider_by_id(operation.provider_id)
    try:
        target, headers = _fetch_target(provider=provider, url=url)
    except DestinationNotAllowed as exc:
        raise OutputUnavailable(exc.detail) from None
    except adapters.CredentialUnavailable as exc:
        raise OutputUnavailable(f"the provider's credential cannot be used: {exc}") from None
    limit = output_max_bytes()
    timeout = float(objects.setting("OUTPUT_FETCH_TIMEOUT_SECONDS"))
    own_client = client is None
    http = client if client is not None else outbound_client(purpose=PURPOSE, timeout=timeout)
    try:
        received = _fetch(client=http, url=target, headers=headers, limit=limit, timeout=timeout)
    except objects.ObjectTooLarge:
        return output_reject(operation=operation, actor=actor, reason=f"the output is larger than {limit} bytes")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        # InvalidURL (not an HTTPError): a path the provider named with control characters, or
        # longer than httpx takes — no verdict on the output, like any fetch that cannot run.
        # The class only: an error's text can carry the URL, which can carry a signature.
        raise OutputUnavailable(f"the output could not be fetched ({type(exc).__name__})") from None
    finally:
        if own_client:
            http.close()
    try:
        return _check_and_publish(operation=operation, received=received, expect=expect, actor=actor)
    finally:
        received.close()


def _check_and_publish(
    *, operation: Operation, received: objects.Received, expect: OutputExpectation, actor: str
) -> OperationOutput:
    quarantine = objects.quarantine_storage()
    quarantined = objects.object_save(
        quarantine,
        name=objects.object_name(kind="outputs", tenant_id=operation.tenant_id, sha256=received.sha256),
        file=received.file,
    )
    try:
        # Type and dimensions are read from the quarantined copy, and it is what gets published:
        # exactly the bytes that were checked.
        with quarantine.open(quarantined, "rb") as file:
            reason, facts = _verdict(file=file, received=received, expect=expect)
            if reason:
                return output_reject(operation=operation, actor=actor, reason=reason)
            return _publish(operation=operation, file=file, received=received, facts=facts)
    finally:
        # Passed or not, the quarantined copy goes: published bytes live in the objects storage.
        objects.object_delete(quarantine, quarantined)


def _publish(
    *, operation: Operation, file: IO[bytes], received: objects.Received, facts: objects.Facts
) -> OperationOutput:
    storage = objects.objects_storage()
    name = objects.object_save(
        storage,
        name=objects.object_name(kind="outputs", tenant_id=operation.tenant_id, sha256=received.sha256),
        file=file,
    )
    try:
        with transaction.atomic():
            # Fenced: only the lease that fetched it publishes, and only once.
            held = list(
                Operation.objects.select_for_update()
                .filter(
                    pk=operation.pk,
                    tenant_id=operation.tenant_id,
                    lease_token=operation.lease_token,
                    status__in=REPORTABLE_STATES,
                )
                .values_list("request", flat=True)
            )
            if not held:
                raise LeaseLost("The operation moved before its output could be published.")
            # An erasure locks this row too: one that committed first destroyed the request
            # (nothing is published after it); one that comes later finds the output and
            # deletes it.
            if _request_destroyed(held[0]):
                raise OutputErased("the operation was erased on request; its output is not kept")
            existing = OperationOutput.objects.filter(tenant_id=operation.tenant_id, operation_id=operation.pk).first()
            if existing is not None:
                objects.object_delete(storage, name)
                return existing
            output = OperationOutput.objects.create(
                tenant_id=operation.tenant_id,
                operation_id=operation.pk,
                key=output_key(received.sha256),
                sha256=received.sha256,
                size=received.size,
                media_type=facts.media_type,
                width=facts.width,
                height=facts.height,
                storage_name=name,
                # The revision the lease holder ran under (a row is moved to another
                # revision only while nothing is under way): what a rollback recalls by.
                adapter_revision_id=operation.adapter_revision_id,
            )
            # The job's evaluation manifest, written before any output could exist, now names it.
            manifests.manifest_output_link(
                tenant_id=operation.tenant_id, operation_id=operation.pk, output_id=output.pk
            )
            # Published late, under a revision rolled back meanwhile (ADR 0020): recalled in the
            # same transaction, so it is never served as good, not even until the sweeper's
            # next pass. (A rollback committing between this read and this commit is the pass's.)
            if (
                output.adapter_revision_id is not None
                and AdapterRevision.objects.filter(pk=output.adapter_revision_id, rolled_back_at__isnull=False).exists()
            ):
                outputs_recall(
                    tenant_id=operation.tenant_id,
                    output_ids=[output.pk],
                    actor="system:recall",
                    reason="published after its adapter revision was rolled back",
                )
                output.refresh_from_db()
    except BaseException:
        # No row names it: nobody could ever read it.
        objects.object_delete(storage, name)
        raise
    log.info(
        "output_published key=%s operation=%s size=%s type=%s width=%s height=%s",
        operation.key,
        operation.pk,
        output.size,
        output.media_type,
        output.width,
        output.height,
    )
    return output


def output_reject(*, operation: Operation, actor: str, reason: str) -> OperationOutput:
    """Fail the operation as ``invalid_output`` (its latest holder's verdict, from any state
    that holder may still report from); always raises :class:`InvalidOutput`. Also for an
    answer that says "done" but names no output (ledger.execution.polling)."""
    reason = sanitize_message(reason)
    current = Operation.objects.filter(
        pk=operation.pk, lease_token=operation.lease_token, status__in=REPORTABLE_STATES
    ).first()
    if current is None:
        raise LeaseLost("The operation moved before its output could be judged.")
    failed = operation_output_reject(operation=current, actor=actor, reason=reason)
    log.warning("output_invalid key=%s operation=%s reason=%s", operation.key, operation.pk, reason)
    raise InvalidOutput(reason, failed)


def outputs_delete_for(*, operation_ids: list[int]) -> int:
    """Delete the outputs of operations about to be deleted (retention): the rows in the
    caller's transaction, their objects once it commits."""
    rows = list(OperationOutput.objects.filter(operation_id__in=operation_ids).values_list("pk", "storage_name"))
    if not rows:
        return 0
    OperationOutput.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
    objects.objects_delete_on_commit([name for _, name in rows])
    return len(rows)
