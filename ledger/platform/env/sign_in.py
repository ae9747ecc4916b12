"""Console sign-in: single sign-on through the organisation's OpenID Connect provider (its
groups mapped to the console's roles and tenants) and the second factor of local accounts
(ADR 0014, ``review.staff.oidc`` and ``review.staff.mfa``)."""

from __future__ import annotations

from ledger.platform.env.declare import (
    BOOL,
    CHOICE,
    INT,
    JSON_OBJECT,
    LIST,
    STR,
    Setting,
    _group,
    _s,
)

CONSOLE_SIGN_IN: list[Setting] = _group(
    "Console sign-in",
    "settings.{}",
    _s(
        "OIDC_RP_CLIENT_ID",
        STR,
        "",
        """The console's client id at the OpenID Connect provider. Unset: single sign-on is
        off and the sign-in page shows no button.""",
    ),
    _s(
        "OIDC_RP_CLIENT_SECRET",
        STR,
        "",
        "The console's client secret at the provider (the token request's client authentication).",
        secret=True,
    ),
    _s(
        "CONSOLE_OIDC_ISSUER",
        STR,
        "",
        """The provider's issuer (its `iss`, e.g. https://login.example.com/realms/ops): an ID
        token from any other issuer is refused, and an identity is this issuer plus its subject.""",
    ),
    _s(
        "OIDC_OP_AUTHORIZATION_ENDPOINT",
        STR,
        "",
        "The provider's authorization endpoint (its discovery document says).",
    ),
    _s("OIDC_OP_TOKEN_ENDPOINT", STR, "", "The provider's token endpoint."),
    _s("OIDC_OP_JWKS_ENDPOINT", STR, "", "The provider's signing keys (JWKS)."),
    _s(
        "OIDC_OP_USER_ENDPOINT",
        STR,
        "",
        """The provider's userinfo endpoint. Unset: the claims are the ID token's alone (the
        provider must put the role and tenant claims in it).""",
    ),
    _s(
        "OIDC_RP_SIGN_ALGO",
        CHOICE,
        "RS256",
        "The ID token's signature algorithm; a token signed otherwise is refused.",
        choices=("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"),
    ),
    _s("OIDC_RP_SCOPES", STR, "openid email profile", "Scopes asked for at sign-in."),
    _s(
        "OIDC_TIMEOUT",
        INT,
        10,
        "Seconds the token and key requests to the provider may take.",
        minimum=1,
    ),
    _s(
        "CONSOLE_OIDC_ROLE_CLAIM",
        STR,
        "groups",
        "The claim holding the user's groups at the provider (a list, or one string).",
    ),
    _s(
        "CONSOLE_OIDC_ROLE_MAP",
        JSON_OBJECT,
        {},
        """Provider group → console role (operator, reviewer, auditor, admin), e.g.
        {"ops-oncall": "operator", "risk-audit": "auditor"}. A user none of whose groups is
        mapped is refused; roles are set afresh at every sign-in.""",
    ),
    _s(
        "CONSOLE_OIDC_TENANT_CLAIM",
        STR,
        "",
        """The claim holding the slugs of the tenants the user works for. Set: memberships are
        set afresh from it at every sign-in and a user with no known tenant is refused. Unset:
        memberships are managed in the console.""",
    ),
    _s(
        "CONSOLE_REQUIRE_MFA",
        BOOL,
        False,
        """Local (password) accounts must enrol a second factor (TOTP or a security key) and
        use it at every sign-in. Single sign-on is exempt: the provider does its own.""",
    ),
    _s(
        "CONSOLE_MFA_EXEMPT_USERS",
        LIST,
        [],
        """Local usernames that keep signing in with a password alone (make run sets its demo
        admin here, in var/local.env).""",
    ),
    _s(
        "CONSOLE_MFA_MAX_FAILURES",
        INT,
        10,
        """Wrong codes in a row after which a device is locked until `manage.py mfa_reset`
        (before that, each wrong code doubles the wait before the next try).""",
        minimum=1,
    ),
    _s(
        "CONSOLE_WEBAUTHN_RP_ID",
        STR,
        "",
        """The console's WebAuthn relying-party id (its host name, e.g. console.example.com).
        Unset: security keys are not offered.""",
    ),
    _s(
        "CONSOLE_WEBAUTHN_ORIGINS",
        LIST,
        [],
        "Origins a security key's answer may come from. Unset: https://<CONSOLE_WEBAUTHN_RP_ID>.",
    ),
)
