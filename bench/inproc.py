"""(b) The in-process guard: ledger.protocol.guard.run_once, and the two services it wraps.

run_once is called the way application code calls it (a Tenant object, the provider's
slug, an action and a small request); the services variant passes the Provider object
and calls operation_claim(mark_sent=True) + operation_complete directly, so the gap
between the two is the guard's own cost.
"""

from __future__ import annotations

from typing import Any

from bench.common import PROVIDER_SLUG, Op

ACTION = "bench"


def _request(key: str) -> dict[str, Any]:
    return {"amount": 1000, "currency": "EUR", "ref": key[-12:]}


def guard_factory(tenant: Any, kind: str) -> Any:
    from ledger.protocol.guard import run_once

    def fresh(key: str) -> None:
        value = run_once(
            tenant=tenant,
            key=key,
            fn=_effect,
            args=(key,),
            provider=PROVIDER_SLUG,
            action=ACTION,
            request=_request(key),
        )
        if not isinstance(value, dict) or value.get("ref") != key:
            raise RuntimeError(f"run_once returned {str(value)[:80]}")

    def replay(key: str) -> None:
        value = run_once(
            tenant=tenant,
            key=key,
            fn=_must_not_run,
            args=(key,),
            provider=PROVIDER_SLUG,
            action=ACTION,
            request=_request(key),
        )
        if not isinstance(value, dict) or value.get("ref") != key:
            raise RuntimeError(f"replay returned {str(value)[:80]} instead of the recorded result")

    def factory(_lane: int) -> Op:
        return fresh if kind == "fresh" else replay

    return factory


def services_factory(tenant: Any, provider: Any, kind: str) -> Any:
    from ledger.protocol import services

    def claim(key: str) -> Any:
        return services.operation_claim(
            tenant=tenant,
            key=key,
            provider=provider,
            action=ACTION,
            request=_request(key),
            mark_sent=True,
            actor="guard",
            via_claims=False,
        )

    def fresh(key: str) -> None:
        result = claim(key)
        if not result.acquired:
            raise RuntimeError(f"claim of fresh {key} not acquired")
        op = result.operation
        services.operation_complete(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            response_body=_effect(key),
            actor="guard",
        )

    def replay(key: str) -> None:
        result = claim(key)
        if not result.replayed:
            raise RuntimeError(f"claim of finished {key} was not a replay")

    def factory(_lane: int) -> Op:
        return fresh if kind == "fresh" else replay

    return factory


def _effect(key: str) -> dict[str, Any]:
    return {"ok": True, "ref": key}


def _must_not_run(key: str) -> dict[str, Any]:
    raise AssertionError(f"the guarded function ran again for {key}")


def backend_probe() -> Any:
    """CPU of this process's own Django connection's backend."""
    from django.db import connection

    from bench.common import proc_cpu_seconds

    def probe() -> dict[str, float]:
        connection.ensure_connection()
        return {"pg": proc_cpu_seconds(connection.connection.info.backend_pid)}

    return probe
