"""The providers a request or a worker reads, cached per process for PROVIDER_CACHE_SECONDS: by (tenant, slug) for callers, by id for workers; every configuration change forgets its entry. Below the protocol, so a rollout (ledger.providers.canary) forgets what it changed without importing the services."""

from __future__ import annotations

from ledger.models import Provider, Tenant
from ledger.platform.caching import TtlCache
from ledger.platform.errors import ReservedProvider, UnknownProvider

# Providers by (tenant id, slug), for PROVIDER_CACHE_SECONDS; upserts forget their entry.
PROVIDERS: TtlCache[Provider] = TtlCache("PROVIDER_CACHE_SECONDS")


# Slugs beginning with this belong to the service's own providers (ledger.protocol.callbacks'
# ``_callbacks``): callers may neither claim under them nor create one.
RESERVED_PROVIDER_PREFIX = "_"
RESERVED_PROVIDER_DETAIL = (
    "Provider slugs beginning with _ belong to the service (its callbacks, for one): they cannot be named"
    " in a claim or a submission, nor created."
)


def provider_for(*, tenant: Tenant | int, slug: str | None) -> Provider | None:
    """A caller's provider by slug (claims, submissions, the guard); None for no slug."""
    if slug in (None, ""):
        return None
    if isinstance(slug, str) and slug.startswith(RESERVED_PROVIDER_PREFIX):
        raise ReservedProvider(RESERVED_PROVIDER_DETAIL)
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    provider = PROVIDERS.get((tenant_id, slug), lambda: Provider.objects.filter(tenant_id=tenant_id, slug=slug).first())
    if provider is None:
        raise UnknownProvider(f"No provider named {slug!r} is configured for this tenant.")
    return provider


def provider_cache_forget(provider: Provider) -> None:
    """This process's cached copies of ``provider`` go (other processes' within
    PROVIDER_CACHE_SECONDS): after any change of its configuration."""
    PROVIDERS.forget((provider.tenant_id, provider.slug))
    PROVIDERS_BY_ID.forget(provider.pk)


# Providers by id, for the workers (config changes reach them within the same time).
PROVIDERS_BY_ID: TtlCache[Provider] = TtlCache("PROVIDER_CACHE_SECONDS")


def provider_by_id(provider_id: int) -> Provider:
    provider = PROVIDERS_BY_ID.get(provider_id, lambda: Provider.objects.filter(pk=provider_id).first())
    if provider is None:
        raise UnknownProvider(f"No provider with id {provider_id}.")
    return provider
