"""Plans of the hot statements: EXPLAIN (ANALYZE, BUFFERS, WAL) of the raw seed statements
and of exactly the statements the ledger sends (captured in flight, explained inside a
savepoint that is rolled back before the real statement runs)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

import psycopg

from bench import raw

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
SCAN_NODES = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}


def summarize_plan(label: str, plan_json: Any) -> dict[str, Any]:
    top = plan_json[0] if isinstance(plan_json, list) else plan_json
    nodes: list[str] = []
    scanned = 0
    removed = 0

    def walk(node: dict[str, Any], depth: int) -> None:
        nonlocal scanned, removed
        rows = node.get("Actual Rows", 0)
        loops = node.get("Actual Loops", 1)
        text = node["Node Type"]
        if node.get("Operation") and node["Node Type"] == "ModifyTable":
            text = f"{node['Operation']}"
        if node.get("Relation Name"):
            text += f" {node['Relation Name']}"
        if node.get("Index Name"):
            text += f" using {node['Index Name']}"
        if node.get("CTE Name"):
            text += f" [{node['CTE Name']}]"
        if node.get("Subplan Name"):
            text += f" ({node['Subplan Name']})"
        if node.get("Conflict Resolution"):
            text += f" on conflict {node['Conflict Resolution']} (arbiter {', '.join(node.get('Conflict Arbiter Indexes', []))})"
        bits = [f"rows={rows}×{loops}"]
        gone = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
        if gone:
            bits.append(f"removed={gone}")
        if node.get("Conflicting Tuples") is not None:
            bits.append(f"conflicts={node['Conflicting Tuples']}")
        hit, read = node.get("Shared Hit Blocks", 0), node.get("Shared Read Blocks", 0)
        bits.append(f"buf hit={hit}" + (f" read={read}" if read else ""))
        nodes.append("  " * depth + text + "  " + " ".join(bits))
        if node["Node Type"] in SCAN_NODES and node["Node Type"] != "Bitmap Index Scan":
            scanned += rows * loops + gone
            removed += gone
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(top["Plan"], 0)
    plan = top["Plan"]
    return {
        "statement": label,
        "planning_ms": round(top.get("Planning Time", 0.0), 3),
        "execution_ms": round(top.get("Execution Time", 0.0), 3),
        "rows_scanned": scanned,
        "rows_removed_by_filter": removed,
        "buffers_hit": plan.get("Shared Hit Blocks", 0),
        "buffers_dirtied": plan.get("Shared Dirtied Blocks", 0),
        "wal_records": plan.get("WAL Records", 0),
        "wal_bytes": plan.get("WAL Bytes", 0),
        "wal_fpi": plan.get("WAL FPI", 0),
        "triggers": [t.get("Trigger Name") for t in top.get("Triggers", [])],
        "plan": nodes,
    }


def explain_raw(dsn: str, table: str, tenant_id: int, finished_key: str) -> list[dict[str, Any]]:
    """The raw statements: fresh insert, guarded update, replay insert, replay select."""
    out = []
    with psycopg.connect(dsn) as conn:  # a transaction, rolled back at the end
        sql = raw.statements(conn, table)
        name = "narrow" if table == raw.NARROW else "wide"
        key = "explain-" + secrets.token_hex(6)
        token = secrets.token_hex(16)
        plan = conn.execute(EXPLAIN + sql["insert"], [tenant_id, key, raw.FINGERPRINT, token]).fetchone()[0]
        out.append(summarize_plan(f"raw[{name}] fresh INSERT … ON CONFLICT DO NOTHING RETURNING id", plan))
        op_id = conn.execute(sql["select"], [tenant_id, key]).fetchone()[0]
        plan = conn.execute(EXPLAIN + sql["update"], ["ref", raw.BODY, op_id, token]).fetchone()[0]
        out.append(summarize_plan(f"raw[{name}] fresh UPDATE … WHERE id AND lease_token", plan))
        plan = conn.execute(EXPLAIN + sql["insert"], [tenant_id, finished_key, raw.FINGERPRINT, token]).fetchone()[0]
        out.append(summarize_plan(f"raw[{name}] replay INSERT (conflict, no row)", plan))
        plan = conn.execute(EXPLAIN + sql["select"], [tenant_id, finished_key]).fetchone()[0]
        out.append(summarize_plan(f"raw[{name}] replay SELECT by (tenant_id, key)", plan))
        conn.rollback()
    return out


EXPLAINABLE = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


def explain_ledger(steps: list[tuple[str, Callable[[], Any]]]) -> list[dict[str, Any]]:
    """Run each step in a transaction that is rolled back; EXPLAIN every statement it sends.

    The EXPLAIN runs in a savepoint rolled back just before the real statement executes,
    so each plan is of the statement exactly as the ledger sends it, in the state it meets.
    """
    from django.db import connection, transaction

    out: list[dict[str, Any]] = []
    current = {"label": ""}

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if not sql.lstrip().upper().startswith(EXPLAINABLE):
            # The services' own savepoints (a nested atomic block) have no plan.
            return execute(sql, params, many, context)
        raw_cursor = context["cursor"].cursor
        raw_cursor.execute("SAVEPOINT bench_explain")
        raw_cursor.execute(EXPLAIN + sql, params)
        plan = raw_cursor.fetchone()[0]
        raw_cursor.execute("ROLLBACK TO SAVEPOINT bench_explain")
        if isinstance(plan, str):
            plan = json.loads(plan)
        first = " ".join(sql.split())[:60]
        out.append(summarize_plan(f"{current['label']}: {first}…", plan))
        return execute(sql, params, many, context)

    for label, step in steps:
        current["label"] = label
        with transaction.atomic():
            with connection.execute_wrapper(wrapper):
                step()
            transaction.set_rollback(True)
    return out


def format_plans(plans: list[dict[str, Any]]) -> str:
    lines = []
    for p in plans:
        lines.append(
            f"- {p['statement']}\n    planning {p['planning_ms']} ms, execution {p['execution_ms']} ms,"
            f" rows scanned {p['rows_scanned']}, buffers hit {p['buffers_hit']} dirtied {p['buffers_dirtied']},"
            f" WAL {p['wal_records']} records / {p['wal_bytes']} B" + (f" / {p['wal_fpi']} FPI" if p["wal_fpi"] else "")
        )
        lines += [f"      {n}" for n in p["plan"]]
    return "\n".join(lines)


def explain_selects(label: str, run: Callable[[], Any]) -> list[dict[str, Any]]:
    """EXPLAIN the read-only statements ``run`` sends (e.g. an HTTP request's auth and
    provider lookups), after it ran; writes are explained by :func:`explain_ledger`."""
    from django.db import connection

    seen: dict[str, Any] = {}

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if sql.lstrip().upper().startswith("SELECT"):
            seen.setdefault(sql, dict(params) if isinstance(params, dict) else list(params or []))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        run()
    out = []
    with connection.cursor() as cursor:
        for sql, params in seen.items():
            cursor.execute(EXPLAIN + sql, params)
            plan = cursor.fetchone()[0]
            if isinstance(plan, str):
                plan = json.loads(plan)
            first = " ".join(sql.split())[:60]
            out.append(summarize_plan(f"{label}: {first}…", plan))
    return out
