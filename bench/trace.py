"""Count the round trips an operation makes, from libpq's own protocol trace.

Every round trip ends with one ReadyForQuery from the server, whichever path sent it
(Django's execute wrapper misses the CONN_HEALTH_CHECKS ``SELECT 1`` and the BEGIN/COMMIT
that psycopg sends itself), so the trace is the ground truth.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

_QUERY = re.compile(r'^F\t\d+\t(?:Query|Parse)\t "(?:[^"]*" ")?(.*?)"(?: \d+.*)?$')


def _shape(sql: str) -> str:
    sql = " ".join(sql.split())
    head = sql[:70]
    return head + ("…" if len(sql) > 70 else "")


def count_round_trips(run_one: Callable[[Any], None], items: Sequence[Any]) -> dict[str, Any]:
    """Run ``items`` through ``run_one`` with Django's connection traced; per-op averages."""
    import psycopg
    from django.db import connection

    # A fresh connection: one older than CONN_MAX_AGE (a long run) would be replaced by the
    # first request's close_old_connections, and the trace would follow the old one.
    connection.close()
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as fh:
        pgconn.trace(fh.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        errors = 0
        try:
            for item in items:
                try:
                    run_one(item)
                except Exception:  # the timed runs count and report these
                    errors += 1
        finally:
            if connection.connection is not None and connection.connection.pgconn is pgconn:
                pgconn.untrace()
        fh.seek(0)
        lines = fh.read().splitlines()
    n = max(1, len(items))
    shapes: Counter[str] = Counter()
    for line in lines:
        m = _QUERY.match(line)
        if m:
            shapes[_shape(m.group(1))] += 1
    ready = sum(1 for line in lines if "\tReadyForQuery\t" in line)
    return {
        "round_trips_per_op": round(ready / n, 2),
        "statements_per_op": {k: round(v / n, 2) for k, v in shapes.most_common()},
        "trace_errors": errors,
    }
