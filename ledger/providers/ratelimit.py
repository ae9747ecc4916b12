"""Provider rate and concurrency caps (DESIGN §5, rate and concurrency caps).

A provider may declare ``max_in_flight`` (calls at once) and a rate (``rate_limit`` calls per
``rate_period_seconds``, ``rate_burst`` of them at once after a quiet spell). Workers of every
process respect them through the database, never a process's memory:

- *in flight* is the provider's claimed execute-mode rows, counted at the take
  (``provider_in_flight``, on the partial ``open_exec_inflight_idx`` of the work queue, ADR 0017);
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

The same answers lower the provider's **concurrency** too (ADR 0008), for every provider,
declared caps or not: its effective in-flight limit halves (down to 1) from the declared
``max_in_flight`` — or ``PROVIDER_DEFAULT_MAX_IN_FLIGHT`` for a provider that declared none —
and climbs back by 1 per quiet period (the provider's ``concurrency_recovery_seconds``, else
``PROVIDER_CONCURRENCY_RECOVERY_SECONDS``), applied by the take's refill; back at the cap it is
no longer lowered (the bucket's ``concurrency`` is NULL again, and an undeclared provider is
uncapped again). The take reads the bucket's ``concurrency`` with each due row, so an uncapped
provider's bucket is locked and its calls counted only while its limit is lowered.
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

from ledger.models import OpenOperation, OperationMode, OperationStatus, Provider, ProviderRate
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
    "provider__concurrency_recovery_seconds",
    # The effective in-flight limit after a 429 (NULL: not lowered); a LEFT JOIN on the bucket.
    "provider__rate_state__concurrency",
)

CapRow = tuple[int, int, int | None, int | None, int | None, int | None, int | None, int | None]


def decrease_factor() -> float:
    return min(1.0, max(0.01, float(settings.ONCEGUARD["PROVIDER_RATE_DECREASE"])))


def floor_fraction() -> float:
    return min(1.0, max(0.001, float(settings.ONCEGUARD["PROVIDER_RATE_FLOOR_FRACTION"])))


def recovery_seconds() -> float:
    return max(0.0, float(settings.ONCEGUARD["PROVIDER_RATE_RECOVERY_SECONDS"]))


def step_fraction() -> float:
    return min(1.0, max(0.001, float(settings.ONCEGUARD["PROVIDER_RATE_STEP_FRACTION"])))


def concurrency_cap(max_in_flight: int | None) -> int:
    """The most a lowered in-flight limit climbs back to: the declared cap, or the deployment's
    default for a provider that declared none."""
    if max_in_flight is not None:
        return max(1, int(max_in_flight))
    return max(1, int(settings.ONCEGUARD["PROVIDER_DEFAULT_MAX_IN_FLIGHT"]))


def concurrency_quiet_seconds(recovery_seconds: int | None) -> float:
    """The quiet period per +1 of a lowered in-flight limit: the provider's own, else the
    deployment's."""
    if recovery_seconds is not None:
        return float(recovery_seconds)
    return max(0.0, float(settings.ONCEGUARD["PROVIDER_CONCURRENCY_RECOVERY_SECONDS"]))


def cap_row(provider: Provider) -> CapRow:
    """``CAP_COLUMNS`` of ``provider`` (its bucket's lowered limit read now), for a take of one
    provider's row that did not select it with them (the webhook's poll)."""
    lowered = (
        ProviderRate.objects.filter(tenant_id=provider.tenant_id, provider_id=provider.pk)
        .values_list("concurrency", flat=True)
        .first()
    )
    return (
        provider.pk,
        provider.tenant_id,
        provider.max_in_flight,
        provider.rate_limit,
        provider.rate_period_seconds,
        provider.rate_burst,
        provider.concurrency_recovery_seconds,
        lowered,
    )


def declared_rate(rate_limit: int | None, rate_period_seconds: int | None) -> float | None:
    """The declared rate in calls per second, or None for no rate."""
    if not rate_limit:
        return None
    return float(rate_limit) / float(max(1, rate_period_seconds or 1))


def held_back() -> Q:
    """Providers (a filter of ``Provider``) the take passes over for their caps: a bucket that
    will not hold a whole call before ``next_take_at``, or as many calls in flight as allowed
    (the declared cap, or the limit a 429 lowered)."""
    in_flight = (
        # Off the work queue's mirror (open_exec_inflight_idx, ADR 0017).
        OpenOperation.objects.filter(
            provider_id=OuterRef("pk"), status=OperationStatus.CLAIMED, mode=OperationMode.EXECUTE
        )
        .order_by()
        .values("provider_id")
        .annotate(n=Count("operation_id"))
        .values("n")
    )
    counted = Coalesce(Subquery(in_flight, output_field=IntegerField()), 0)
    return (
        Q(rate_state__next_take_at__gt=Now())
        | Q(max_in_flight__isnull=False, max_in_flight__lte=counted)
        | Q(rate_state__concurrency__isnull=False, rate_state__concurrency__lte=counted)
    )


@dataclass
class _Cap:
    provider_id: int
    tenant_id: int
    max_in_flight: int | None
    ceiling: float | None  # declared calls per second; None: no rate
    burst: float
    wanted: int
    # The climb of a lowered in-flight limit: up to this, by 1 per quiet period of this long.
    concurrency_cap: int = 1
    concurrency_quiet_seconds: float = 0.0
    # The effective in-flight limit after the refill (None: as declared).
    concurrency: int | None = None
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
        "concurrency_cap": cap.concurrency_cap,
        "concurrency_quiet_seconds": cap.concurrency_quiet_seconds,
    }


def _refill(cap: _Cap) -> tuple[float, float, int | None]:
    """Lock the provider's bucket (until the take commits) and refill it; (tokens, rate, the
    effective in-flight limit or None when not lowered)."""
    params = _params(cap)
    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(statements.text("provider_rate_refill"), params)
            row = cursor.fetchone()
        if row is not None:
            return float(row[0]), float(row[1]), None if row[2] is None else int(row[2])
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
    def reserve(cls, rows: Iterable[CapRow]) -> TakeBudget:
        """``rows``: for each selected row, its ``CAP_COLUMNS``."""
        wanted: Counter[int] = Counter()
        caps: dict[int, _Cap] = {}
        for provider_id, tenant_id, max_in_flight, rate_limit, period, burst, recovery, lowered in rows:
            if max_in_flight is None and rate_limit is None and lowered is None:
                continue
            wanted[provider_id] += 1
            caps[provider_id] = _Cap(
                provider_id=provider_id,
                tenant_id=tenant_id,
                max_in_flight=max_in_flight,
                ceiling=declared_rate(rate_limit, period),
                burst=float(max(1, burst or 1)),
                wanted=0,
                concurrency_cap=concurrency_cap(max_in_flight),
                concurrency_quiet_seconds=concurrency_quiet_seconds(recovery),
            )
        # In provider-id order: two takers lock the buckets they share in the same order.
        for provider_id in sorted(caps):
            cap = caps[provider_id]
            cap.wanted = wanted[provider_id]
            cap.tokens, cap.rate, cap.concurrency = _refill(cap)
            allowed = cap.wanted
            # The fewer of the declared cap and the limit a 429 lowered (the refill may just have
            # lifted it: then the declared cap alone, or none).
            limits = [n for n in (cap.max_in_flight, cap.concurrency) if n is not None]
            if limits:
                with connection.cursor() as cursor:
                    cursor.execute(
                        statements.text("provider_in_flight"), {"provider_id": provider_id, "tenant_id": cap.tenant_id}
                    )
                    cap.in_flight = int(cursor.fetchone()[0])
                allowed = min(allowed, max(0, min(limits) - cap.in_flight))
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
                    "provider_capped provider=%s wanted=%s allowed=%s in_flight=%s tokens=%.2f concurrency=%s",
                    provider_id,
                    cap.wanted,
                    cap.allowed,
                    cap.in_flight,
                    cap.tokens,
                    cap.concurrency,
                )


def lowers_rate(*, status: int | None, retry_after: float | None) -> bool:
    """Which throttled answers lower a provider's rate and concurrency: a 429, and a 503 that
    says when to come back (a bare 503 is an outage more often than a rate limit)."""
    return status == 429 or (status == 503 and retry_after is not None)


@dataclass(frozen=True)
class Lowered:
    """Where a provider's limits stand after :func:`provider_rate_lower`."""

    # Calls per second the bucket allows now; None: the provider declares no rate.
    rate: float | None
    # The effective in-flight limit now (None: not lowered — the row was gone).
    concurrency: int | None


def provider_rate_lower(*, provider: Provider, operation_id: int, status: int | None = 429) -> Lowered:
    """A 429 (or 503 with Retry-After) from ``provider`` to the call ``operation_id`` sent:
    unless the call was sent before the last lowering (the same storm), halve its effective
    rate (a provider that declares one) and its effective in-flight limit (every provider, ADR
    0008); both quiet periods start again either way."""
    ceiling = declared_rate(provider.rate_limit, provider.rate_period_seconds)
    cap = _Cap(
        provider_id=provider.pk,
        tenant_id=provider.tenant_id,
        max_in_flight=provider.max_in_flight,
        ceiling=ceiling,
        burst=float(provider.rate_burst or 1),
        wanted=0,
        concurrency_cap=concurrency_cap(provider.max_in_flight),
    )
    # A provider that declares no caps gets its bucket here, at its first 429 (rate 0: no rate).
    statements.execute("provider_rate_insert", _params(cap))
    answer = "HTTP 429" if status == 429 else f"HTTP {status} with Retry-After"
    with connection.cursor() as cursor:
        cursor.execute(
            statements.text("provider_rate_lower"),
            {
                "provider_id": provider.pk,
                # The operation's tenant is its provider's.
                "tenant_id": provider.tenant_id,
                "operation_id": operation_id,
                "factor": decrease_factor(),
                "floor": (ceiling or 0.0) * floor_fraction(),
                "concurrency_cap": cap.concurrency_cap,
                "reason": f"halved after an {answer} answer",
            },
        )
        row = cursor.fetchone()
    if row is None:
        return Lowered(rate=None, concurrency=None)
    rate = float(row[0]) if ceiling is not None else None
    concurrency = None if row[1] is None else int(row[1])
    log.info(
        "provider_rate_throttled provider=%s rate_per_period=%s period=%s in_flight_limit=%s",
        provider.pk,
        "-" if rate is None else f"{rate * (provider.rate_period_seconds or 1):.3f}",
        provider.rate_period_seconds,
        concurrency,
    )
    return Lowered(rate=rate, concurrency=concurrency)


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
    # Calls at once the workers allow now: the limit a 429 lowered, else the declared cap (None:
    # no cap); why it was lowered and since when it holds (ADR 0008).
    effective_in_flight: int | None = None
    in_flight_lowered: bool = False
    in_flight_reason: str = ""
    in_flight_since: datetime | None = None
    # What a lowered limit climbs back to, by 1 per this many quiet seconds.
    in_flight_ceiling: int = 1
    in_flight_recovery_seconds: float = 0.0

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
            "effective_max_in_flight": self.effective_in_flight,
            "in_flight_lowered": self.in_flight_lowered,
            "in_flight_lowered_reason": self.in_flight_reason or None,
            "in_flight_limit_since": self.in_flight_since,
            "in_flight_recovery_seconds": self.in_flight_recovery_seconds,
        }

    def summary(self) -> str:
        parts = []
        if self.in_flight_lowered:
            # Lowered by a 429: what holds now, why, and how it climbs back.
            since = self.in_flight_since.strftime("%Y-%m-%d %H:%M:%S UTC") if self.in_flight_since else "?"
            parts.append(
                f"at most {self.effective_in_flight} in flight (now {self.in_flight}): {self.in_flight_reason}"
                f" at {since}; climbing back by 1 per {self.in_flight_recovery_seconds:g} s without a 429 up to"
                f" {self.in_flight_ceiling}"
                + ("" if self.max_in_flight is not None else " (the deployment's default), then uncapped")
            )
        elif self.max_in_flight is not None:
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
        in_flight = OpenOperation.objects.filter(
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
    ceiling_in_flight = concurrency_cap(provider.max_in_flight)
    lowered = state is not None and state.concurrency is not None
    effective_in_flight = provider.max_in_flight
    if lowered:
        effective_in_flight = min(ceiling_in_flight, int(state.concurrency))
    return CapsView(
        max_in_flight=provider.max_in_flight,
        in_flight=in_flight,
        rate_limit=provider.rate_limit,
        rate_period_seconds=period,
        rate_burst=int(provider.rate_burst or 1),
        effective_rate=effective,
        lowered_at=sql.to_datetime(state.lowered_at) if state is not None else None,
        quiet_since=sql.to_datetime(state.quiet_since) if state is not None else None,
        effective_in_flight=effective_in_flight,
        in_flight_lowered=lowered,
        in_flight_reason=state.concurrency_reason if lowered else "",
        in_flight_since=sql.to_datetime(state.concurrency_since) if lowered else None,
        in_flight_ceiling=ceiling_in_flight,
        in_flight_recovery_seconds=concurrency_quiet_seconds(provider.concurrency_recovery_seconds),
    )
