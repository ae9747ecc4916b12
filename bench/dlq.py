"""DLQ at scale: 1M dead-letter entries on PostgreSQL; the console's and the API's filtered
lists must answer in under 300 ms. Run with ``.venv/bin/python -m bench.dlq``.

It builds its own database (onceguard_bench_dlq) so it never touches a test database, fills
it with one INSERT … SELECT generate_series (skipped when the rows are already there), then
times each filtered list through the real stack in-process (the DRF view with API-key auth,
the admin changelist with a logged-in user — a superuser and a tenant-scoped operator) and
EXPLAINs (ANALYZE) the list query each one ran, naming the indexes it used.

Rows: 4 tenants (70 % on the measured one), 200 workflows, 5 error classes, 15 % pending and
the rest replayed/resolved/discarded, failed over the last ~12 days — the shape of a DLQ
that operators keep tidy, with a backlog.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
DB = common.suite_db("onceguard_bench_dlq")
TARGET_MS = 300.0

# i % 100 → status; i % 20 → error class; i % 10 → tenant (0–6 the measured one).
_FILL = {
    "tenant_id": "CASE WHEN i % 10 < 7 THEN %(t0)s WHEN i % 10 = 7 THEN %(t1)s WHEN i % 10 = 8 THEN %(t2)s ELSE %(t3)s END",
    "event_id": "'n8n:wf-' || (i % 200) || ':' || i",
    "weak_identity": "false",
    "shape": "'n8n_execution'",
    "source_workflow_id": "'wf-' || (i % 200)",
    "source_workflow_name": "'workflow ' || (i % 200)",
    "source_execution_id": "i::text",
    "source_execution_url": "'https://n8n.example.invalid/workflow/' || (i % 200) || '/executions/' || i",
    "source_node": "'CRM: Create Contact'",
    "source_mode": "'webhook'",
    "payload": "jsonb_build_object('_enc', 'v1:bench:' || md5(i::text) || md5((i + 1)::text))",
    "search_fields": "jsonb_build_object('workflow.id', 'wf-' || (i % 200), 'execution.mode', 'webhook',"
    " 'event_type', CASE i % 4 WHEN 0 THEN 'call_analyzed' WHEN 1 THEN 'order_paid' ELSE 'lead_created' END)",
    "error_message": "'The service is receiving too many requests from you [429]'",
    "error_class": "CASE WHEN i % 20 < 10 THEN 'transient' WHEN i % 20 < 16 THEN 'invalid_input'"
    " WHEN i % 20 = 16 THEN 'permission' WHEN i % 20 < 19 THEN 'ambiguous' ELSE '' END",
    "failed_at": "now() - (i || ' seconds')::interval",
    "last_seen_at": "now() - (i || ' seconds')::interval",
    "retry_count": "i % 3",
    "seen_count": "1",
    "status": "CASE WHEN i % 100 < 15 THEN 'pending' WHEN i % 100 < 55 THEN 'replayed'"
    " WHEN i % 100 < 90 THEN 'resolved' ELSE 'discarded' END",
    "original_key": "'order-' || i || ':crm:create:v1'",
    "replay_target_slug": "''",
    "replay_count": "CASE WHEN i % 100 BETWEEN 15 AND 54 THEN 1 ELSE 0 END",
    "auto_replay_count": "0",
    "status_note": "''",
    "created_at": "now() - (i || ' seconds')::interval",
    "updated_at": "now() - (i || ' seconds')::interval",
    "operation_id": "NULL",
}


def _url() -> str:
    return common.bench_database_url(common.server_url(), db=DB, suite="bench.dlq")


def _django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1")  # every bench address is loopback
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("onceguard").setLevel(logging.WARNING)
    logging.getLogger("django.request").setLevel(logging.CRITICAL)


def fill(rows: int) -> tuple[list[int], float]:
    """The tenants and ``rows`` entries (one statement), unless they are there already."""
    from django.db import connection

    from dlq.models import FailedEvent
    from ledger.models import Tenant
    from ledger.protocol import services

    tenants = []
    for slug in ("bench", "bench-b", "bench-c", "bench-d"):
        tenants.append((Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug)).pk)
    if FailedEvent.objects.count() == rows:
        return tenants, 0.0
    fields = [f for f in FailedEvent._meta.concrete_fields if not f.primary_key]
    columns = [f.column for f in fields]
    params = {"t0": tenants[0], "t1": tenants[1], "t2": tenants[2], "t3": tenants[3], "rows": rows}
    values = []
    for f in fields:
        if f.column in _FILL:
            values.append(_FILL[f.column].replace("%", "%%").replace("%%(", "%("))
        elif f.null:
            values.append("NULL")
        else:
            # A column added since the fill was written: its model default, so the bench
            # follows the schema instead of stopping at every new field.
            json_field = f.get_internal_type() == "JSONField"
            default = f.get_default()
            params[f"d_{f.column}"] = json.dumps(default) if json_field else default
            values.append(f"%(d_{f.column})s::jsonb" if json_field else f"%(d_{f.column})s")
    defaulted = [f.column for f in fields if f.column not in _FILL]
    if defaulted:
        print(f"bench.dlq: filled with their defaults: {', '.join(defaulted)}", flush=True)
    values = ", ".join(values)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        assert connection.settings_dict["NAME"] == DB
        cursor.execute("TRUNCATE dlq_failedevent RESTART IDENTITY CASCADE")
        cursor.execute(
            f"INSERT INTO dlq_failedevent ({', '.join(columns)}) SELECT {values}"
            " FROM generate_series(1, %(rows)s) AS i",
            params,
        )
    # VACUUM (not in a transaction): visibility map for index-only scans, fresh statistics.
    connection.ensure_connection()
    connection.connection.autocommit = True
    with connection.connection.cursor() as raw:
        raw.execute("VACUUM ANALYZE dlq_failedevent")
    return tenants, time.perf_counter() - started


def _index_names(plan: Any) -> list[str]:
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.append(f"{node['Node Type']} {node['Index Name']}")
        elif node.get("Node Type") == "Seq Scan":
            found.append(f"Seq Scan {node.get('Relation Name')}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


def _explain(sql: str) -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return {"indexes": _index_names(plan), "execution_ms": round(plan[0]["Execution Time"], 2)}


def _list_query(captured: list[dict[str, str]]) -> str | None:
    """The query that fetched the page of entries (the biggest SELECT on the table)."""
    selects = [
        q["sql"]
        for q in captured
        if q["sql"].lstrip().upper().startswith("SELECT")
        and 'FROM "dlq_failedevent"' in q["sql"]
        and "COUNT(" not in q["sql"].upper()
        and "ORDER BY" in q["sql"].upper()
    ]
    # A page is LIMITed; the admin drops the LIMIT when everything fits on one page.
    limited = [sql for sql in selects if "LIMIT" in sql.upper()]
    return (limited or selects or [None])[0]


def _count_query(captured: list[dict[str, str]]) -> str | None:
    found = [q["sql"] for q in captured if "COUNT(" in q["sql"].upper() and '"dlq_failedevent"' in q["sql"]]
    return found[0] if found else None


def measure(label: str, fetch: Any, repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fetch()  # warm: caches, plans, the first page of the index in shared buffers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = fetch()
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{label}: HTTP {response.status_code} {response.content[:300]!r}")
    with CaptureQueriesContext(connection) as ctx:
        fetch()
    result: dict[str, Any] = {
        "label": label,
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(sorted(times)[max(0, int(len(times) * 0.95) - 1)], 1),
        "max_ms": round(max(times), 1),
        "queries": len(ctx.captured_queries),
    }
    sql = _list_query(ctx.captured_queries)
    if sql:
        result["list_query"] = _explain(sql)
    count_sql = _count_query(ctx.captured_queries)
    if count_sql:
        result["count_query"] = _explain(count_sql)
    result["ok"] = result["p95_ms"] < TARGET_MS
    return result


def scenarios(tenant_id: int) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    from django.utils import timezone

    day = timezone.now() - timezone.timedelta(days=5)
    window = {"failed_after": day.isoformat(), "failed_before": (day + timezone.timedelta(days=1)).isoformat()}
    api = [
        ("no filter", {}),
        ("status=pending", {"status": "pending"}),
        ("workflow=wf-10", {"workflow": "wf-10"}),
        ("error_class=permission", {"error_class": "permission"}),
        ("one day, 5 days ago", window),
        ("match workflow.id:wf-10", {"match": "workflow.id:wf-10"}),
        ("match event_type:order_paid", {"match": "event_type:order_paid"}),
        ("pending+transient+wf-10", {"status": "pending", "error_class": "transient", "workflow": "wf-10"}),
        ("pending, page_size=500", {"status": "pending", "page_size": 500}),
    ]
    console = [
        ("no filter", {}),
        ("status=pending", {"status__exact": "pending"}),
        ("error_class=permission", {"error_class__exact": "permission"}),
        ("workflow=wf-10", {"workflow": "wf-10"}),
        ("match workflow.id:wf-10", {"match": "workflow.id:wf-10"}),
        (
            "past 7 days",
            {"failed_at__gte": (timezone.now() - timezone.timedelta(days=7)).strftime("%Y-%m-%d 00:00:00+00:00")},
        ),
        ("tenant + pending", {"tenant": str(tenant_id), "status__exact": "pending"}),
        ("search =event_id", {"q": "n8n:wf-10:1210"}),
    ]
    return api, console


def run(rows: int, repeat: int) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from rest_framework.test import APIClient

    from ledger.models import Tenant
    from ledger.protocol import services

    tenants, fill_seconds = fill(rows)
    tenant = Tenant.objects.get(pk=tenants[0])
    _, secret = services.apikey_create(tenant=tenant, scopes=["read"], name="bench-dlq")
    api_client = APIClient(SERVER_NAME="127.0.0.1")
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    admin_user = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", password=None
    )
    operator = User.objects.filter(username="bench-operator").first() or User.objects.create_user(
        "bench-operator", password=None, is_staff=True
    )
    try:
        from review.models import StaffTenant

        StaffTenant.objects.get_or_create(user=operator, tenant=tenant)
        group = Group.objects.filter(name="operator").first()
        if group is not None:
            operator.groups.add(group)
    except ImportError:  # no console tenancy in this tree
        operator = admin_user
    consoles = []
    for who, user in (("superuser", admin_user), ("operator (1 tenant)", operator)):
        browser = Client(SERVER_NAME="127.0.0.1")
        browser.force_login(user)
        consoles.append((who, browser))

    api_cases, console_cases = scenarios(tenant.pk)
    results: dict[str, Any] = {"rows": rows, "fill_seconds": round(fill_seconds, 1), "api": [], "console": []}
    for label, params in api_cases:
        query = urlencode(params)
        results["api"].append(measure(label, lambda q=query: api_client.get(f"/api/v1/dlq/events?{q}"), repeat))
    # The second page: the cursor the first page hands out.
    first = api_client.get("/api/v1/dlq/events?status=pending").json()
    results["api"].append(measure("status=pending, page 2 (cursor)", lambda: api_client.get(first["next"]), repeat))
    for who, browser in consoles:
        for label, params in console_cases:
            query = urlencode(params)
            results["console"].append(
                measure(f"{who}: {label}", lambda q=query, b=browser: b.get(f"/admin/dlq/failedevent/?{q}"), repeat)
            )
    return results


def report(results: dict[str, Any]) -> str:
    lines = [
        f"DLQ list latency, {results['rows']:,} entries on PostgreSQL (fill {results['fill_seconds']} s;"
        f" target p95 < {TARGET_MS:.0f} ms)",
    ]
    for section in ("api", "console"):
        lines.append("")
        lines.append(f"{'API' if section == 'api' else 'Console (admin changelist)'}")
        lines.append(f"  {'case':44} {'p50':>7} {'p95':>7} {'max':>7}  {'SQL ms':>7}  indexes used")
        for r in results[section]:
            plan = r.get("list_query", {})
            lines.append(
                f"  {r['label'][:44]:44} {r['p50_ms']:7.1f} {r['p95_ms']:7.1f} {r['max_ms']:7.1f}"
                f"  {plan.get('execution_ms', 0):7.2f}  {', '.join(plan.get('indexes', [])) or '-'}"
                f"{'' if r['ok'] else '   <-- over target'}"
            )
            if "count_query" in r:
                count = r["count_query"]
                lines.append(
                    f"  {'  (capped count)':44} {'':7} {'':7} {'':7}  {count['execution_ms']:7.2f}"
                    f"  {', '.join(count['indexes'])}"
                )
    bad = [r["label"] for s in ("api", "console") for r in results[s] if not r["ok"]]
    lines.append("")
    lines.append("all under target" if not bad else f"over target: {', '.join(bad)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dlq", description=__doc__)
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_DLQ_ROWS", 1_000_000)))
    parser.add_argument(
        "--repeat",
        type=int,
        default=int(os.environ.get("BENCH_DLQ_REPEAT", 20)),
        help="timed requests per case (after one warm-up)",
    )
    parser.add_argument("--json", default=str(ROOT / "var" / "bench-dlq.json"))
    args = parser.parse_args(argv)
    url = _url()
    dbsetup.database_ready(url)
    _django(url)
    results = run(args.rows, args.repeat)
    print(report(results))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    # Errors (an answer other than 200) end the run above with SystemExit; a missed
    # target fails it too, except in a smoke run (common.SMOKE: tiny tables).
    return 0 if common.SMOKE or all(r["ok"] for s in ("api", "console") for r in results[s]) else 1


if __name__ == "__main__":
    sys.exit(main())
