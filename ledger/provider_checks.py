"""What a provider's configuration may say, checked on every save path (the console's forms
through ``Provider.clean``, ``services.provider_upsert``) and again at send time: where it
sends (ledger.outbound) and which environment variable it may read its credential from
(ledger.credentials). Plain values in, messages out: no models, no crypto, so the model
module can use it."""

from __future__ import annotations

import re

from django.conf import settings

from ledger.errors import DestinationNotAllowed
from ledger.outbound import outbound_check

DEFAULT_SECRET_PREFIX = "ONCEGUARD_SECRET_"
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def secret_env_prefix() -> str:
    return str(settings.ONCEGUARD.get("PROVIDER_SECRET_PREFIX") or DEFAULT_SECRET_PREFIX)


def tenant_env_prefix(tenant_slug: str) -> str:
    """The names a tenant's providers may reference: ``<prefix><TENANT>_``."""
    return f"{secret_env_prefix()}{re.sub(r'[^A-Z0-9]', '_', tenant_slug.upper())}_"


def secret_env_refusal(*, tenant_slug: str, name: str) -> str | None:
    """Why ``name`` may not be read as a credential of ``tenant_slug``'s providers (None: it may)."""
    if not name:
        return None
    wanted = tenant_env_prefix(tenant_slug)
    if not _ENV_NAME.fullmatch(name) or not name.startswith(wanted) or len(name) == len(wanted):
        return (
            f"credential variable {name[:100]!r} is not one of this tenant's declared variables"
            f" ({wanted}…); store the credential on the provider instead"
        )
    return None


def lookup_path_problem(path: str) -> str | None:
    """A lookup path may use ``{key}`` and ``{reconciliation_handle}`` and nothing else."""
    try:
        path.format(key="k", reconciliation_handle="h")
    except (KeyError, IndexError, ValueError, AttributeError):
        return "the lookup path may use only {key} and {reconciliation_handle}"
    return None


def provider_config_errors(
    *, tenant_slug: str, base_url: str, lookup_path: str, auth_secret_env: str
) -> tuple[dict[str, str], str]:
    """(field → message, the base URL in canonical form)."""
    errors: dict[str, str] = {}
    if base_url:
        try:
            base_url = outbound_check(base_url, purpose="provider base URL").url
        except DestinationNotAllowed as exc:
            errors["base_url"] = exc.detail
    if lookup_path:
        problem = lookup_path_problem(lookup_path)
        if problem:
            errors["lookup_path"] = problem
        elif base_url and "base_url" not in errors:
            example = lookup_path.format(key="k", reconciliation_handle="h")
            try:
                outbound_check(base_url.rstrip("/") + "/" + example.lstrip("/"), purpose="provider lookup URL")
            except DestinationNotAllowed as exc:
                errors["lookup_path"] = exc.detail
    problem = secret_env_refusal(tenant_slug=tenant_slug, name=auth_secret_env)
    if problem:
        errors["auth_secret_env"] = problem
    return errors, base_url
