"""The console's sign-in pages besides the password form (ADR 0014): the way to the identity
provider and back (review.staff.oidc), the page that says why a single sign-on was refused,
and the second factor's pages — enrolling an authenticator app and typing its code
(review.staff.mfa). The site (review.console.site) gives them their addresses under /admin/."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from review.models import ConsoleTotpDevice
from review.staff import mfa
from review.staff.oidc import REFUSAL_ATTR, SignInRefused, TokenInvalid, oidc_enabled

_ENROLMENT_SESSION_KEY = "onceguard_mfa_enrolment"


class CodeForm(forms.Form):
    code = forms.CharField(
        max_length=12,
        label="Code from your authenticator app",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "autofocus": True}),
    )


def _next_url(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return target
    return reverse("admin:index")


def _context(site: admin.AdminSite, request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**site.each_context(request), "next": _next_url(request), **extra}


def sign_in_refused_page(site: admin.AdminSite, request: HttpRequest, refusal: SignInRefused) -> HttpResponse:
    return TemplateResponse(
        request,
        "admin/onceguard/sign_in_refused.html",
        {**site.each_context(request), "title": "Sign-in refused", "refusal": refusal},
        status=refusal.status,
    )


def oidc_start_view(request: HttpRequest) -> HttpResponse:
    """To the identity provider (state, nonce and PKCE verifier kept in the session)."""
    if not oidc_enabled():
        raise Http404("Single sign-on is not configured.")
    return OIDCAuthenticationRequestView.as_view()(request)


class ConsoleOidcCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back: signed in, or a page saying why not (never a 500)."""

    site: admin.AdminSite = admin.site

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc_enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except SuspiciousOperation:
            # A state this browser never asked for (a replayed or forged redirect).
            return sign_in_refused_page(self.site, request, TokenInvalid("unknown state"))

    def login_failure(self) -> HttpResponse:
        refusal = getattr(self.request, REFUSAL_ATTR, None)
        if refusal is None:
            detail = "The identity provider did not sign you in." if self.request.GET.get("error") else ""
            refusal = SignInRefused(detail or "The sign-in could not be completed; start again.")
        return sign_in_refused_page(self.site, self.request, refusal)


def mfa_verify_view(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    """Type the authenticator app's code (or use a security key) to open the console."""
    if not mfa.mfa_required(request) or mfa.mfa_verified(request):
        return HttpResponseRedirect(_next_url(request))
    devices = mfa.confirmed_devices(request.user)
    if not devices:
        return HttpResponseRedirect(f"{reverse(mfa.ENROL_URL_NAME)}?{urlencode({'next': _next_url(request)})}")
    form = CodeForm(request.POST or None)
    error = ""
    if request.method == "POST" and form.is_valid():
        if mfa.mfa_verify(request=request, code=form.cleaned_data["code"]):
            return HttpResponseRedirect(_next_url(request))
        error = "That code is not right, or it was already used. Wait for the next one."
    if mfa.mfa_locked(request.user):
        error = "Too many wrong codes: this authenticator is locked. Ask a platform administrator to reset it."
    has_app = any(isinstance(d, ConsoleTotpDevice) for d in devices)
    has_key = mfa.webauthn_enabled() and len(devices) > has_app
    return TemplateResponse(
        request,
        "admin/onceguard/mfa_verify.html",
        _context(site, request, title="Second factor", form=form, error=error, has_app=has_app, has_key=has_key),
        status=400 if error and request.method == "POST" else 200,
    )


def mfa_enrol_view(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    """Enrol an authenticator app: its key shown once, confirmed by its first code. Open to a
    verified session too (replacing a lost phone's app needs the current factor first)."""
    required = mfa.mfa_required(request)
    if required and not mfa.mfa_verified(request) and mfa.confirmed_devices(request.user):
        # An unverified session never replaces a factor: that would bypass it.
        return HttpResponseRedirect(f"{reverse(mfa.VERIFY_URL_NAME)}?{urlencode({'next': _next_url(request)})}")
    device = ConsoleTotpDevice.objects.filter(
        pk=request.session.get(_ENROLMENT_SESSION_KEY) or 0, user_id=request.user.pk, confirmed=False
    ).first()
    form = CodeForm(request.POST or None)
    error = ""
    if request.method == "POST" and device is not None and form.is_valid():
        if mfa.totp_enrolment_confirm(request=request, device=device, code=form.cleaned_data["code"]):
            request.session.pop(_ENROLMENT_SESSION_KEY, None)
            return HttpResponseRedirect(_next_url(request))
        error = "That code does not match. Check the app's clock and type the newest code."
    if device is None:
        device, key_b32 = mfa.totp_enrolment_begin(user=request.user)
        request.session[_ENROLMENT_SESSION_KEY] = device.pk
    else:
        key_b32 = mfa.totp_enrolment_key(device)
    return TemplateResponse(
        request,
        "admin/onceguard/mfa_enrol.html",
        _context(
            site,
            request,
            title="Set up your second factor",
            form=form,
            error=error,
            key=" ".join(key_b32[i : i + 4] for i in range(0, len(key_b32), 4)),
            uri=mfa.otpauth_uri(key_b32=key_b32, account=request.user.get_username()),
            has_key=mfa.webauthn_enabled(),
        ),
        status=400 if error else 200,
    )
