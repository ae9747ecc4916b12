"""The dedicated bench database: created if missing, migrated, seeded, emptied per run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.common import BENCH_DB, PROVIDER_SLUG, TENANT_SLUG, libpq_dsn

ROOT = Path(__file__).resolve().parent.parent


def ensure_database(base_url: str, name: str = BENCH_DB) -> None:
    """CREATE DATABASE ``name`` on the server ``base_url`` points at, if missing."""
    import psycopg

    with psycopg.connect(libpq_dsn(base_url), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            # A migrated template (BENCH_DB_TEMPLATE) makes a new suite database a file copy
            # instead of a full migrate: the smoke tests create six of them.
            template = os.environ.get("BENCH_DB_TEMPLATE", "")
            known = template and conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template]).fetchone()
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if known else ""))


def migrate(bench_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": bench_url}
    proc = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        name = urlsplit(bench_url).path.lstrip("/")
        raise SystemExit(f"manage.py migrate on {name} failed:\n{proc.stdout}\n{proc.stderr}")


def database_ready(url: str) -> None:
    """The database ``url`` names, created on its server if missing and migrated."""
    parts = urlsplit(url)
    maintenance = urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))
    ensure_database(maintenance, parts.path.lstrip("/"))
    migrate(url)


def setup_django(bench_url: str) -> None:
    """Point this process's Django at the bench database and quiet the per-op log lines."""
    os.environ["DATABASE_URL"] = bench_url
    # The bench's providers and mock receivers live on loopback, which egress refuses unless
    # listed (ledger.rules.outbound); every bench address is loopback.
    os.environ.setdefault("OUTBOUND_ALLOW", "127.0.0.1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    import django

    django.setup()
    quiet_logging()


def quiet_logging() -> None:
    """Whatever the app logs at the configured level (LOG_LEVEL) still costs what it costs,
    but goes to var/bench-app.log instead of the terminal. Call again after anything that
    re-runs django.setup() (it reconfigures logging)."""
    import logging

    stream = open(ROOT / "var" / "bench-app.log", "a")  # lives as long as the process
    for handler in logging.getLogger("onceguard").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(stream)


def seed() -> dict[str, Any]:
    """The bench tenant, its provider and a fresh API key; every ledger row emptied."""
    from django.db import connection

    from ledger.models import Tenant
    from ledger.protocol import services

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(quote_ident(tablename), ', ') FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename IN ('ledger_operation', 'ledger_open_operation', 'ledger_operation_search', 'ledger_attempt',"
            " 'ledger_operationevent')"
        )
        tables = cursor.fetchone()[0]
        if tables:
            # Only ever in onceguard_bench: every run starts from the same (empty) tables.
            assert connection.settings_dict["NAME"] == BENCH_DB
            cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    tenant = Tenant.objects.filter(slug=TENANT_SLUG).first() or services.tenant_create(slug=TENANT_SLUG)
    provider = services.provider_upsert(
        tenant=tenant,
        slug=PROVIDER_SLUG,
        idempotency_class="key_enforced",
        base_url="http://127.0.0.1:9/",
    )
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write"], name="bench")
    return {"tenant": tenant, "provider": provider, "api_key": secret}
