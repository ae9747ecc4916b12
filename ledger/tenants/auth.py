"""API-key authentication (``Authorization: Bearer <key>``) and scope checks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from ledger.models import ApiKey, Tenant
from ledger.platform.caching import TtlCache


def hash_api_key(secret: str) -> str:
    # API keys are 256-bit random secrets: a fast hash is enough (no dictionary to try).
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class ApiPrincipal:
    """The caller behind an API key: what views need, without a Django user."""

    api_key_id: int
    prefix: str
    tenant: Tenant
    scopes: frozenset[str]
    # Checked on every request, not only when the key is loaded: a cached key expires on time.
    expires_at: datetime | None = None

    is_authenticated = True

    @property
    def actor(self) -> str:
        return f"apikey:{self.prefix}"


def _load_principal(hashed: str) -> tuple[ApiPrincipal, ApiKey] | None:
    try:
        api_key = ApiKey.objects.select_related("tenant").get(hashed_key=hashed, revoked_at__isnull=True)
    except ApiKey.DoesNotExist:
        return None
    principal = ApiPrincipal(
        api_key_id=api_key.pk,
        prefix=api_key.prefix,
        tenant=api_key.tenant,
        scopes=frozenset(api_key.scopes),
        expires_at=api_key.expires_at,
    )
    return principal, api_key


# Valid keys by hash, for API_KEY_CACHE_SECONDS: revocation reaches every node within that.
API_KEYS: TtlCache[tuple[ApiPrincipal, ApiKey]] = TtlCache("API_KEY_CACHE_SECONDS")


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        found = API_KEYS.get(hash_api_key(secret.strip()), lambda: _load_principal(hash_api_key(secret.strip())))
        if found is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        expires_at = found[0].expires_at
        if expires_at is not None and expires_at <= timezone.now():
            raise exceptions.AuthenticationFailed("This API key has expired.")
        return found

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


# Scopes `admin` does not imply (ApiKey.SCOPES says what each allows): `payload` reveals a
# person's data and `approve` is the second pair of eyes on another's re-send (ADR 0013);
# handing an automation an admin key must hand it neither.
SCOPES_NOT_IMPLIED_BY_ADMIN = frozenset({"payload", "approve"})


class HasApiKeyScope(permissions.BasePermission):
    """Safe methods need `read`; anything else needs `write` (or the view's `required_scope`).
    `admin` implies every scope but those of ``SCOPES_NOT_IMPLIED_BY_ADMIN``."""

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, ApiPrincipal):
            raise exceptions.NotAuthenticated()
        needed = getattr(view, "required_scope", None) or (
            "read" if request.method in permissions.SAFE_METHODS else "write"
        )
        if needed in principal.scopes:
            return True
        if "admin" in principal.scopes and needed not in SCOPES_NOT_IMPLIED_BY_ADMIN:
            return True
        implied = " (not implied by admin)" if needed in SCOPES_NOT_IMPLIED_BY_ADMIN else ""
        raise exceptions.PermissionDenied(f"This API key lacks the '{needed}' scope{implied}.")


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents the Bearer API key in the OpenAPI schema."""

    target_class = "ledger.tenants.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A tenant API key: `Authorization: Bearer og_…`"}
