"""Scale: the ledger at SCALE_ROWS operations (default 10M) beside the same on small tables.

    SCALE_ROWS=200000 .venv/bin/python -m bench.scale        # a quick run
    .venv/bin/python -m bench.scale                           # the real measurement (10M, ~12 GB)

Two databases on the DATABASE_URL server: ``bench_scale`` (SCALE_ROWS operations, each with
one attempt and, once it left ``claimed``, one event — a guard claim's move is on its row, ADR
0024 — one big tenant with 90 % of the rows, nine small ones, and a
quiet tenant with a few hundred succeeded rows) and ``bench_scale_small`` (SCALE_SMALL_ROWS,
same shape). Rows are generated in SQL (INSERT … SELECT generate_series, secondary indexes
built after the fill, foreign-key triggers off while filling), and a filled database is reused
while its recorded fill matches, so a re-run measures without refilling.

Each measurement runs in a child process per database, in the same run: every filter of
the operations API (those matching nothing for the quiet tenant too, and the second page),
the review and DLQ lists, every console changelist (unfiltered, each status, the console's
filters, an exact key and a substring search), the dashboard, one sweeper pass and one purge
batch (both rolled back). Each is repeated SCALE_REPEAT times — more than psycopg's prepare
threshold, so a prepared statement's generic plan is measured too — and printed as p50/p95
on small and big tables with their ratio, the number of SQL statements, and its target.
Claims (fresh claim→complete, random replay of an existing key, fresh on a small tenant) are
measured last, big and small interleaved in one process (``bench.scale_claims``: blocks
alternating between the databases, the ratio of block medians with its spread), so both
sides see the same machine in the same minutes; measured one database after the other, the
load that comes and goes on a shared machine lands on one side.

A fill ends as a database in service would be, not as a bulk load leaves it: its VACUUM
(ANALYZE) sets hint bits and the visibility map and takes statistics, then a CHECKPOINT
writes out what the fill and the VACUUM dirtied (gigabytes at 10M) so the measures do not
queue behind that write-back. Operations and attempts are filled at fillfactor 100 and given
back their own (90, migration ledger.0021/0025) afterwards (fill version 10): a live table's
old pages are packed — each row was inserted claimed and its one update (the completion)
took the room the fillfactor kept — so a fresh row goes to the table's end, as in service.
Before, the fill left room on nearly every page that its VACUUM published, and a fresh row
that fitted in it went to the next old page — a page read and a full-page image in the WAL
per fresh claim (bench/results/scale-10M.md, *Claims at scale*).

The plans of every list query (custom and generic) go to var/bench-scale-plans.md, the
figures to var/bench-scale.json.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench import common, dbsetup
from bench.scale_claims import MEASURES

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
BIG_DB = os.environ.get("SCALE_DB", common.suite_db("bench_scale"))
SMALL_DB = BIG_DB + "_small"
ROWS = int(os.environ.get("SCALE_ROWS", 10_000_000))
SMALL_ROWS = int(os.environ.get("SCALE_SMALL_ROWS", 20_000))
REPEAT = int(os.environ.get("SCALE_REPEAT", 20))
# Claims: SCALE_PAIRED_BLOCKS pairs of blocks of SCALE_PAIRED_OPS each (bench.scale_claims).
# SCALE_ONLY=growth: fill, claims, WAL/HOT and the byte breakdown only (no list, console,
# sweeper or purge measure) — the quick run of the 10M figures; SCALE_ONLY=bytes:
# the fill and the byte breakdown only; SCALE_ONLY=search: the error search's measures and,
# beside them in the same minutes, the lists that met their target before (SEARCH_REFERENCES;
# no claims, growth, sweeper or purge; custom plans only). SCALE_MARGINAL: fresh operations
# whose WAL and table growth are averaged (default 2,000). SCALE_ONLY=lists: the state,
# needs and updated_after lists of the API and the console (``_listed``) beside the
# references, nothing else (no claims, growth, sweeper or purge; custom plans only).
# SCALE_ONLY=console: the dashboard and every console page (``console …``), as lists.
ONLY = os.environ.get("SCALE_ONLY", "")
MARGINAL = int(os.environ.get("SCALE_MARGINAL", 2000))
# Single fresh claims whose WAL is read one by one (the least is the operation's own).
WAL_SAMPLES = int(os.environ.get("SCALE_WAL_SAMPLES", 60))
# Bump when the generated shape changes: a database filled by another version is refilled.
FILL_VERSION = 10
SMALL_TENANTS = 9
QUIET_ROWS = 300
BIG = "scale-big"
QUIET = "scale-quiet"
PROVIDER = "pay"
ACTION = "charge"
# Targets at 10M (docs/explanation/scale.md): every list p95 under this; claims within 15 % of small tables.
LIST_P95_MS = 300.0
CLAIM_RATIO = 1.15
# The small tenant whose fresh claims are measured (in both databases).
SMALL_TENANT = "scale-s01"
# Every filled row's payload (and response); fresh claims carry none, as before.
PAYLOAD = {"customer": "cus_123", "amount": 1999, "currency": "eur"}


def _url(db: str) -> str:
    return common.bench_database_url(common.server_url(), db=db, suite="bench.scale")


def prepare(db: str) -> str:
    """CREATE DATABASE ``db`` if missing and migrate it; its DATABASE_URL."""
    url = _url(db)
    dbsetup.database_ready(url)
    return url


# --- Fill -------------------------------------------------------------------------------------

TABLES = (
    "ledger_operation",
    "ledger_open_operation",
    "ledger_operation_search",
    "ledger_attempt",
    "ledger_operationevent",
)
TABLES_ARRAY = "ARRAY['" + "', '".join(TABLES) + "']"
# The tables and, for those partitioned by month, their partitions (a partitioned table has no
# storage of its own): what sizes are summed over.
_TREES = (
    "SELECT c FROM unnest(%s::regclass[]) AS c UNION ALL SELECT inhrelid::regclass FROM pg_inherits"
    " WHERE inhparent = ANY(%s::regclass[])"
)

# Row i's state, from (i / 10) % 1000 so that tenants (from i % 10) and states are independent.
_STATE = (
    "CASE WHEN s < 986 THEN 'succeeded' WHEN s < 990 THEN 'failed' WHEN s < 992 THEN 'abandoned'"
    " WHEN s < 994 THEN 'review' WHEN s < 996 THEN 'uncertain' WHEN s < 997 THEN 'claimed'"
    " WHEN s < 998 THEN 'retry_wait' ELSE 'claimed' END"
)

# A failed row's error (its operation's last error, its attempt's message, its failure event's
# reason), picked by a hash of i so that it is independent of tenant and state. Worded as
# providers word them; the error search's words (ERROR_SEARCH below) match a known share of
# the failure events: "timeout" 45 %, "duplicate_value" 0.5 %, "certificate" none.
_ERROR_MESSAGES = (
    # (per mille of failure events, error class, message)
    (250, "transient", "read timeout after 30 s (POST /v1/charges)"),
    (200, "transient", "upstream gateway timeout (HTTP 504)"),
    (200, "transient", "HTTP 503 from provider: service unavailable, retry later"),
    (200, "invalid_input", "Contact rejected: field email is not a valid address"),
    (145, "invalid_input", "card declined: insufficient funds"),
    (5, "invalid_input", "Contact rejected: DUPLICATE_VALUE on field email"),
)
assert sum(share for share, _, _ in _ERROR_MESSAGES) == 1000


def _error_case(column: int) -> str:
    bounds, arms = 0, []
    for share, error_class, message in _ERROR_MESSAGES:
        bounds += share
        arms.append(f" WHEN h < {bounds} THEN '{(error_class, message)[column]}'")
    return "CASE" + "".join(arms) + " END"


# The states whose move writes the error into the event's reason (ledger.protocol.selectors.ERROR_EVENT_STATES).
_FAILED = "('failed', 'retry_wait', 'uncertain', 'review')"
_ERROR = (
    f"SELECT CASE WHEN r.st IN {_FAILED} THEN {_error_case(1)} ELSE '' END AS message,"
    f" CASE WHEN r.st IN {_FAILED} THEN {_error_case(0)} ELSE '' END AS error_class"
    " FROM (SELECT ('x' || left(md5('error-' || r.i), 4))::bit(16)::int %% 1000 AS h) hashed"
)
# The failure event's reason as ledger.protocol.transitions.holder writes it: its decision's reason,
# then the message (ledger.protocol.transitions.holder._decide_failure).
# What the error search is measured with (API ``error=``, the console's search box), by the
# share of failure events that match: 0.5 %, 45 %, none; and a near miss, whose every trigram
# is in the commonest messages but never in this order (the index narrows nothing: every
# "gateway timeout" event is read and rejected).
# Measured beside the error search by SCALE_ONLY=search: the lists that met their target on an
# idle machine (bench/results/scale-10M.md), so that a loaded machine's share of a figure shows.
SEARCH_REFERENCES = (
    "API operations (no filter)",
    "API operations page_size=500",
    "console dashboard",
    "console ledger.operation",
    "console operations search substring",
)
ERROR_SEARCH = {
    "rare": "duplicate_value",
    "common": "timeout",
    "none": "certificate",
    "near miss": "timeout gateway",
}
_REASON = (
    f"CASE WHEN status IN {_FAILED} THEN (CASE WHEN status = 'retry_wait' THEN 'transient: retry scheduled: '"
    " WHEN status = 'uncertain' THEN 'ambiguous outcome: '"
    " WHEN error_class = 'transient' THEN 'transient: attempts exhausted: '"
    " ELSE error_class || ': no retry: ' END) || last_error ELSE 'completed' END"
)


def _drop_secondary(cursor: Any) -> list[str]:
    """Drop the tables' unique constraints and non-primary indexes; the statements that
    put them back (the fill then writes heap only, and each index is built once, sorted)."""
    restore: list[str] = []
    cursor.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid::regclass::text = ANY(%s) AND contype = 'u'",
        [list(TABLES)],
    )
    for table, name, definition in cursor.fetchall():
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        restore.append(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    cursor.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " WHERE i.indrelid::regclass::text = ANY(%s) AND NOT i.indisprimary",
        [list(TABLES)],
    )
    for name, definition in cursor.fetchall():
        cursor.execute(f"DROP INDEX {name}")
        # A partitioned table's index reads back as "CREATE INDEX … ON ONLY <table>", which
        # builds no partition's index (and leaves the parent's invalid): without ONLY it
        # builds every partition's and attaches them.
        restore.append(definition.replace(" ON ONLY ", " ON ", 1))
    return restore


# Filled at fillfactor 100, then given their own back (fill version 10): the tables whose rows
# a live ledger updates once after inserting them (operations and attempts, each partition).
_PACKED = ("ledger_operation", "ledger_attempt")


def _pack(cursor: Any) -> list[str]:
    """Set fillfactor 100 on each of _PACKED's tables (a partitioned table: its partitions,
    which hold the storage parameters) that has another; the statements that put each
    one's own value back."""
    cursor.execute(
        "SELECT c.oid::regclass::text, opt FROM pg_class c, unnest(c.reloptions) AS opt"
        " WHERE c.relkind = 'r' AND opt LIKE 'fillfactor=%%' AND (c.oid = ANY(%s::regclass[])"
        " OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = ANY(%s::regclass[])))",
        [list(_PACKED), list(_PACKED)],
    )
    restore = []
    for table, option in cursor.fetchall():
        cursor.execute(f"ALTER TABLE {table} SET (fillfactor = 100)")
        restore.append(f"ALTER TABLE {table} SET ({option})")
    return restore


def fill(rows: int) -> float:
    """``rows`` operations (+1 attempt each, +1 event each that left ``claimed``) unless the
    recorded fill matches."""
    from django.db import connection, transaction

    from ledger.models import Tenant, sealed_to_bytes
    from ledger.platform import crypto
    from ledger.protocol import services

    assert connection.settings_dict["NAME"] in (BIG_DB, SMALL_DB)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_scale_fill (rows bigint, version int, filled_at timestamptz)")
        cursor.execute("SELECT rows, version FROM bench_scale_fill")
        if cursor.fetchone() == (rows, FILL_VERSION):
            return 0.0
    started = time.perf_counter()
    tenants = {}
    for slug in [BIG, QUIET, *(f"scale-s{n:02}" for n in range(1, SMALL_TENANTS + 1))]:
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug)
        services.provider_upsert(
            tenant=tenant, slug=PROVIDER, base_url="http://127.0.0.1:9/", idempotency_class="key_enforced"
        )
        tenants[slug] = tenant.pk
    fingerprint = services.request_fingerprint(mode="guard", provider=PROVIDER, action=ACTION, request=None)
    # In its stored form: bytes (ledger.models.SealedJSONField; fill version 6).
    sealed = sealed_to_bytes(crypto.seal_json(PAYLOAD))
    smalls = [tenants[f"scale-s{n:02}"] for n in range(1, SMALL_TENANTS + 1)]
    # One transaction: a fill that fails half-way leaves the schema (dropped indexes) as it was.
    with transaction.atomic(), connection.cursor() as cursor:
        # The dashboard's rollup of the rows this replaces goes with them.
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_tombstone, review_activityhour RESTART IDENTITY CASCADE"
        )
        restore = _drop_secondary(cursor)
        # Packed pages, as a live table's are (fill version 10; the module's docstring): each
        # table filled at fillfactor 100 gets its own storage parameters back after the fill.
        restore += _pack(cursor)
        # Foreign-key triggers off for this session's inserts: every row points at a row this
        # fill wrote (attempts and events are selected from the operations just inserted).
        cursor.execute("SET session_replication_role = replica")
        # i: 1..rows, oldest first over 180 days; tenant from i % 10 (9 in 10 rows the big
        # tenant's), state from (i / 10) % 1000; the quiet tenant's rows come after.
        cursor.execute(
            "INSERT INTO ledger_operation (tenant_id, key, mode, status, provider_id, action, fingerprint,"
            " payload, response_body, attempts, throttled_attempts, max_attempts, lease_token, uses_sent_marker,"
            " last_error, error_class, provider_ref, response_status, reconciliation_handle, execution_id,"
            " workflow_id, workflow_version, correlation_id, lookup_failures, request_bytes, cost, callback_url,"
            " run, record, claim_actor, claim_sent, created_at, updated_at, done_at, claimed_at,"
            " lease_expires_at, sent_at, next_attempt_at)"
            " SELECT t, 'ord-' || i || '-' || left(md5(i::text), 8), 'guard', st,"
            " (SELECT id FROM ledger_provider p WHERE p.tenant_id = t), %(action)s, decode(%(fp)s, 'hex'),"
            " %(sealed)s,"
            " CASE WHEN st = 'succeeded' THEN %(sealed)s END, 1, 0, 4, decode(md5(i::text), 'hex'), true,"
            " e.message, e.error_class,"
            " CASE WHEN st = 'succeeded' THEN 'ch_' || left(md5('r' || i), 20) ELSE '' END,"
            " CASE WHEN st = 'succeeded' THEN 200 END,"
            " CASE WHEN i %% 2 = 0 THEN 'h-' || i ELSE '' END, 'exec-' || (i / 3), 'wf-' || (i %% 50), '3',"
            " 'corr-' || (i / 3), 0, 0, 0, '', '', '', 'api', true, at, at + interval '1 second',"
            " CASE WHEN st IN ('succeeded', 'failed', 'abandoned') THEN at + interval '1 second' END, at,"
            " CASE WHEN st = 'claimed' THEN (CASE WHEN s = 996 THEN now() - interval '1 minute'"
            " ELSE now() + interval '1 hour' END) END, at,"
            " CASE WHEN st = 'retry_wait' THEN now() + interval '1 hour' END"
            " FROM (SELECT i, s, at, CASE WHEN i > %(rows)s THEN %(quiet)s WHEN i %% 10 <> 0 THEN %(big)s"
            " ELSE (%(smalls)s::bigint[])[(i / 10) %% %(n_small)s + 1] END AS t,"
            " CASE WHEN i > %(rows)s THEN 'succeeded' ELSE " + _STATE + " END AS st"
            " FROM (SELECT i, (i / 10) %% 1000 AS s,"
            " now() - interval '180 days' * (1 - i::float8 / %(all)s) AS at"
            " FROM generate_series(1, %(all)s) AS i) g) r, LATERAL (" + _ERROR + ") e",
            {
                "action": ACTION,
                "fp": fingerprint,
                "sealed": sealed,
                "rows": rows,
                "all": rows + QUIET_ROWS,
                "quiet": tenants[QUIET],
                "big": tenants[BIG],
                "smalls": smalls,
                "n_small": SMALL_TENANTS,
            },
        )
        cursor.execute(
            "INSERT INTO ledger_attempt (tenant_id, operation_id, number, lease_token, started_at, lease_expires_at,"
            " sent_at, finished_at, outcome, error_class, message, provider_ref, response_status, execution_id)"
            " SELECT tenant_id, id, 1, lease_token, created_at, lease_expires_at, sent_at, done_at,"
            " CASE status WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed'"
            " WHEN 'uncertain' THEN 'ambiguous' WHEN 'review' THEN 'ambiguous' WHEN 'retry_wait' THEN 'transient'"
            " WHEN 'abandoned' THEN 'ambiguous' ELSE 'pending' END,"
            " error_class, last_error, provider_ref, response_status, execution_id FROM ledger_operation"
        )
        # A guard claim's move ('' → claimed) is on its row (ADR 0024; claim_actor, claim_sent
        # above, as operation_claim_pg writes them for a claim that is also the sent marker:
        # sent_at is the claim's time), so each operation has one event row, its move out of
        # claimed (fill version 10; before, a claim event too). Every filled row is guard mode.
        cursor.execute(
            "INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason,"
            " attempt, at)"
            " SELECT tenant_id, id, 'claimed', status, 'api', " + _REASON + ", 1, updated_at"
            " FROM ledger_operation WHERE status <> 'claimed' ORDER BY 2"
        )
        # The search rows (ADR 0018): the claim's identifiers, and the provider reference the
        # completion appended (fill version 8).
        cursor.execute(
            "INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)"
            " SELECT id, 0, tenant_id, false,"
            " key || chr(1) || reconciliation_handle || chr(1) || execution_id || chr(1) || correlation_id"
            " FROM ledger_operation"
            " UNION ALL SELECT id, 1, tenant_id, true, provider_ref FROM ledger_operation WHERE provider_ref <> ''"
        )
        # The work queue's mirror of the open rows (ADR 0017): the fill's replica role keeps its
        # triggers off, so its rows are copied as the backfill would (fill version 9).
        from ledger.store import open_rows

        cursor.execute(
            f"INSERT INTO ledger_open_operation ({open_rows.COLUMNS})"
            f" SELECT {open_rows.COLUMNS} FROM ledger_operation WHERE status NOT IN {open_rows.TERMINAL_SQL}"
        )
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute("SET max_parallel_maintenance_workers = 1")
        for statement in restore:
            cursor.execute(statement)
        cursor.execute("DELETE FROM bench_scale_fill")
        cursor.execute("INSERT INTO bench_scale_fill VALUES (%s, %s, now())", [rows, FILL_VERSION])
    # VACUUM cannot run in a transaction block; Django's cursor is in autocommit here.
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
        settle(cursor)
    return time.perf_counter() - started


def settle(cursor: Any) -> None:
    """Write out what the fill dirtied before anything is measured. At 10M the VACUUM after
    the fill dirties every heap page (hint bits, all-visible), gigabytes the kernel writes back
    for minutes afterwards; measured then, the big database's side queued behind that I/O and
    a checkpoint the fill's WAL had started (bench/results/scale-10M.md, *Claims at scale*). CHECKPOINT
    writes and syncs it all now; it needs superuser or pg_checkpoint, and without either the
    fill goes on (and says so)."""
    try:
        cursor.execute("CHECKPOINT")
    except Exception as exc:  # no privilege: measured as before, with the note
        print(f"  (no CHECKPOINT after the fill: {type(exc).__name__}: {exc})", flush=True)


# --- Measurements (in the child process of one database) --------------------------------------

BUDGET_S = float(os.environ.get("SCALE_BUDGET_SECONDS", 60))


class Recorder:
    """Runs each measured call REPEAT times (fewer past BUDGET_S), keeping latencies, the
    number of SQL statements of the last call and its slowest statement (for the plans)."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}

    def measure(self, name: str, call: Callable[[], Any], *, repeat: int = REPEAT, group: str = "list") -> None:
        from django.db import connection

        if ONLY == "search" and not _searched(name):
            return
        if ONLY == "lists" and not _listed(name):
            return
        if ONLY == "console" and not name.startswith("console "):
            return
        latencies: list[float] = []
        statements: list[tuple[float, str, Any]] = []
        started = time.perf_counter()
        error = ""

        def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                statements.append((time.perf_counter() - t0, sql, params))

        # Beside the wall time: this process's CPU time and the time spent waiting on SQL per
        # call. On a machine shared with other work the wall time is mostly queueing; these
        # say where a call's own time goes (the database server's CPU is in the SQL time).
        cpu: list[float] = []
        in_sql: list[float] = []
        for n in range(repeat):
            last = n == repeat - 1 or time.perf_counter() - started > BUDGET_S
            statements.clear()
            c0 = time.process_time()
            t0 = time.perf_counter()
            try:
                with connection.execute_wrapper(capture):
                    call()
            except Exception as exc:  # recorded and printed: a failing measurement is a finding
                error = f"{type(exc).__name__}: {exc}"[:300]
            latencies.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            in_sql.append(sum(s[0] for s in statements))
            if last or error:
                break
        # The process's first call of a page pays what later calls find done (a connection's
        # catalog caches, a first JIT): kept apart, so a p95 that is the first call shows as one.
        first = latencies[0] if latencies else float("nan")
        latencies.sort()
        cpu.sort()
        in_sql.sort()
        slowest = max(statements, default=(0.0, "", None), key=lambda s: s[0])
        self.results[name] = {
            "group": group,
            "n": len(latencies),
            "p50_ms": round(_pct(latencies, 50) * 1000, 2),
            "p95_ms": round(_pct(latencies, 95) * 1000, 2),
            "max_ms": round(latencies[-1] * 1000, 2),
            "first_ms": round(first * 1000, 2),
            "cpu_p50_ms": round(_pct(cpu, 50) * 1000, 2),
            "sql_p50_ms": round(_pct(in_sql, 50) * 1000, 2),
            "queries": len(statements),
            "slowest_ms": round(slowest[0] * 1000, 2),
            "slowest_sql": slowest[1],
            "slowest_params": [str(p) for p in slowest[2]] if slowest[2] else [],
            "_params": slowest[2],
            "error": error,
        }


def _searched(name: str) -> bool:
    """Whether SCALE_ONLY=search measures ``name``: a search (error, console) or a filter that
    names no provider, or one of the references."""
    return " error" in name or " search " in name or "no such provider" in name or name in SEARCH_REFERENCES


def _listed(name: str) -> bool:
    """Whether SCALE_ONLY=lists measures ``name``: a list by state, by what it needs or by
    ``updated_after`` (ADR 0027), or one of the references."""
    return any(part in name for part in ("status=", "needs=", "updated_after")) or name in SEARCH_REFERENCES


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    rank = max(1, min(len(values), int(round(q / 100.0 * len(values) + 0.5))))
    return values[rank - 1]


def _key(i: int) -> str:
    import hashlib

    return f"ord-{i}-{hashlib.md5(str(i).encode()).hexdigest()[:8]}"


def _big_succeeded(rows: int, rng: random.Random) -> int:
    """A row number of the big tenant whose operation succeeded (the fill's formulas)."""
    while True:
        i = rng.randint(1, rows)
        if i % 10 != 0 and (i // 10) % 1000 < 986:
            return i


# The console search's common text: "ord-1" is in one key in nine (keys ord-<i>-<md5 8>), and
# those are the oldest rows (i from 1M to 2M at 10M) — a newest-first walk reads the rest first.
SEARCH_COMMON = "ord-1"


def _staff_of(tenant: Any) -> Any:
    """A console user who is staff of ``tenant`` only (every group's permissions)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from review.models import StaffTenant

    users = get_user_model()
    name = f"scale-staff-{tenant.slug}"
    user = users.objects.filter(username=name).first()
    if user is None:
        user = users.objects.create_user(name, is_staff=True)
        user.groups.add(*Group.objects.all())
        StaffTenant.objects.create(user=user, tenant=tenant)
    return user


def measure_all(rows: int, label: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    from ledger.models import Operation, Provider, Tenant
    from ledger.protocol import services

    rng = random.Random(16)
    rec = Recorder()
    big = Tenant.objects.get(slug=BIG)
    quiet = Tenant.objects.get(slug=QUIET)
    small = Tenant.objects.get(slug=SMALL_TENANT)
    providers = {p.tenant_id: p for p in Provider.objects.filter(slug=PROVIDER)}
    run_id = f"{int(time.time())}-{os.getpid()}"

    # Fresh claims (claim → complete) for the WAL and growth figures, and replays of random
    # finished keys; the claim rows of the report are bench.scale_claims' (main()).
    fresh = iter(range(10**9))

    def claim_fresh(tenant: Tenant) -> Callable[[], None]:
        def call() -> None:
            result = services.operation_claim(
                tenant=tenant,
                key=f"fresh-{run_id}-{next(fresh)}",
                provider=providers[tenant.pk],
                action=ACTION,
            )
            op = result.operation
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_x"
            )

        return call

    def claim_replay() -> None:
        result = services.operation_claim(
            tenant=big, key=_key(_big_succeeded(rows, rng)), provider=providers[big.pk], action=ACTION
        )
        assert result.replayed, "a finished key must replay"

    if ONLY == "bytes":
        return _sized({"label": label, "rows": rows, "growth": {}, "results": {}, "plans": []})
    # Warm-up (imports, caches, prepared statements) outside the figures.
    for _ in range(30):
        claim_fresh(big)()
        claim_replay()
    growth = wal_and_hot(claim_fresh(big)) if ONLY not in ("search", "lists", "console") else {}
    if ONLY == "growth":
        Operation.objects.filter(key__startswith=f"fresh-{run_id}-").delete()
        return _sized({"label": label, "rows": rows, "growth": growth, "results": rec.results, "plans": []})

    # API lists.
    _, big_secret = services.apikey_create(tenant=big, scopes=["read"], name="scale")
    _, quiet_secret = services.apikey_create(tenant=quiet, scopes=["read"], name="scale")
    api_big = Client(HTTP_AUTHORIZATION=f"Bearer {big_secret}", HTTP_HOST="127.0.0.1")
    api_quiet = Client(HTTP_AUTHORIZATION=f"Bearer {quiet_secret}", HTTP_HOST="127.0.0.1")
    sample = _big_succeeded(rows, rng)
    known = Operation.objects.filter(tenant=big, key=_key(sample)).values().first() or {}
    recent = urlencode({"updated_after": (known.get("updated_at") or timezone.now()).isoformat()})

    def get(client: Client, path: str, expect: int = 200) -> Callable[[], None]:
        def call() -> None:
            response = client.get(path)
            assert response.status_code == expect, f"{path}: {response.status_code} {response.content[:200]!r}"

        return call

    first = api_big.get("/api/v1/operations").json()
    second_page = first.get("next") or "/api/v1/operations"
    op_filters = {
        "": "",
        "key (exists)": f"key={known.get('key', '')}",
        "key (no such key)": "key=no-such-key",
        "status=succeeded": "status=succeeded",
        "status=failed": "status=failed",
        "status=review": "status=review",
        "status=claimed": "status=claimed",
        "provider": f"provider={PROVIDER}",
        "provider + status=failed": f"provider={PROVIDER}&status=failed",
        # A slug that names none of the tenant's providers (576 ms p95 at 2M rows while the
        # filter joined on the slug): the empty page, without reading the operations.
        "provider (no such provider)": "provider=no-such-provider",
        "updated_after (a random row's)": recent,
        "reconciliation_handle": f"reconciliation_handle=h-{sample - sample % 2}",
        "provider_ref": f"provider_ref={known.get('provider_ref', '')}",
        "execution_id": f"execution_id={known.get('execution_id', '')}",
        "correlation_id": f"correlation_id={known.get('correlation_id', '')}",
        "page_size=500": "page_size=500",
    }
    for name, query in op_filters.items():
        rec.measure(f"API operations {name or '(no filter)'}", get(api_big, f"/api/v1/operations?{query}"))
    rec.measure("API operations second page", get(api_big, second_page))
    for name in ("", "status=failed", "status=review", "key=no-such-key", f"provider={PROVIDER}&status=review"):
        rec.measure(
            f"API operations {name or '(no filter)'} [quiet tenant]", get(api_quiet, f"/api/v1/operations?{name}")
        )
    for name, text in ERROR_SEARCH.items():
        query = urlencode({"error": text})
        rec.measure(f"API operations error={text} ({name})", get(api_big, f"/api/v1/operations?{query}"))
    rec.measure(
        f"API operations error={ERROR_SEARCH['common']} [quiet tenant]",
        get(api_quiet, "/api/v1/operations?" + urlencode({"error": ERROR_SEARCH["common"]})),
    )
    rec.measure("API review items", get(api_big, "/api/v1/review/items"))
    rec.measure("API review items [quiet tenant]", get(api_quiet, "/api/v1/review/items"))
    rec.measure("API review items q=key", get(api_big, f"/api/v1/review/items?q={known.get('key', '')}"))
    rec.measure(
        "API review items provider (no such provider)", get(api_big, "/api/v1/review/items?provider=no-such-provider")
    )
    rec.measure("API dlq events", get(api_big, "/api/v1/dlq/events"))
    rec.measure("API dlq events [quiet tenant]", get(api_quiet, "/api/v1/dlq/events?status=pending"))
    rec.measure("API run (correlation id)", get(api_big, f"/api/v1/runs/{known.get('correlation_id', 'x')}"))

    # Console: every changelist, the operations list's filters and search, the dashboard.
    user_model = get_user_model()
    admin_user = user_model.objects.filter(username="scale-admin").first() or user_model.objects.create_superuser(
        "scale-admin", "scale@example.invalid", None
    )
    console = Client(HTTP_HOST="127.0.0.1")
    console.force_login(admin_user)
    # The dashboard's activity chart reads finished hours from a rollup that a schedule keeps
    # (review.activity_rollup, every 15 minutes): its pass here stands for the passes a
    # deployment would have run over the hours the fill stands for, and is measured apart.
    from review.schedules import activity_rollup_task

    rec.measure("activity rollup pass (schedule)", activity_rollup_task, repeat=1, group="batch")
    rec.measure("console dashboard", get(console, "/admin/"))
    from django.contrib import admin

    # ModelAdmins and the history tables' own pages (review.console.history_pages: attempts, events).
    listed = [*admin.site._registry, *admin.site._history_pages]
    for model in sorted(listed, key=lambda m: (m._meta.app_label, m._meta.model_name)):
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        rec.measure(f"console {model._meta.app_label}.{model._meta.model_name}", get(console, url), group="console")
    ops_url = reverse("admin:ledger_operation_changelist")
    for name, query in {
        "status=review": "status__exact=review",
        "status=failed": "status__exact=failed",
        "quiet tenant, status=failed": f"tenant__id__exact={quiet.pk}&status__exact=failed",
        "needs=due": "needs=due",
        "needs=stuck": "needs=stuck",
        "needs=cancellable": "needs=cancellable",
        "search exact key": f"q={known.get('key', '')}",
        "search substring": "q=" + known.get("key", "x")[4:12],
        "search no match": "q=zzzz-nothing",
        **{f"search error {text} ({name})": urlencode({"q": text}) for name, text in ERROR_SEARCH.items()},
        "sorted by key": "o=2",
    }.items():
        rec.measure(f"console operations {name}", get(console, f"{ops_url}?{query}"), group="console")
    # The console's search by a text in many keys (SEARCH_COMMON: one key in nine, its matches
    # the oldest rows) for the superuser and for the big tenant's staff, whose search reads its
    # tenant's rows only (ADR 0018, *Search speed*: 2–3 s for the big tenant at 1M).
    big_staff = _staff_of(big)
    console_big = Client(HTTP_HOST="127.0.0.1")
    console_big.force_login(big_staff)
    for who, client in (("", console), (" [big tenant staff]", console_big)):
        for name, text in {f"common {SEARCH_COMMON}": SEARCH_COMMON, "key part": known.get("key", "x")[4:12]}.items():
            query = urlencode({"q": text})
            rec.measure(f"console operations search {name}{who}", get(client, f"{ops_url}?{query}"), group="console")

    # Sweeper pass and one purge batch, rolled back so the database is reused unchanged.
    from datetime import timedelta

    from ledger.recovery.sweeper import sweep
    from review.models import RetentionPolicy
    from review.retention.purge import retention_purge_tenant

    class Rollback(Exception):
        pass

    purged: list[int] = []

    def rolled_back(call: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                with transaction.atomic():
                    call()
                    raise Rollback
            except Rollback:
                pass

        return run

    def purge() -> None:
        RetentionPolicy.objects.create(tenant=small, record_type="operations", record_ttl=timedelta(days=150))
        result = retention_purge_tenant(tenant_id=small.pk, batch_size=1000, max_batches=1, trigger="bench")
        purged.append(result.deleted if result else 0)

    moved: list[Any] = []
    rec.measure(
        "sweeper pass (batch 500)", rolled_back(lambda: moved.append(sweep(batch=500).counts)), repeat=3, group="batch"
    )
    if moved:
        rec.results["sweeper pass (batch 500)"]["moved"] = moved[-1]
    rec.measure("purge one batch (1000 ops)", rolled_back(purge), repeat=3, group="batch")
    if purged:
        rec.results["purge one batch (1000 ops)"]["rows"] = purged[-1]

    Operation.objects.filter(key__startswith=f"fresh-{run_id}-").delete()
    plans = explain_slowest(rec)
    return _sized({"label": label, "rows": rows, "growth": growth, "results": rec.results, "plans": plans})


def _sized(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with the tables' total and index bytes and their breakdown."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT sum(pg_total_relation_size(c)), sum(pg_indexes_size(c)) FROM ({_TREES}) t (c)",
            [list(TABLES), list(TABLES)],
        )
        total, indexes = cursor.fetchone()
    for r in result["results"].values():
        r.pop("_params", None)
    return {**result, "bytes": int(total), "index_bytes": int(indexes), "breakdown": byte_breakdown()}


def byte_breakdown() -> dict[str, Any]:
    """Where the bytes are: each table's heap (with TOAST, free-space and visibility maps) and
    each index, partitions summed into their parent; pgstattuple's live/dead/free share where
    the extension can be created; each column's average width from pg_stats (after ANALYZE)."""
    from django.db import connection

    out: dict[str, Any] = {"relations": [], "columns": {}, "tuples": {}}
    with connection.cursor() as cursor:
        # A partition's (and its indexes') parent through pg_inherits, up to the top.
        cursor.execute(
            "WITH RECURSIVE top (rel, root) AS ("
            " SELECT c.oid, c.oid FROM pg_class c WHERE c.oid = ANY(%s::regclass[])"
            " UNION ALL SELECT i.indexrelid, i.indexrelid FROM pg_index i WHERE i.indrelid = ANY(%s::regclass[])"
            " UNION ALL SELECT h.inhrelid, t.root FROM pg_inherits h JOIN top t ON h.inhparent = t.rel)"
            " SELECT root::regclass::text, (SELECT relkind FROM pg_class WHERE oid = root),"
            " sum(CASE WHEN c.relkind IN ('r', 'p') THEN pg_table_size(c.oid) ELSE pg_relation_size(c.oid) END)"
            " FROM top t JOIN pg_class c ON c.oid = t.rel GROUP BY root ORDER BY 3 DESC",
            [list(TABLES), list(TABLES)],
        )
        for name, kind, size in cursor.fetchall():
            out["relations"].append(
                {"name": name, "kind": "table" if kind in ("r", "p") else "index", "bytes": int(size)}
            )
        cursor.execute(
            "SELECT tablename, attname, avg_width, null_frac FROM pg_stats WHERE schemaname = 'public'"
            " AND tablename = ANY(%s) ORDER BY tablename, avg_width DESC",
            [list(TABLES)],
        )
        for table, column, width, null_frac in cursor.fetchall():
            out["columns"].setdefault(table, []).append([column, width, round(null_frac, 3)])
        try:
            with transaction_savepoint(connection):
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                cursor.execute(
                    "SELECT c.oid::regclass::text, s.tuple_percent, s.dead_tuple_percent, s.free_percent"
                    " FROM pg_class c, pgstattuple_approx(c.oid) s WHERE c.relkind = 'r'"
                    " AND (c.oid = ANY(%s::regclass[]) OR c.oid IN (SELECT inhrelid FROM pg_inherits"
                    " WHERE inhparent = ANY(%s::regclass[])))",
                    [list(TABLES), list(TABLES)],
                )
                for name, live, dead, free in cursor.fetchall():
                    out["tuples"][name] = {"live_pct": live, "dead_pct": dead, "free_pct": free}
                cursor.execute(
                    "SELECT i.indexrelid::regclass::text, s.avg_leaf_density FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam,"
                    " pgstatindex(i.indexrelid) s WHERE a.amname = 'btree' AND c.relkind = 'i'"
                    " AND pg_relation_size(i.indexrelid) > 0 AND i.indrelid = ANY(%s::regclass[])",
                    [list(TABLES)],
                )
                for name, density in cursor.fetchall():
                    out["tuples"][name] = {"leaf_density_pct": density}
        except Exception as exc:  # no pgstattuple: the sizes above still stand
            out["tuples"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


def transaction_savepoint(connection: Any) -> Any:
    from django.db import transaction

    return transaction.atomic(using=connection.alias)


def wal_and_hot(call: Callable[[], None], samples: int = WAL_SAMPLES, marginal: int = MARGINAL) -> dict[str, Any]:
    """WAL bytes of one fresh claim → complete, how many of its operation and attempt updates
    were HOT, and the bytes the tables grew by per such operation (``marginal`` more).

    WAL positions are the cluster's, which other sessions write too: the least of many
    single-operation deltas is this operation's own (any other writer only adds)."""
    from django.db import connection

    def one(sql: str) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()

    # Attempts are partitioned by month: their partitions' counts too (ledger_attempt_…).
    stats = (
        "SELECT sum(n_tup_upd) FILTER (WHERE relname = 'ledger_operation'),"
        " sum(n_tup_hot_upd) FILTER (WHERE relname = 'ledger_operation'),"
        " sum(n_tup_upd) FILTER (WHERE relname LIKE 'ledger_attempt%'),"
        " sum(n_tup_hot_upd) FILTER (WHERE relname LIKE 'ledger_attempt%')"
        " FROM pg_stat_user_tables WHERE relname = 'ledger_operation' OR relname LIKE 'ledger_attempt%'"
    )
    sizes = f"SELECT sum(pg_total_relation_size(c)) FROM ({_TREES.replace('%s', TABLES_ARRAY)}) t (c)"
    one("SELECT pg_stat_clear_snapshot()")
    upd0, hot0, att_upd0, att_hot0 = one(stats)
    (size0,) = one(sizes)
    deltas = []
    own = _own_wal_reader()
    owned: list[tuple[int, int]] = []
    for _ in range(samples):
        (before,) = one("SELECT pg_current_wal_insert_lsn()")
        (flushed,) = one("SELECT pg_current_wal_flush_lsn()")
        call()
        (delta,) = one(f"SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '{before}')")
        deltas.append(int(delta))
        if own is not None:
            owned.append(own(flushed))
    # Table statistics are sent at transaction end and read from a snapshot: let them settle.
    time.sleep(1.0)
    one("SELECT pg_stat_clear_snapshot()")
    upd1, hot1, att_upd1, att_hot1 = one(stats)
    # What the tables grew by per operation written through the service (dead row versions
    # and page splits included, before any vacuum), beside the packed fill's bytes per row.
    (wal0,) = one("SELECT pg_current_wal_insert_lsn()")
    for _ in range(marginal):
        call()
    (wal,) = one(f"SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '{wal0}')")
    (size1,) = one(sizes)
    deltas.sort()
    own_total = sorted(t for t, _ in owned)
    own_plain = sorted(t - f for t, f in owned)
    return {
        # This database's own WAL (pg_walinspect: records touching its blocks, and the rest of
        # the transactions that wrote them) — no other session's writes; None without the extension.
        "own_wal_bytes_per_op_mean": round(sum(own_total) / len(own_total)) if own_total else None,
        "own_wal_bytes_per_op_p50": own_total[len(own_total) // 2] if own_total else None,
        "own_wal_bytes_per_op_no_fpi_mean": round(sum(own_plain) / len(own_plain)) if own_plain else None,
        "wal_bytes_per_op_min": deltas[0],
        "wal_bytes_per_op_p50": deltas[len(deltas) // 2],
        "operation_updates": upd1 - upd0,
        "hot_updates": hot1 - hot0,
        "attempt_updates": att_upd1 - att_upd0,
        "attempt_hot_updates": att_hot1 - att_hot0,
        "marginal_bytes_per_op": round((size1 - size0) / (samples + marginal)),
        # Full-page images after each checkpoint included, and other sessions' WAL: an upper bound.
        "wal_bytes_per_op_mean": round(int(wal) / marginal),
    }


def _own_wal_reader() -> Callable[[str], tuple[int, int]] | None:
    """A function of a flushed WAL position giving (bytes, of which full-page images) this
    database wrote since (pg_walinspect, PostgreSQL 15+); None where the extension is missing."""
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
            (oid,) = cursor.fetchone()
    except Exception:  # no extension: the cluster-wide figures only
        return None
    mine = f"%/{oid}/%"

    def read(start: str) -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH r AS (SELECT * FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())),"
                " tx AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %s AND xid <> 0)"
                " SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r"
                " WHERE block_ref LIKE %s OR xid IN (SELECT xid FROM tx)",
                [start, mine, mine],
            )
            total, fpi = cursor.fetchone()
        return int(total), int(fpi)

    return read


def _generic_sql(sql: str) -> str:
    """Django's %s placeholders as $1, $2, … for PREPARE (a literal %% is a %)."""
    import re

    counter = iter(range(1, 10_000))
    return re.sub(r"%s|%%", lambda m: f"${next(counter)}" if m.group() == "%s" else "%", sql)


def explain_slowest(rec: Recorder) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE of each list's slowest statement: its custom plan and the generic plan
    a prepared statement settles on (PREPARE with plan_cache_mode = force_generic_plan)."""
    import psycopg
    from django.db import connection

    plans = []
    seen: set[str] = set()
    for name, r in rec.results.items():
        if r["group"] not in ("list", "console") or not r["slowest_sql"] or r["slowest_sql"] in seen:
            continue
        seen.add(r["slowest_sql"])
        sql, params = r["slowest_sql"], r["_params"] or []
        entry: dict[str, Any] = {"measure": name, "ms": r["slowest_ms"], "sql": sql, "params": r["slowest_params"]}
        raw = connection.connection
        # The lists plan per call (ledger.store.sql.planned_per_call); the generic plan is shown for
        # what a prepared statement would settle on, and costs minutes at 10M (seq scans).
        for mode in ("custom",) if ONLY in ("search", "lists", "console") else ("custom", "generic"):
            try:
                with raw.transaction(), psycopg.ClientCursor(raw) as cursor:
                    cursor.execute(f"SET LOCAL plan_cache_mode = force_{mode}_plan")
                    cursor.execute(f"PREPARE scale_explain AS {_generic_sql(sql)}")
                    args = ", ".join(["%s"] * len(params))
                    execute = f"EXECUTE scale_explain({args})" if params else "EXECUTE scale_explain"
                    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {execute}", list(params))
                    entry[mode] = "\n".join(row[0] for row in cursor.fetchall())
                    cursor.execute("DEALLOCATE scale_explain")
            except Exception as exc:  # shown in the plans file: an unexplainable statement is a finding
                entry[mode] = f"(not explained: {type(exc).__name__}: {exc})"
                with raw.cursor() as cursor:
                    cursor.execute("DEALLOCATE ALL")
        plans.append(entry)
    return plans


def child(db: str, rows: int) -> None:
    url = _url(db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1:9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    import django

    django.setup()
    import logging

    logging.getLogger("onceguard").setLevel(logging.ERROR)
    logging.getLogger("django.request").setLevel(logging.CRITICAL)
    # The measured process stands for a web worker, which config.wsgi warms up at its start
    # (the URL reverse dictionary, the console's templates): its first page does not pay it.
    from config.warmup import warm_up

    warm_up()
    filled = fill(rows)
    how = f"filled in {filled:.0f} s" if filled else "reused"
    print(f"{db}: {rows:,} operations ({how})", flush=True)
    result = measure_all(rows, db)
    result["fill_seconds"] = round(filled, 1)
    (VAR / f"bench-scale-{db}.json").write_text(json.dumps(result, indent=2, default=str))


# --- Report -----------------------------------------------------------------------------------


def claim_verdict(figures: dict[str, float]) -> tuple[bool, str]:
    """Whether a claim measure is within CLAIM_RATIO of small tables: the median over the
    pairs of blocks of big / small block medians; its interquartile range is shown with it."""
    ok = figures["ratio_median"] <= CLAIM_RATIO
    text = (
        f"ratio {figures['ratio_median']:.2f} (IQR {figures['ratio_q1']:.2f}–{figures['ratio_q3']:.2f})"
        f" ≤ {CLAIM_RATIO} {'ok' if ok else 'MISSED'}"
    )
    return ok, text


def report(small: dict[str, Any], big: dict[str, Any], claims: dict[str, Any]) -> int:
    print(
        f"\nSmall tables: {small['rows']:,} operations; big: {big['rows']:,} operations "
        f"({big['bytes'] / 2**30:.1f} GiB with attempts and events, {big['index_bytes'] / 2**30:.1f} GiB of it "
        f"indexes; {big['bytes'] / max(big['rows'], 1):,.0f} bytes per operation)"
    )
    print(
        f"  {'measure':<58} {'small p50/p95 ms':>17} {'big p50/p95 ms':>17} {'p95 ×':>6} {'n':>4} {'sql':>4}"
        f" {'big cpu/sql p50':>15}  target"
    )
    failures = 0
    n_claims = claims.get("pairs", 0) * claims.get("ops", 0)
    for name in MEASURES.values() if claims else ():
        c = claims[name]
        ok, verdict = claim_verdict(c)
        # A smoke run's tiny tables have no scale to compare: only errors fail it (common.SMOKE).
        failures += 0 if ok or common.SMOKE else 1
        print(
            f"  {name[:58]:<58} {c['small_p50_ms']:>8.1f}/{c['small_p95_ms']:<8.1f}"
            f" {c['big_p50_ms']:>8.1f}/{c['big_p95_ms']:<8.1f} {'':>6} {n_claims:>4} {'':>4} {'':>15}  {verdict}"
        )
    if claims:
        print(
            f"  (claims: big and small interleaved in one process, {claims['pairs']} pairs of blocks of"
            f" {claims['ops']} each; load average {claims['load_min']:.1f}–{claims['load_max']:.1f})"
        )
    for name, b in big["results"].items():
        s = small["results"].get(name, {})
        ratio = b["p95_ms"] / s["p95_ms"] if s.get("p95_ms") else float("nan")
        verdict = ""
        if b["group"] in ("list", "console"):
            ok = (b["p95_ms"] < LIST_P95_MS or common.SMOKE) and not b["error"]
            verdict = f"p95 < {LIST_P95_MS:.0f} ms {'ok' if ok else 'MISSED'}"
        else:
            ok = not b["error"]
            if "rows" in b:
                verdict = f"{b['rows']} rows"
            if "moved" in b:
                verdict = f"moved {b['moved']}"
        failures += 0 if ok else 1
        print(
            f"  {name[:58]:<58} {s.get('p50_ms', float('nan')):>8.1f}/{s.get('p95_ms', float('nan')):<8.1f}"
            f" {b['p50_ms']:>8.1f}/{b['p95_ms']:<8.1f} {ratio:>6.2f} {b['n']:>4} {b['queries']:>4}"
            f" {b.get('cpu_p50_ms', float('nan')):>7.1f}/{b.get('sql_p50_ms', float('nan')):<7.1f}  {verdict}"
        )
        if b["error"]:
            print(f"      error: {b['error']}")
    print_breakdown(big)
    for label, data in (("small", small), ("big", big)):
        g = data.get("growth", {})
        print(
            f"  growth ({label}): WAL per fresh claim→complete {g.get('wal_bytes_per_op_min')} B"
            f" (least of 60; median {g.get('wal_bytes_per_op_p50')} B with other sessions' writes;"
            f" mean of the next 2,000 with full-page images {g.get('wal_bytes_per_op_mean')} B);"
            f" this database's own WAL per fresh claim→complete mean {g.get('own_wal_bytes_per_op_mean')} B,"
            f" median {g.get('own_wal_bytes_per_op_p50')} B, without full-page images"
            f" {g.get('own_wal_bytes_per_op_no_fpi_mean')} B;"
            f" HOT updates of operations {g.get('hot_updates')} of {g.get('operation_updates')},"
            f" of attempts {g.get('attempt_hot_updates')} of {g.get('attempt_updates')};"
            f" tables grew {g.get('marginal_bytes_per_op')} B per fresh operation"
        )
    print(f"\n{failures} measure(s) missed their target")
    return failures


def print_breakdown(big: dict[str, Any]) -> None:
    """Bytes per operation of each table and index of the big database, and column widths."""
    b = big.get("breakdown") or {}
    rows = max(big["rows"], 1)
    print(f"\n  bytes per operation at {rows:,} (pg_table_size / pg_relation_size, partitions summed):")
    for r in b.get("relations", []):
        extra = (b.get("tuples") or {}).get(r["name"], {})
        note = ", ".join(f"{k} {v}" for k, v in extra.items()) if isinstance(extra, dict) else ""
        print(f"    {r['kind']:<6} {r['name']:<44} {r['bytes'] / rows:>8.1f}  {note}")
    print(f"    {'total':<51} {big['bytes'] / rows:>8.1f}")
    for table, columns in (b.get("columns") or {}).items():
        widths = ", ".join(f"{c} {w}" for c, w, _ in columns)
        print(f"  avg_width {table}: {widths}")
    print()


def write_plans(big: dict[str, Any]) -> Path:
    out = VAR / "bench-scale-plans.md"
    lines = [f"# Plans of every list query at {big['rows']:,} operations (bench.scale)\n"]
    for p in big["plans"]:
        lines += [
            f"## {p['measure']} ({p['ms']} ms)\n",
            "```sql",
            p["sql"],
            "```",
            f"params: {p['params']}\n",
            "custom plan:\n```",
            p.get("custom", ""),
            "```",
            "generic plan:\n```",
            p.get("generic", ""),
            "```\n",
        ]
    out.write_text("\n".join(lines))
    return out


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    VAR.mkdir(exist_ok=True)
    results = {}
    for db, rows in ((SMALL_DB, SMALL_ROWS), (BIG_DB, ROWS)):
        prepare(db)
        proc = subprocess.run([sys.executable, "-m", "bench.scale", "--child", db, str(rows)], cwd=ROOT)
        if proc.returncode:
            return proc.returncode
        results[db] = json.loads((VAR / f"bench-scale-{db}.json").read_text())
    # Claims last, both databases in one process, interleaved (bench.scale_claims).
    results["claims"] = {}
    if ONLY not in ("bytes", "search", "lists", "console"):
        claims_json = VAR / "bench-scale-claims.json"
        env = {**os.environ, "SCALE_DB": BIG_DB, "SCALE_SMALL_DB": SMALL_DB, "SCALE_CLAIMS_JSON": str(claims_json)}
        proc = subprocess.run([sys.executable, "-m", "bench.scale_claims"], cwd=ROOT, env=env)
        if proc.returncode:
            return proc.returncode
        results["claims"] = json.loads(claims_json.read_text())
    failures = report(results[SMALL_DB], results[BIG_DB], results["claims"])
    plans = write_plans(results[BIG_DB])
    (VAR / "bench-scale.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"plans: {plans}; figures: {VAR / 'bench-scale.json'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
