"""Helpers for the console suite: example payloads, staff users with roles and tenants,
operations in each interesting state."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client

from ledger.models import ErrorClass, IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from ledger.protocol import services
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
    from ledger.recovery.sweeper import sweep
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
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        error_class=ErrorClass.INVALID_INPUT,
        message="HTTP 422",
    )


def succeeded_op(
    tenant: Tenant, provider: Provider, key: str, *, payload: Any = None, response: Any = None
) -> Operation:
    op = services.operation_claim(tenant=tenant, key=key, provider=provider, payload=payload).operation
    return services.operation_complete(
        operation_id=op.pk,
        tenant_id=op.tenant_id,
        lease_token=op.lease_token,
        provider_ref=f"ref-{key}",
        response_body=response or {"ok": True},
    )


def page(client: Client, url: str, **kwargs: Any) -> tuple[int, str]:
    response = client.get(url, **kwargs)
    if getattr(response, "streaming", False):
        return response.status_code, b"".join(response.streaming_content).decode()
    return response.status_code, response.content.decode()


class FormValues(HTMLParser):
    """The values a browser would submit from a page's forms (inputs, selects, textareas)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, Any] = {}
        self._select: str | None = None
        self._multiple = False
        self._textarea: str | None = None

    def _add(self, name: str, value: str, many: bool) -> None:
        if many:
            self.values.setdefault(name, []).append(value)
        else:
            self.values[name] = value

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio"):
                if "checked" in a:
                    self._add(name, a.get("value", "on"), a.get("type") == "checkbox" and name in self.values)
            else:
                self.values[name] = a.get("value", "")
        elif tag == "select" and name:
            self._select, self._multiple = name, "multiple" in a
            if self._multiple:
                self.values.setdefault(name, [])
        elif tag == "option" and self._select and "selected" in a:
            self._add(self._select, a.get("value", ""), self._multiple)
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data.lstrip("\n") if not self.values[self._textarea] else data


def submit_form(client: Client, form_url: str, **changes: Any) -> Any:
    """GET a console form, change some fields (None removes one), POST it back as a browser would."""
    response = client.get(form_url)
    assert response.status_code == 200, (form_url, response.status_code)
    parser = FormValues()
    parser.feed(response.content.decode())
    data = {k: v for k, v in parser.values.items() if k not in ("_addanother", "_continue", "_save")}
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    data["_save"] = "Save"
    return client.post(form_url, data)


def _price_out(cursor: Any, in_index_order: bool) -> None:
    cursor.execute("SET LOCAL enable_seqscan = off")
    if in_index_order:
        # Sorts and bitmap scans priced out too: the plans left read an index in the query's
        # order. Which index the planner takes among several that could serve a tiny table
        # otherwise follows the statistics autovacuum last took (other tests fill and roll back
        # thousands of rows), not the query's shape.
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")


def seq_scan_free_plan(qs: Any, *, in_index_order: bool = False) -> str:
    """PostgreSQL's plan for ``qs`` with sequential scans priced out: an index that can serve
    it shows up even on the tests' nearly empty tables."""
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        _price_out(cursor, in_index_order)
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(r[0] for r in cursor.fetchall())


def generic_plan(qs: Any, *, in_index_order: bool = False) -> str:
    """The plan PostgreSQL settles on for ``qs`` as a prepared statement (its generic plan,
    parameters unseen), sequential scans priced out as in ``seq_scan_free_plan``."""
    import re

    import psycopg

    sql, params = qs.query.sql_with_params()
    counter = iter(range(1, 1000))
    prepared = re.sub(r"%s", lambda m: f"${next(counter)}", sql)
    connection.ensure_connection()
    # Client-side binding: EXECUTE's arguments are SQL text, not protocol parameters.
    with psycopg.ClientCursor(connection.connection) as cursor:
        _price_out(cursor, in_index_order)
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE og_generic AS {prepared}".replace("%", "%%"))
        try:
            args = ", ".join(["%s"] * len(params))
            cursor.execute(f"EXPLAIN EXECUTE og_generic({args})" if params else "EXPLAIN EXECUTE og_generic", params)
            return "\n".join(r[0] for r in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE og_generic")


def drop_indexes_until_rollback(*names: str) -> None:
    """Drops the named indexes for the rest of the test's transaction (its rollback restores
    them). Two partial indexes in the same order cost the same on the tests' tiny tables, so
    which one a plan takes follows the statistics of the moment; without the other, the plan
    shows whether the planner sees that the query's filter implies this index's predicate."""
    assert connection.in_atomic_block, "only inside the test's transaction"
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")
