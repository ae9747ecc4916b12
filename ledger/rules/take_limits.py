"""The deployment's bounds of the fair take (ADR 0021, ``ledger.execution.fairness``): a
system-wide in-flight cap, each tenant's default cap and share, and the most a tenant's own
share may be. A tenant's own values (``Tenant.take_share``, ``take_max_in_flight``) are the
platform's to set and stay within these; a stored value the deployment lowered since is
clamped where it is read."""

from __future__ import annotations

from django.conf import settings

from ledger.platform.errors import TakeInFlightAboveDeployment, TakeShareAboveDeployment


def system_max_in_flight() -> int | None:
    """Execute-mode operations sent at once across every tenant (None: no cap)."""
    value = settings.ONCEGUARD["EXECUTE_MAX_IN_FLIGHT"]
    return int(value) if value else None


def tenant_default_max_in_flight() -> int | None:
    value = settings.ONCEGUARD["EXECUTE_TENANT_MAX_IN_FLIGHT"]
    return int(value) if value else None


def tenant_default_share() -> int:
    return max(1, int(settings.ONCEGUARD["EXECUTE_TENANT_SHARE"]))


def tenant_max_share() -> int:
    return max(1, int(settings.ONCEGUARD["EXECUTE_TENANT_MAX_SHARE"]))


def take_share(own: int | None) -> int:
    """A tenant's rows per round: its own share (bounded by the deployment's), else the default."""
    if own is None:
        return tenant_default_share()
    return max(1, min(int(own), tenant_max_share()))


def take_max_in_flight(own: int | None) -> int | None:
    """A tenant's cap on operations sent at once: the lowest of its own, the deployment's
    per-tenant default and the system-wide cap; None: no cap."""
    caps = [int(n) for n in (own, tenant_default_max_in_flight(), system_max_in_flight()) if n is not None]
    return min(caps) if caps else None


def tenant_take_limits_check(*, take_share: int | None, take_max_in_flight: int | None) -> None:
    """Refuse a tenant's own take settings beyond the deployment's bound (a named 422)."""
    if take_share is not None and int(take_share) > tenant_max_share():
        raise TakeShareAboveDeployment(
            f"A tenant's share is at most {tenant_max_share()} (EXECUTE_TENANT_MAX_SHARE); asked {take_share}.",
            extra={"field": "take_share", "limit": tenant_max_share()},
        )
    if take_max_in_flight is None:
        return
    bounds = [n for n in (tenant_default_max_in_flight(), system_max_in_flight()) if n is not None]
    if bounds and int(take_max_in_flight) > min(bounds):
        raise TakeInFlightAboveDeployment(
            f"A tenant's in-flight cap may only lower the deployment's ({min(bounds)}); asked {take_max_in_flight}.",
            extra={"field": "take_max_in_flight", "limit": min(bounds)},
        )
