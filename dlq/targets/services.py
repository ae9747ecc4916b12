"""Replay targets, written one way (ADR 0006): ``manage.py replaytarget_upsert`` and the
console call ``replay_target_upsert`` — the URLs checked, the credential sealed, a new target's
signing secret made, the default moved, each change in the configuration trail. The signing
secrets a replay is signed with (made on first use, rotated with an overlap) and what the
console says of them instead of showing them.
"""

from __future__ import annotations

import re
import secrets
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlq.models import N8nConnection, ReplayAck, ReplayTarget
from dlq.rules.conf import dlq_setting
from dlq.rules.destinations import replay_target_url_check
from ledger.models import ConfigChangeAction, IdempotencyClass, Tenant
from ledger.platform.errors import ValidationFailed
from ledger.providers.credentials import sealed_credential, secret_open, signing_secret_summary, signing_secrets_now
from ledger.tenants.config_changes import config_change_of, config_change_record, config_snapshot


def replay_target_upsert(
    *,
    tenant: Tenant,
    slug: str,
    url: str,
    idempotency_header: str | None = None,
    timeout_seconds: float | None = None,
    is_default: bool | None = None,
    auto_replay: bool | None = None,
    active: bool | None = None,
    idempotency_class: str | None = None,
    lookup_url: str | None = None,
    credential_header: str | None = None,
    credential_value: str | None = None,
    ack: str | None = None,
    actor: str = "system",
) -> ReplayTarget:
    """Create or update a tenant's replay target; ``is_default`` moves the default to it.
    Each target changed is recorded (ledger.tenants.config_changes, secrets masked).

    ``idempotency_class``: declaring it confirms it; a target created without one is
    key-advisory and unconfirmed, as migrated ones are (the console and the command require
    it for new targets). ``credential_value``: None keeps the stored one, "" removes it; it is
    stored sealed. A new target gets its signing secret, returned in clear once as the
    instance's ``new_signing_secret`` ("" for an update).

    ``ack`` (ReplayAck, ADR 0007): declaring it confirms it. A new target created without one
    is ``echo`` when its URL is on the tenant's n8n (its n8n connection's origin: an n8n
    receiver), else ``status``, and unconfirmed either way, listed for the operator."""
    # The model fields' own rules (a slug's shape, lengths): what the console's form says,
    # said the same way to the command (ADR 0006), and never a database error.
    for name, value in (("slug", slug), ("idempotency_header", idempotency_header)):
        if value is not None:
            try:
                ReplayTarget._meta.get_field(name).clean(value, None)
            except DjangoValidationError as exc:
                raise ValidationFailed("; ".join(exc.messages), extra={"field": name}) from None
    # Checked and stored in canonical form (ledger.rules.outbound, https unless loopback): the URL
    # replays will be sent to.
    fields: dict[str, Any] = {"url": replay_target_url_check(url)}
    if idempotency_class is not None:
        if idempotency_class not in IdempotencyClass.values:
            raise ValidationFailed(
                f"idempotency_class must be one of {', '.join(IdempotencyClass.values)}.",
                extra={"field": "idempotency_class"},
            )
        fields.update(idempotency_class=idempotency_class, class_confirmed=True)
    if ack is not None:
        if ack not in ReplayAck.values:
            raise ValidationFailed(f"ack must be one of {', '.join(ReplayAck.values)}.", extra={"field": "ack"})
        fields.update(ack=ack, ack_confirmed=True)
    if lookup_url is not None:
        fields["lookup_url"] = replay_target_url_check(lookup_url, lookup=True) if lookup_url else ""
    if credential_header is not None:
        if credential_header and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}", credential_header):
            raise ValidationFailed(
                "credential_header must be an HTTP header name.", extra={"field": "credential_header"}
            )
        fields["credential_header"] = credential_header
    if credential_value is not None:
        if credential_value and not credential_value.isprintable():
            raise ValidationFailed("The credential must be printable text.", extra={"field": "credential"})
        fields["credential_secret"] = sealed_credential(credential_value) if credential_value else None
    for name, value in (
        ("idempotency_header", idempotency_header),
        ("timeout_seconds", timeout_seconds),
        ("is_default", is_default),
        ("auto_replay", auto_replay),
        ("active", active),
    ):
        if value is not None:
            fields[name] = value
    with transaction.atomic():
        if is_default:
            for other in (
                ReplayTarget.objects.select_for_update().filter(tenant=tenant, is_default=True).exclude(slug=slug)
            ):
                before = config_snapshot(other)
                other.is_default = False
                other.save(update_fields=["is_default", "updated_at"])
                config_change_of(other, actor=actor, action=ConfigChangeAction.UPDATE, before=before)
        existing = ReplayTarget.objects.select_for_update().filter(tenant=tenant, slug=slug).first()
        before = config_snapshot(existing) if existing is not None else None
        fresh = ""
        if existing is None:
            fresh = secrets.token_urlsafe(32)
            fields["signing_secret"] = sealed_credential(fresh)
            if idempotency_class is None:
                fields.update(idempotency_class=IdempotencyClass.KEY_ADVISORY, class_confirmed=False)
            if ack is None:
                fields.update(ack=_undeclared_ack(tenant_id=tenant.pk, url=fields["url"]), ack_confirmed=False)
        target, created = ReplayTarget.objects.update_or_create(tenant=tenant, slug=slug, defaults=fields)
        # The only clear copy, for the caller to show once (the command, the console).
        target.new_signing_secret = fresh
        config_change_of(
            target,
            actor=actor,
            action=ConfigChangeAction.CREATE if created else ConfigChangeAction.UPDATE,
            before=before,
        )
    return target


def _undeclared_ack(*, tenant_id: int, url: str) -> str:
    """The acknowledgement a new target gets when none is declared: ``echo`` for a URL on the
    tenant's n8n (the n8n connection's scheme, host and port — an n8n receiver, which can
    send it and whose bare 2xx may be n8n's own), else ``status`` (what targets did before)."""
    base = N8nConnection.objects.filter(tenant_id=tenant_id).values_list("base_url", flat=True).first()
    if base and _origin(url) == _origin(base):
        return ReplayAck.ECHO
    return ReplayAck.STATUS


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def replay_target_signing_secret(*, target_id: int, rotate: bool = False, actor: str = "system") -> tuple[str, bool]:
    """(the target's current signing secret, whether it was just made). Made on first use
    (a guarded update: two racing first uses agree on one). ``rotate`` makes a new one and
    keeps the old one signing for DLQ ``REPLAY_SECRET_OVERLAP_SECONDS`` — the scheme of
    ``ledger.protocol.callbacks.tenant_callback_secret``. Callers show it only when it was just made."""
    fresh = secrets.token_urlsafe(32)
    sealed = sealed_credential(fresh)
    with transaction.atomic():
        if rotate:
            # The sealed value moves as it is: the previous secret is never opened here.
            changed = ReplayTarget.objects.filter(pk=target_id).update(
                signing_secret_previous=F("signing_secret"),
                signing_secret=sealed,
                signing_secret_rotated_at=timezone.now(),
            )
        else:
            changed = ReplayTarget.objects.filter(pk=target_id, signing_secret__isnull=True).update(
                signing_secret=sealed
            )
        if changed:
            target = ReplayTarget.objects.get(pk=target_id)
            config_change_record(
                tenant_id=target.tenant_id,
                actor=actor,
                action=ConfigChangeAction.UPDATE,
                object_type=target._meta.label_lower,
                object_id=target_id,
                object_repr=str(target),
                before={"signing_secret": (target.signing_secret_previous if rotate else None) or ""},
                after={"signing_secret": sealed},
                secret_fields=("signing_secret",),
            )
    if changed:
        return fresh, True
    return secret_open(ReplayTarget.objects.values_list("signing_secret", flat=True).get(pk=target_id)), False


def replay_target_signing_secrets(*, target_id: int) -> list[str]:
    """The secrets a replay is signed with now: the current one, and the previous one while
    the rotation's overlap lasts (one ``v1=`` each, current first)."""
    current, _made = replay_target_signing_secret(target_id=target_id)
    previous, rotated_at = ReplayTarget.objects.values_list("signing_secret_previous", "signing_secret_rotated_at").get(
        pk=target_id
    )
    return signing_secrets_now(
        current=current, previous=previous, rotated_at=rotated_at, overlap_seconds=_replay_overlap_seconds()
    )


def _replay_overlap_seconds() -> float:
    return float(dlq_setting("REPLAY_SECRET_OVERLAP_SECONDS"))


def replay_target_secret_summary(target: ReplayTarget) -> str:
    """What the console says about a target's signing secret instead of showing it."""
    return signing_secret_summary(
        current=target.signing_secret,
        previous=target.signing_secret_previous,
        rotated_at=target.signing_secret_rotated_at,
        overlap_seconds=_replay_overlap_seconds(),
        unset="not made yet (made at the first replay; rotate to get one you can copy)",
    )
