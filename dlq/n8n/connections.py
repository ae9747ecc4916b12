"""A tenant's n8n connection, written one way (ADR 0006): ``manage.py n8n_connect`` and the
console's form call ``n8n_connection_save``. The URL passes the outbound policy and is stored
canonical, the API key is sealed, and every change is in the configuration trail with the key
masked (``N8N_SECRET_FIELDS``).
"""

from __future__ import annotations

import logging
import re

from django.db import transaction
from django.utils import timezone

from dlq.models import N8nConnection
from dlq.rules.destinations import n8n_base_url_check, n8n_timeout_check
from ledger.models import ConfigChangeAction, Tenant
from ledger.platform.errors import ValidationFailed
from ledger.providers.credentials import sealed_credential
from ledger.tenants.config_changes import config_change_of, config_snapshot

log = logging.getLogger("onceguard.dlq")


# Masked in the configuration trail (the console's saves: review.audit.changes.AUDITED).
N8N_SECRET_FIELDS = ("api_key_secret",)
# What n8n's keys look like (JWTs; older `n8n_api_…` keys): printable, no spaces, bounded.
_N8N_API_KEY = re.compile(r"^[\x21-\x7e]{1,4096}$")


def n8n_api_key_check(api_key: str) -> str:
    api_key = api_key.strip()
    if not _N8N_API_KEY.match(api_key):
        raise ValidationFailed("The n8n API key must be 1–4096 printable characters without spaces.")
    return api_key


def n8n_connection_save(
    *,
    tenant: Tenant,
    base_url: str,
    api_key: str | None = None,
    timeout_seconds: float | None = None,
    active: bool | None = None,
    actor: str,
) -> N8nConnection:
    """Create or update the tenant's n8n connection (``manage.py n8n_connect``; the console's
    form does the same through the model). The URL passes the outbound policy and is stored
    canonical; ``api_key`` is sealed (None keeps the stored one; a new connection needs one).
    The change is recorded in the configuration trail with the key masked."""
    url = n8n_base_url_check(base_url)
    if api_key is not None:
        api_key = n8n_api_key_check(api_key)
    if timeout_seconds is not None:
        timeout_seconds = n8n_timeout_check(timeout_seconds)
    with transaction.atomic():
        connection = N8nConnection.objects.select_for_update().filter(tenant_id=tenant.pk).first()
        before = config_snapshot(connection) if connection is not None else None
        if connection is None:
            if not api_key:
                raise ValidationFailed("A new n8n connection needs the n8n API key.")
            connection = N8nConnection(tenant=tenant)
        connection.base_url = url
        if api_key:
            connection.api_key_secret = sealed_credential(api_key)
            connection.api_key_set_at = timezone.now()
        if timeout_seconds is not None:
            connection.timeout_seconds = float(timeout_seconds)
        if active is not None:
            connection.active = active
        connection.save()
        config_change_of(
            connection,
            actor=actor,
            action=ConfigChangeAction.CREATE if before is None else ConfigChangeAction.UPDATE,
            before=before,
            secret_fields=N8N_SECRET_FIELDS,
        )
    log.info("n8n_connection_saved tenant=%s key_replaced=%s active=%s", tenant.slug, bool(api_key), connection.active)
    return connection


def n8n_connection_delete(*, tenant: Tenant, actor: str) -> bool:
    """Remove the tenant's n8n connection and its key; False when there was none."""
    with transaction.atomic():
        connection = N8nConnection.objects.select_for_update().filter(tenant_id=tenant.pk).first()
        if connection is None:
            return False
        config_change_of(connection, actor=actor, action=ConfigChangeAction.DELETE, secret_fields=N8N_SECRET_FIELDS)
        connection.delete()
    log.info("n8n_connection_deleted tenant=%s", tenant.slug)
    return True
