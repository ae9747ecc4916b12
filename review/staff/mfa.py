"""The second factor of the console's local (password) accounts (ADR 0014).

With CONSOLE_REQUIRE_MFA on, a session signed in with a password reaches no console page until
it is verified with a second factor: an authenticator app (``ConsoleTotpDevice``, its key
sealed at rest) or, where CONSOLE_WEBAUTHN_RP_ID is set, a security key (django-otp-webauthn).
A user without one is sent to enrol first. Verification is django-otp's: the device that
verified is kept in the session (``django_otp.login``) and ``OTPMiddleware`` puts it on the
user of each request.

Exempt: sessions signed in through single sign-on (the identity provider asks its own second
factor; review.staff.oidc) and the usernames in CONSOLE_MFA_EXEMPT_USERS (``make run`` puts its
demo admin there). Wrong codes are throttled by django-otp (each doubles the wait) and
CONSOLE_MFA_MAX_FAILURES in a row lock the device until a platform admin runs
``manage.py mfa_reset <username>``. Enrolment and reset leave a ConfigChange row.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import django_otp
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django_otp_webauthn.models import WebAuthnCredential

from ledger.models import ConfigChangeAction
from ledger.providers.credentials import sealed_credential, secret_open
from ledger.tenants.config_changes import config_change_record
from review.models import TOTP_DIGITS, TOTP_STEP, ConsoleTotpDevice

OIDC_BACKEND = "review.staff.oidc.ConsoleOidcBackend"
VERIFY_URL_NAME = "admin:onceguard_mfa_verify"
ENROL_URL_NAME = "admin:onceguard_mfa_enrol"
WEBAUTHN_URL_PREFIX = "/admin/sign-in/webauthn/"
# The pages a signed-in but unverified session may still open: the second factor's own,
# signing out, and what the sign-in page itself loads.
_OPEN_URL_NAMES = (
    VERIFY_URL_NAME,
    ENROL_URL_NAME,
    "admin:logout",
    "admin:login",
    "admin:jsi18n",
)


def webauthn_enabled() -> bool:
    return bool(settings.CONSOLE_WEBAUTHN_RP_ID)


def mfa_required(request: HttpRequest) -> bool:
    """Whether this signed-in session must show a second factor before the console."""
    user = getattr(request, "user", None)
    if not settings.CONSOLE_REQUIRE_MFA or user is None or not user.is_authenticated:
        return False
    if request.session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND:
        return False
    return user.get_username() not in settings.CONSOLE_MFA_EXEMPT_USERS


def mfa_verified(request: HttpRequest) -> bool:
    is_verified = getattr(request.user, "is_verified", None)
    return bool(is_verified and is_verified())


def confirmed_devices(user: AbstractBaseUser) -> list[Any]:
    """The user's second factors: the authenticator app and any security keys."""
    devices: list[Any] = list(ConsoleTotpDevice.objects.filter(user_id=user.pk, confirmed=True))
    if webauthn_enabled():
        devices += list(WebAuthnCredential.objects.filter(user_id=user.pk, confirmed=True))
    return devices


class ConsoleMfaMiddleware:
    """Sends a password-signed-in session that must show a second factor, and has not, to the
    verification page (or to enrolment when it has none yet); after django-otp's middleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self._open_paths: tuple[str, ...] | None = None

    def _open(self, path: str) -> bool:
        if self._open_paths is None:
            self._open_paths = tuple(reverse(name) for name in _OPEN_URL_NAMES)
        # django-otp-webauthn's ceremonies (config.urls) answer the second factor's pages.
        return path in self._open_paths or path.startswith(WEBAUTHN_URL_PREFIX)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(WEBAUTHN_URL_PREFIX) and not webauthn_enabled():
            # No relying party configured: no key may be registered or used (its ceremonies
            # would otherwise run under the placeholder id).
            raise Http404("Security keys are not enabled.")
        if settings.CONSOLE_REQUIRE_MFA and request.path.startswith("/admin/") and mfa_required(request):
            if not self._open(request.path) and not mfa_verified(request):
                target = VERIFY_URL_NAME if confirmed_devices(request.user) else ENROL_URL_NAME
                return HttpResponseRedirect(f"{reverse(target)}?{urlencode({'next': request.get_full_path()})}")
        return self.get_response(request)


# --- The authenticator app ------------------------------------------------------------------


def otpauth_uri(*, key_b32: str, account: str, issuer: str = "Onceguard") -> str:
    """The ``otpauth://`` address an authenticator app reads (Key Uri Format)."""
    query = urlencode({"secret": key_b32, "issuer": issuer, "digits": TOTP_DIGITS, "period": TOTP_STEP})
    return f"otpauth://totp/{quote(issuer)}:{quote(account)}?{query}"


def totp_enrolment_begin(*, user: AbstractBaseUser) -> tuple[ConsoleTotpDevice, str]:
    """A new, unconfirmed authenticator for ``user`` and its key (base32), to show once: the
    key is sealed in the row and never shown again. An earlier unconfirmed one is dropped."""
    key_b32 = base64.b32encode(os.urandom(20)).decode()
    with transaction.atomic():
        ConsoleTotpDevice.objects.filter(user_id=user.pk, confirmed=False).delete()
        device = ConsoleTotpDevice.objects.create(
            user=user, name="authenticator app", confirmed=False, sealed_key=sealed_credential(key_b32)
        )
    return device, key_b32


def totp_enrolment_key(device: ConsoleTotpDevice) -> str:
    """The key of an enrolment still in progress (the page is shown again after a wrong
    code); never of a confirmed device."""
    if device.confirmed:
        raise PermissionError("A confirmed device's key is never shown.")
    return secret_open(device.sealed_key)


def totp_enrolment_confirm(*, request: HttpRequest, device: ConsoleTotpDevice, code: str) -> bool:
    """Confirms the enrolment when ``code`` is the app's current code, replacing any earlier
    authenticator of the user, and marks the session verified with it."""
    if device.confirmed or device.user_id != request.user.pk or not device.verify_token(code):
        return False
    with transaction.atomic():
        replaced = ConsoleTotpDevice.objects.filter(user_id=device.user_id, confirmed=True).delete()[0]
        ConsoleTotpDevice.objects.filter(pk=device.pk).update(confirmed=True)
        device.confirmed = True
        config_change_record(
            tenant_id=None,
            actor=f"user:{request.user.get_username()}",
            action=ConfigChangeAction.UPDATE,
            object_type="auth.user",
            object_id=device.user_id,
            object_repr=request.user.get_username(),
            before={"authenticator_app": bool(replaced)},
            after={"authenticator_app": True},
            reason="second factor enrolled" if not replaced else "second factor replaced",
        )
    django_otp.login(request, device)
    return True


def mfa_verify(*, request: HttpRequest, code: str) -> bool:
    """Whether ``code`` is the current code of the user's authenticator app; on success the
    session is verified. Throttled and locked per device (ConsoleTotpDevice.verify_token)."""
    device = ConsoleTotpDevice.objects.filter(user_id=request.user.pk, confirmed=True).first()
    if device is None or not device.verify_token(code):
        return False
    django_otp.login(request, device)
    return True


def mfa_locked(user: AbstractBaseUser) -> bool:
    """Whether the user's authenticator app is locked (too many wrong codes in a row)."""
    device = ConsoleTotpDevice.objects.filter(user_id=user.pk, confirmed=True).first()
    return device is not None and device.throttling_failure_count >= settings.CONSOLE_MFA_MAX_FAILURES


def mfa_reset(*, user: AbstractBaseUser, actor: str) -> int:
    """Removes every second factor of ``user`` (a lost phone, a locked device): they enrol
    again at their next sign-in. Returns how many were removed."""
    with transaction.atomic():
        removed = ConsoleTotpDevice.objects.filter(user_id=user.pk).delete()[0]
        removed += WebAuthnCredential.objects.filter(user_id=user.pk).delete()[0]
        config_change_record(
            tenant_id=None,
            actor=actor,
            action=ConfigChangeAction.UPDATE,
            object_type="auth.user",
            object_id=user.pk,
            object_repr=user.get_username(),
            before={"second_factors": removed},
            after={"second_factors": 0},
            reason="second factors reset",
        )
    return removed
