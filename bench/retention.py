"""Retention purge at scale: 1M terminal operations (with an attempt and two events each)
deleted by the real purge (review.retention.purge) in bounded batches, on PostgreSQL, in its own
database ``onceguard_bench_ret``. Also times a payload-redaction pass.

    .venv/bin/python -m bench.retention [--rows 1000000] [--batch 5000] [--redact-rows 100000]

Reports rows/s, the number of batches and the longest batch (≈ the longest any lock is held),
and writes var/bench-retention.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench import common, dbsetup

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = common.suite_db("onceguard_bench_ret")
TENANT = "bench-ret"


def _prepare(base_url: str) -> None:
    bench_url = common.bench_database_url(base_url, db=BENCH_DB, suite="bench.retention")
    dbsetup.database_ready(bench_url)
    os.environ["DATABASE_URL"] = bench_url
    # The bench's provider points at the discard port, never reached; the outbound policy
    # refuses loopback destinations unless the deployment names them (ledger.rules.outbound).
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1:9")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("onceguard").setLevel(logging.WARNING)


def _seed(rows: int, redact_rows: int) -> int:
    """``rows`` old succeeded operations (1 attempt, 2 events each) + ``redact_rows`` whose
    payload is past its TTL but whose record is not; returns the tenant id."""
    from django.db import connection

    from ledger.models import Tenant, sealed_to_bytes
    from ledger.platform import crypto
    from ledger.protocol import services

    assert connection.settings_dict["NAME"] == BENCH_DB
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE ledger_operation, ledger_open_operation, ledger_operation_search, ledger_attempt, ledger_operationevent, ledger_tombstone,"
            " review_retentionrun, review_retentionpolicy, review_subjectindex RESTART IDENTITY CASCADE"
        )
    tenant = Tenant.objects.filter(slug=TENANT).first() or services.tenant_create(slug=TENANT)
    provider = services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    # In its stored form: bytes (ledger.models.SealedJSONField).
    sealed = sealed_to_bytes(
        crypto.seal_json({"body": {"firstName": "Bench", "email": "bench@example.invalid", "n": 1}})
    )
    with connection.cursor() as cursor:
        for label, count, age in (("old", rows, "400 days"), ("redact", redact_rows, "40 days")):
            if count <= 0:
                continue
            # Distinct times, oldest first, as real traffic would have them.
            ts = f"(now() - interval '{age}' - (%s - g) * interval '1 millisecond')"
            cursor.execute(
                "INSERT INTO ledger_operation (tenant_id, key, mode, status, provider_id, action, fingerprint,"
                " payload, response_body, attempts, throttled_attempts, max_attempts, lease_token,"
                " uses_sent_marker, last_error, error_class, provider_ref, response_status, reconciliation_handle,"
                " execution_id, workflow_id, workflow_version, correlation_id, lookup_failures, request_bytes, cost,"
                " callback_url, created_at, updated_at, done_at, claimed_at, sent_at)"
                f" SELECT %s, '{label}:' || g, 'guard', 'succeeded', %s, 'create-contact', decode(md5(g::text) || md5(g::text), 'hex'),"
                " %s, %s, 1, 0, 4, decode(md5('t' || g), 'hex'), true, '', '', 'ref_' || g, 200, '', '', '', '',"
                f" '', 0, 0, 0, '', {ts}, {ts}, {ts}, {ts}, {ts}"
                " FROM generate_series(1, %s) g",
                [tenant.pk, provider.pk, sealed, sealed, *([count] * 5), count],
            )
        cursor.execute(
            "INSERT INTO ledger_attempt (tenant_id, operation_id, number, lease_token, started_at, sent_at,"
            " finished_at, outcome, error_class, message, provider_ref, execution_id)"
            " SELECT tenant_id, id, 1, lease_token, created_at, created_at, done_at, 'succeeded', '', '', provider_ref, ''"
            " FROM ledger_operation WHERE tenant_id = %s",
            [tenant.pk],
        )
        cursor.execute(
            "INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason,"
            " attempt, at)"
            " SELECT tenant_id, id, s.f, s.t, 'bench', 'seed', 1, created_at FROM ledger_operation,"
            " (VALUES ('', 'claimed'), ('claimed', 'succeeded')) AS s(f, t) WHERE tenant_id = %s",
            [tenant.pk],
        )
        cursor.execute("ANALYZE ledger_operation; ANALYZE ledger_attempt; ANALYZE ledger_operationevent")
    return tenant.pk


def _phase(tenant_id: int, batch: int) -> tuple[Any, float]:
    from review.retention.purge import retention_purge_tenant

    t0 = time.monotonic()
    run_ = retention_purge_tenant(tenant_id=tenant_id, batch_size=batch, max_batches=10**6, trigger="bench")
    assert run_ is not None
    return run_, time.monotonic() - t0


def run(rows: int, batch: int, redact_rows: int) -> dict[str, Any]:
    from datetime import timedelta

    from django.conf import settings
    from django.db import connection

    from ledger.models import Tombstone
    from review.models import RetentionPolicy

    started = time.monotonic()
    tenant_id = _seed(rows, redact_rows)
    seeded_s = time.monotonic() - started
    settings.ONCEGUARD_RETENTION = {"TIME_BUDGET_SECONDS": 3600, "MAX_BATCHES": 10**6}
    # Phase 1: the record TTL (delete + tombstone) over the old rows.
    policy = RetentionPolicy.objects.create(
        tenant_id=tenant_id, record_type="operations", record_ttl=timedelta(days=365)
    )
    deleted, delete_s = _phase(tenant_id, batch)
    # Phase 2: the payload TTL (decrypt, keyed digest, redact) over the younger rows.
    RetentionPolicy.objects.filter(pk=policy.pk).update(payload_ttl=timedelta(days=30))
    redacted, redact_s = _phase(tenant_id, batch)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ledger_operation WHERE tenant_id = %s", [tenant_id])
        left = cursor.fetchone()[0]
    return {
        "database": connection.settings_dict["NAME"],
        "batch_size": batch,
        "seed_seconds": round(seeded_s, 1),
        "deleted_rows": deleted.deleted,
        "delete_seconds": round(delete_s, 1),
        "delete_rows_per_second": round(deleted.deleted / delete_s) if delete_s else None,
        "delete_batches": deleted.batches,
        "delete_longest_batch_ms": deleted.details.get("longest_batch_ms"),
        "tombstones": Tombstone.objects.filter(tenant_id=tenant_id).count(),
        "redacted_rows": redacted.redacted,
        "redact_seconds": round(redact_s, 1),
        "redact_rows_per_second": round(redacted.redacted / redact_s) if redact_s else None,
        "redact_longest_batch_ms": redacted.details.get("longest_batch_ms"),
        "operations_left": left,
        "status": f"{deleted.status}/{redacted.status}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_RET_ROWS", 1_000_000)))
    parser.add_argument("--batch", type=int, default=int(os.environ.get("BENCH_RET_BATCH", 2000)))
    parser.add_argument("--redact-rows", type=int, default=int(os.environ.get("BENCH_RET_REDACT_ROWS", 100_000)))
    args = parser.parse_args(argv)
    _prepare(common.server_url())
    result = run(args.rows, args.batch, args.redact_rows)
    width = max(len(k) for k in result)
    print("retention purge (PostgreSQL, one RetentionRun, bounded batches)")
    for key, value in result.items():
        print(f"  {key:<{width}}  {value}")
    out = ROOT / "var" / "bench-retention.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out}")
    # An error, not a slow run: a run that did not finish, or rows it should have removed.
    errors = []
    if result["status"] != "done/done":
        errors.append(f"runs ended {result['status']}")
    if result["deleted_rows"] != args.rows or result["operations_left"] != args.redact_rows:
        errors.append(f"deleted {result['deleted_rows']} of {args.rows}, {result['operations_left']} left")
    if errors:
        print("bench.retention errors: " + "; ".join(errors))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
