"""The ledger's other writes: tenants, API keys, providers and their throttles and pauses.

Every move of an operation between states is a named function in ``ledger.protocol.transitions``
(claim, take, complete, fail, the sweeper's and reviewers' moves …); the claim and holder
moves and the input checks are re-exported here for the callers that name them through this
module.

What other apps do in the same transaction (a DLQ entry for a failed row, a replay settled,
a subject indexed, an alert) goes through the hooks in ``ledger.platform.hooks``; the ledger imports
nothing from the apps above it.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ledger.models import (
    ADAPTER_FIELDS,
    PROVIDER_CAP_FIELDS,
    ApiKey,
    ConfigChangeAction,
    OperationStatus,
    Provider,
    Tenant,
    prompt_slots_of,
    provider_caps_errors,
)
from ledger.platform import hooks
from ledger.platform.errors import DestinationNotAllowed, PlatformOwnedSetting, ValidationFailed
from ledger.platform.storable import MAX_DURATION_SECONDS

# Re-exported: callers (and tests) that name these through ledger.protocol.services; new code imports ledger.protocol.inputs.
from ledger.protocol.inputs import (  # noqa: F401
    MAX_MESSAGE_LENGTH,
    MAX_VERSION,
    RESERVED_KEY_PREFIXES,
    backoff_seconds,
    canonical_json,
    claim_key_check,
    clamp_lease,
    new_lease_token,
    request_fingerprint,
    reserved_key_check,
    sanitize_message,
    validate_key,
    validate_run,
    versioned_key,
)
from ledger.protocol.transitions import (  # noqa: F401
    CANCELLABLE_STATES,
    ClaimResult,
    ExecuteTerms,
    callback_enqueue,
    decide_unsent_expiry,
    eligibility_ask_interval,
    eligibility_recheck_due,
    operation_cancel,
    operation_claim,
    operation_complete,
    operation_fail,
    operation_heartbeat,
    operation_mark_sent,
    operation_poll_take,
    operation_reclaim,
    operation_retry_now,
    operation_supersede,
    operation_take,
    operation_wait,
)
from ledger.providers import ratelimit, revisions
from ledger.providers.credentials import sealed_credential
from ledger.providers.lookup import (  # noqa: F401
    PROVIDERS_BY_ID,
    RESERVED_PROVIDER_DETAIL,
    RESERVED_PROVIDER_PREFIX,
    provider_by_id,
    provider_cache_forget,
    provider_for,
)
from ledger.rules import take_limits
from ledger.rules.intents import RequestTemplateInvalid, intent_config_errors
from ledger.rules.provider_checks import (
    NAMESPACE_MAX_LENGTH,
    async_config_errors,
    namespace_valid,
    provider_config_errors,
)
from ledger.store import sql
from ledger.tenants.auth import API_KEYS, hash_api_key
from ledger.tenants.config_changes import config_change_of, config_change_record, config_snapshot

S = OperationStatus
log = logging.getLogger("onceguard.ledger")


# --- Tenants, keys, providers ----------------------------------------------------------


def tenant_create(
    *, slug: str, name: str = "", secret_namespace: str = "", actor: str = "system", **settings: Any
) -> Tenant:
    """A new tenant with its secret namespace, fixed from now on (ADR 0001): ``secret_namespace``
    when the platform names one, else derived from the slug (``acme`` → ``ACME``) or, where
    that is taken or overlaps another's, the next free one (ledger.rules.provider_checks).
    ``settings``: its other fields (limits, budget, allow-list …), checked by the model's rules
    as the console's form checks them — the one write path of both (ADR 0006)."""
    if secret_namespace and not namespace_valid(secret_namespace):
        raise ValidationFailed(
            f"A secret namespace is 1–{NAMESPACE_MAX_LENGTH} capital letters and digits (no _): {secret_namespace[:40]!r}."
        )
    fixed = set(settings) & {*TENANT_FIXED_FIELDS, "slug", "name"}
    if fixed:
        raise ValidationFailed(f"Not a setting: {', '.join(sorted(fixed))}.")
    take_limits.tenant_take_limits_check(
        take_share=settings.get("take_share"), take_max_in_flight=settings.get("take_max_in_flight")
    )
    tenant = Tenant(slug=slug, name=name or slug, secret_namespace=secret_namespace, **settings)
    try:
        # The slug's and name's shape and length, the allow-list and eligibility URL against the
        # outbound policy (Tenant.clean); uniqueness is the insert's to decide.
        tenant.full_clean(exclude=["secret_namespace"], validate_unique=False, validate_constraints=False)
    except DjangoValidationError as exc:
        raise ValidationFailed("; ".join(exc.messages)) from exc
    try:
        with transaction.atomic():
            tenant.save(force_insert=True)
            config_change_of(tenant, actor=actor, action=ConfigChangeAction.CREATE)
            return tenant
    except IntegrityError as exc:
        if Tenant.objects.filter(slug=slug).exists():
            raise ValidationFailed(f"A tenant named {slug!r} exists already.") from exc
        raise ValidationFailed(
            f"The secret namespace {secret_namespace or 'derived from the slug'!s} is taken or overlaps another"
            " tenant's (one a prefix of the other); name a free one or try again."
        ) from exc


# Fixed when the tenant is made: its providers' variable names depend on it (ADR 0001).
TENANT_FIXED_FIELDS = ("secret_namespace",)


def tenant_update(*, tenant_id: int, actor: str, **fields: Any) -> Tenant:
    """Change a tenant's settings (limits, callback allow-list, …), recorded as a change. A
    platform action (CLI, a superuser): no tenant API calls it. A slug change keeps the
    secret namespace."""
    fixed = set(fields) & set(TENANT_FIXED_FIELDS)
    if fixed:
        raise ValidationFailed(f"Fixed when the tenant was made: {', '.join(sorted(fixed))}.")
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
        before = config_snapshot(tenant)
        for name, value in fields.items():
            setattr(tenant, name, value)
        # Within the deployment's bound (ADR 0021); a stored value the deployment lowered since
        # is clamped at the take, and does not block an unrelated change.
        take_limits.tenant_take_limits_check(
            take_share=fields.get("take_share"), take_max_in_flight=fields.get("take_max_in_flight")
        )
        try:
            tenant.full_clean()
        except DjangoValidationError as exc:
            raise ValidationFailed("; ".join(exc.messages)) from exc
        tenant.save(update_fields=list(fields))
        config_change_of(tenant, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    return tenant


def apikey_create(
    *,
    tenant: Tenant,
    scopes: list[str] | None = None,
    name: str = "",
    expires_at: datetime | None = None,
    actor: str = "system",
) -> tuple[Any, str]:
    """Create an API key; the secret is returned once and only its sha256 is stored. After
    ``expires_at`` (if given) it authenticates nothing."""
    scopes = scopes or ["read", "write"]
    unknown = set(scopes) - set(ApiKey.SCOPES)
    if unknown:
        raise ValidationFailed(f"Unknown scopes: {', '.join(sorted(unknown))}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("An API key's expiry must lie in the future.")
    prefix = secrets.token_hex(4)
    secret = f"og_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            hashed_key=hash_api_key(secret),
            scopes=scopes,
            expires_at=expires_at,
        )
        config_change_of(api_key, actor=actor, action=ConfigChangeAction.CREATE)
    return api_key, secret


def apikey_revoke(*, api_key_id: int, actor: str = "system") -> None:
    with transaction.atomic():
        api_key = ApiKey.objects.select_for_update().filter(pk=api_key_id, revoked_at__isnull=True).first()
        if api_key is not None:
            before = config_snapshot(api_key)
            api_key.revoked_at = timezone.now()
            api_key.save(update_fields=["revoked_at"])
            config_change_of(api_key, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    API_KEYS.forget_where(lambda found: found[1].pk == api_key_id)


# Operational state the workers and operators move (throttling, pausing), and the adapter
# rollout's pointers, which the trail records by revision number (ledger.providers.revisions.rollout_state).
PROVIDER_STATE_FIELDS = (
    "throttled_until",
    "paused_at",
    "paused_reason",
    "revision",
    "canary_revision",
    "canary_percent",
    "canary_started_at",
)
# What ledger.rules.provider_checks looks at on every save.
_CHECKED_FIELDS = ("base_url", "lookup_path", "auth_secret_env")


def provider_slug_check(slug: str) -> str:
    """A slug a provider may be made under: the model field's shape and length (the console's
    form says the same), and none of the service's own (``_callbacks``…)."""
    if slug.startswith(RESERVED_PROVIDER_PREFIX):
        raise ValidationFailed(RESERVED_PROVIDER_DETAIL, extra={"field": "slug"})
    try:
        Provider._meta.get_field("slug").clean(slug, None)
    except DjangoValidationError as exc:
        raise ValidationFailed("; ".join(exc.messages), extra={"field": "slug"}) from None
    return slug


# A provider's fields that only the platform changes (ADR 0013): a tenant's own roles cannot
# switch off the second person their re-sends need.
PROVIDER_PLATFORM_FIELDS = ("resend_approval_required",)


def platform_owned_check(existing: Provider | None, fields: dict[str, Any]) -> None:
    """Refuse a tenant-side change of a platform-owned field (``platform_owned_setting``); a
    new provider made by a tenant starts with the platform's default."""
    for name in PROVIDER_PLATFORM_FIELDS:
        if name not in fields:
            continue
        current = getattr(existing, name) if existing is not None else Provider._meta.get_field(name).get_default()
        if bool(fields[name]) != bool(current):
            raise PlatformOwnedSetting(
                f"{name} is set by the platform: a tenant's roles cannot change it.", extra={"field": name}
            )


def provider_upsert(
    *,
    tenant: Tenant,
    slug: str,
    actor: str = "system",
    auth_secret: str | None = None,
    webhook_secret: str | None = None,
    reason: str = "",
    canary_percent: int | None = None,
    platform: bool = False,
    **fields: Any,
) -> Provider:
    """Create or update a tenant's provider, checked like a console save (``Provider.clean``:
    the outbound policy for its URLs, the declared set for an environment credential) and
    recorded as a configuration change. ``auth_secret``: a new credential to store sealed
    ("" clears it; None leaves it) — never returned, never recorded in clear;
    ``webhook_secret`` likewise (the key an asynchronous provider signs its webhooks with).

    A change of the adapter fields records the next adapter revision (``ledger.providers.revisions``):
    the stable one at once, or — with ``canary_percent`` — a canary taking that share of new
    operations while the provider keeps its stable revision (DESIGN §5, adapter revisions).
    ``reason`` says why, in the revision and the trail. ``platform``: the caller is the
    platform (a superuser, the command line), the only one who may change a platform-owned
    field (``PROVIDER_PLATFORM_FIELDS``: the four-eyes requirement, ADR 0013)."""
    provider_slug_check(slug)
    if auth_secret is not None:
        fields["auth_secret"] = sealed_credential(auth_secret)
    if webhook_secret is not None:
        fields["webhook_secret"] = sealed_credential(webhook_secret)
    unknown = set(fields) & set(PROVIDER_STATE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Not configuration: {', '.join(sorted(unknown))} (see ledger.providers.canary).")
    with transaction.atomic():
        existing = Provider.objects.select_for_update().filter(tenant=tenant, slug=slug).first()
        if not platform:
            platform_owned_check(existing, fields)
        before = config_snapshot(existing, exclude=PROVIDER_STATE_FIELDS) if existing is not None else None
        wanted = {
            name: fields.get(name, getattr(existing, name) if existing is not None else "") or ""
            for name in _CHECKED_FIELDS
        }
        # The stored namespace, never the slug (ADR 0001); read, not taken from ``tenant``,
        # which a caller may have built with only its id.
        namespace = Tenant.objects.filter(pk=tenant.pk).values_list("secret_namespace", flat=True).first() or ""
        errors, base_url = provider_config_errors(namespace=namespace, **wanted)
        if errors:
            text = " ".join(errors.values())
            raise DestinationNotAllowed(text) if "base_url" in errors else ValidationFailed(text)
        # The intent schema and request template (ledger.rules.intents): checked as a pair.
        intent_errors = intent_config_errors(
            **{
                name: fields[name] if name in fields else getattr(existing, name, None)
                for name in ("intent_schema", "request_template")
            },
            prompt_slots=prompt_slots_of(tenant.pk),
        )
        if intent_errors:
            raise RequestTemplateInvalid(" ".join(intent_errors.values()), extra={"fields": intent_errors})
        async_values = {
            name: fields[name] if name in fields else getattr(existing, name, Provider._meta.get_field(name).default)
            for name in ADAPTER_FIELDS
        }
        async_values = {k: (v() if callable(v) else v) for k, v in async_values.items()}
        async_errors = async_config_errors(async_values)
        if async_errors:
            raise ValidationFailed(" ".join(f"{name}: {message}." for name, message in async_errors.items()))
        if "base_url" in fields:
            # Stored in the canonical form the check saw.
            fields["base_url"] = base_url
        caps = {name: fields.get(name, getattr(existing, name, None)) for name in PROVIDER_CAP_FIELDS}
        if existing is None:
            # A new provider: what it does not say is the field's default (None: no cap).
            caps.update({name: fields.get(name, Provider._meta.get_field(name).get_default()) for name in caps})
        cap_errors = provider_caps_errors(**caps)
        if cap_errors:
            raise ValidationFailed(" ".join(cap_errors.values()))
        caps_changed = existing is not None and any(caps[name] != getattr(existing, name) for name in caps)
        if existing is None:
            if canary_percent is not None:
                raise ValidationFailed("A new provider has no stable revision to run a canary against.")
            provider = Provider.objects.create(tenant=tenant, slug=slug, **fields)
            revisions.revision_first(provider=provider, actor=actor, reason=reason)
            rollout_before: dict[str, Any] = {}
        else:
            rollout_before = revisions.rollout_state(existing)
            provider = existing
            for name, value in fields.items():
                setattr(provider, name, value)
            revisions.revision_for_save(
                candidate=provider,
                stored=Provider.objects.get(pk=existing.pk),
                actor=actor,
                reason=reason,
                canary_percent=canary_percent,
            )
            provider.save()
        # The trail records what is stored, however the caller typed it (a price of "0" from
        # the command, Decimal("0") from the console): every path writes the same row.
        provider.refresh_from_db()
        config_change_record(
            tenant_id=tenant.pk,
            actor=actor,
            action=ConfigChangeAction.CREATE if existing is None else ConfigChangeAction.UPDATE,
            object_type=provider._meta.label_lower,
            object_id=provider.pk,
            object_repr=str(provider),
            before={**before, **rollout_before} if before is not None else None,
            after={**config_snapshot(provider, exclude=PROVIDER_STATE_FIELDS), **revisions.rollout_state(provider)},
            reason=revisions.clean_reason(reason),
        )
        if caps_changed:
            ratelimit.provider_rate_reset(provider=provider)
    provider_cache_forget(provider)
    return provider


# --- Provider throttling and pausing (execute mode) -------------------------------------------


def provider_throttle(*, provider_id: int, seconds: float) -> None:
    """A 429/503 answer: workers take none of this provider's work until ``throttled_until``
    (database clock). Only ever extends, so two workers reporting at once keep the later time."""
    until = sql.db_now() + timedelta(seconds=min(max(0.0, seconds), MAX_DURATION_SECONDS))
    Provider.objects.filter(pk=provider_id).filter(
        Q(throttled_until__isnull=True) | Q(throttled_until__lt=until)
    ).update(throttled_until=until)
    log.info("provider_throttled provider=%s seconds=%.1f", provider_id, seconds)


def provider_pause(*, provider_id: int, reason: str, actor: str = "worker") -> bool:
    """401/403 from a provider: no worker sends to it until an operator resumes it.

    Returns True when this call paused it (and raised the alert); a provider already paused
    stays paused with its first reason."""
    reason = sanitize_message(reason)[:200]
    with transaction.atomic():
        paused = Provider.objects.filter(pk=provider_id, paused_at__isnull=True).update(
            paused_at=timezone.now(), paused_reason=reason, updated_at=timezone.now()
        )
        if paused:
            provider = Provider.objects.only("id", "tenant_id", "slug").get(pk=provider_id)
            hooks.alert_raised.send(
                tenant_id=provider.tenant_id,
                kind="provider_paused",
                ref=provider.slug,
                summary=f"provider {provider.slug} paused: {reason}",
            )
    if paused:
        log.warning("provider_paused provider=%s actor=%s reason=%s", provider_id, actor, reason)
    return bool(paused)


def provider_resume(*, provider_id: int, actor: str) -> bool:
    """An operator's decision: the provider's queued work flows again. Recorded in the
    configuration trail in the same transaction, for the console's action and
    ``manage.py provider_resume`` alike (ADR 0006)."""
    with transaction.atomic():
        stored = Provider.objects.filter(pk=provider_id).first()
        before = config_snapshot(stored) if stored is not None else None
        resumed = Provider.objects.filter(pk=provider_id, paused_at__isnull=False).update(
            paused_at=None, paused_reason="", throttled_until=None, updated_at=timezone.now()
        )
        if resumed and stored is not None:
            stored.refresh_from_db()
            config_change_of(stored, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
    if resumed:
        log.info("provider_resumed provider=%s actor=%s", provider_id, actor)
    return bool(resumed)
