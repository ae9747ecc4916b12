"""Tenant scoping for staff: the one place that decides which tenants' rows a user sees.

* ``tenant_ids_for_user`` — None for superusers (every tenant), else the user's StaffTenant
  memberships (a staff user with none sees nothing).
* ``TenantScopeMiddleware`` puts that on ``request.onceguard_tenant_ids`` for every request.
* ``TenantScopedAdminMixin`` is mixed into EVERY ModelAdmin by the console's admin site
  (review.console.site.OnceguardAdminSite.register), so lists, searches, filters, detail pages,
  actions, autocompletes and exports of every model — whoever wrote the ModelAdmin — only
  ever see rows of the user's tenants. Models without a path to a tenant are superuser-only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.contrib import admin
from django.contrib.admin.filters import RelatedFieldListFilter
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from ledger.models import Tenant
from review.models import StaffTenant

ATTR = "onceguard_tenant_ids"


def tenant_ids_for_user(user: Any) -> list[int] | None:
    """None = every tenant (superuser); otherwise the list (possibly empty)."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return []
    if user.is_superuser:
        return None
    return sorted(StaffTenant.objects.filter(user_id=user.pk).values_list("tenant_id", flat=True))


def tenant_ids_for_request(request: HttpRequest) -> list[int] | None:
    if not hasattr(request, ATTR):
        setattr(request, ATTR, tenant_ids_for_user(getattr(request, "user", None)))
    return getattr(request, ATTR)


class TenantScopeMiddleware:
    """Computes ``request.onceguard_tenant_ids`` once per signed-in console request (after
    auth): None for superusers, else the list of the user's tenants. API requests are scoped
    by their key's tenant instead."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if not request.path.startswith("/api/") and user is not None and user.is_authenticated:
            setattr(request, ATTR, tenant_ids_for_user(user))
        return self.get_response(request)


def scope_of(request: HttpRequest) -> list[int] | None:
    return tenant_ids_for_request(request)


# A model's path to its tenant is fixed once the apps are loaded; asked on every query a
# console page scopes and for every model its app list checks.
@cache
def tenant_path(model: type[models.Model], depth: int = 3) -> str | None:
    """The ORM path from ``model`` to its tenant id: ``id`` for Tenant itself, ``tenant_id``
    for a model with a tenant FK, ``operation__tenant_id`` through one FK, and so on."""
    if model is Tenant or (model._meta.proxy and model._meta.concrete_model is Tenant):
        return "id"
    for field in model._meta.concrete_model._meta.get_fields():
        # A foreign key, or a one-to-one keyed by tenant (its forward side: dlq.N8nConnection).
        forward = getattr(field, "many_to_one", False) or (getattr(field, "one_to_one", False) and field.concrete)
        if forward and field.related_model is Tenant:
            return f"{field.name}_id"
    if depth <= 1:
        return None
    for field in model._meta.concrete_model._meta.get_fields():
        if getattr(field, "many_to_one", False) and field.concrete and field.related_model is not model:
            inner = tenant_path(field.related_model, depth - 1)
            if inner and inner != "id":
                return f"{field.name}__{inner}"
            if inner == "id":
                return f"{field.name}_id"
    return None


def scope_queryset(qs: QuerySet[Any], tenant_ids: list[int] | None) -> QuerySet[Any]:
    """Rows of ``qs`` within ``tenant_ids`` (None: all). Models without a tenant: none."""
    if tenant_ids is None:
        return qs
    path = tenant_path(qs.model)
    if path is None:
        return qs.none()
    return qs.filter(**{f"{path}__in": tenant_ids})


def object_tenant_id(obj: models.Model) -> int | None:
    path = tenant_path(type(obj))
    if path is None:
        return None
    value: Any = obj
    for part in path.split("__"):
        if value is None:
            return None
        value = getattr(value, part)
    return value


def in_scope(obj: models.Model | None, tenant_ids: list[int] | None) -> bool:
    if obj is None or tenant_ids is None:
        return True
    return object_tenant_id(obj) in tenant_ids


class ScopedRelatedFieldListFilter(RelatedFieldListFilter):
    """A related filter whose choices come from the related table (tenants, providers),
    scoped to the user's tenants: the stock one lists every row of it, and the
    "related only" one scans the (big) listed table for distinct values."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        qs = scope_queryset(field.related_model._default_manager.all(), scope_of(request))
        # A row that names itself by its tenant (a provider is "tenant/slug") reads it in the
        # same query: one query for the choices, not one more per choice.
        path = tenant_path(field.related_model)
        if path and path != "id" and "__" not in path:
            qs = qs.select_related(path.removesuffix("_id"))
        ordering = self.field_admin_ordering(field, request, model_admin)
        if ordering:
            qs = qs.order_by(*ordering)
        return [(obj.pk, str(obj)) for obj in qs[:500]]


class TenantScopedAdminMixin:
    """Mixed in front of every registered ModelAdmin by the console's admin site."""

    onceguard_scoped = True

    def _scope(self, request: HttpRequest) -> list[int] | None:
        return scope_of(request)

    def tenant_scope(self, request: HttpRequest) -> list[int] | None:
        """The user's tenant ids (None: every tenant), for list filters of the wrapped admin
        (the DLQ's tenant filter asks this instead of importing the console)."""
        return scope_of(request)

    def _tenantless(self) -> bool:
        return tenant_path(self.model) is None  # type: ignore[attr-defined]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scope_queryset(super().get_queryset(request), self._scope(request))  # type: ignore[misc]

    # Models with no tenant (users, groups, django-q's tables) are for superusers only.
    def has_module_permission(self, request: HttpRequest) -> bool:
        if self._tenantless() and not request.user.is_superuser:
            return False
        return super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self._tenantless() and not request.user.is_superuser:
            return False
        return in_scope(obj, self._scope(request)) and super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self._tenantless() and not request.user.is_superuser:
            return False
        return in_scope(obj, self._scope(request)) and super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self._tenantless() and not request.user.is_superuser:
            return False
        return in_scope(obj, self._scope(request)) and super().has_delete_permission(request, obj)  # type: ignore[misc]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        if self._tenantless() and not request.user.is_superuser:
            return False
        return super().has_add_permission(request, *args)  # type: ignore[misc]

    def get_list_filter(self, request: HttpRequest) -> list[Any]:
        # A plain related filter lists every tenant / provider in the database; only the
        # user's tenants (and their rows) may be offered.
        filters = list(super().get_list_filter(request))  # type: ignore[misc]
        out: list[Any] = []
        for item in filters:
            if isinstance(item, str) and "__" not in item:
                try:
                    field = self.model._meta.get_field(item)  # type: ignore[attr-defined]
                except Exception:
                    out.append(item)
                    continue
                if field.is_relation:
                    out.append((item, ScopedRelatedFieldListFilter))
                    continue
            out.append(item)
        return out

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # Choices of a related model (tenant, provider, target) are scoped too, so a form
        # can neither show nor accept another tenant's rows.
        scope = self._scope(request)
        if scope is not None and "queryset" not in kwargs:
            kwargs["queryset"] = scope_queryset(db_field.related_model._default_manager.all(), scope)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        scope = self._scope(request)
        if scope is not None and object_tenant_id(obj) not in scope:
            raise PermissionDenied("That tenant is not one of yours.")
        super().save_model(request, obj, form, change)  # type: ignore[misc]


def scoped_admin_class(admin_class: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    if getattr(admin_class, "onceguard_scoped", False):
        return admin_class
    return type(admin_class.__name__, (TenantScopedAdminMixin, admin_class), {"__module__": admin_class.__module__})
