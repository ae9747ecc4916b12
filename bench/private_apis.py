"""What each framework-internal use in ledger/platform/_adapters/ buys, against its public alternative,
on PostgreSQL (docs/adr/0004-private-framework-apis.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<scratch db> python -m bench.private_apis

The database is migrated if needed; a tenant ``bench-private-apis`` is created once. Each pair
runs in interleaved rounds on one connection; the table gives the median µs per call of each
side and the difference; the end-to-end pairs run a fresh claim→complete and a replay through the
services with the public alternative swapped in.
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


def _median_us(call: Call, n: int) -> tuple[float, float]:
    """Median wall and thread-CPU µs per call (CPU time barely moves with the machine's load)."""
    wall, cpu = [], []
    for _ in range(n):
        started, started_cpu = time.perf_counter(), time.thread_time()
        call()
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def _pair(name: str, private: Call, public: Call, *, n: int, rounds: int) -> dict[str, Any]:
    for call in (private, public):
        for _ in range(min(200, n)):
            call()
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    for _ in range(rounds):
        a.append(_median_us(private, n))
        b.append(_median_us(public, n))
    wall_a, cpu_a = (statistics.median(x[i] for x in a) for i in (0, 1))
    wall_b, cpu_b = (statistics.median(x[i] for x in b) for i in (0, 1))
    # Rounds in which the private side was faster, of all rounds (wall time).
    wins = sum(x[0] < y[0] for x, y in zip(a, b, strict=True))
    return {"pair": name, "wall": (wall_a, wall_b), "cpu": (cpu_a, cpu_b), "wins": wins, "rounds": rounds}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.private_apis", description=__doc__)
    p.add_argument("--n", type=int, default=2000, help="calls per side per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="run the pairs whose name contains this")
    args = p.parse_args(argv)
    only = args.__dict__.pop("only")
    url = os.environ["DATABASE_URL"]
    database_ready(url)
    setup_django(url)

    from django.db import connection

    from ledger.models import Operation, Tenant
    from ledger.protocol import services
    from ledger.store import fast_rows

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

    replay_key = f"private-apis-{run}-0"

    def replay_op() -> None:
        claimed = services.operation_claim(
            tenant=tenant,
            key=replay_key,
            provider=provider,
            action="bench",
            request={"ref": replay_key},
            mark_sent=True,
            actor="guard",
            via_claims=False,
        )
        assert claimed.replayed

    def swapped(op: Call, *, description: bool = False) -> Call:
        def call() -> None:
            if description:
                fast_rows.result_columns = by_description
            try:
                op()
            finally:
                fast_rows.result_columns = by_pgresult

        return call

    e2e = dict(n=max(50, args.n // 10), rounds=args.rounds)
    pairs = [
        (
            "operation row columns: pgresult vs cursor.description",
            lambda: _pair(
                "operation row columns: pgresult vs cursor.description", rows_pgresult, rows_description, **vars(args)
            ),
        ),
        (
            "fresh op: pgresult vs cursor.description",
            lambda: _pair(
                "fresh op: pgresult vs cursor.description", fresh_op, swapped(fresh_op, description=True), **e2e
            ),
        ),
        (
            "replay op: pgresult vs cursor.description",
            lambda: _pair(
                "replay op: pgresult vs cursor.description", replay_op, swapped(replay_op, description=True), **e2e
            ),
        ),
    ]
    results = [run_pair() for name, run_pair in pairs if only in name]
    print(
        f"{'pair':52} {'wall µs private/public':>22} {'saved':>6} {'CPU µs private/public':>21} {'saved':>6} {'wins':>5}"
    )
    for r in results:
        (wa, wb), (ca, cb) = r["wall"], r["cpu"]
        print(
            f"{r['pair']:52} {wa:10.0f} /{wb:10.0f} {100 * (wb - wa) / wb:5.1f}% {ca:9.0f} /{cb:10.0f}"
            f" {100 * (cb - ca) / cb:5.1f}% {r['wins']}/{r['rounds']}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
