"""Execute mode (DESIGN §3), the submitter's side: an operation accepted for the workers.

:func:`operation_submit` validates the provider-neutral envelope (:func:`normalize_envelope`,
or an intent checked against the provider's schema and rendered once), runs admission for a
new key, and writes the row ``queued`` in the request's transaction: the operations table is
the work queue, so nothing is lost between the web and the workers. A key accepted before
answers with its own row — its recorded outcome once finished, the operation itself while it
is open — never the claim protocol's 409s. The workers' take, send and record are
``ledger.execution.attempts``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from ledger.execution import manifests, translation
from ledger.models import Operation, OperationMode, Provider, ProviderKind, Tenant
from ledger.platform.crypto import open_json
from ledger.platform.errors import (
    AdmissionRefused,
    OperationInProgress,
    OperationNeedsReconciliation,
    OperationRetryScheduled,
    UnknownProvider,
    ValidationFailed,
)
from ledger.protocol import callbacks, services, transitions
from ledger.protocol.inputs import versioned_key
from ledger.providers import adapters, admission, revisions
from ledger.rules import intents

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Never accepted from a caller, whatever a provider's allow-list says: credentials, hop-by-hop
# and framing headers are ours to set.
FORBIDDEN_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
    }
)
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
MAX_PATH_LENGTH = 2000


class RequestTooLarge(ValidationFailed):
    code, title = "request_too_large", "Request envelope too large"


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and value != value)


def normalize_envelope(*, request: Any, provider: Provider) -> dict[str, Any]:
    """The stored form of a submitted ``request`` (method/path/query/headers/body), or a 400."""
    if not isinstance(request, dict):
        raise ValidationFailed("`request` must be an object with method, path, query, headers, body.")
    unknown = set(request) - {"method", "path", "query", "headers", "body"}
    if unknown:
        raise ValidationFailed(f"Unknown request fields: {', '.join(sorted(unknown))}.")
    method = request.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValidationFailed(f"request.method must be one of {', '.join(METHODS)}.")
    path = request.get("path", "/")
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or path.startswith("//")
        or len(path) > MAX_PATH_LENGTH
        or not path.isprintable()
        or " " in path
        or "?" in path
        or "#" in path
        or any(segment in ("..", ".") for segment in path.split("/"))
    ):
        # A path relative to the provider's base URL: it can never name another host.
        raise ValidationFailed("request.path must be an absolute path below the provider's base URL (no query).")
    query = request.get("query") or {}
    if not isinstance(query, dict) or not all(
        isinstance(k, str) and (_scalar(v) or (isinstance(v, list) and all(_scalar(i) for i in v)))
        for k, v in query.items()
    ):
        raise ValidationFailed("request.query must map names to strings, numbers, booleans or lists of them.")
    headers = request.get("headers") or {}
    if not isinstance(headers, dict):
        raise ValidationFailed("request.headers must map names to strings.")
    allowed = {h.lower() for h in provider.forward_headers or []}
    reserved = {provider.idempotency_header.lower()} | (
        {provider.auth_header.lower()} if provider.auth_header else set()
    )
    clean_headers: dict[str, str] = {}
    for name, value in headers.items():
        lname = name.lower() if isinstance(name, str) else ""
        if not _HEADER_NAME.match(lname or "-") or not lname:
            raise ValidationFailed("request.headers has a header name that is not valid.")
        if lname in FORBIDDEN_HEADERS or lname in reserved or lname not in allowed:
            raise ValidationFailed(
                f"Header {name!r} is not allowed for this provider.",
                extra={"allowed_headers": sorted(allowed - FORBIDDEN_HEADERS - reserved)},
            )
        # Printable ASCII, as a key is: the worker sends it as is, and an HTTP client encodes
        # header values as ASCII (a non-ASCII value accepted here would fail every attempt).
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value) or len(value) > 1000:
            raise ValidationFailed(
                f"Header {name!r} must be a string of printable ASCII characters, at most 1000 of them."
            )
        clean_headers[lname] = value
    envelope: dict[str, Any] = {"method": method.upper(), "path": path}
    if query:
        envelope["query"] = query
    if clean_headers:
        envelope["headers"] = clean_headers
    if "body" in request and request["body"] is not None:
        envelope["body"] = request["body"]
    return envelope


@dataclass(frozen=True)
class SubmitResult:
    operation: Operation
    # True when this submission wrote the row (202).
    created: bool
    # True when the key's row was finished: its recorded outcome is replayed (200).
    replayed: bool
    # True when the key was accepted before and its row is still open (queued, claimed,
    # retry_wait, uncertain, review): the same operation answers again (202, replayed).
    still_open: bool = False


def execute_provider_for(*, tenant: Tenant, slug: str) -> Provider:
    provider = services.provider_for(tenant=tenant, slug=slug)
    if provider is None or provider.kind != ProviderKind.HTTP:
        raise UnknownProvider(f"No provider named {slug!r} is configured for this tenant.")
    if not provider.base_url:
        raise UnknownProvider(f"Provider {slug!r} has no base URL; it cannot be used in execute mode.")
    return provider


# What the claim protocol answers for a key whose row is open (claimed; queued or retry_wait;
# uncertain or review): for a submission, the operation itself.
OPEN_ROW_ANSWERS = (OperationInProgress, OperationRetryScheduled, OperationNeedsReconciliation)


def operation_submit(
    *,
    tenant: Tenant,
    key: str,
    provider: str,
    action: str = "",
    request: Any = None,
    intent: Any = None,
    payload: Any = None,
    deadline_seconds: float | None = None,
    callback_url: str = "",
    reconciliation_handle: str = "",
    execution_id: str = "",
    workflow_id: str = "",
    workflow_version: str = "",
    correlation_id: str = "",
    run: str = "",
    step: int | None = None,
    record: str = "",
    version: int | None = None,
    actor: str = "api",
    prompt_pins: dict[str, int] | None = None,
    manifest: Any = None,
    evaluates: Any = None,
) -> SubmitResult:
    """Accept an operation for the workers, or answer for the key's existing row (DESIGN §5):
    its recorded outcome once finished (``replayed``), the operation itself while it is open
    (``still_open``), never the claim protocol's 409s; another request is still a 422.

    A provider with an intent schema (DESIGN §5, intents) takes ``intent`` instead of
    ``request`` (``request={"intent": …}`` is the same, as the DLQ's correction resubmits a
    stored one): it is checked against the schema of the revision the new row would run
    under, its uploads against the tenant's, rendered once, and stored as ``{"intent": …}``
    (so the fingerprint covers it) with the prompt template versions that rendering used
    (``"prompts": {name: version}``, outside the fingerprint: every attempt renders them, ADR
    0009); ``request_bytes`` adds the referenced uploads' sizes. ``prompt_pins``: the versions
    a job keeps from the one it corrects (the DLQ's correction), instead of the newest.

    ``manifest``: the generated document's evaluation manifest, checked against the job's
    presets and stored with the new row (a key accepted before: as ``PUT …/manifest`` would);
    ``evaluates``: the generating job an extraction reads (ADR 0022,
    ledger.execution.manifests). Neither is part of the fingerprint.

    Validation and admission raise before anything is written, so a corrected retry can
    succeed. Admission runs only for a key that is new: a replay is never refused.
    """
    # A submitter's key: never one of the service's own key spaces (callback:, replay:, ~r{n}).
    key = services.reserved_key_check(services.claim_key_check(tenant_id=tenant.pk, key=key))
    provider_obj = execute_provider_for(tenant=tenant, slug=provider)
    # The revision a new row would run under (a key already stored keeps its own): its
    # adapter fields say which headers a caller may forward, and what intent it takes.
    revision_id = revisions.revision_assign(provider=provider_obj, tenant_id=tenant.pk, key=key)
    view = revisions.revision_view(provider_obj, revision_id)
    if intent is None and intents.is_intent(request):
        intent, request = request["intent"], None
    upload_bytes = 0
    upload_refs: tuple[intents.UploadRef, ...] = ()
    pins: dict[str, int] = {}
    if view.intent_schema:
        if request is not None:
            raise intents.IntentRequired(
                f"Provider {provider_obj.slug!r} takes an intent (`intent`: its declared fields), not a request."
            )
        try:
            admitted = translation.intent_admit(tenant_id=tenant.pk, provider=view, intent=intent, pins=prompt_pins)
        except intents.UploadReferenceInvalid:
            # A key accepted before answers with its own row (its recorded outcome, or itself
            # while open) even once an upload it named is gone (an erasure; retention after its
            # lifetime): a replay is never refused. The row's fingerprint still decides whether
            # this is the same request; a new key is refused as before.
            if not Operation.objects.filter(tenant_id=tenant.pk, key=key).exists():
                raise
            envelope: dict[str, Any] = {"intent": intents.intent_validate(view.intent_schema, intent).values}
        else:
            # What the worker will send must pass the same checks as a submitted request.
            normalize_envelope(request=admitted.rendered.request, provider=view)
            envelope = {"intent": admitted.values}
            pins = admitted.pins
            upload_bytes = admitted.upload_bytes
            upload_refs = admitted.uploads
    elif intent is not None:
        raise intents.IntentNotAccepted(f"Provider {provider_obj.slug!r} declares no intent schema: send `request`.")
    else:
        envelope = normalize_envelope(request=request, provider=view)
    size = len(services.canonical_json(envelope).encode())
    limit = int(settings.ONCEGUARD["EXECUTE_MAX_REQUEST_BYTES"])
    if size > limit:
        raise RequestTooLarge(f"The request envelope is {size} bytes; the limit is {limit}.", extra={"limit": limit})
    # Admission's queued bytes: the envelope and the uploads it makes a worker send (DESIGN §11).
    size += upload_bytes
    if deadline_seconds is not None and not 0 < float(deadline_seconds) <= 366 * 86400:
        raise ValidationFailed("deadline_seconds must be positive (at most a year).")
    if callback_url:
        callback_url = callbacks.callback_url_check(tenant=tenant, url=callback_url)
    # Checked against the presets this rendering pinned, before anything is written (ADR 0022).
    checked = None
    if manifest is not None:
        presets = manifests.job_presets(tenant_id=tenant.pk, request={**envelope, intents.PINS: pins})
        checked = manifests.manifest_check(manifest=manifest, presets=presets)
    link = manifests.evaluates_check(tenant_id=tenant.pk, evaluates=evaluates) if evaluates is not None else None
    fingerprint = services.request_fingerprint(
        mode=OperationMode.EXECUTE, provider=provider_obj.slug, action=action, request=envelope
    )
    cost = Decimal(provider_obj.unit_price or 0)
    claim_kwargs: dict[str, Any] = dict(
        key=key,
        provider=provider_obj,
        action=action,
        # The prompt versions this rendering used are stored with the intent, outside the
        # fingerprint: a retry of the submission after a new version is the same request, and
        # every attempt renders what the job was accepted with (ADR 0009).
        request={**envelope, intents.PINS: pins} if pins else envelope,
        payload=payload,
        mode=OperationMode.EXECUTE,
        deadline_seconds=deadline_seconds,
        reconciliation_handle=reconciliation_handle,
        execution_id=execution_id,
        workflow_id=workflow_id,
        workflow_version=workflow_version,
        correlation_id=correlation_id,
        run=run,
        step=step,
        record=record,
        version=version,
        actor=actor,
        via_claims=False,
        fingerprint=fingerprint,
        execute=transitions.ExecuteTerms(request_bytes=size, cost=str(cost), callback_url=callback_url),
        adapter_revision_id=revision_id,
    )
    if callback_url and not tenant.callback_secret:
        # The secret exists before the first callback could be signed.
        callbacks.tenant_callback_secret(tenant_id=tenant.pk)
    if upload_refs:
        # Before the row, committed with or before it: retention must not delete an upload an accepted
        # job names while that job can run (DESIGN §11). A refusal after this (admission, a key
        # already taken) only keeps the upload longer.
        translation.uploads_retained(
            tenant_id=tenant.pk, refs=upload_refs, seconds=upload_retain_seconds(provider_obj, view)
        )
    try:
        with transaction.atomic() if checked or link else contextlib.nullcontext():
            result = _claim_admitted(tenant=tenant, claim_kwargs=claim_kwargs, size=size, cost=cost)
            _evaluation_attach(result.operation, checked=checked, link=link, actor=actor)
    except OPEN_ROW_ANSWERS:
        # The same request (another fingerprint is a 422 before these) for a key accepted
        # before, whose row is still open: the submitter retried one whose 202 it never saw.
        # The claim protocol's 409 would send it down its error path; the service already
        # has the work, so the answer is that operation again (DESIGN §5).
        op = Operation.objects.get(tenant_id=tenant.pk, key=key)
        _evaluation_attach(op, checked=checked, link=link, actor=actor)
        return SubmitResult(op, created=False, replayed=False, still_open=True)
    return SubmitResult(result.operation, created=result.acquired, replayed=result.replayed)


def _evaluation_attach(
    op: Operation, *, checked: manifests.CheckedManifest | None, link: manifests.EvaluatesLink | None, actor: str
) -> None:
    """The submission's manifest and evaluation, with its row: written for a new row; for a key
    accepted before, the same manifest answers as stored and another one is refused, as a
    ``PUT …/manifest`` would be (ADR 0022)."""
    if checked is not None:
        manifests.manifest_store(operation_id=op.pk, tenant_id=op.tenant_id, checked=checked, actor=actor)
    if link is not None:
        manifests.manifest_score_open(operation=op, link=link)


def upload_retain_seconds(provider: Provider, view: Provider) -> float:
    """How long the uploads a new job names are kept from its submission: the job's lifetime
    (its ``expires_at``: no attempt or poll starts after it), then the lease of an attempt or
    poll that started just before its end (both read the intent's uploads), under the longer
    timeout of the provider and the revision the job starts under."""
    timeout = max(float(provider.timeout_seconds), float(view.timeout_seconds))
    return (
        float(provider.lifetime_seconds) + adapters.worker_lease_seconds(timeout) + adapters.poll_lease_seconds(timeout)
    )


def _claim_admitted(
    *, tenant: Tenant, claim_kwargs: dict[str, Any], size: int, cost: Decimal
) -> transitions.ClaimResult:
    """The claim of a submission, with admission checked first for a key that is new."""
    if not admission.tenant_has_limits(tenant):
        return transitions.operation_claim(tenant=tenant, **claim_kwargs)
    try:
        with transaction.atomic():
            locked = admission.lock_tenant(tenant)
            # Under the tenant lock: a key inserted by a racing submission is visible now.
            if not Operation.objects.filter(tenant_id=tenant.pk, key=claim_kwargs["key"]).exists():
                admission.admission_check(tenant=locked, request_bytes=size, cost=cost)
            return transitions.operation_claim(tenant=tenant, **claim_kwargs)
    except AdmissionRefused as refusal:
        admission.admission_refusal_record(tenant_id=tenant.pk, reason=refusal.code)
        raise


def version_after(*, tenant_id: int, record: str, action: str, version: int) -> int:
    """The version to send next for ``record`` and ``action``: one more than ``version`` and
    than the newest the ledger knows (a corrected replay, a recalled output's re-run)."""
    newest = Operation.objects.filter(tenant_id=tenant_id, record=record, action=action).aggregate(n=Max("version"))
    return max(version, newest["n"] or 0) + 1


def operation_submit_version(
    *,
    original: Operation,
    tenant: Tenant,
    provider: str,
    record: str,
    action: str,
    version: int,
    request: Any,
    prompt_pins: Any,
    actor: str,
) -> Operation:
    """``original`` submitted again as version ``version`` of its record and action: a new
    operation carrying the original's payload, callback, workflow, correlation and run step,
    with ``request`` (corrected, or as it was) and the prompt versions it was accepted with."""
    return operation_submit(
        tenant=tenant,
        key=versioned_key(record=record, action=action, version=version),
        provider=provider,
        action=action,
        request=request,
        payload=open_json(original.payload),
        callback_url=original.callback_url,
        workflow_id=original.workflow_id,
        workflow_version=original.workflow_version,
        correlation_id=original.correlation_id,
        run=original.run,
        step=original.step,
        record=record,
        version=version,
        actor=actor,
        prompt_pins=prompt_pins,
    ).operation
