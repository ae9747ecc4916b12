"""Shared by the guard- and execute-mode crash-window tests: a mock provider behind a fault
relay configured as a ledger provider, the expected outcome table, and time on the DB clock."""

from __future__ import annotations

from typing import Any

from django.db import connection

from ledger.models import IdempotencyClass, OperationStatus, Provider, Tenant
from ledger.protocol import services
from ledger.store import sql
from relay.testing import RunningServer, start_mock_provider, start_relay

S = OperationStatus
ENFORCED, ADVISORY = IdempotencyClass.KEY_ENFORCED, IdempotencyClass.KEY_ADVISORY

# The provider's attempt timeout; the relay's delay mode holds answers three times longer.
TIMEOUT = 0.5

# relay mode → provider class → (final status, effects at the provider). Issue 4's table.
EXPECTED: dict[str, dict[str, tuple[str, int]]] = {
    "forward-and-respond": {ENFORCED: (S.SUCCEEDED, 1), ADVISORY: (S.SUCCEEDED, 1)},
    "fail-before-forward": {ENFORCED: (S.SUCCEEDED, 1), ADVISORY: (S.REVIEW, 0)},
    "forward-then-drop-response": {ENFORCED: (S.SUCCEEDED, 1), ADVISORY: (S.REVIEW, 1)},
    "delay-then-respond": {ENFORCED: (S.SUCCEEDED, 1), ADVISORY: (S.REVIEW, 1)},
}


class Stack:
    """A mock provider of one class behind a fault relay, and the ledger provider `pay`."""

    def __init__(self, tenant: Tenant, cls: str, **provider_fields: Any) -> None:
        self.cls = cls
        self.provider = start_mock_provider("enforced" if cls == ENFORCED else "advisory")
        self.relay = start_relay(self.provider, delay=TIMEOUT * 3)
        fields: dict[str, Any] = dict(
            base_url=self.relay.url,
            idempotency_class=cls,
            lookup_path="/charges?idempotency_key={key}" if cls == ENFORCED else "",
            ref_pointer="/id",
            status_pointer="/status",
            success_values=["succeeded"],
            lookup_settle_seconds=0,
            timeout_seconds=TIMEOUT,
        )
        fields.update(provider_fields)
        self.ledger_provider: Provider = services.provider_upsert(tenant=tenant, slug="pay", **fields)

    def effects(self) -> int:
        return self.provider.effects()["count"]

    def stop(self) -> None:
        self.relay.stop()
        self.provider.stop()


def settle(op_id: int, seconds: float = 5.0) -> None:
    """Age the attempt on the database's clock past the provider's timeout + settle time,
    instead of sleeping: only then does the sweeper trust a "not found"."""
    past, params = sql.now_plus(-seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ledger_operation SET sent_at = CASE WHEN sent_at IS NULL THEN NULL ELSE {past} END,"
            f" claimed_at = {past} WHERE id = %s",
            [*params, *params, op_id],
        )


def effects(server: RunningServer) -> int:
    return server.effects()["count"]
