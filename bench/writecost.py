"""What one operation writes: WAL, index entries, HOT share and statements, beside raw SQL (a).

Counts, not timings, so they hold on a loaded machine. Each scenario runs ``n`` fresh
claim→complete pairs, then ``n`` replays of the same (finished) keys, one after the other
in this process, untimed, after the timed groups of ``make bench``:

- (a) raw SQL, the baseline: the two statements of ``bench.raw`` on the narrow table;
- (b) the in-process guard (``run_once``);
- (c) the HTTP API through the WSGI handler in-process (the server's code path and SQL,
  without a socket).

Figures per op:

- **WAL** bytes and records of this database only: ``pg_walinspect`` reads the records
  between two positions and keeps those that touch a block of this database, plus the rest
  of the transactions that wrote them (their commit records). Bytes with and without
  full-page images (an image is written at the first touch of a page after a checkpoint,
  so that share depends on when the checkpoints fell). Without the extension (it needs a
  superuser to create) the WAL rows say so and are left out.
- **Index entries** per table: the index-insert WAL records (B-tree leaf inserts and
  splits, GIN fast-update appends and inserts) of each index, summed per table — exact,
  partial indexes included. Without ``pg_walinspect``: (inserts + non-HOT updates) × the
  table's indexes, an upper bound.
- **Heap rows** per table: ``pg_stat_user_tables`` deltas (inserts, updates, of which HOT,
  deletes), partitions counted in their root table; the **HOT share of the completion** is
  HOT updates / updates on the operation table (``bench_raw_op`` for (a)).
- **Statements** through the app's cursors (``connection.execute_wrapper``; for (a) a
  counting psycopg cursor) with transaction control (BEGIN, COMMIT, SAVEPOINT …) left out.
  Beside it, the round trips from libpq's trace (``bench.trace``, the timed scenarios'
  ``RT`` sample): everything on the wire, BEGIN/COMMIT included.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

# Transaction control is left out of "statements": it is what a statement costs, not one.
_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START TRANSACTION|SAVEPOINT|RELEASE)\b", re.I)

# WAL records that add an index entry: a B-tree leaf insert (a posting-list insert, or a
# page split carrying the new item), a GIN insert or a fast-update append to its pending
# list (the metapage record carries the appended tuples).
_INDEX_INSERTS = {
    "Btree": ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R"),
    "Gin": ("INSERT", "UPDATE_META_PAGE"),
}

# Ops per WAL read (see measure).
WAL_CHUNK = 100
# pg_walinspect is unavailable, or may not be created by this user.
WalReader = Callable[[str, str], dict[str, Any]] | None


@dataclass
class Cost:
    scenario: str
    kind: str  # "fresh" (claim→complete) or "replay"
    ops: int
    errors: int = 0
    first_error: str = ""
    wal: dict[str, float] | None = None  # bytes, bytes_no_fpi, records, commits per op
    tables: dict[str, dict[str, float]] = field(default_factory=dict)  # per op
    hot_share: float | None = None
    statements: float | None = None
    index_source: str = "wal"
    # Index entries per op of each index (WAL only), busiest first: the audit's figure.
    indexes: dict[str, float] = field(default_factory=dict)
    # Heap LOCK records per op, by table (row locks: foreign-key checks, FOR UPDATE).
    heap_locks: dict[str, float] = field(default_factory=dict)
    # WAL bytes per op of each index's insert records.
    index_bytes: dict[str, float] = field(default_factory=dict)
    # Records and WAL bytes per op by relation and record type (full-page images included).
    by_record: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "kind": self.kind,
            "ops": self.ops,
            "errors": self.errors,
            "first_error": self.first_error,
            "wal_per_op": self.wal,
            "tables_per_op": self.tables,
            "hot_share": self.hot_share,
            "statements_per_op": self.statements,
            "index_entries_from": self.index_source,
            "index_entries_per_index": self.indexes,
            "heap_locks_per_op": self.heap_locks,
            "index_wal_bytes_per_op": self.index_bytes,
            "wal_by_relation_and_record_per_op": self.by_record,
        }


def wal_reader(conn: psycopg.Connection) -> WalReader:
    """Reads this database's WAL between two positions; None (with the reason printed by the
    caller) where ``pg_walinspect`` cannot be created."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return None
    (oid,) = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    mine = f"%/{oid}/%"
    inserts = [(rm, rt) for rm, types in _INDEX_INSERTS.items() for rt in types]

    def read(start: str, end: str) -> dict[str, Any]:
        total = conn.execute(
            "WITH r AS (SELECT * FROM pg_get_wal_records_info(%s, %s)),"
            " tx AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %s AND xid <> 0)"
            " SELECT count(*), coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0),"
            " count(*) FILTER (WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%')"
            " FROM r WHERE block_ref LIKE %s OR xid IN (SELECT xid FROM tx)",
            [start, end, mine, mine],
        ).fetchone()
        # The relation of each index-insert record, by its file node (first block reference).
        rows = conn.execute(
            "WITH r AS (SELECT substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid AS node, record_length"
            " FROM pg_get_wal_records_info(%s, %s)"
            " WHERE block_ref LIKE %s AND (resource_manager, record_type) IN"
            f" ({', '.join(['(%s, %s)'] * len(inserts))}))"
            " SELECT t.relname, coalesce(pg_partition_root(i.indexrelid), i.indexrelid)::regclass::text, count(*),"
            " sum(r.record_length)"
            " FROM r JOIN pg_index i ON i.indexrelid = pg_filenode_relation(0, r.node)"
            " JOIN pg_class t ON t.oid = coalesce(pg_partition_root(i.indrelid), i.indrelid)"
            " GROUP BY 1, 2",
            [start, end, mine, *[x for pair in inserts for x in pair]],
        ).fetchall()
        # Row locks written to a table's rows (Heap LOCK records: SELECT … FOR KEY SHARE of a
        # foreign-key check, FOR UPDATE), by table: ADR 0019 counts the tenant's and provider's.
        locks = conn.execute(
            "WITH r AS (SELECT substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid AS node"
            " FROM pg_get_wal_records_info(%s, %s)"
            " WHERE block_ref LIKE %s AND resource_manager = 'Heap' AND record_type LIKE 'LOCK%%')"
            " SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text, count(*)"
            " FROM r JOIN pg_class c ON c.oid = pg_filenode_relation(0, r.node) GROUP BY 1",
            [start, end, mine],
        ).fetchall()
        # Every record of this database by relation (tables and indexes under their root;
        # records with no block, such as commits, as "-") and record type: where the bytes go.
        kinds = conn.execute(
            "WITH r AS (SELECT substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid AS node, resource_manager,"
            " split_part(record_type, ' ', 1) AS rt, record_length"
            " FROM pg_get_wal_records_info(%s, %s)"
            " WHERE block_ref LIKE %s OR xid IN (SELECT DISTINCT xid FROM pg_get_wal_records_info(%s, %s)"
            " WHERE block_ref LIKE %s AND xid <> 0))"
            " SELECT coalesce(coalesce(pg_partition_root(c.oid), c.oid)::regclass::text, '-'),"
            " r.resource_manager || '/' || r.rt, count(*), sum(r.record_length)"
            " FROM r LEFT JOIN pg_class c ON c.oid = pg_filenode_relation(0, r.node) GROUP BY 1, 2",
            [start, end, mine, start, end, mine],
        ).fetchall()
        return {
            "by_record": {f"{rel} {kind}": (int(n), int(b)) for rel, kind, n, b in kinds},
            "heap_locks": {table: int(n) for table, n in locks},
            "records": int(total[0]),
            "bytes": int(total[1]),
            "fpi_bytes": int(total[2]),
            "commits": int(total[3]),
            "index_entries": {
                table: sum(int(n) for t, _, n, _ in rows if t == table) for table in {t for t, _, _, _ in rows}
            },
            "by_index": {f"{table}.{index}": int(n) for table, index, n, _ in rows},
            # WAL bytes of those records (full-page images included), by index.
            "index_bytes": {f"{table}.{index}": int(b) for table, index, _, b in rows},
        }

    return read


_TABLE_STATS = (
    "SELECT coalesce(r.relname, s.relname), sum(s.n_tup_ins), sum(s.n_tup_upd), sum(s.n_tup_hot_upd),"
    " sum(s.n_tup_del) FROM pg_stat_user_tables s"
    " LEFT JOIN pg_class r ON r.oid = pg_partition_root(s.relid) GROUP BY 1"
)
_INDEX_COUNTS = (
    "SELECT coalesce(r.relname, t.relname), count(*) FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid"
    " JOIN pg_namespace n ON n.oid = t.relnamespace LEFT JOIN pg_class r ON r.oid = pg_partition_root(t.oid)"
    " WHERE n.nspname = 'public' AND t.relkind = 'r' GROUP BY 1"
)


def _table_stats(conn: psycopg.Connection) -> dict[str, tuple[int, int, int, int]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {r[0]: tuple(int(x or 0) for x in r[1:]) for r in conn.execute(_TABLE_STATS)}  # type: ignore[misc]


def _settled_stats(conn: psycopg.Connection, limit: int = 20) -> dict[str, tuple[int, int, int, int]]:
    """Table statistics once the writers' counts are in: read until two readings agree."""
    last = _table_stats(conn)
    for _ in range(limit):
        time.sleep(0.3)
        now = _table_stats(conn)
        if now == last:
            return now
        last = now
    return last


def _flushed_lsn(conn: psycopg.Connection) -> str:
    """A WAL position up to which everything written so far is flushed: a transaction that
    wrote WAL commits synchronously, which flushes all WAL before it (a transaction with only
    an id would commit asynchronously). Its message touches no block of any database."""
    conn.execute("SELECT pg_logical_emit_message(true, 'onceguard-bench', '')")
    return str(conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])


def measure(
    monitor: psycopg.Connection,
    wal: WalReader,
    scenario: str,
    kind: str,
    run_one: Callable[[Any], None],
    items: Sequence[Any],
    *,
    counted: Callable[[], int],
    operation_table: str,
    flush_stats: Callable[[], None],
) -> Cost:
    """Run ``items`` through ``run_one`` one by one and read what they wrote.

    ``flush_stats`` runs ``SELECT pg_stat_force_next_flush()`` on the writer's connection:
    an idle backend otherwise reports its table counts up to seconds later."""
    n = max(1, len(items))
    stats0 = _table_stats(monitor)
    statements0 = counted()
    errors, first, wal_error = 0, "", ""
    walled: dict[str, Any] | None = None
    wal_ops = 0
    # The WAL is read a chunk at a time: on a busy cluster a checkpoint recycles the segments
    # of a long window before it could be read.
    for at in range(0, len(items), WAL_CHUNK):
        chunk = items[at : at + WAL_CHUNK]
        start = _flushed_lsn(monitor)
        for item in chunk:
            try:
                run_one(item)
            except Exception as exc:  # counted and reported, never hidden
                errors += 1
                first = first or f"{type(exc).__name__}: {exc}"[:300]
        if wal is None:
            continue
        end = _flushed_lsn(monitor)
        try:
            part = wal(start, end) if start != end else None
        except psycopg.Error as exc:  # this chunk's segments recycled all the same: left out
            wal_error = wal_error or f"WAL of some ops unreadable: {exc}"[:300]
            continue
        wal_ops += len(chunk)
        walled = walled or {
            "records": 0,
            "bytes": 0,
            "fpi_bytes": 0,
            "commits": 0,
            "index_entries": {},
            "by_index": {},
            "index_bytes": {},
            "heap_locks": {},
            "by_record": {},
        }
        for key in ("records", "bytes", "fpi_bytes", "commits"):
            walled[key] += part[key] if part else 0
        for table, entries in (part or {}).get("index_entries", {}).items():
            walled["index_entries"][table] = walled["index_entries"].get(table, 0) + entries
        for index, entries in (part or {}).get("by_index", {}).items():
            walled["by_index"][index] = walled["by_index"].get(index, 0) + entries
        for index, size in (part or {}).get("index_bytes", {}).items():
            walled["index_bytes"][index] = walled["index_bytes"].get(index, 0) + size
        for table, locks in (part or {}).get("heap_locks", {}).items():
            walled["heap_locks"][table] = walled["heap_locks"].get(table, 0) + locks
        for what, (count, size) in (part or {}).get("by_record", {}).items():
            had = walled["by_record"].get(what, (0, 0))
            walled["by_record"][what] = (had[0] + count, had[1] + size)
    statements = counted() - statements0
    flush_stats()
    stats1 = _settled_stats(monitor)
    cost = Cost(scenario, kind, len(items), errors, first or wal_error, statements=round(statements / n, 2))
    index_counts = dict(monitor.execute(_INDEX_COUNTS).fetchall())
    for table, after in stats1.items():
        ins, upd, hot, dele = (a - b for a, b in zip(after, stats0.get(table, (0, 0, 0, 0)), strict=True))
        if not (ins or upd or dele):
            continue
        if walled is not None:
            entries = walled["index_entries"].get(table, 0) * n / wal_ops
        else:
            entries = (ins + upd - hot) * index_counts.get(table, 0)
        cost.tables[table] = {
            "inserts": round(ins / n, 2),
            "updates": round(upd / n, 2),
            "hot_updates": round(hot / n, 2),
            "deletes": round(dele / n, 2),
            "index_entries": round(entries / n, 2),
        }
        if table == operation_table and upd:
            cost.hot_share = round(hot / upd, 3)
    if walled is not None:
        cost.indexes = {
            index: round(entries / wal_ops, 2)
            for index, entries in sorted(walled["by_index"].items(), key=lambda kv: (-kv[1], kv[0]))
        }
        cost.wal = {
            "bytes": round(walled["bytes"] / wal_ops, 1),
            "bytes_no_fpi": round((walled["bytes"] - walled["fpi_bytes"]) / wal_ops, 1),
            "records": round(walled["records"] / wal_ops, 2),
            "commits": round(walled["commits"] / wal_ops, 2),
            "ops_read": wal_ops,
        }
        cost.heap_locks = {table: round(n / wal_ops, 2) for table, n in sorted(walled["heap_locks"].items())}
        cost.index_bytes = {index: round(size / wal_ops, 1) for index, size in sorted(walled["index_bytes"].items())}
        cost.by_record = {
            what: (round(count / wal_ops, 2), round(size / wal_ops, 1))
            for what, (count, size) in sorted(walled["by_record"].items(), key=lambda kv: -kv[1][1])
        }
    else:
        cost.index_source = "estimate"
    return cost


@contextmanager
def django_statement_counter() -> Iterator[Callable[[], int]]:
    """Statements through Django's cursors on this thread's connection, transaction
    control left out."""
    from django.db import connection

    box = [0]

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not _CONTROL.match(sql):
            box[0] += len(params) if many and params is not None else 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield lambda: box[0]


class CountingCursor(psycopg.Cursor):  # type: ignore[type-arg]
    """(a)'s cursor: counts what it executes, transaction control left out."""

    count = 0

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        if not _CONTROL.match(str(query)):
            CountingCursor.count += 1
        return super().execute(query, params, **kw)


def round_trips(stats_extra: dict[str, Any]) -> float | None:
    """Round trips per op from libpq's trace (``bench.trace``): everything the app sends,
    pipelines and BEGIN/COMMIT included (its statement shapes count only parsed statements,
    not prepared ones re-executed, so they cannot give a statement count)."""
    value = stats_extra.get("round_trips_per_op")
    return None if value is None else float(value)


# --- The table ------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base <= 0 or value < 0:
        return ""
    return f"{value / base:.2f}×"


def fmt_table(
    costs: list[Cost], cpu: dict[tuple[str, str], dict[str, float]], wire: dict[tuple[str, str], float]
) -> str:
    """One column per scenario, (a) first; ×(a) = the ratio to (a) in the same run."""
    scenarios = list(dict.fromkeys(c.scenario for c in costs))
    by = {(c.scenario, c.kind): c for c in costs}
    base = scenarios[0]
    width = 13
    head = f"{'per op':<52}" + "".join(
        f"{s[:width]:>{width}}" + ("" if s == base else f"{'×(a)':>9}") for s in scenarios
    )
    lines = [head, "-" * len(head)]

    def row(label: str, get: Callable[[str, str], float | None], kind: str, digits: int = 1) -> None:
        values = [get(s, kind) for s in scenarios]
        if all(v is None for v in values):
            return
        text = f"{kind + ': ' + label:<52}"
        for s, v in zip(scenarios, values, strict=True):
            text += f"{_fmt(v, digits):>{width}}" + ("" if s == base else f" {_ratio(v, values[0]):>8}")
        lines.append(text)

    def wal_field(name: str) -> Callable[[str, str], float | None]:
        return lambda s, k: (by[(s, k)].wal or {}).get(name) if (s, k) in by else None

    tables = sorted({t for c in costs for t in c.tables})
    for kind in ("fresh", "replay"):
        row("WAL bytes (this database)", wal_field("bytes"), kind, 0)
        row("WAL bytes without full-page images", wal_field("bytes_no_fpi"), kind, 0)
        row("WAL records", wal_field("records"), kind, 2)
        row("commits", wal_field("commits"), kind, 2)
        row("statements (app's cursors, no BEGIN/COMMIT)", lambda s, k: by[(s, k)].statements, kind, 2)
        row("round trips (libpq trace, with BEGIN/COMMIT)", lambda s, k: wire.get((s, k)), kind, 2)
        for t in tables:
            row(
                f"{t}: index entries",
                lambda s, k, t=t: by[(s, k)].tables.get(t, {}).get("index_entries"),
                kind,
                2,
            )
            row(
                f"{t}: heap rows ins+upd",
                lambda s, k, t=t: _rows(by[(s, k)].tables.get(t)),
                kind,
                2,
            )
        for t in sorted({t for c in costs for t in c.heap_locks}):
            row(f"{t}: row locks (Heap LOCK records)", lambda s, k, t=t: by[(s, k)].heap_locks.get(t), kind, 2)
        if kind == "fresh":
            row("completion HOT share (operation table)", lambda s, k: by[(s, k)].hot_share, kind, 2)
        for proc, name in (("client", "client"), ("app", "server"), ("pg", "PostgreSQL")):
            row(f"CPU ms, {name}", lambda s, k, p=proc: cpu.get((s, k), {}).get(p), kind, 3)
    for c in costs:
        if c.errors:
            lines.append(f"ERRORS {c.scenario} {c.kind}: {c.errors} of {c.ops}: {c.first_error[:120]}")
    source = {c.index_source for c in costs}
    lines.append(
        "WAL: pg_walinspect, this database's records and their transactions' commits."
        if "wal" in source
        else "WAL: pg_walinspect unavailable (CREATE EXTENSION needs a superuser): no WAL figures;"
        " index entries are (inserts + non-HOT updates) × indexes, an upper bound."
    )
    lines.append(
        "rows ins+upd: heap rows inserted and updated per op (pg_stat_user_tables); a table's HOT updates"
        " leave its indexes alone. CPU: from the timed runs above ((a) and (b) at 1 connection in-process,"
        " (c) at client concurrency 8: client = load processes, server = WSGI server, PostgreSQL = backends)."
    )
    return "\n".join(lines)


def fmt_indexes(costs: list[Cost]) -> str:
    """Index entries and their WAL bytes per op, by index, of every fresh scenario."""
    lines = []
    for c in costs:
        if c.kind != "fresh" or not c.indexes:
            continue
        lines.append(f"{c.scenario} fresh: index entries (WAL bytes) per op")
        for index, entries in c.indexes.items():
            lines.append(f"  {index:<60}{entries:>8.2f}{c.index_bytes.get(index, 0):>10,.0f} B")
    for c in costs:
        if c.kind != "fresh" or not c.by_record:
            continue
        lines.append(f"{c.scenario} fresh: WAL records (bytes) per op by relation and record type")
        for what, (count, size) in c.by_record.items():
            if size >= 1:
                lines.append(f"  {what:<60}{count:>8.2f}{size:>10,.0f} B")
    return "\n".join(lines)


def _rows(t: dict[str, float] | None) -> float | None:
    return None if t is None else round(t["inserts"] + t["updates"], 2)
