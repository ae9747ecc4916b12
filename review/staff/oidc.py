"""Single sign-on to the console through the organisation's OpenID Connect provider (ADR 0014).

mozilla-django-oidc runs the authorization-code flow (state, nonce, PKCE S256) and fetches the
provider's keys; :class:`ConsoleOidcBackend` adds what it leaves out and what the console needs:

* the ID token is checked in full — signature by the provider's key and the one configured
  algorithm, ``iss`` equal to CONSOLE_OIDC_ISSUER, ``aud`` naming our client id (and ``azp``
  when there are several audiences), ``exp``/``iat`` present and current, the session's nonce;
* the person is their (issuer, subject) pair (``OidcIdentity``), never their e-mail address;
* their groups (CONSOLE_OIDC_ROLE_CLAIM) become console roles through CONSOLE_OIDC_ROLE_MAP and
  their tenants come from CONSOLE_OIDC_TENANT_CLAIM, set afresh at every sign-in, so a change
  at the provider applies at the next one; each change leaves a ConfigChange row;
* a person with no mapped role (or, with a tenant claim, no known tenant) is refused with a
  named reason the sign-in page shows (:class:`SignInRefused`), never a 500.

Accounts made here are staff, never superusers, and have no usable password: the platform's
break-glass superuser stays a local account (with its second factor, review.staff.mfa).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from ledger.models import ConfigChangeAction, Tenant
from ledger.platform.errors import DomainError
from ledger.tenants.config_changes import config_change_record
from review.models import OidcIdentity, StaffTenant
from review.staff.roles import ROLES

log = logging.getLogger("onceguard.sign_in")

CALLBACK_URL_NAME = "admin:onceguard_oidc_callback"
# Where the backend leaves why a sign-in was refused, for the page that says so.
REFUSAL_ATTR = "onceguard_sign_in_refused"
# Seconds of clock difference with the provider tolerated on exp/iat/nbf.
CLOCK_LEEWAY_SECONDS = 60


class SignInRefused(DomainError):
    status, code, title = 403, "sign_in_refused", "Sign-in refused"


class TokenInvalid(SignInRefused):
    """The provider's answer did not prove who signed in (signature, issuer, audience, expiry, nonce)."""

    code, title = "sso_token_invalid", "The identity provider's answer could not be verified"


class ProviderUnavailable(SignInRefused):
    status, code, title = 502, "sso_provider_unavailable", "The identity provider did not answer"


class NoMappedRole(SignInRefused):
    code, title = "sso_no_role", "None of your groups at the identity provider gives a console role"


class NoKnownTenant(SignInRefused):
    code, title = "sso_no_tenant", "Your identity provider names no tenant of this service"


def oidc_enabled() -> bool:
    """Single sign-on is on when the client id and the issuer are set."""
    return bool(settings.OIDC_RP_CLIENT_ID and settings.CONSOLE_OIDC_ISSUER)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(v) for v in value if isinstance(v, str | int)]
    return []


def roles_from_claims(claims: dict[str, Any]) -> list[str]:
    """The console roles the provider's groups map to (unknown groups and roles ignored)."""
    role_map = settings.CONSOLE_OIDC_ROLE_MAP
    groups = _as_list(claims.get(settings.CONSOLE_OIDC_ROLE_CLAIM))
    return sorted({role_map[g] for g in groups if role_map.get(g) in ROLES})


def tenant_ids_from_claims(claims: dict[str, Any]) -> list[int] | None:
    """The ids of the tenants the claim names (unknown slugs ignored); None when no tenant
    claim is configured (memberships are the console's business then)."""
    claim = settings.CONSOLE_OIDC_TENANT_CLAIM
    if not claim:
        return None
    slugs = _as_list(claims.get(claim))
    return sorted(Tenant.objects.filter(slug__in=slugs).values_list("pk", flat=True))


def _username_for(issuer: str, subject: str, claims: dict[str, Any]) -> str:
    # Readable (the name the provider shows) and unique per identity: a local "admin" and
    # an "admin" at the provider, or the same name at two issuers, are different accounts.
    base = str(claims.get("preferred_username") or claims.get("email") or "sso")[:120]
    tag = hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:8]
    return f"{base}~{tag}"


def _roles_of(user: AbstractBaseUser) -> list[str]:
    return sorted(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def _tenants_of(user: AbstractBaseUser) -> list[int]:
    return sorted(StaffTenant.objects.filter(user_id=user.pk).values_list("tenant_id", flat=True))


def oidc_user_sign_in(*, issuer: str, subject: str, claims: dict[str, Any]) -> AbstractBaseUser:
    """The console user of this identity, made on its first sign-in, with its roles and
    tenants set from ``claims``; SignInRefused when the claims give no role (or no tenant)."""
    roles = roles_from_claims(claims)
    if not roles:
        raise NoMappedRole()
    tenant_ids = tenant_ids_from_claims(claims)
    if tenant_ids is not None and not tenant_ids:
        raise NoKnownTenant()
    User = get_user_model()
    with transaction.atomic():
        identity = OidcIdentity.objects.select_for_update().filter(issuer=issuer, subject=subject).first()
        if identity is None:
            user = User(username=_username_for(issuer, subject, claims), is_staff=True, is_superuser=False)
            user.set_unusable_password()
            user.save()
            try:
                with transaction.atomic():
                    identity = OidcIdentity.objects.create(issuer=issuer, subject=subject, user=user)
            except IntegrityError:
                # Two first sign-ins of one person at once: the other made the identity.
                raise TokenInvalid("Sign-in already in progress; try again.") from None
            before_roles: list[str] = []
            before_tenants: list[int] = []
        else:
            user = identity.user
            before_roles, before_tenants = _roles_of(user), _tenants_of(user)
        # Whatever the console did to this account, the provider decides: staff, never superuser.
        user.is_active, user.is_staff, user.is_superuser = True, True, False
        user.email = str(claims.get("email") or "")[:254]
        user.first_name = str(claims.get("given_name") or "")[:150]
        user.last_name = str(claims.get("family_name") or "")[:150]
        user.save()
        user.groups.set(Group.objects.filter(name__in=roles))
        if tenant_ids is not None:
            StaffTenant.objects.filter(user_id=user.pk).exclude(tenant_id__in=tenant_ids).delete()
            for tenant_id in sorted(set(tenant_ids) - set(before_tenants)):
                StaffTenant.objects.get_or_create(user_id=user.pk, tenant_id=tenant_id)
        after_tenants = _tenants_of(user)
        config_change_record(
            tenant_id=None,
            actor=f"sso:{issuer}"[:150],
            action=ConfigChangeAction.CREATE if not before_roles and not before_tenants else ConfigChangeAction.UPDATE,
            object_type="auth.user",
            object_id=user.pk,
            object_repr=user.get_username(),
            before={"roles": before_roles, "tenants": before_tenants},
            after={"roles": roles, "tenants": after_tenants},
            reason="single sign-on: roles and tenants from the identity provider's claims",
        )
        OidcIdentity.objects.filter(pk=identity.pk).update(last_sign_in_at=timezone.now())
    return user


class ConsoleOidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with the checks and mapping the module's docstring lists."""

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> AbstractBaseUser | None:
        # Only the provider's redirect back is ours: a password form posted to a URL with
        # ?code=&state= is the password backend's business.
        if request is None or not oidc_enabled() or "password" in kwargs:
            return None
        if request.path != reverse(CALLBACK_URL_NAME):
            return None
        try:
            return super().authenticate(request, **kwargs)
        except SignInRefused as exc:
            self._refuse(request, exc)
        except SuspiciousOperation as exc:
            self._refuse(request, TokenInvalid(str(exc)))
        except (requests.RequestException, ValueError) as exc:
            self._refuse(request, ProviderUnavailable(type(exc).__name__))
        return None

    @staticmethod
    def _refuse(request: HttpRequest, exc: SignInRefused) -> None:
        # The code and the library's reason only: never a claim, a token or an address.
        log.warning("console_sign_in_refused code=%s why=%s", exc.code, exc.detail[:200])
        setattr(request, REFUSAL_ATTR, exc)

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        # The library checks the signature only; the claims that make the token ours are
        # checked here (OpenID Connect Core §3.1.3.7).
        try:
            header = jwt.get_unverified_header(payload)
        except jwt.PyJWTError as exc:
            raise TokenInvalid("not a JWT") from exc
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise TokenInvalid("unexpected signature algorithm")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.CONSOLE_OIDC_ISSUER,
                leeway=CLOCK_LEEWAY_SECONDS,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise TokenInvalid(type(exc).__name__) from exc
        audiences = _as_list(claims.get("aud"))
        if len(audiences) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise TokenInvalid("InvalidAuthorizedParty")
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The verified ID token's claims, completed by the userinfo endpoint when one is
        configured — whose answer counts only if it is about the same subject."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            info = super().get_userinfo(access_token, id_token, payload)
            if info.get("sub") != payload.get("sub"):
                raise TokenInvalid("userinfo names another subject")
            claims.update({k: v for k, v in info.items() if k not in ("iss", "aud", "sub", "exp", "iat", "nonce")})
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        # Unused: get_or_create_user binds by (issuer, subject) instead of the e-mail lookup.
        return self.UserModel.objects.none()

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> AbstractBaseUser:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise TokenInvalid("no subject")
        return oidc_user_sign_in(issuer=str(payload["iss"]), subject=str(payload["sub"]), claims=claims)
