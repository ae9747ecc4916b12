"""Console saves of configuration leave their trace: every add, change and delete of a
configuration model through the console writes a ``ConfigChange`` row (ledger.tenants.config_changes)
in the transaction of the save, with the user as actor and secrets masked.

The console's site (review.console.site) mixes :class:`ConfigChangeAdminMixin` into every
ModelAdmin; it acts on the models listed in :data:`AUDITED` only. The services of each app
record the changes made outside the console (management commands, API) themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from alerts.services import CHANNEL_SECRET_FIELDS, CHANNEL_STATE_FIELDS
from dlq.n8n.connections import N8N_SECRET_FIELDS
from ledger.models import ConfigChangeAction
from ledger.protocol.services import PROVIDER_STATE_FIELDS
from ledger.tenants.config_changes import config_change_of, config_snapshot
from review.models import StaffTenant


@dataclass(frozen=True)
class Audited:
    secret: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


# Configuration, staff roles and tenant memberships, by model label: which fields are
# secrets (masked) and which are bookkeeping (left out).
AUDITED: dict[str, Audited] = {
    "ledger.tenant": Audited(secret=("callback_secret",)),
    "ledger.provider": Audited(exclude=PROVIDER_STATE_FIELDS),
    "ledger.apikey": Audited(secret=("hashed_key",)),
    "dlq.replaytarget": Audited(),
    "dlq.n8nconnection": Audited(secret=N8N_SECRET_FIELDS),
    "alerts.alertchannel": Audited(secret=CHANNEL_SECRET_FIELDS, exclude=CHANNEL_STATE_FIELDS),
    "review.retentionpolicy": Audited(),
    "review.stafftenant": Audited(),
    # A staff user's roles are their groups; the password hash is masked.
    "auth.user": Audited(secret=("password",), exclude=("date_joined",)),
    # A role's permissions.
    "auth.group": Audited(),
}

_BEFORE = "_onceguard_config_before"


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _tenants_of(obj: models.Model) -> list[int | None]:
    """The tenants a change belongs to: a user's change is shown to each tenant they work
    for (a new admin of tenant A is A's business); None = platform-level."""
    if obj._meta.label_lower == "auth.user":
        return list(StaffTenant.objects.filter(user_id=obj.pk).values_list("tenant_id", flat=True)) or [None]
    if obj._meta.label_lower == "auth.group":
        return [None]
    return [getattr(obj, "tenant_id", None) if obj._meta.label_lower != "ledger.tenant" else obj.pk]


def _record(request: HttpRequest, obj: models.Model, spec: Audited, *, action: str, before: Any = None) -> None:
    for tenant_id in _tenants_of(obj):
        config_change_of(
            obj,
            actor=_actor(request),
            action=action,
            before=before,
            secret_fields=spec.secret,
            exclude=spec.exclude,
            tenant_id=tenant_id,
        )


class ConfigChangeAdminMixin:
    """Records console adds, changes and deletes of the models in :data:`AUDITED`."""

    def _audited(self) -> Audited | None:
        return AUDITED.get(self.model._meta.label_lower)  # type: ignore[attr-defined]

    def _saved_by_service(self) -> bool:
        # Pages whose saves call the object's service (ledger.web.console_base.ServiceSaveAdmin,
        # ADR 0006): the service writes the row, the same one as the command's and the API's.
        return bool(getattr(self, "config_change_by_service", False))

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        spec = self._audited()
        if spec is not None and not self._saved_by_service():
            before = None
            if change and obj.pk is not None:
                stored = type(obj)._default_manager.filter(pk=obj.pk).first()
                before = config_snapshot(stored, exclude=spec.exclude) if stored is not None else None
            setattr(request, _BEFORE, before)
        super().save_model(request, obj, form, change)  # type: ignore[misc]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # After the many-to-many fields are saved: a user's groups (roles) are part of it.
        super().save_related(request, form, formsets, change)  # type: ignore[misc]
        spec = self._audited()
        if spec is not None and not self._saved_by_service():
            before = getattr(request, _BEFORE, None)
            action = ConfigChangeAction.UPDATE if change and before is not None else ConfigChangeAction.CREATE
            _record(request, form.instance, spec, action=action, before=before)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        spec = self._audited()
        if spec is not None:
            _record(request, obj, spec, action=ConfigChangeAction.DELETE)
        super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        spec = self._audited()
        if spec is not None:
            for obj in queryset:
                _record(request, obj, spec, action=ConfigChangeAction.DELETE)
        super().delete_queryset(request, queryset)  # type: ignore[misc]
