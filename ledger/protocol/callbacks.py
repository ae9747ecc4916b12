"""Callbacks: the terminal outcome of an execute-mode operation POSTed to the submitter.

A callback is itself a ledger operation (key ``callback:{operation id}``, DESIGN §5) on the
tenant's internal callback provider, written ``queued`` in the same transaction as the
terminal move that causes it. The workers deliver it like any other operation — retried
with backoff, never blocking the worker that finished the original — signed with an HMAC
of the tenant's callback secret. Receivers should dedup on the ``Idempotency-Key`` header:
a callback whose answer was lost is re-sent with the same key.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ledger.models import (
    ConfigChangeAction,
    IdempotencyClass,
    Operation,
    OperationMode,
    Provider,
    ProviderKind,
    Tenant,
)
from ledger.platform.crypto import open_json
from ledger.platform.errors import ValidationFailed
from ledger.protocol.representation import operation_representation
from ledger.protocol.selectors import provider_slug
from ledger.providers.credentials import sealed_credential, secret_open, signing_secret_summary, signing_secrets_now
from ledger.rules.outbound import normalise_url, outbound_check
from ledger.tenants.config_changes import config_change_record

log = logging.getLogger("onceguard.callbacks")

CALLBACK_PROVIDER_SLUG = "_callbacks"
CALLBACK_ACTION = "callback"
MAX_CALLBACK_URL_LENGTH = 1000


def callback_url_allowed(*, allow_list: list[str], url: str) -> bool:
    """True when ``url`` lies under an allow-list prefix: same scheme, host and port, and a
    path at or below the prefix's path. Both sides are normalised first (ledger.rules.outbound:
    ``..`` and ``%2e%2e`` segments resolved, default ports dropped, host case folded), and a
    URL that cannot be — credentials, backslashes, encoded slashes, a fragment — is refused."""
    try:
        target = normalise_url(url)
    except ValueError:
        return False
    for prefix in allow_list or []:
        try:
            allowed = normalise_url(str(prefix))
        except ValueError:
            continue
        if target.is_under(allowed):
            return True
    return False


def callback_url_check(*, tenant: Tenant, url: str) -> str:
    """Validate a submitted callback_url (400 otherwise) and return it in canonical form —
    the form that is stored, checked against the allow-list and sent to: the outbound
    policy allows its destination, and it lies under one of the tenant's prefixes."""
    if not isinstance(url, str) or len(url) > MAX_CALLBACK_URL_LENGTH or not url.isprintable():
        raise ValidationFailed("callback_url must be a URL of at most 1000 printable characters.")
    # Never echo the URL back: it may carry personal data in its path or query.
    normalised = outbound_check(url, purpose="callback_url")
    if not callback_url_allowed(allow_list=tenant.callback_allow_list, url=normalised.url):
        raise ValidationFailed(
            "callback_url is not on this tenant's callback allow-list.", extra={"field": "callback_url"}
        )
    return normalised.url


def tenant_callback_secret(*, tenant_id: int, rotate: bool = False, actor: str = "system") -> str:
    """The tenant's current signing secret, created on first use (a guarded update: two
    racing first uses agree on one secret). ``rotate`` makes a new one and keeps the old one
    as ``callback_secret_previous``: both sign until ``CALLBACK_SECRET_OVERLAP_SECONDS`` after
    the rotation (a second rotation within that window ends the oldest at once). Creating or
    replacing it is a recorded configuration change (the value masked). The caller shows the
    value once — when it was just made — and never again (manage.py tenant_callback_secret,
    the console's rotate action). Stored sealed (ledger.providers.credentials): the value returned is
    the only clear copy."""
    fresh = secrets.token_urlsafe(32)
    sealed = sealed_credential(fresh)
    with transaction.atomic():
        if rotate:
            # The column's sealed value moves as it is: the previous secret is never opened here.
            changed = Tenant.objects.filter(pk=tenant_id).update(
                callback_secret_previous=F("callback_secret"),
                callback_secret=sealed,
                callback_secret_rotated_at=timezone.now(),
            )
        else:
            changed = Tenant.objects.filter(pk=tenant_id, callback_secret__isnull=True).update(callback_secret=sealed)
        if changed:
            tenant = Tenant.objects.only("pk", "slug", "callback_secret_previous").get(pk=tenant_id)
            config_change_record(
                tenant_id=tenant_id,
                actor=actor,
                action=ConfigChangeAction.UPDATE,
                object_type=tenant._meta.label_lower,
                object_id=tenant_id,
                object_repr=tenant.slug,
                # Sealed values (masked by the trail): the clear secret never reaches it.
                before={"callback_secret": (tenant.callback_secret_previous if rotate else None) or ""},
                after={"callback_secret": sealed},
                secret_fields=("callback_secret",),
            )
    if rotate:
        return fresh
    return secret_open(Tenant.objects.values_list("callback_secret", flat=True).get(pk=tenant_id))


def _overlap_seconds() -> float:
    return float(settings.ONCEGUARD.get("CALLBACK_SECRET_OVERLAP_SECONDS", 86400))


def callback_signing_secrets(*, tenant_id: int) -> list[str]:
    """The secrets a callback is signed with now: the current one, and the previous one
    while the rotation's overlap lasts (one ``v1=`` signature each, current first)."""
    current = tenant_callback_secret(tenant_id=tenant_id)
    previous, rotated_at = Tenant.objects.values_list("callback_secret_previous", "callback_secret_rotated_at").get(
        pk=tenant_id
    )
    return signing_secrets_now(
        current=current, previous=previous, rotated_at=rotated_at, overlap_seconds=_overlap_seconds()
    )


def callback_secret_summary(tenant: Tenant) -> str:
    """What the console and the command say about the secret instead of showing it: whether
    it is set, its last 4 characters at most (to tell a receiver's copy apart), when it was
    rotated and how long the previous one still signs."""
    return signing_secret_summary(
        current=tenant.callback_secret,
        previous=tenant.callback_secret_previous,
        rotated_at=tenant.callback_secret_rotated_at,
        overlap_seconds=_overlap_seconds(),
        unset="not set (made at the first submission with a callback_url, or by rotating)",
    )


def callback_provider(*, tenant_id: int) -> Provider:
    """The tenant's internal callback provider (created on first use).

    Key-enforced without a lookup: an ambiguous delivery is re-sent with the same key (the
    sweeper's execute-mode rule), which is what receivers dedup on."""
    provider = Provider.objects.filter(tenant_id=tenant_id, slug=CALLBACK_PROVIDER_SLUG).first()
    if provider is not None:
        return provider
    cfg = settings.ONCEGUARD
    try:
        with transaction.atomic():
            return Provider.objects.create(
                tenant_id=tenant_id,
                slug=CALLBACK_PROVIDER_SLUG,
                kind=ProviderKind.CALLBACK,
                idempotency_class=IdempotencyClass.KEY_ENFORCED,
                base_url="",
                ref_pointer="",
                timeout_seconds=float(cfg.get("CALLBACK_TIMEOUT_SECONDS", 5)),
                max_attempts=int(cfg.get("CALLBACK_MAX_ATTEMPTS", 8)),
                lifetime_seconds=int(cfg.get("CALLBACK_LIFETIME_SECONDS", 86400)),
                base_delay_seconds=2.0,
                max_delay_seconds=600.0,
            )
    except IntegrityError:
        return Provider.objects.get(tenant_id=tenant_id, slug=CALLBACK_PROVIDER_SLUG)


# Callbacks besides the terminal one, by the event they announce: the key's suffix and the
# body's ``type``. A recalled output (ADR 0020) is told to the submitter once, with the
# operation as it is then (its output marked quarantined or flagged).
OUTPUT_RECALLED = "output_recalled"
CALLBACK_TYPES = {"": "operation.finished", OUTPUT_RECALLED: "operation.output_recalled"}


def callback_claim_arguments(*, operation: Operation, event: str = "") -> dict[str, Any] | None:
    """What the callback operation of a finished operation is claimed with (the claim itself
    is ``ledger.protocol.transitions.callback_enqueue``, which the terminal move calls): key
    ``callback:{id}`` on the tenant's callback provider, in execute mode — ``callback:{id}:{event}``
    for a later event (``CALLBACK_TYPES``). None when the operation has no callback."""
    if not operation.callback_url or operation.mode != OperationMode.EXECUTE:
        return None
    request: dict[str, Any] = {"method": "POST", "url": operation.callback_url, "operation_id": operation.pk}
    if event:
        request["event"] = event
    return {
        "tenant": Tenant(pk=operation.tenant_id),
        "key": f"callback:{operation.pk}" + (f":{event}" if event else ""),
        "provider": callback_provider(tenant_id=operation.tenant_id),
        "action": CALLBACK_ACTION,
        "request": request,
        "mode": OperationMode.EXECUTE,
        "via_claims": False,
        "actor": "callbacks",
        "correlation_id": operation.correlation_id,
        "workflow_id": operation.workflow_id,
        "execution_id": operation.execution_id,
    }


def callback_body(*, callback_operation: Operation) -> bytes:
    """What the receiver gets: the finished operation's public representation (never its
    payload or request), built at send time from the terminal row, so a re-send is equal.

    The recorded response is in clear here: the callback is the asynchronous answer to the
    submission (the same the submitter gets by replaying its key with a write-scoped key),
    signed, and sent only to a URL on the tenant's own callback allow-list."""
    request = open_json(callback_operation.request) or {}
    source = Operation.objects.get(pk=request.get("operation_id"), tenant_id=callback_operation.tenant_id)
    document: dict[str, Any] = {
        "type": CALLBACK_TYPES.get(request.get("event") or "", CALLBACK_TYPES[""]),
        "operation": operation_representation(
            source, provider_slug=provider_slug(source.provider_id), response_in_clear=True
        ),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
