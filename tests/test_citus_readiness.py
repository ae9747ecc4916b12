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

from dlq import models as dlq_models
from ledger.execution.attempts import operations_take
from ledger.models import IdempotencyClass, Operation, OperationEvent, OperationStatus
from ledger.protocol import services
from ledger.providers import adapters
from ledger.recovery.sweeper import sweep
from ledger.store import statements
from review.staff.roles import OPERATOR
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
        # The open rows' mirror (ADR 0017): co-located with its operation, written by the
        # operation row's triggers on the same shard.
        "ledger_open_operation",
        "ledger_attempt",
        "ledger_operationevent",
        # The write-once search rows (ADR 0018): written with their operation, by its tenant;
        # a tenant's search binds tenant_id (the superuser's reads every shard).
        "ledger_operation_search",
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
        # Restore holds (ADR 0012): one row per key a restore made the ledger forget, unique by
        # (tenant, key); a claim's check reads one tenant's.
        "ledger_fencehold",
        # Failed attempts' evidence (ADR 0016): written in the failed attempt's transaction with
        # its tenant, read by one tenant's console page and API list, expired per tenant.
        "ledger_attemptevidence",
        # Four-eyes requests (ADR 0013): a tenant's re-sends waiting for a second person, read and
        # moved by tenant (the API, the console, the approver's guarded UPDATE).
        "ledger_approvalrequest",
        # Evaluation manifests and extraction scores (ADR 0022): one row per job that has one,
        # written and read with its operation's tenant.
        "ledger_operationmanifest",
        "ledger_manifestscore",
        # Verdicts on outputs (ADR 0020): written by a tenant's consumer (or its manifests'
        # scoring), counted per tenant's canary by the watch.
        "ledger_outputverdict",
        "alerts_alert",
        "alerts_alertdelivery",
        "dlq_failedevent",
        "dlq_failedeventalias",
        "dlq_failedeventchange",
        # Each failure of an entry's key (an n8n execution): written with its entry, by tenant.
        "dlq_failedeventoccurrence",
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
# Callers whose statements may read or write several tenants' rows: Citus runs them on every
# node (or, for a single-row write, on the node the row's own tenant_id routes to once the
# statement carries it). "module.function" (or a module) of the statement's owner: the innermost
# project frame that is not a carrier (_CARRIERS) — a service a listed pass calls is not excused.
FANS_OUT: dict[str, str] = {
    # Cross-tenant by design: the platform's background passes.
    "ledger.execution.attempts.operations_take": "a worker takes due rows of every tenant, oldest first (SKIP LOCKED)",
    "ledger.execution.fairness": "the fair take (ADR 0021) walks every tenant with due work and counts every"
    " tenant's rows in flight against the system-wide cap",
    "ledger.execution.polling.operations_poll_take": "a worker's take also takes waiting rows of every tenant whose poll is due"
    " (SKIP LOCKED), under each provider's cap",
    "ledger.recovery.eligibility.eligibility_recheck": "the sweeper's eligibility pass takes due rows of every tenant whose"
    " provider asks for a recheck",
    "ledger.protocol.fencing": "a restore is the platform's: the fence view reads the journal's keys of every tenant"
    " and whether any tenant has an unreleased hold",
    "ledger.recovery.sweeper": "a sweeper pass moves expired leases and unresolved rows of every tenant",
    "ledger.recovery.recall.outputs_recall_due": "the sweeper's recall pass (ADR 0020) finds every tenant's rolled-back"
    " revisions that still have a published output (each batch it recalls is one tenant's)",
    "ledger.protocol.approvals.approval_requests_expire": "the sweeper's pass expires the four-eyes requests of every"
    " tenant nobody answered in time (ADR 0013)",
    "ledger.protocol.selectors.metrics": "the /metrics gauges are platform-wide",
    "review.retention": "the purge pass walks every tenant with a policy (each batch is one tenant's)",
    "review.console.selectors.activity_rollup": "the dashboard's rollup schedule reads every tenant's hour just over"
    " (200 tenants a statement)",
    "alerts": "alert delivery and the alert sweep run over every tenant's channels",
    "ledger.execution.polling._webhook_take": "a webhook's poll is admitted like a worker's: the provider's calls in flight"
    " (provider_in_flight, by provider_id — one provider is one tenant's) until the statement gains its tenant_id",
}
# Callers (the innermost frame only) whose one statement writes rows of several tenants, each
# row carrying its own tenant_id: Citus routes each row of a multi-row INSERT to its tenant's
# node (an INSERT … SELECT FROM UNNEST through the coordinator), no read fans out.
ROWS_BY_THEIR_OWN_TENANT: dict[str, str] = {
    "review.console.selectors.activity_hours": "the dashboard stores the hours it computed for the viewer's tenants"
    " (review_activityhour) in one INSERT … SELECT FROM UNNEST of arrays, the tenant_id one of them",
}
# Callers whose statement names its tenant for one table but joins a second co-located table by
# an id alone (Citus plans a join of distributed tables on one node only when the join is on
# tenant_id too). Django 5.2 joins a ForeignKey on its one column; the Citus migration makes
# these keys (tenant_id, x_id) → (tenant_id, id) (a ForeignObject over both columns), and the
# join then carries the tenant.
JOINED_BY_ID: dict[str, str] = {
    "ledger.web.pagination.paginate_queryset": "the operations API list LEFT JOINs each row's validated output"
    " (ledger_operationoutput) by operation_id",
    "review.console.selectors._activity_rows": "the dashboard's dead-letter series LEFT JOINs each entry's operation"
    " (its provider's slug) by operation_id; an entry posted by a workflow has none, so the join cannot be"
    " an inner one pinned in WHERE",
}

_TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)
# A value Citus can route by: one parameter (named ones masked as %[name]s) or an integer literal.
_VALUE = r"(?:%s|%\[\w+\]s|\d+)"
# tenant_id, qualified or not, equal to one value or IN a list of exactly one; not the first term
# of arithmetic or a cast. Where it stands is checked by pinned() below.
_PIN = re.compile(
    r'(?<![\w".])(?:"?\w+"?\.)?"?tenant_id"?\s*(?:=\s*(?P<eq>' + _VALUE + r")|IN\s*\(\s*(?P<in>" + _VALUE + r")\s*\))"
    r"(?!\s*(?:[-+*/|%]|::))",
    re.IGNORECASE,
)
# Two tables joined on tenant_id (a correlated sub-select on its outer row's tenant): co-located.
_JOIN = re.compile(r'(?<![\w".])(?:"?\w+"?\.)?"?tenant_id"?\s*=\s*\(?\s*"?\w+"?\."?tenant_id"?\s*\)?', re.IGNORECASE)
_INSERT = re.compile(
    r'^\s*INSERT\s+(?:OR\s+\w+\s+)?INTO\s+"?\w+"?\s*\(([^()]*)\)\s*(?:VALUES\s*\(|SELECT\b)', re.IGNORECASE
)
# A parenthesised group that is a statement of its own: a sub-select or a CTE's body.
_SCOPE = re.compile(r"^\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
# Where a list of conditions starts and ends, at one level of a statement.
_CONDITIONS = re.compile(r"\b(?:WHERE|HAVING|ON)\b(?!\s+CONFLICT)", re.IGNORECASE)
_END = re.compile(
    r"\b(?:RETURNING|ORDER\s+BY|GROUP\s+BY|LIMIT|OFFSET|FOR\s+(?:NO\s+KEY\s+)?(?:UPDATE|SHARE)|ON\s+CONFLICT|UNION"
    r"|(?:LEFT|RIGHT|INNER|FULL|CROSS)?\s*(?:OUTER\s+)?JOIN)\b",
    re.IGNORECASE,
)
_OR = re.compile(r"\bOR\b", re.IGNORECASE)
# What may stand right before a group of conditions (anything else — COALESCE, NOT, CASE WHEN,
# a SELECT list — makes the group something other than a condition every row must meet).
_CONDITION_GROUP_AFTER = {"", "AND", "WHERE", "HAVING", "ON"}


def _masked(sql: str) -> str:
    """``sql`` with named parameters' parentheses and string literals' contents masked (same
    length), so every parenthesis left is the statement's own."""
    sql = re.sub(r"%\((\w+)\)s", lambda m: f"%[{m.group(1)}]s", sql)
    return re.sub(r"'[^']*'", lambda m: "'" + "x" * (len(m.group(0)) - 2) + "'", sql)


def _groups(sql: str) -> list[tuple[int, int]]:
    """Every parenthesised group as (index of "(", index of ")")."""
    stack, found = [], []
    for i, c in enumerate(sql):
        if c == "(":
            stack.append(i)
        elif c == ")" and stack:
            found.append((stack.pop(), i))
    return found


def _blank(sql: str, groups: list[tuple[int, int]]) -> str:
    chars = list(sql)
    for start, end in groups:
        chars[start + 1 : end] = " " * (end - start - 1)
    return "".join(chars)


def _value(token: str, masked: str, at: int, params: Any) -> Any:
    """What a pin compares with (None for a NULL parameter): a literal, a named parameter, or
    the positional one at ``at``."""
    if token.isdigit():
        return int(token)
    if token.startswith("%["):
        return params.get(token[2:-2]) if isinstance(params, dict) else None
    index = masked[:at].count("%s")
    return params[index] if isinstance(params, (list, tuple)) and index < len(params) else None


def _word_before(masked: str, at: int) -> str:
    words = re.findall(r"\w+$", masked[:at].rstrip())
    return words[0].upper() if words else ""


def _holds(masked: str, groups: list[tuple[int, int]], scope: tuple[int, int], at: int) -> bool:
    """Whether the condition at ``at`` must hold for every row of its scope: each group around
    it (up to the scope's own) is a plain group of conditions without an OR, and the outermost
    stands in the scope's WHERE (ON, HAVING) among conditions without an OR."""
    around = sorted((g for g in groups if scope[0] < g[0] < at < g[1] < scope[1]), reverse=True)
    for start, end in around:
        if _word_before(masked, start) not in _CONDITION_GROUP_AFTER:
            return False
        if _OR.search(_blank(masked, [g for g in groups if start < g[0] and g[1] < end]), start, end):
            return False
    outer = around[-1][0] if around else at
    level = _blank(masked, [g for g in groups if scope[0] < g[0] and g[1] < scope[1]])
    begins = [m.end() for m in _CONDITIONS.finditer(level, scope[0] + 1, outer)]
    if not begins:
        return False
    end = _END.search(level, outer, scope[1])
    return not _OR.search(level, begins[-1], end.start() if end else scope[1])


def _inserts_one_tenant(own: str, masked: str, offset: int, params: Any, selected_pinned: bool) -> bool:
    """An INSERT whose new row's tenant_id is one value: the first row of a VALUES list, or the
    SELECT list of an INSERT … SELECT — a value, or the tenant_id column of rows the SELECT
    reads by one tenant (``selected_pinned``)."""
    insert = _INSERT.match(own)
    if not insert:
        return False
    columns = [c.strip().strip('"').lower() for c in insert.group(1).split(",")]
    if "tenant_id" not in columns:
        return False
    wanted, item, depth, start = columns.index("tenant_id"), 0, 0, insert.end()
    for i in range(insert.end(), len(own)):
        c = own[i]
        if c == "(":
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif depth == 0 and (c in ",)" or re.match(r"\bFROM\b", own[i:], re.IGNORECASE)):
            if item == wanted:
                token = own[start:i].strip()
                if selected_pinned and re.fullmatch(r'(?:"?\w+"?\.)?"?tenant_id"?', token):
                    return True
                at = offset + start + own[start:i].index(token) if token else 0
                return bool(re.fullmatch(_VALUE, token)) and _value(token, masked, at, params) is not None
            if c != ",":
                return False
            item, start = item + 1, i + 1
    return False


def pinned(sql: str, params: Any = None) -> bool:
    """Citus's router rule, read off a statement's text: each of its scopes (the statement, each
    sub-select, each CTE) that reads or writes a distributed table names one tenant — a
    ``tenant_id = <value>`` (or ``IN (<one value>)``) with a value that is not NULL, standing
    where every row must meet it (not inside COALESCE(…), NOT (…) or CASE, not OR-ed with
    anything) — or, for an INSERT, gives the new row's ``tenant_id`` one such value. A scope may
    instead join its table on ``tenant_id`` to another (a sub-select correlated on its outer
    row's tenant) when some scope names the value; a scope that reads two distributed tables
    needs both: the value and the join (or two values)."""
    masked = _masked(sql)
    groups = _groups(masked)
    scopes = [(-1, len(masked))] + [g for g in groups if _SCOPE.match(masked[g[0] + 1 : g[1]])]
    touched = valued = False
    for scope in scopes:
        inner = [g for g in scopes[1:] if scope[0] < g[0] and g[1] < scope[1]]
        blanked = _blank(masked, inner)
        own = blanked[scope[0] + 1 : scope[1]]
        tables = [t.lower() for t in _TABLE.findall(own) if t.lower() in DISTRIBUTED]
        if not tables:
            continue
        offset = scope[0] + 1
        plain = [g for g in groups if g not in inner]
        values = 0
        for match in _PIN.finditer(own):
            token = match.group("eq") or match.group("in")
            value_at = offset + match.start("eq" if match.group("eq") else "in")
            if _value(token, masked, value_at, params) is None:
                continue
            values += _holds(blanked, plain, scope, offset + match.start())
        values += _inserts_one_tenant(own, masked, offset, params, values > 0)
        joins = sum(_holds(blanked, plain, scope, offset + m.start()) for m in _JOIN.finditer(own))
        if values + joins < len(set(tables)):
            return False
        touched, valued = True, valued or values > 0
    return valued or not touched


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


# A captured statement: the service's frames that ran it (innermost first), its text, its parameters.
Seen = tuple[tuple[str, ...], str, Any]


@contextmanager
def statements_with_callers() -> Iterator[list[Seen]]:
    seen: list[Seen] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        # executemany: each set of parameters is a statement of its own.
        for one in params if many else [params]:
            seen.append((_callers(), sql, one))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


# Modules that only carry a statement to the database for their caller: the statement is their
# caller's (a listed pass's own statement run through ledger.store.sql is still that pass's).
_CARRIERS = ("ledger.store.sql.", "ledger.store.statements.", "ledger.store.fast_rows.", "ledger.platform.caching.")


def _owner(callers: tuple[str, ...]) -> str:
    """The innermost frame that wrote the statement: the first caller that is not a carrier."""
    return next((c for c in callers if not c.startswith(_CARRIERS)), callers[0])


def _listed(callers: tuple[str, ...], table: dict[str, str]) -> bool:
    """Whether the statement's owner (not any frame further out: a service a listed pass calls
    still routes its own statements by tenant) is listed, by itself or a module prefix."""
    owner = _owner(callers)
    return any(owner == prefix or owner.startswith(prefix + ".") for prefix in table)


def _joins_by_id_only(sql: str, params: Any) -> bool:
    """Whether the statement would pass if its joined tables' own pins were not needed: each
    scope names a tenant at least once (the JOINED_BY_ID excuse covers only the join)."""
    masked = _masked(sql)
    return bool(_PIN.search(masked)) and all(
        _PIN.search(masked[s + 1 : e]) or not set(_TABLE.findall(masked[s + 1 : e])) & DISTRIBUTED
        for s, e in _groups(masked)
        if _SCOPE.match(masked[s + 1 : e])
    )


def violations(seen: list[Seen]) -> dict[str, set[str]]:
    """Callers whose statements touch a distributed table without pinning one tenant."""
    found: dict[str, set[str]] = {}
    for callers, sql, params in seen:
        tables = {t.lower() for t in _TABLE.findall(sql)} & DISTRIBUTED
        if not callers or not tables or pinned(sql, params):
            continue
        if _listed(callers, FANS_OUT) or callers[0] in ROWS_BY_THEIR_OWN_TENANT:
            continue
        if _listed(callers, JOINED_BY_ID) and _joins_by_id_only(sql, params):
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
        entry = dlq_models.FailedEvent.objects.filter(tenant=tenant).order_by("id").first()
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
    ran = {sql for _, sql, _ in seen}
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
    assert any(c.startswith("ledger.execution.polling.webhook_receive") for callers, _, _ in seen for c in callers)
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
    }
    assert not DISTRIBUTED & REFERENCE
    assert not tenant_tables - DISTRIBUTED - REFERENCE, "tables of a tenant neither distributed nor reference"
    assert not (DISTRIBUTED | REFERENCE) - tenant_tables - {"ledger_tenant"}, "listed tables that do not exist"


# Every distributed table's primary key is (id) today and becomes (tenant_id, id) in the Citus
# migration (Django 5.2's CompositePrimaryKey), so each of the constraints below follows it.
# Listed by name: a new unique constraint or foreign key must include tenant_id, or be here.
CONSTRAINTS_TO_WIDEN: dict[str, str] = {
    # Partitioned by month (DESIGN §12): the primary key holds the partition key; Citus keeps
    # a distributed partitioned table's keys with the distribution column added.
    "ledger_attempt_pkey": "(id, started_at) → (tenant_id, id, started_at): the column is there (ledger 0029);"
    " widening the key rebuilds every partition's primary key index, the Citus migration's work",
    "ledger_operationevent_pkey": "(id, at) → (tenant_id, id, at): as attempts",
    "ledger_operation_search_pkey": "(operation_id, seq) → (tenant_id, operation_id, seq): the column is there",
    "dlq_failedevent_operation_id_key": "one entry per operation → (tenant_id, operation_id)",
    "ledger_operationoutput_operation_id_key": "one output per operation → (tenant_id, operation_id)",
    "ledger_operationmanifest_operation_id_key": "one manifest per operation → (tenant_id, operation_id)",
    "ledger_operationmanifest_output_id_key": "one manifest per output → (tenant_id, output_id)",
    "ledger_manifestscore_operation_id_key": "one score per extraction → (tenant_id, operation_id)",
    "ledger_providerrate_pkey": "one bucket per provider → (tenant_id, provider_id): the column is there"
    " (ledger 0029); the key is Django's OneToOneField primary key until the Citus migration",
    "review_accesslog_hash_key": "the hash chain is per tenant already → (tenant_id, hash)",
    "subjectindex_unique": "(record_type, record_id, kind, key_id, digest) → with tenant_id first",
}
# Foreign keys between distributed tables by id alone: each becomes (tenant_id, x_id) →
# (tenant_id, id) once both sides carry tenant_id (a row never points at another tenant's) and
# the target's key is (tenant_id, id): Django 5.2 declares no composite foreign key, so the
# Citus migration writes them in SQL and the models use ForeignObject over both columns.
FOREIGN_KEYS_TO_WIDEN = {
    ("ledger_attempt", "operation_id"),
    ("ledger_operationevent", "operation_id"),
    ("ledger_operationoutput", "operation_id"),
    ("ledger_operationmanifest", "operation_id"),
    ("ledger_operationmanifest", "output_id"),
    ("ledger_manifestscore", "operation_id"),
    ("ledger_manifestscore", "evaluates_id"),
    ("ledger_outputverdict", "operation_id"),
    ("ledger_outputverdict", "output_id"),
    ("ledger_operation", "superseded_by_id"),
    ("ledger_operation", "replaced_by_id"),
    ("dlq_failedevent", "operation_id"),
    ("dlq_failedevent", "corrected_operation_id"),
    ("dlq_failedeventalias", "event_id"),
    ("dlq_failedeventchange", "event_id"),
    ("dlq_failedeventoccurrence", "event_id"),
    ("dlq_failedevent", "previous_id"),
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


# The checker's own examples: what Citus can route by one tenant and what it cannot.
ROUTED = [
    ("UPDATE ledger_operation SET x = 1 WHERE id = %(id)s AND tenant_id = %(tenant_id)s", {"id": 1, "tenant_id": 7}),
    ('SELECT * FROM "ledger_attempt" WHERE ("ledger_attempt"."operation_id" = %s AND "ledger_attempt"."tenant_id" = %s)', [1, 7]),
    ('SELECT * FROM "ledger_attempt" WHERE "ledger_attempt"."tenant_id" IN (%s) ORDER BY id', [7]),
    ("SELECT 1 FROM ledger_operation WHERE tenant_id = 7 AND (status = 'a' OR status = 'b')", None),
    ("INSERT INTO ledger_operationevent (tenant_id, operation_id) VALUES (%(tenant_id)s, %(operation_id)s)", {"tenant_id": 7, "operation_id": 1}),
    ('INSERT INTO "ledger_attempt" ("tenant_id", "operation_id") VALUES (%s, %s) RETURNING "id"', [7, 1]),
    ("INSERT INTO ledger_attempt (tenant_id, operation_id) SELECT tenant_id, id FROM ledger_operation"
     " WHERE id = %(id)s AND tenant_id = %(tenant_id)s", {"id": 1, "tenant_id": 7}),
    ("UPDATE ledger_providerrate SET rate = CASE WHEN a IS NULL OR a < s.at THEN 1 ELSE 2 END FROM"
     " (SELECT sent_at AS at FROM ledger_operation WHERE id = %(id)s AND tenant_id = %(t)s) AS s"
     " WHERE provider_id = %(p)s AND tenant_id = %(t)s RETURNING rate", {"id": 1, "t": 7, "p": 2}),
    ("WITH op AS (UPDATE ledger_operation SET a = 1 WHERE id = %(id)s AND tenant_id = %(t)s RETURNING *),"
     " e AS (INSERT INTO ledger_operationevent (tenant_id, operation_id) SELECT %(t)s, id FROM op)"
     " SELECT * FROM op", {"id": 1, "t": 7}),
    ("SELECT * FROM dlq_replaytarget WHERE id = %s", [1]),  # a reference table only
    ('SELECT o.id, (SELECT U0."name" FROM "ledger_workflowname" U0 WHERE (U0."tenant_id" = (o."tenant_id")'
     ' AND U0."workflow_id" = (o."workflow_id")) LIMIT 1) FROM "ledger_operation" o WHERE o."tenant_id" IN (%s)', [7]),
    ("SELECT * FROM ledger_attempt a JOIN ledger_operation o ON a.tenant_id = o.tenant_id AND a.operation_id = o.id"
     " WHERE o.tenant_id = %s", [7]),
]  # fmt: skip
NOT_ROUTED = [
    # The guard this test once let through: the value compared with is not a constant.
    ("UPDATE ledger_operation SET x = 1 WHERE id = %(id)s AND tenant_id = COALESCE(%(tenant_id)s, tenant_id)", {"id": 1, "tenant_id": 7}),
    ("UPDATE ledger_operation SET x = 1 WHERE id = %(id)s AND tenant_id = %(tenant_id)s", {"id": 1, "tenant_id": None}),
    ("SELECT * FROM ledger_operation WHERE tenant_id = %s OR key = %s", [7, "k"]),
    ("SELECT * FROM ledger_operation WHERE (tenant_id = %s OR key = %s) AND id = %s", [7, "k", 1]),
    ("SELECT * FROM ledger_operation WHERE tenant_id IS NULL", None),
    ("SELECT * FROM ledger_operation WHERE tenant_id IN (%s, %s)", [7, 8]),
    ("SELECT * FROM ledger_operation WHERE NOT (tenant_id = %s)", [7]),
    ("SELECT * FROM ledger_operation WHERE COALESCE(tenant_id = %s, TRUE)", [7]),
    ("SELECT id, tenant_id, key FROM ledger_operation WHERE id = %s", [1]),
    ("SELECT tenant_id = %s FROM ledger_operation WHERE id = %s", [7, 1]),
    ("SELECT * FROM ledger_operation WHERE tenant_id = %s + 1", [7]),
    ("SELECT * FROM ledger_operation WHERE id = %s", [1]),
    # Each scope on its own: a pinned sub-select does not pin the statement around it.
    ("SELECT * FROM ledger_attempt WHERE operation_id IN (SELECT id FROM ledger_operation WHERE tenant_id = %s)", [7]),
    ("INSERT INTO ledger_attempt (tenant_id, operation_id) SELECT tenant_id, id FROM ledger_operation WHERE id = %s", [1]),
    ("INSERT INTO ledger_attempt (tenant_id, operation_id) VALUES (%s, %s)", [None, 1]),
    ("SELECT * FROM ledger_operation o JOIN ledger_attempt a ON a.operation_id = o.id AND a.tenant_id = %s OR TRUE", [7]),
    # Two distributed tables, one pinned, not joined on tenant_id.
    ("SELECT * FROM ledger_attempt a JOIN ledger_operation o ON a.operation_id = o.id WHERE o.tenant_id = %s", [7]),
    # A sub-select joined on tenant_id to a statement that names no tenant.
    ("SELECT o.id, (SELECT 1 FROM ledger_workflowname w WHERE w.tenant_id = o.tenant_id) FROM ledger_operation o"
     " WHERE o.id = %s", [1]),
]  # fmt: skip


@pytest.mark.parametrize(("sql", "params"), ROUTED)
def test_the_checker_passes_a_statement_routed_by_one_tenant(sql: str, params: Any) -> None:
    assert pinned(sql, params)


@pytest.mark.parametrize(("sql", "params"), NOT_ROUTED)
def test_the_checker_refuses_a_statement_citus_could_not_route_by_one_tenant(sql: str, params: Any) -> None:
    assert not pinned(sql, params)
