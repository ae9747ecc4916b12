"""Sweeper at scale: 1M operations on PostgreSQL, the plans of its candidate queries and
the time of one pass. Run with ``.venv/bin/python -m bench.sweeper`` (part of ``make bench``).

It builds its own database (onceguard_bench_sweep) so it never touches a test database.
Rows: 1M, of which 99.7% are finished and the rest spread over the open states, the shape
of a healthy production ledger. Every sweeper query must reach its rows through a partial
index on (status, time), never a sequential scan of the table.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
DB = common.suite_db("onceguard_bench_sweep")
ROWS = int(os.environ.get("BENCH_SWEEP_ROWS", 1_000_000))


def _url() -> str:
    return common.bench_database_url(common.server_url(), db=DB, suite="bench.sweeper")


def _django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("onceguard").setLevel(logging.WARNING)


# status by i % 1000: 997 succeeded; 1 claimed (lease expired), 1 uncertain, 1 review.
_EXPRESSIONS = {
    "key": "'k-' || i",
    "mode": "'guard'",
    "status": "CASE i %% 1000 WHEN 1 THEN 'claimed' WHEN 2 THEN 'uncertain' WHEN 3 THEN 'review' ELSE 'succeeded' END",
    # Stored as bytes (ledger.models.HexBytesField).
    "fingerprint": "decode(md5(i::text) || md5(i::text), 'hex')",
    "lease_token": "decode(md5(i::text), 'hex')",
    "provider_ref": "'ch_' || i",
    "attempts": "1",
    "uses_sent_marker": "true",
    "created_at": "now() - (i || ' seconds')::interval",
    "updated_at": "now() - (i || ' seconds')::interval",
    "done_at": "CASE WHEN i %% 1000 IN (1, 2, 3) THEN NULL ELSE now() END",
    "claimed_at": "now() - interval '1 hour'",
    "lease_expires_at": "CASE WHEN i %% 1000 = 1 THEN now() - interval '1 minute' END",
    "sent_at": "now() - interval '1 hour'",
}


def fill() -> float:
    """1M rows through generate_series (one statement), unless already there."""
    from django.db import connection

    from ledger.models import Operation, Tenant
    from ledger.protocol import services

    tenant = Tenant.objects.filter(slug="sweep").first() or services.tenant_create(slug="sweep")
    if Operation.objects.count() == ROWS:
        return 0.0
    columns, values, params = [], [], []
    for f in Operation._meta.concrete_fields:
        if f.primary_key:
            continue
        columns.append(f.column)
        if f.column == "tenant_id":
            values.append("%s")
            params.append(tenant.pk)
        elif f.name in _EXPRESSIONS:
            values.append(_EXPRESSIONS[f.name])
        elif f.null:
            values.append("NULL")
        else:
            default = f.get_default()
            values.append("%s::jsonb" if f.get_internal_type() == "JSONField" else "%s")
            params.append(json.dumps(default) if f.get_internal_type() == "JSONField" else default)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search CASCADE", [])
        cursor.execute(
            f"INSERT INTO ledger_operation ({', '.join(columns)}) SELECT {', '.join(values)}"
            " FROM generate_series(1, %s) AS i",
            [*params, ROWS],
        )
        cursor.execute("ANALYZE ledger_operation", [])
    return time.perf_counter() - started


def explain_sweeper_queries() -> list[dict[str, Any]]:
    """Capture the SQL of one sweeper pass, roll it back, and EXPLAIN the candidate queries."""
    from django.db import connection, transaction

    from ledger.recovery.sweeper import sweep

    captured: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        started = time.perf_counter()
        try:
            with transaction.atomic():
                report = sweep(batch=500)
                pass_seconds = time.perf_counter() - started
                raise _Rollback
        except _Rollback:
            pass
    plans = []
    seen: set[str] = set()
    for sql, params in captured:
        # The candidate queries: the ones that pick rows by state and time.
        if "LIMIT" not in sql or "ledger_operation" not in sql:
            continue
        shape = re.sub(r"\s+", " ", sql)
        if shape in seen:
            continue
        seen.add(shape)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
            transaction.set_rollback(True)
        if isinstance(plan, str):
            plan = json.loads(plan)
        root = plan[0]
        nodes = list(_walk(root["Plan"]))
        plans.append(
            {
                "query": shape[:160],
                "ms": round(root["Execution Time"], 3),
                "seq_scan_on_operations": any(
                    n.get("Node Type") == "Seq Scan" and n.get("Relation Name") == "ledger_operation" for n in nodes
                ),
                "indexes": sorted({n["Index Name"] for n in nodes if "Index Name" in n}),
                "rows_scanned": sum(
                    int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
                    for n in nodes
                    if "Scan" in n.get("Node Type", "")
                ),
            }
        )
    return [{"pass_seconds": round(pass_seconds, 3), "moved": report.counts}, *plans]


class _Rollback(Exception):
    pass


def _walk(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def main() -> int:
    url = _url()
    dbsetup.database_ready(url)
    _django(url)
    filled = fill()
    result = explain_sweeper_queries()
    head, plans = result[0], result[1:]
    print(f"\nSweeper over {ROWS:,} operations (filled in {filled:.1f} s; 0 = reused)")
    print(f"  one pass (rolled back): {head['pass_seconds']} s, moved {head['moved']}")
    print(f"  {'ms':>8}  {'rows scanned':>12}  seq scan?  indexes  query")
    for p in plans:
        print(
            f"  {p['ms']:>8}  {p['rows_scanned']:>12}  {'YES' if p['seq_scan_on_operations'] else 'no':>9}  {','.join(p['indexes']) or '-'}  {p['query'][:90]}"
        )
    out = ROOT / "var" / "bench-sweeper.json"
    out.write_text(json.dumps({"rows": ROWS, **head, "plans": plans}, indent=2, default=str))
    # A sequential scan at 1M rows is a failure; at a smoke run's few rows it is the
    # planner's right choice (common.SMOKE), and errors end the run with an exception.
    return 1 if not common.SMOKE and any(p["seq_scan_on_operations"] for p in plans) else 0


if __name__ == "__main__":
    raise SystemExit(main())
