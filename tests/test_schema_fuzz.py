"""Schemathesis against /api/schema/ (issue 11, item 4): for any request the schema allows,
and for requests it does not (schemathesis' negative mode), the API never answers 5xx, every
4xx is RFC 9457 problem+json with a code, and every 2xx is documented and matches the
schema. A response that does not match is a wrong declaration: fix the declaration
(extend_schema / serializers), never the check.

Heavy: runs once per `make test`, in the PostgreSQL pass (the stricter database: NUL in
text, numeric and timestamp ranges). Bounded by FUZZ_EXAMPLES per operation and mode
(default 25); the requests go through the WSGI application in the test's thread, each in
its own transaction as in production.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.serializers.json import DjangoJSONEncoder
from django.core.wsgi import get_wsgi_application
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from dlq.ingest import services as dlq_ingest
from ledger.models import ErrorClass, IdempotencyClass, Tenant
from ledger.protocol import services

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

PROBLEM_JSON = "application/problem+json"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))


def _load_schema() -> Any:
    """The document /api/schema/ serves, generated without a request (collection happens
    before any database exists); requests go to the WSGI application."""
    document = SchemaGenerator().get_schema(request=None, public=True)
    loaded = schemathesis.openapi.from_dict(json.loads(json.dumps(document, cls=DjangoJSONEncoder)))
    loaded.app = get_wsgi_application()
    return loaded


schema = _load_schema()


@pytest.fixture
def world(db: Any) -> Iterator[dict[str, str]]:
    """A tenant with providers, rows in several states and a key with every scope."""
    tenant: Tenant = services.tenant_create(slug="fuzz")
    stripe = services.provider_upsert(
        tenant=tenant, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )
    for n in range(3):
        op = services.operation_claim(tenant=tenant, key=f"fuzz-{n}", provider=stripe, payload={"n": n}).operation
        if n == 1:
            services.operation_fail(
                operation_id=op.pk,
                tenant_id=op.tenant_id,
                lease_token=op.lease_token,
                error_class=ErrorClass.INVALID_INPUT,
                message="HTTP 422",
            )
        if n == 2:
            services.operation_complete(
                operation_id=op.pk, tenant_id=op.tenant_id, lease_token=op.lease_token, provider_ref="ch_1"
            )
    dlq_ingest.failed_event_ingest(tenant=tenant, raw=b'{"event_id": "fuzz-e", "payload": {"a": 1}}', actor="t")
    _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write", "admin", "payload"])
    yield {"Authorization": f"Bearer {secret}"}


def problem_json_for_every_4xx(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every refusal is RFC 9457 problem+json carrying a stable `code`."""
    if 400 <= response.status_code < 500:
        content_type = (response.headers.get("content-type") or [""])[0]
        assert content_type.startswith(PROBLEM_JSON), f"{response.status_code} answered as {content_type!r}"
        body = response.json()
        assert isinstance(body, dict) and body.get("code") and body.get("status") == response.status_code, body
    return None


def every_2xx_is_documented(ctx: Any, response: Any, case: Any) -> bool | None:
    # Only for the operation's own method: negative mode also probes others (OPTIONS is 200).
    if 200 <= response.status_code < 300 and case.method.upper() == case.operation.method.upper():
        documented = set(case.operation.definition.raw.get("responses", {}))
        assert str(response.status_code) in documented, f"{response.status_code} not in {sorted(documented)}"
    return None


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_every_request_without_5xx_and_as_documented(case: Any, world: dict[str, str]) -> None:
    case.call_and_validate(
        headers=world,
        checks=[
            not_a_server_error,
            response_schema_conformance,
            problem_json_for_every_4xx,
            every_2xx_is_documented,
        ],
    )
