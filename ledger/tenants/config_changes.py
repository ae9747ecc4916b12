"""The trail of who changed what (DESIGN §8): one append-only ``ConfigChange`` row per change
of configuration — providers, API keys, tenants and their callback settings (the ledger's
own services), replay targets, alert channels, retention policies, staff roles and tenant
memberships (the apps above call :func:`config_change_record` from their services and from
the console's save paths, review.audit.changes). The lowest layer that can hold it: every app may
write here, and it imports nothing above the ledger.

A module of its own rather than part of ``ledger.protocol.services``: ``ledger.protocol.callbacks`` (imported
by the services) records callback-secret changes too.

Values are JSON (datetimes ISO, decimals as text, durations in words as the console shows
them, "30 days"; foreign keys by id, many-to-many relations by name). Secrets never reach the table: a field named like one
(``secret``, ``password``, ``token``, ``credential``, ``hashed_key``…) or declared secret by
the caller (an alert channel's webhook URL) is stored as ``‹secret›`` — and as
``‹secret, replaced›`` when it changed; URLs lose their credentials and query string.
"""

from __future__ import annotations

import getpass
import re
import uuid
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.db import models
from django.utils import timezone

from ledger.models import ConfigChange, ConfigChangeAction, Tenant
from ledger.platform import durations

SECRET_MASK = "‹secret›"
SECRET_REPLACED = "‹secret, replaced›"
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|hashed_key|private_key", re.IGNORECASE)
# Bookkeeping that changes with every save or use: never a configuration change of its own.
NOISE_FIELDS = frozenset({"updated_at", "last_used_at", "last_login"})


def cli_actor() -> str:
    """The actor of a management command: the operating-system account that ran it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


def config_value(value: Any) -> Any:
    """``value`` as JSON the table can hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return durations.duration_words(value, exact=True)  # "30 days", as the console shows it
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, dict):
        return {str(k): config_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [config_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(str(v) for v in value)
    return str(value)


def config_snapshot(obj: models.Model, *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The configuration an object holds: its concrete fields (foreign keys by id) and, once
    saved, its many-to-many relations by name (a user's groups = their roles)."""
    skip = set(exclude) | NOISE_FIELDS | {"id"}
    data: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.name not in skip:
            data[field.name] = config_value(field.value_from_object(obj))
    if obj.pk is not None:
        for field in obj._meta.many_to_many:
            if field.name not in skip:
                data[field.name] = sorted(str(related) for related in getattr(obj, field.name).all())
    return data


def _mask_url(text: str) -> str:
    """A URL's credentials and query (where tokens travel) never reach the table."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return SECRET_MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{SECRET_MASK}@{netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, SECRET_MASK if parts.query else "", ""))


def _mask(name: str, value: Any, secret_fields: frozenset[str]) -> Any:
    if value in (None, "", [], {}):
        return value
    # `…_env` names an environment variable: which one is configuration, not a secret.
    if name in secret_fields or (_SECRET_NAME.search(name) and not name.endswith("_env")):
        return SECRET_MASK
    if isinstance(value, str) and value[:8].lower().startswith(("http://", "https://")):
        return _mask_url(value)
    return value


def config_change_record(
    *,
    tenant_id: int | None,
    actor: str,
    action: str,
    object_type: str,
    object_id: Any = "",
    object_repr: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    secret_fields: Iterable[str] = (),
    reason: str = "",
) -> ConfigChange | None:
    """Append one change (in the caller's transaction). For an update only the fields whose
    values differ are kept; None when nothing did (a save that changed nothing). ``reason``:
    why, where the change path asks for one (an adapter rollout's moves)."""
    secret = frozenset(secret_fields)
    before = {k: config_value(v) for k, v in (before or {}).items()}
    after = {k: config_value(v) for k, v in (after or {}).items()}
    if action == ConfigChangeAction.UPDATE:
        names = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if not names:
            return None
        before = {k: before.get(k) for k in names}
        after = {k: after.get(k) for k in names}
    masked_before = {k: _mask(k, v, secret) for k, v in before.items()}
    masked_after = {k: _mask(k, v, secret) for k, v in after.items()}
    for name, value in masked_after.items():
        # Both sides of a replaced secret mask alike: say that it changed, never to what.
        if value == SECRET_MASK and masked_before.get(name) == SECRET_MASK:
            masked_after[name] = SECRET_REPLACED
    return ConfigChange.objects.create(
        tenant_id=tenant_id,
        at=timezone.now(),
        actor=str(actor)[:150],
        action=action,
        object_type=object_type[:50],
        object_id=str(object_id if object_id is not None else "")[:64],
        object_repr=str(object_repr)[:200],
        before=masked_before or None,
        after=masked_after or None,
        reason=" ".join(str(reason or "").split())[:500],
    )


def tenant_of(obj: models.Model) -> int | None:
    if isinstance(obj, Tenant):
        return obj.pk
    return getattr(obj, "tenant_id", None)


def config_change_of(
    obj: models.Model,
    *,
    actor: str,
    action: str,
    before: dict[str, Any] | None = None,
    secret_fields: Iterable[str] = (),
    exclude: Iterable[str] = (),
    tenant_id: int | None = None,
) -> ConfigChange | None:
    """Record a change of ``obj``: ``before`` is its :func:`config_snapshot` taken before the
    change (None on create); the state after is read from ``obj`` (none on delete)."""
    after = None if action == ConfigChangeAction.DELETE else config_snapshot(obj, exclude=exclude)
    if action == ConfigChangeAction.DELETE and before is None:
        before = config_snapshot(obj, exclude=exclude)
    return config_change_record(
        tenant_id=tenant_id if tenant_id is not None else tenant_of(obj),
        actor=actor,
        action=action,
        object_type=obj._meta.label_lower,
        object_id=obj.pk,
        object_repr=str(obj),
        before=before,
        after=after,
        secret_fields=secret_fields,
    )
