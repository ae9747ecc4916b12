"""Traces end to end (ADR 0015): an incoming traceparent is continued, the worker's attempt
and the provider call are child spans in the caller's trace, the provider and the callback
receiver get a traceparent, spans carry the key's HMAC and never the key — exported over
OTLP/HTTP to a real receiver on loopback. Off by default: no middleware, no column, no export."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpResponse
from django.urls import reverse

from config.middleware import TraceContextMiddleware
from ledger.models import IdempotencyClass, Operation, Provider, Tenant
from ledger.platform import tracing
from ledger.protocol import transitions
from ledger.protocol.services import provider_upsert
from ledger.recovery.sweeper import reconcile_uncertain, sweep_expired_leases
from tests.execute.support import run_due
from tests.ledger.support import expire_lease
from tests.observability.otlp import OtlpReceiver
from tests.support.listener import Listener

pytestmark = pytest.mark.django_db

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
# The key must never leave the service in a span: only its HMAC does.
KEY = "order-7731:charge:v1"
SERVER, CLIENT = 2, 3  # OTLP's span kinds


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "onceguard-test"}, batch=False)
    yield receiver
    tracing.configure({})
    receiver.close()


@pytest.fixture
def provider_listener() -> Iterator[Listener]:
    listener = Listener(allow=True)
    yield listener
    listener.close()


@pytest.fixture
def charges(tenant: Tenant, provider_listener: Listener) -> Provider:
    return provider_upsert(
        tenant=tenant,
        slug="charges",
        base_url=provider_listener.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        timeout_seconds=2.0,
        max_attempts=3,
        lifetime_seconds=120,
    )


def submit(api: Any, *, key: str = KEY, callback_url: str = "", **headers: Any) -> Any:
    body: dict[str, Any] = {
        "key": key,
        "provider": "charges",
        "request": {"method": "POST", "path": "/charges", "body": {"amount": 1000}},
    }
    if callback_url:
        body["callback_url"] = callback_url
    return api.post("/api/v1/operations", body, format="json", **headers)


def parent_of(header: str) -> tuple[str, str]:
    """(trace id, parent span id) of a traceparent header."""
    _, trace_id, span_id, _ = header.split("-")
    return trace_id, span_id


def test_an_incoming_traceparent_is_continued_by_the_claims_server_span(otlp, tenant, provider, make_client):
    api = make_client(tenant)
    response = api.post(
        "/api/v1/claims",
        {"key": KEY, "provider": "stripe", "action": "charge", "request": {"amount": 1}},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    assert response.status_code == 201, response.json()
    (server,) = otlp.named("POST ")
    assert server.name == "POST /api/v1/claims" and server.kind == SERVER
    assert (server.trace_id, server.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert server.service_name == "onceguard-test"
    assert server.attributes["http.route"] == "/api/v1/claims"
    assert server.attributes["http.response.status_code"] == 201
    op = Operation.objects.get(pk=response.json()["id"])
    assert server.attributes[tracing.KEY_ATTRIBUTE] == tracing.key_hmac(tenant_id=tenant.pk, key=KEY)
    assert server.attributes["onceguard.operation_id"] == op.pk
    # The row keeps the claim's span as the parent of what happens to it later.
    assert op.trace_context == f"00-{TRACE_ID}-{server.span_id}-01"
    assert otlp.paths == ["/v1/traces"] and otlp.content_types == ["application/x-protobuf"]
    assert KEY.encode() not in otlp.everything()


def test_a_claim_without_a_traceparent_is_a_new_trace_and_stores_nothing(otlp, tenant, provider, make_client):
    api = make_client(tenant)
    response = api.post(
        "/api/v1/claims", {"key": "k-no-trace", "provider": "stripe", "request": {"a": 1}}, format="json"
    )
    assert response.status_code == 201
    (server,) = otlp.named("POST ")
    assert server.parent_span_id == "" and server.trace_id != TRACE_ID
    assert Operation.objects.get(pk=response.json()["id"]).trace_context == ""


def test_the_attempt_and_the_provider_call_are_children_in_the_callers_trace(
    otlp, tenant, charges, provider_listener, make_client
):
    api = make_client(tenant)
    response = submit(api, HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 202, response.json()
    (done,) = run_due()
    assert done.status == "succeeded"

    (server,) = otlp.named("POST ")
    (attempt,) = otlp.named("onceguard.attempt")
    (call,) = otlp.named("onceguard.provider_call")
    assert server.trace_id == attempt.trace_id == call.trace_id == TRACE_ID
    assert attempt.parent_span_id == server.span_id
    assert call.parent_span_id == attempt.span_id and call.kind == CLIENT
    assert call.name == "onceguard.provider_call charges"
    wanted = tracing.key_hmac(tenant_id=tenant.pk, key=KEY)
    assert attempt.attributes[tracing.KEY_ATTRIBUTE] == call.attributes[tracing.KEY_ATTRIBUTE] == wanted
    assert attempt.attributes["onceguard.provider"] == "charges" and attempt.attributes["onceguard.attempt"] == 1
    assert call.attributes["onceguard.outcome"] == "succeeded" and call.attributes["http.response.status_code"] == 200

    # The provider's request carries the provider call's span as its parent.
    (request,) = provider_listener.seen
    assert parent_of(request.headers["traceparent"]) == (TRACE_ID, call.span_id)
    # Neither the key nor anything of the request body left in a span.
    exported = otlp.everything()
    assert KEY.encode() not in exported and b"amount" not in exported


def test_the_callback_delivery_continues_the_trace_and_carries_a_traceparent(otlp, tenant, charges, make_client):
    receiver = Listener(allow=True)
    try:
        tenant.callback_allow_list = [f"{receiver.url}/hooks/"]
        tenant.save()
        api = make_client(tenant)
        response = submit(api, callback_url=f"{receiver.url}/hooks/done", HTTP_TRACEPARENT=TRACEPARENT)
        assert response.status_code == 202, response.json()
        run_due()  # the charge
        run_due()  # its callback
        (delivery,) = receiver.seen
    finally:
        receiver.close()
    (attempt,) = otlp.named("onceguard.attempt")
    (callback,) = otlp.named("onceguard.callback")
    # The callback was queued inside the attempt: its span is the attempt's child, in the trace.
    assert callback.trace_id == TRACE_ID and callback.parent_span_id == attempt.span_id
    calls = {s.span_id: s for s in otlp.named("onceguard.provider_call")}
    trace_id, parent = parent_of(delivery.headers["traceparent"])
    assert trace_id == TRACE_ID and calls[parent].parent_span_id == callback.span_id
    assert KEY.encode() not in otlp.everything()


def test_tracing_off_means_no_middleware_no_column_and_no_export(tenant, charges, provider_listener, make_client):
    receiver = OtlpReceiver()
    try:
        assert not tracing.enabled()
        with pytest.raises(MiddlewareNotUsed):
            TraceContextMiddleware(lambda request: HttpResponse())
        api = make_client(tenant)
        response = submit(api, HTTP_TRACEPARENT=TRACEPARENT)
        assert response.status_code == 202
        op = Operation.objects.get(pk=response.json()["id"])
        assert op.trace_context == ""
        (done,) = run_due()
        assert done.status == "succeeded"
        (request,) = provider_listener.seen
        assert "traceparent" not in {name.lower() for name in request.headers}
        with tracing.span("anything") as span:
            assert span is None
        assert tracing.stored_context() == "" and tracing.current_traceparent() == ""
        tracing.flush()
        assert receiver.bodies == []
    finally:
        receiver.close()


def test_a_stored_traceparent_gives_its_trace_id_and_link():
    assert tracing.trace_id_of(TRACEPARENT) == TRACE_ID
    assert tracing.trace_id_of("") == tracing.trace_id_of("00-zz-00f067aa0ba902b7-01") == ""
    assert tracing.trace_id_of(f"00-{'0' * 32}-{PARENT_ID}-01") == ""
    template = "https://tempo.example/trace/{trace_id}"
    assert tracing.trace_link(trace_id=TRACE_ID, template=template) == f"https://tempo.example/trace/{TRACE_ID}"
    assert tracing.trace_link(trace_id=TRACE_ID, template="") == ""
    assert tracing.trace_link(trace_id="", template=template) == ""


def _console_page(client: Any, op: Operation) -> str:
    response = client.get(reverse("admin:ledger_operation_change", args=[op.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_operation_page_shows_the_trace_id_linked_by_the_template(tenant, provider, client, settings):
    client.force_login(User.objects.create_superuser("root", "root@example.invalid", "x"))
    traced = transitions.operation_claim(
        tenant=tenant, key="k-traced", provider=provider, request={"a": 1}, trace_context=TRACEPARENT
    ).operation
    untraced = transitions.operation_claim(tenant=tenant, key="k-plain", provider=provider, request={"a": 1}).operation
    assert traced.trace_context == TRACEPARENT and untraced.trace_context == ""

    settings.TRACE_LINK_TEMPLATE = "https://tempo.example/trace/{trace_id}"
    page = _console_page(client, traced)
    assert (
        f'<a href="https://tempo.example/trace/{TRACE_ID}" rel="noopener noreferrer"><code>{TRACE_ID}</code></a>'
        in page
    )
    assert TRACE_ID not in _console_page(client, untraced)

    # Without a template (or with one that is no web address) the id is shown, not linked.
    for template in ("", "javascript:alert('{trace_id}')"):
        settings.TRACE_LINK_TEMPLATE = template
        page = _console_page(client, traced)
        assert f"<code>{TRACE_ID}</code>" in page and "tempo.example" not in page and "javascript:" not in page


def test_the_sweepers_lookup_continues_the_stored_trace_and_sends_its_traceparent(otlp, tenant, provider_listener):
    lookups = provider_upsert(
        tenant=tenant,
        slug="lookups",
        base_url=provider_listener.url,
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
        lookup_path="/charges?idempotency_key={key}",
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        lookup_settle_seconds=0,
    )
    stored = f"00-{TRACE_ID}-{PARENT_ID}-01"
    op = transitions.operation_claim(
        tenant=tenant, key=KEY, provider=lookups, request={"a": 1}, mark_sent=True, trace_context=stored
    ).operation
    expire_lease(op.pk)
    sweep_expired_leases()
    Operation.objects.filter(pk=op.pk).update(reconcile_until=None)
    reconcile_uncertain()

    (reconcile,) = otlp.named("onceguard.reconcile")
    assert (reconcile.trace_id, reconcile.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert reconcile.attributes[tracing.KEY_ATTRIBUTE] == tracing.key_hmac(tenant_id=tenant.pk, key=KEY)
    (lookup,) = provider_listener.seen
    assert parent_of(lookup.headers["traceparent"]) == (TRACE_ID, reconcile.span_id)
    assert KEY.encode() not in otlp.everything()
