"""Provider rate and concurrency caps (DESIGN §5, rate and concurrency caps).

A provider may declare ``max_in_flight`` (calls at once) and a rate (``rate_limit`` calls per
``rate_period_seconds``, ``rate_burst`` of them at once after a quiet spell). Workers of every
process respect them through the database, never a process's memory:

- *in flight* is the provider's claimed execute-mode rows, counted at the take
  (``provider_in_flight``, on the partial ``op_exec_inflight_idx``);
- *the rate* is a token bucket, one ``ProviderRate`` row per capped provider, refilled on the
  database's clock (``provider_rate_refill``) and spent by guarded UPDATEs
  (``provider_rate_spend``: never below empty).

The take (:class:`TakeBudget`, used by ``ledger.execution.attempts.operations_take``) locks each capped
provider's bucket row — the refill is an UPDATE, so the lock lasts until the take commits —
before it counts, so two takers of one provider queue there and the second counts what the
first committed (PostgreSQL; SQLite has one writer at a time anyway). Locks are taken in
provider-id order, and nothing else waits on an operation row while holding one, so takers
cannot deadlock. Rows the caps do not allow are simply not taken: they stay queued, no
attempt spent, and the next take passes the provider over (``held_back``) until a call could
start again.

A 429 — or a 503 that says when to come back — lowers the effective rate
(:func:`provider_rate_lower`: multiplied by ``PROVIDER_RATE_DECREASE``, never below
``PROVIDER_RATE_FLOOR_FRACTION`` of the declared rate; answers to calls sent before the last
lowering are the same storm and do not lower it again). Once quiet for
``PROVIDER_RATE_RECOVERY_SECONDS`` it climbs back by ``PROVIDER_RATE_STEP_FRACTION`` of the
declared rate per quiet period (additive increase, applied by the take's refill). The
provider's ``throttled_until`` (Retry-After) still holds every call back first: when it ends,
calls resume at the lowered rate instead of the storm that caused it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Now

from ledger.models import Operation, OperationMode, OperationStatus, Provider, ProviderRate
from ledger.store import sql, statements

log = logging.getLogger("onceguard.ratelimit")

# The provider columns the take reads with each due row (in this order) to know its caps; the
# row's tenant is its provider's, and every statement on the bucket names it (DESIGN §12, Citus).
CAP_COLUMNS = (
    "provider_id",
    "tenant_id",
    "provider__max_in_flight",
    "provider__rate_limit",
    "provider__rate_period_seconds",
    "provider__rate_burst",
)


def decrease_factor() -> float:
    return min(1.0, max(0.01, float(settings.ONCEGUARD["PROVIDER_RATE_DECREASE"])))


def floor_fraction() -> float:
    return min(1.0, max(0.001, float(settings.ONCEGUARD["PROVIDER_RATE_FLOOR_FRACTION"])))


def recovery_seconds() -> float:
    return max(0.0, float(settings.ONCEGUARD["PROVIDER_RATE_RECOVERY_SECONDS"]))


def step_fraction() -> float:
    return min(1.0, max(0.001, float(settings.ONCEGUARD["PROVIDER_RATE_STEP_FRACTION"])))


def declared_rate(rate_limit: int | None, rate_period_seconds: int | None) -> float | None:
    """The declared rate in calls per second, or None for no rate."""
    if not rate_limit:
        return None
    return float(rate_limit) / float(max(1, rate_period_seconds or 1))


def is_capped(provider: Provider) -> bool:
    return provider.max_in_flight is not None or provider.rate_limit is not None


def held_back() -> Q:
    """Providers (a filter of ``Provider``) the take passes over for their caps: a bucket that
    will not hold a whole call before ``next_take_at``, or as many calls in flight as allowed."""
    in_flight = (
        Operation.objects.filter(provider_id=OuterRef("pk"), status=OperationStatus.CLAIMED, mode=OperationMode.EXECUTE)
        .order_by()
        .values("provider_id")
        .annotate(n=Count("id"))
        .values("n")
    )
    return Q(rate_state__next_take_at__gt=Now()) | Q(
        max_in_flight__isnull=False,
        max_in_flight__lte=Coalesce(Subquery(in_flight, output_field=IntegerField()), 0),
    )


@dataclass
class _Cap:
    provider_id: int
    tenant_id: int
    max_in_flight: int | None
    ceiling: float | None  # declared calls per second; None: no rate
    burst: float
    wanted: int
    allowed: int = 0
    taken: int = 0
    tokens: float = 0.0
    rate: float = 0.0
    in_flight: int = 0


def _params(cap: _Cap) -> dict[str, Any]:
    ceiling = cap.ceiling or 0.0
    return {
        "provider_id": cap.provider_id,
        "tenant_id": cap.tenant_id,
        "burst": cap.burst if cap.ceiling else 0.0,
        "ceiling": ceiling,
        "step": ceiling * step_fraction(),
        "quiet_seconds": recovery_seconds(),
    }


def _refill(cap: _Cap) -> tuple[float, float]:
    """Lock the provider's bucket (until the take commits) and refill it; (tokens, rate)."""
    params = _params(cap)
    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(statements.text("provider_rate_refill"), params)
            row = cursor.fetchone()
        if row is not None:
            return float(row[0]), float(row[1])
        # A provider capped since its last take: its bucket starts full.
        statements.execute("provider_rate_insert", params)
    raise AssertionError("provider_rate_insert wrote no row")  # pragma: no cover


class TakeBudget:
    """How many of the rows one take selected each capped provider allows, reserved under the
    lock of its bucket row in the take's transaction; uncapped providers are not limited.

    ``reserve`` before taking, ``admit`` per row (False: leave the row queued), ``refund`` for a
    row whose take matched nothing, ``settle`` after the last take (spends the tokens)."""

    def __init__(self, caps: dict[int, _Cap]) -> None:
        self._caps = caps

    @classmethod
    def reserve(cls, rows: Iterable[tuple[int, int, int | None, int | None, int | None, int | None]]) -> TakeBudget:
        """``rows``: for each selected row, its ``CAP_COLUMNS``."""
        wanted: Counter[int] = Counter()
        caps: dict[int, _Cap] = {}
        for provider_id, tenant_id, max_in_flight, rate_limit, period, burst in rows:
            if max_in_flight is None and rate_limit is None:
                continue
            wanted[provider_id] += 1
            caps[provider_id] = _Cap(
                provider_id=provider_id,
                tenant_id=tenant_id,
                max_in_flight=max_in_flight,
                ceiling=declared_rate(rate_limit, period),
                burst=float(max(1, burst or 1)),
                wanted=0,
            )
        # In provider-id order: two takers lock the buckets they share in the same order.
        for provider_id in sorted(caps):
            cap = caps[provider_id]
            cap.wanted = wanted[provider_id]
            cap.tokens, cap.rate = _refill(cap)
            allowed = cap.wanted
            if cap.max_in_flight is not None:
                with connection.cursor() as cursor:
                    cursor.execute(
                        statements.text("provider_in_flight"), {"provider_id": provider_id, "tenant_id": cap.tenant_id}
                    )
                    cap.in_flight = int(cursor.fetchone()[0])
                allowed = min(allowed, max(0, cap.max_in_flight - cap.in_flight))
            if cap.ceiling:
                # A float that should be a whole token (3 × ⅓) still counts as one.
                allowed = min(allowed, max(0, math.floor(cap.tokens + 1e-9)))
            cap.allowed = allowed
        return cls(caps)

    def admit(self, provider_id: int) -> bool:
        cap = self._caps.get(provider_id)
        if cap is None:
            return True
        if cap.taken >= cap.allowed:
            return False
        cap.taken += 1
        return True

    def refund(self, provider_id: int) -> None:
        cap = self._caps.get(provider_id)
        if cap is not None and cap.taken > 0:
            cap.taken -= 1

    def settle(self) -> None:
        """Spend the tokens of the calls taken, and say when the bucket holds a call again."""
        for provider_id in sorted(self._caps):
            cap = self._caps[provider_id]
            if not cap.ceiling:
                continue
            taken = min(cap.taken, math.floor(cap.tokens + 1e-9))
            left = cap.tokens - taken
            wait = None if left >= 1 - 1e-9 or cap.rate <= 0 else (1.0 - left) / cap.rate
            statements.execute(
                "provider_rate_spend",
                # The guard compares with the stored float: never ask for a hair more than it holds.
                {
                    "provider_id": provider_id,
                    "tenant_id": cap.tenant_id,
                    "taken": float(min(taken, cap.tokens)),
                    "wait_seconds": wait,
                },
            )
            if cap.wanted > cap.allowed:
                log.debug(
                    "provider_capped provider=%s wanted=%s allowed=%s in_flight=%s tokens=%.2f",
                    provider_id,
                    cap.wanted,
                    cap.allowed,
                    cap.in_flight,
                    cap.tokens,
                )


def lowers_rate(*, status: int | None, retry_after: float | None) -> bool:
    """Which throttled answers lower a provider's rate: a 429, and a 503 that says when to come
    back (a bare 503 is an outage more often than a rate limit)."""
    return status == 429 or (status == 503 and retry_after is not None)


def provider_rate_lower(*, provider: Provider, operation_id: int) -> float | None:
    """A 429 (or 503 with Retry-After) from a rate-capped provider to the call ``operation_id``
    sent: halve its effective rate unless the call was sent before the last lowering; the
    quiet period starts again either way. Returns the effective rate in calls per second (None:
    the provider declares no rate, nothing to lower)."""
    ceiling = declared_rate(provider.rate_limit, provider.rate_period_seconds)
    if ceiling is None:
        return None
    cap = _Cap(
        provider_id=provider.pk,
        tenant_id=provider.tenant_id,
        max_in_flight=provider.max_in_flight,
        ceiling=ceiling,
        burst=float(provider.rate_burst or 1),
        wanted=0,
    )
    statements.execute("provider_rate_insert", _params(cap))
    with connection.cursor() as cursor:
        cursor.execute(
            statements.text("provider_rate_lower"),
            {
                "provider_id": provider.pk,
                # The operation's tenant is its provider's.
                "tenant_id": provider.tenant_id,
                "operation_id": operation_id,
                "factor": decrease_factor(),
                "floor": ceiling * floor_fraction(),
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    rate = float(row[0])
    log.info(
        "provider_rate_throttled provider=%s rate_per_period=%.3f period=%s",
        provider.pk,
        rate * (provider.rate_period_seconds or 1),
        provider.rate_period_seconds,
    )
    return rate


def provider_rate_reset(*, provider: Provider) -> None:
    """After a change of the provider's caps: its bucket starts again, full, at the declared
    rate (a provider capped for the first time gets its bucket at its first take)."""
    ceiling = declared_rate(provider.rate_limit, provider.rate_period_seconds) or 0.0
    statements.execute(
        "provider_rate_reset",
        {
            "provider_id": provider.pk,
            "tenant_id": provider.tenant_id,
            "burst": float(provider.rate_burst or 1) if ceiling else 0.0,
            "ceiling": ceiling,
        },
    )


@dataclass(frozen=True)
class CapsView:
    """What the console's provider page and the provider API show of the caps."""

    max_in_flight: int | None
    in_flight: int
    rate_limit: int | None
    rate_period_seconds: int
    rate_burst: int
    # Calls per rate period the workers allow now (the declared rate unless lowered).
    effective_rate: float | None
    lowered_at: datetime | None
    quiet_since: datetime | None

    @property
    def lowered(self) -> bool:
        return self.rate_limit is not None and self.effective_rate is not None and self.effective_rate < self.rate_limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_in_flight": self.max_in_flight,
            "in_flight": self.in_flight,
            "rate_limit": self.rate_limit,
            "rate_period_seconds": self.rate_period_seconds,
            "rate_burst": self.rate_burst,
            "effective_rate": None if self.effective_rate is None else round(self.effective_rate, 3),
            "rate_lowered": self.lowered,
            "rate_lowered_at": self.lowered_at,
        }

    def summary(self) -> str:
        parts = []
        if self.max_in_flight is not None:
            parts.append(f"at most {self.max_in_flight} in flight (now {self.in_flight})")
        if self.rate_limit is not None:
            per = "second" if self.rate_period_seconds == 1 else f"{self.rate_period_seconds} s"
            text = f"{self.rate_limit} per {per}, burst {self.rate_burst}"
            if self.lowered and self.effective_rate is not None:
                text += f"; lowered after a 429 to {self.effective_rate:.3g} per {per}, climbing back while quiet"
            else:
                text += "; effective rate as declared"
            parts.append(text)
        return " · ".join(parts) if parts else "no caps"


def provider_caps(provider: Provider) -> CapsView:
    """The provider's caps and where they stand now (its bucket row and in-flight count)."""
    in_flight = 0
    if provider.pk is not None:
        in_flight = Operation.objects.filter(
            tenant_id=provider.tenant_id,
            provider_id=provider.pk,
            status=OperationStatus.CLAIMED,
            mode=OperationMode.EXECUTE,
        ).count()
    state = (
        ProviderRate.objects.filter(tenant_id=provider.tenant_id, provider_id=provider.pk).first()
        if provider.pk is not None
        else None
    )
    period = int(provider.rate_period_seconds or 1)
    effective: float | None = None
    if provider.rate_limit is not None:
        ceiling = declared_rate(provider.rate_limit, period) or 0.0
        rate = min(state.rate, ceiling) if state is not None and state.rate > 0 else ceiling
        effective = rate * period
    return CapsView(
        max_in_flight=provider.max_in_flight,
        in_flight=in_flight,
        rate_limit=provider.rate_limit,
        rate_period_seconds=period,
        rate_burst=int(provider.rate_burst or 1),
        effective_rate=effective,
        lowered_at=sql.to_datetime(state.lowered_at) if state is not None else None,
        quiet_since=sql.to_datetime(state.quiet_since) if state is not None else None,
    )
