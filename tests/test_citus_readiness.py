"""Ready for Citus (issue 16, DESIGN §12): what can be checked without a Citus cluster.

Citus distributes each tenant-owned table by ``tenant_id`` and co-locates them, so a claim,
its attempt and its events live on one node. It then runs a statement on one node only when
the statement pins every distributed table it reads or writes to one ``tenant_id`` (the
router-query rule); anything else fans out to every node. And it can keep a unique
constraint only when it includes the distribution column, a foreign key between distributed
tables only when both sides include it.

Two checks pin that down here:

* every SQL statement a representative slice of the service runs — claims, completion,
  failures, an execute-mode submission and a worker's take, an asynchronous render of a
  capped provider (a 429, the take, waiting, a poll, the output's publish, completion, a
  webhook), a sweeper pass, DLQ ingestion and replay, a review decision, the API lists and a
  tenant's console pages — either pins its
  tenant-owned tables to one tenant or is listed below by its caller with the reason it may
  fan out (or the change the Citus migration makes to it);
* every table holding a tenant's rows is either distributed or a reference table;
* on PostgreSQL, every unique constraint, unique index and foreign key of a tenant-owned
  table is one Citus could keep, or is listed with the reason.

A new statement or constraint that breaks a rule fails the test until it is fixed or listed.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from dlq import services as dlq_services
from ledger import adapters, services, statements
from ledger.execute import operations_take
from ledger.models import IdempotencyClass, Operation, OperationEvent, OperationStatus
from ledger.sweeper import sweep
from review.roles import OPERATOR
from tests.conftest import on_postgres
from tests.console.support import client_for, staff
from tests.dlq.conftest import example_bytes, post_raw, sink, sink_factory, target  # noqa: F401 (fixtures)
from tests.execute.support import make_due, run_due, unthrottle
from tests.execute.test_async_providers import ASK, WEBHOOK_SECRET, render_fields
from tests.execute.test_provider_caps import move_bucket_clock
from tests.support.fixtures import mock_images  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent

# Distributed by tenant_id: the tables that grow with traffic (each has the column, or gains it
# in the Citus migration: DESIGN §12). The small configuration tables (REFERENCE) are
# reference tables (a copy on every node); users, roles and django-q2's queue stay on the
# coordinator: a statement reading only those is routed anywhere.
DISTRIBUTED = frozenset(
    {
        "ledger_operation",
        "ledger_attempt",
        "ledger_operationevent",
        "ledger_admissionrefusalcount",
        "ledger_tombstone",
        "ledger_upload",
        "ledger_operationoutput",
        "ledger_configchange",
        # A capped provider's token bucket: written by every take of the provider and by its
        # 429s (a reference table's write goes to every node), its row lock the queue of the
        # provider's takers. Gains tenant_id (its provider's).
        "ledger_providerrate",
        "ledger_workflowname",
        "alerts_alert",
        "alerts_alertdelivery",
        "dlq_failedevent",
        "dlq_failedeventalias",
        "dlq_failedeventchange",
        "dlq_bulkreplay",
        "dlq_replay",
        "dlq_runresume",
        "review_accesslog",
        "review_accesslogcheckpoint",
        "review_subjectindex",
        "review_retentionrun",
        "review_erasurerun",
        # The dashboard's activity per tenant and finished hour (written by the rollup schedule,
        # each statement one tenant's or a batch of tenants' like the purge pass).
        "review_activityhour",
    }
)
# Reference tables: small, read by every claim, request or send, written rarely (a write goes to
# every node). Prompt templates and adapter revisions are immutable versions of a tenant's
# configuration, read with its provider at each intent's send.
REFERENCE = frozenset(
    {
        "ledger_tenant",
        "ledger_provider",
        "ledger_adapterrevision",
        "ledger_prompttemplate",
        "ledger_apikey",
        "dlq_replaytarget",
        "dlq_n8nconnection",
        "alerts_alertchannel",
        "review_retentionpolicy",
        "review_stafftenant",
    }
)
# Tables that have no tenant_id today and gain it in the Citus migration: until then their
# statements are routed through the operation (or entry, or channel) they belong to.
GAIN_TENANT_ID = frozenset(
    {
        "dlq_failedeventchange",
        "dlq_replay",
        "alerts_alertdelivery",
    }
)

# Callers whose statements may read or write several tenants' rows: Citus runs them on every
# node (or, for a single-row write, on the node the row's own tenant_id routes to once the
# statement carries it). "module.function" of the first project frame that ran them.
FANS_OUT: dict[str, str] = {
    # Cross-tenant by design: the platform's background passes.
    "ledger.execute.operations_take": "a worker takes due rows of every tenant, oldest first (SKIP LOCKED)",
    "ledger.sweeper": "a sweeper pass moves expired leases and unresolved rows of every tenant",
    "ledger.selectors.metrics": "the /metrics gauges are platform-wide",
    "review.retention": "the purge pass walks every tenant with a policy (each batch is one tenant's)",
    "review.selectors.activity_rollup": "the dashboard's rollup schedule reads every tenant's hour just over"
    " (200 tenants a statement)",
    "alerts": "alert delivery and the alert sweep run over every tenant's channels",
    "ledger.polling._webhook_take": "a webhook's poll is admitted like a worker's: the provider's calls in flight"
    " (provider_in_flight, by provider_id — one provider is one tenant's) until the statement gains its tenant_id",
}
# Statements routed by a key other than tenant_id today, the Citus migration adds tenant_id
# to them (DESIGN §12); one entry per caller, with what it is routed by now.
ROUTED_BY_PARENT: dict[str, str] = {
    "ledger.polling.attempt_log_fields": "a poll's attempt (the prompt template version its log lines name),"
    " by (operation_id, number)",
    "ledger.admin.change_view": "the console's operation page: its attempts and events",
    "review.serializers.review_item_representation": "a review item's attempts and events (one query per page)",
    "dlq.services._log_change": "an entry's status change, by event_id",
    "dlq.services._replay_begin": "an entry's replay row, by event_id",
    "dlq.services._replay_finish": "the replay row, by its id (the entry's tenant is at hand)",
    "dlq.services.failed_event_replay": "the replay row, by its id",
    "dlq.services.replay_settle_for_operation": "the replay that made an operation, by operation_id",
}
# Callers that address a row of a distributed table by its id alone (the id is unique across
# tenants, but Citus routes by tenant_id): the Citus migration adds the tenant to their WHERE
# — every one of them has it at hand (the API key's tenant, the row it just read).
BY_ROW_ID: dict[str, str] = {
    "dlq.services._replay_begin": "the entry's replay count, by the entry's id",
    "dlq.services._replay_finish": "the entry and its replay, by id",
    "dlq.services._settle_entry": "the entry a replay settles, by id",
    "dlq.services.replay_settle_for_operation": "the entry of the replay that made an operation, by id",
}

_TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)
# "tenant_id" = %s, tenant_id = %(tenant_id)s, "tenant_id" IN (%s), and the INSERT column list.
_PINNED = re.compile(
    r'"?tenant_id"?\s*(?:=\s*(?:%s|%\(\w+\)s|\d+)|IN\s*\((?:%s|\d+)\))|\(\s*"?tenant_id"?\s*,|,\s*"?tenant_id"?\s*[,)]',
    re.IGNORECASE,
)


def _callers() -> tuple[str, ...]:
    """module.function of every frame of the service's own code that led to the statement,
    innermost first; empty for the test's own set-up statements."""
    callers = []
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename)
        if path.suffix != ".py" or not path.is_file():
            continue
        try:
            rel = path.resolve().relative_to(ROOT)
        except ValueError:
            continue
        if rel.parts[0] in ("tests", ".venv"):
            continue
        callers.append(".".join(rel.with_suffix("").parts) + "." + frame.name)
    return tuple(callers)


@contextmanager
def statements_with_callers() -> Iterator[list[tuple[tuple[str, ...], str]]]:
    seen: list[tuple[tuple[str, ...], str]] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((_callers(), sql))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


def _listed(callers: tuple[str, ...], table: dict[str, str]) -> bool:
    """Whether any caller on the stack is listed (by itself or a module prefix)."""
    return any(c == prefix or c.startswith(prefix + ".") for c in callers for prefix in table)


def violations(seen: list[tuple[tuple[str, ...], str]]) -> dict[str, set[str]]:
    """Callers whose statements touch a distributed table without pinning one tenant."""
    found: dict[str, set[str]] = {}
    for callers, sql in seen:
        tables = {t.lower() for t in _TABLE.findall(sql)} & DISTRIBUTED
        if not callers or not tables or _PINNED.search(sql):
            continue
        if _listed(callers, FANS_OUT) or _listed(callers, BY_ROW_ID):
            continue
        if tables <= GAIN_TENANT_ID and _listed(callers, ROUTED_BY_PARENT):
            continue
        found.setdefault(" < ".join(callers[:3]), set()).add(" ".join(sql.split())[-300:])
    return found


def asynchronous_render(api, tenant, mock_images) -> None:  # noqa: F811 (the fixture's server)
    """A capped asynchronous provider (DESIGN §5): a submit answered 429 (the throttle and the
    rate's decrease), two renders submitted and taken (claimed → waiting), one polled, fetched,
    published and completed, the other finished by the provider's signed webhook; the output
    read over the API."""
    images = services.provider_upsert(
        tenant=tenant,
        slug="images",
        webhook_secret=WEBHOOK_SECRET,
        **render_fields(
            mock_images.url,
            max_in_flight=4,
            rate_limit=100,
            rate_period_seconds=1,
            rate_burst=10,
            poll_initial_seconds=60,
            poll_max_seconds=120,
        ),
    )
    mock_images.script([{"status": 429, "retry_after": 0}])
    ids = []
    for key in ("render-1", "render-2"):
        answer = api.post(
            "/api/v1/operations",
            {"key": key, "provider": "images", "request": {"method": "POST", "path": "/v1/renders", "body": ASK}},
            format="json",
        )
        assert answer.status_code == 202, answer.content
        ids.append(answer.json()["id"])
    throttled = run_due(limit=1)
    assert [op.status for op in throttled] == [OperationStatus.RETRY_WAIT]
    unthrottle(images.pk)
    # The test's one transaction holds PostgreSQL's now(): the emptied bucket refills only if
    # its clock is moved back.
    move_bucket_clock(images.pk, 10)
    for op_id in ids:
        make_due(op_id)
    assert {op.status for op in run_due()} == {OperationStatus.WAITING}
    make_due(ids[0])
    assert [op.status for op in run_due()] == [OperationStatus.SUCCEEDED]
    job = Operation.objects.get(pk=ids[1]).provider_ref
    body = json.dumps({"id": job, "status": "succeeded"}).encode()
    signed = {"HTTP_ONCEGUARD_SIGNATURE": adapters.sign(secret=WEBHOOK_SECRET, body=body)}
    hook = APIClient().post(f"/api/v1/webhooks/{tenant.slug}/images", body, content_type="application/json", **signed)
    assert hook.json()["status"] == "succeeded", hook.content
    assert api.get(f"/api/v1/operations/{ids[0]}/output").status_code == 200
    content = api.get(f"/api/v1/operations/{ids[0]}/output/content")
    assert content.status_code == 200 and b"".join(content.streaming_content).startswith(b"\x89PNG")


@pytest.mark.usefixtures("target")
def test_every_statement_is_routed_by_one_tenant_or_listed_with_its_reason(
    tenant,
    other_tenant,
    provider,
    make_client,
    mock_images,  # noqa: F811 (fixture)
):
    api = make_client(tenant, ["read", "write"])
    services.provider_upsert(
        tenant=tenant,
        slug="crm",
        base_url="http://127.0.0.1:9",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        max_attempts=1,
    )
    operator = client_for(staff("op", role=OPERATOR, tenants=[tenant]))
    with statements_with_callers() as seen:
        # Guard mode over the API: claim → complete, claim → fail (transient, then definitive).
        done = api.post("/api/v1/claims", {"key": "k-1", "provider": "stripe"}, format="json").json()
        api.post(
            f"/api/v1/operations/{done['id']}/complete",
            {"lease_token": done["lease_token"], "provider_ref": "ch_1"},
            format="json",
        )
        api.post("/api/v1/claims", {"key": "k-1", "provider": "stripe"}, format="json")
        failed = api.post("/api/v1/claims", {"key": "k-2", "provider": "stripe"}, format="json").json()
        api.post(
            f"/api/v1/operations/{failed['id']}/fail",
            {"lease_token": failed["lease_token"], "error_class": "invalid_input", "message": "declined"},
            format="json",
        )
        # Execute mode: a submission, a worker's take.
        api.post("/api/v1/operations", {"key": "x-1", "provider": "crm", "request": {"body": {"n": 1}}}, format="json")
        operations_take(limit=5, actor="worker-1")
        # An asynchronous render of a capped provider, polled and by webhook.
        asynchronous_render(api, tenant, mock_images)
        # A review decision on a row the sweeper left in review.
        stuck = services.operation_claim(tenant=tenant, key="k-3", provider=provider).operation
        Operation.objects.filter(pk=stuck.pk).update(status=OperationStatus.REVIEW, lease_expires_at=None)
        OperationEvent.objects.create(
            tenant_id=stuck.tenant_id,
            operation=stuck,
            from_status="claimed",
            to_status="review",
            actor="sweeper",
            reason="r",
            at=timezone.now(),
        )
        api.post(
            f"/api/v1/review/items/{stuck.pk}/decision", {"decision": "abandon", "note": "not wanted"}, format="json"
        )
        # DLQ: an n8n failure ingested, the ledger's failed operation replayed to the target.
        post_raw(api, example_bytes("n8n-error-trigger-execution.json"))
        entry = dlq_services.FailedEvent.objects.filter(tenant=tenant).order_by("id").first()
        api.post(f"/api/v1/dlq/events/{entry.pk}/replay", {"note": "again"}, format="json")
        # The platform's background pass.
        sweep(batch=50)
        # Lists: the API's, then a tenant operator's console pages.
        for url in (
            "/api/v1/operations",
            "/api/v1/operations?status=failed",
            "/api/v1/operations?key=k-1",
            "/api/v1/review/items",
            "/api/v1/dlq/events",
        ):
            assert api.get(url).status_code == 200, url
        for url in (
            "/admin/",
            "/admin/ledger/operation/",
            "/admin/ledger/operation/?status__exact=failed",
            "/admin/ledger/operation/?q=k-1",
            f"/admin/ledger/operation/{done['id']}/change/",
            "/admin/dlq/failedevent/",
            "/admin/review/reviewitem/",
        ):
            assert operator.get(url).status_code == 200, url

    assert len(seen) > 100, "the slice's statements were not captured"
    # The asynchronous render and the capped provider's statements are in the slice.
    ran = {sql for _, sql in seen}
    for name in (
        "operation_wait",
        "attempt_job",
        "operation_poll_take",
        "provider_rate_insert",
        "provider_rate_refill",
        "provider_in_flight",
        "provider_rate_spend",
        "provider_rate_lower",
    ):
        assert statements.text(name) in ran, name
    assert any(c.startswith("ledger.polling.webhook_receive") for callers, _ in seen for c in callers)
    found = violations(seen)
    assert not found, "statements not routed by one tenant_id, and not listed:\n" + "\n".join(
        f"{caller}:\n    " + "\n    ".join(sorted(sqls)) for caller, sqls in sorted(found.items())
    )


def test_every_table_of_a_tenant_is_distributed_or_a_reference_table():
    """A new table that holds a tenant's rows (a tenant_id column, or one it gains) must be
    placed: distributed (its statements then checked above) or a reference table."""
    tenant_tables = {
        model._meta.db_table
        for model in apps.get_models()
        if "tenant_id" in {field.column for field in model._meta.concrete_fields}
    } | GAIN_TENANT_ID
    assert not DISTRIBUTED & REFERENCE
    assert not tenant_tables - DISTRIBUTED - REFERENCE, "tables of a tenant neither distributed nor reference"
    assert not (DISTRIBUTED | REFERENCE) - tenant_tables - {"ledger_tenant"}, "listed tables that do not exist"


# Every distributed table's primary key is (id) today and becomes (tenant_id, id) in the Citus
# migration (Django 5.2's CompositePrimaryKey), so each of the constraints below follows it.
# Listed by name: a new unique constraint or foreign key must include tenant_id, or be here.
CONSTRAINTS_TO_WIDEN: dict[str, str] = {
    # Partitioned by month (DESIGN §12): the primary key holds the partition key; Citus keeps
    # a distributed partitioned table's keys with the distribution column added.
    "ledger_attempt_pkey": "(id, started_at) → (tenant_id, id, started_at): attempts gain tenant_id",
    "ledger_operationevent_pkey": "(id, at) → (tenant_id, id, at): events gain tenant_id",
    "replay_unique_number": "(event_id, number) → (tenant_id, event_id, number): replays gain tenant_id",
    "dlq_failedevent_operation_id_key": "one entry per operation → (tenant_id, operation_id)",
    "ledger_operationoutput_operation_id_key": "one output per operation → (tenant_id, operation_id)",
    "ledger_providerrate_pkey": "one bucket per provider → (tenant_id, provider_id)",
    "review_accesslog_hash_key": "the hash chain is per tenant already → (tenant_id, hash)",
    "subjectindex_unique": "(record_type, record_id, kind, key_id, digest) → with tenant_id first",
}
# Foreign keys between distributed tables by id alone: each becomes (tenant_id, x_id) →
# (tenant_id, id) once both sides carry tenant_id (a row never points at another tenant's).
FOREIGN_KEYS_TO_WIDEN = {
    ("ledger_attempt", "operation_id"),
    ("ledger_operationevent", "operation_id"),
    ("ledger_operationoutput", "operation_id"),
    ("ledger_operation", "superseded_by_id"),
    ("ledger_operation", "replaced_by_id"),
    ("dlq_failedevent", "operation_id"),
    ("dlq_failedevent", "corrected_operation_id"),
    ("dlq_failedeventalias", "event_id"),
    ("dlq_failedeventchange", "event_id"),
    ("dlq_replay", "event_id"),
    ("dlq_replay", "operation_id"),
    ("dlq_replay", "bulk_id"),
}


@pytest.mark.skipif(not on_postgres(), reason="reads PostgreSQL's catalog")
def test_every_unique_constraint_and_foreign_key_is_one_citus_could_keep():
    tables = sorted(DISTRIBUTED)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.relname, x.indisprimary,"
            " ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum = ANY(x.indkey))"
            " FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE x.indisunique AND c.relname = ANY(%s)",
            [tables],
        )
        unique = cursor.fetchall()
        cursor.execute(
            "SELECT c.relname, r.relname, k.conname,"
            " ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum = ANY(k.conkey))"
            " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class r ON r.oid = k.confrelid"
            # A partition's copy of its partitioned table's key is that key (checked there).
            " WHERE k.contype = 'f' AND NOT c.relispartition AND (c.relname = ANY(%s) OR r.relname = ANY(%s))",
            [tables, tables],
        )
        foreign = cursor.fetchall()
    assert unique and foreign, "the catalog query found nothing"
    found = []
    for table, index, primary, columns in unique:
        if "tenant_id" in columns or (primary and columns == ["id"]) or index in CONSTRAINTS_TO_WIDEN:
            continue
        found.append(f"UNIQUE {index} on {table}{tuple(columns)} lacks tenant_id")
    for table, referenced, name, columns in foreign:
        if table not in DISTRIBUTED:
            # A reference or coordinator table may not point at a distributed one.
            found.append(f"FOREIGN KEY {name}: {table} (not distributed) → {referenced} (distributed)")
        elif (
            referenced in DISTRIBUTED
            and "tenant_id" not in columns
            and (table, columns[0]) not in FOREIGN_KEYS_TO_WIDEN
        ):
            found.append(f"FOREIGN KEY {name}: {table}{tuple(columns)} → {referenced} lacks tenant_id")
    assert not found, "\n".join(found)
