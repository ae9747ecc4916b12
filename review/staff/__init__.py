"""Staff: who may use the console and which rows they see.

Roles as Django groups and their permissions (``roles``, applied by migration review.0003 and
after every ``migrate``), tenant scoping (``tenancy``: a staff user's tenants, the middleware that
puts them on the request, the mixin every ModelAdmin gets), and the sign-in's defences
(``security``: throttling by username and address, the client's address behind trusted
proxies, the Content-Security-Policy header), and how one signs in (ADR 0014): single sign-on
through the organisation's OpenID Connect provider, its groups mapped to roles and tenants
(``oidc``), and the second factor of local accounts (``mfa``).

May import: ``review.models``. Nothing else of review: every other room may import this one.
"""
