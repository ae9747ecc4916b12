"""Helpers for the console suite: example payloads, staff users with roles and tenants,
operations in each interesting state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from ledger import services
from ledger.models import ErrorClass, IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from review.models import StaffTenant

# The repository's copy of ../shared/examples (invented people, .invalid domains).
EXAMPLES = Path(__file__).resolve().parents[2] / "review" / "demo_examples"

# Values that must never appear in a masked page, a log line or an export.
MARKERS = ("Priya", "Raman", "+61412345678", "priya.raman@example.invalid", "61412345678")


def example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text())


def staff(username: str, *, role: str | None, tenants: list[Tenant], perms: list[str] = ()) -> User:
    user = User.objects.create_user(username, password="correct horse battery", is_staff=True)
    if role:
        user.groups.add(Group.objects.get(name=role))
    for code in perms:
        app, codename = code.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    for tenant in tenants:
        StaffTenant.objects.create(user=user, tenant=tenant)
    return User.objects.get(pk=user.pk)


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def advisory_provider(tenant: Tenant, slug: str = "mailer") -> Provider:
    return services.provider_upsert(
        tenant=tenant, slug=slug, base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )


def enforced_provider(tenant: Tenant, slug: str = "crm") -> Provider:
    return services.provider_upsert(
        tenant=tenant, slug=slug, base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )


def op_in_review(tenant: Tenant, provider: Provider, key: str, *, handle: str = "", payload: Any = None) -> Operation:
    """An operation whose outcome a human must decide (advisory provider, lease expired after send)."""
    from ledger.sweeper import sweep
    from tests.ledger.support import expire_lease

    op = services.operation_claim(
        tenant=tenant,
        key=key,
        provider=provider,
        request={"to": "x"},
        payload=payload,
        mark_sent=True,
        reconciliation_handle=handle,
    ).operation
    expire_lease(op.pk)
    sweep()
    op.refresh_from_db()
    assert op.status == OperationStatus.REVIEW, op.status
    return op


def failed_op(tenant: Tenant, provider: Provider, key: str, *, payload: Any = None) -> Operation:
    """A terminally failed operation (invalid input) — it has its DLQ entry."""
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, payload=payload).operation
    return services.operation_fail(
        operation_id=op.pk, lease_token=op.lease_token, error_class=ErrorClass.INVALID_INPUT, message="HTTP 422"
    )


def succeeded_op(
    tenant: Tenant, provider: Provider, key: str, *, payload: Any = None, response: Any = None
) -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, payload=payload).operation
    return services.operation_complete(
        operation_id=op.pk,
        lease_token=op.lease_token,
        provider_ref=f"ref-{key}",
        response_body=response or {"ok": True},
    )


def page(client: Client, url: str, **kwargs: Any) -> tuple[int, str]:
    response = client.get(url, **kwargs)
    if getattr(response, "streaming", False):
        return response.status_code, b"".join(response.streaming_content).decode()
    return response.status_code, response.content.decode()
