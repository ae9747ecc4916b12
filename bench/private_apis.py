"""What each framework-internal use in ledger/_adapters/ buys, against its public alternative,
on PostgreSQL (docs/adr/0004-private-framework-apis.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<scratch db> python -m bench.private_apis

The database is migrated if needed; a tenant ``bench-private-apis`` is created once. Each pair
runs in interleaved rounds on one connection; the table gives the median µs per call of each
side and the difference, beside a fresh claim→complete through the services for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.dbsetup import database_ready, setup_django

Call = Callable[[], Any]


def _median_us(call: Call, n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _pair(name: str, private: Call, public: Call, *, n: int, rounds: int) -> dict[str, Any]:
    for call in (private, public):
        for _ in range(min(200, n)):
            call()
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(_median_us(private, n))
        b.append(_median_us(public, n))
    pa, pb = statistics.median(a), statistics.median(b)
    return {"pair": name, "private_us": pa, "public_us": pb, "saved_us": pb - pa, "rounds": (a, b)}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.private_apis", description=__doc__)
    p.add_argument("--n", type=int, default=2000, help="calls per side per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    url = os.environ["DATABASE_URL"]
    database_ready(url)
    setup_django(url)

    from django.db import connection, transaction

    from ledger import fast_rows, services, sql
    from ledger.models import Operation, Tenant

    tenant = Tenant.objects.filter(slug="bench-private-apis").first() or services.tenant_create(
        slug="bench-private-apis"
    )
    provider = services.provider_upsert(
        tenant=tenant, slug="bench", idempotency_class="key_enforced", base_url="http://127.0.0.1:9/"
    )
    run = f"{int(time.time()):x}"
    counter = iter(range(10**9))

    def fresh_op() -> None:
        key = f"private-apis-{run}-{next(counter)}"
        claimed = services.operation_claim(
            tenant=tenant,
            key=key,
            provider=provider,
            action="bench",
            request={"ref": key},
            mark_sent=True,
            actor="guard",
            via_claims=False,
        )
        op = claimed.operation
        services.operation_complete(
            operation_id=op.pk,
            tenant_id=op.tenant_id,
            lease_token=op.lease_token,
            response_body={"ok": True},
            actor="guard",
        )

    fresh_op()
    row_id = Operation.objects.filter(tenant=tenant).values_list("pk", flat=True).first()
    statement = "SELECT * FROM ledger_operation WHERE id = %s"

    def rows_pgresult() -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, [row_id])
            fast_rows.operations_from(cursor)

    by_pgresult = fast_rows.result_columns

    def by_description(cursor: Any) -> tuple[str, ...]:
        return tuple(column.name for column in cursor.description)

    def rows_description() -> None:
        fast_rows.result_columns = by_description
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, [row_id])
                fast_rows.operations_from(cursor)
        finally:
            fast_rows.result_columns = by_pgresult

    def plans_outermost() -> None:
        with transaction.atomic(), sql.index_plans(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    def plans_always_restored() -> None:
        # What index_plans must do when it cannot tell whether its block is the outermost.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql._INDEX_PLANS_SAVED, [])
            cursor.execute("SELECT 1")
            cursor.execute(sql._RESTORE_SAVED, [])

    def alone_pipelined() -> None:
        with connection.cursor() as cursor:
            sql.execute_with_index_plans(cursor, statement, [row_id])
            cursor.fetchall()

    def alone_in_a_transaction() -> None:
        with transaction.atomic(), sql.index_plans(), connection.cursor() as cursor:
            cursor.execute(statement, [row_id])
            cursor.fetchall()

    results = [
        _pair("operation row columns: pgresult vs cursor.description", rows_pgresult, rows_description, **vars(args)),
        _pair("index_plans: atomic depth vs always restore", plans_outermost, plans_always_restored, **vars(args)),
        _pair("a statement alone: pipeline vs BEGIN/COMMIT", alone_pipelined, alone_in_a_transaction, **vars(args)),
    ]
    fresh = statistics.median(_median_us(fresh_op, max(50, args.n // 10)) for _ in range(args.rounds))
    print(f"fresh claim→complete through the services: {fresh:.0f} µs (median of {args.rounds} rounds)")
    print(f"{'pair':58} {'private µs':>10} {'public µs':>10} {'saved µs':>9} {'% of a fresh op':>16}")
    for r in results:
        share = 100 * r["saved_us"] / fresh
        print(f"{r['pair']:58} {r['private_us']:10.1f} {r['public_us']:10.1f} {r['saved_us']:9.1f} {share:15.1f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
