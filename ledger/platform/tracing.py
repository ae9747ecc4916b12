"""Traces end to end: W3C Trace Context in, spans out over OTLP/HTTP — off unless configured.

One trace follows an operation across systems (ADR 0015): the n8n node's execution sends a
``traceparent``; the API continues it in a server span (``config.middleware.TraceContextMiddleware``);
a claim that arrived with one stores it on the row (``Operation.trace_context``) so the worker's
attempt, the provider call, a poll and the callback delivery continue the same trace later, in
another process; every outgoing provider and callback request carries the current
``traceparent`` (:func:`headers_inject`, an httpx request hook on the outbound client).

What a span carries: names of steps, ids the service made (operation, attempt), the provider's
slug, outcomes — and ``onceguard.key_hmac``, an HMAC-SHA256 of the tenant and key under the
service's digest key (``ledger.platform.crypto.digest``), never the key itself: a key may be
derived from a person, and a trace backend is outside the data the service guards.

The service keeps its own ``TracerProvider``: the process-wide (global) one belongs to whoever
embeds the service, and a library setting it would fight them. It exists only while
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; otherwise every helper here returns after one test of a
module global (``bench/tracing.py`` measures the off path in microseconds per operation).

Imports no app: any room may call it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ledger.platform import crypto, env

log = logging.getLogger("onceguard.tracing")

KEY_ATTRIBUTE = "onceguard.key_hmac"
TRACEPARENT = "traceparent"
# version-traceid-spanid-flags: 2 + 32 + 16 + 2 hex digits and three dashes.
TRACEPARENT_LENGTH = 55

_PROPAGATOR = TraceContextTextMapPropagator()


class _State:
    """The process's tracer, or None: tracing off."""

    def __init__(self) -> None:
        self.tracer: trace.Tracer | None = None
        self.provider: TracerProvider | None = None
        self.lock = threading.Lock()


_state = _State()
# Read on every call: one global test is the whole cost of the off path.
_enabled = False


def _exporter(environ: Mapping[str, str] | None) -> SpanExporter:
    # Imported here: the exporter pulls in requests and protobuf, which a service with tracing
    # off (the default) never needs to load.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    base = env.read("OTEL_EXPORTER_OTLP_ENDPOINT", environ).strip().rstrip("/")
    headers = {}
    for pair in env.read("OTEL_EXPORTER_OTLP_HEADERS", environ).split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            headers[name.strip()] = value.strip()
    # The variable is the OTLP base URL (the OpenTelemetry convention): traces go to /v1/traces.
    return OTLPSpanExporter(endpoint=f"{base}/v1/traces", headers=headers or None, timeout=10)


def configure(environ: Mapping[str, str] | None = None, *, batch: bool = True) -> bool:
    """(Re)build the process's tracer from the settings (``environ``: the process's environment
    by default); True when tracing is on. ``batch=False`` exports each span as it ends (tests,
    short commands); the default batches in a background thread, off the request's path."""
    global _enabled
    with _state.lock:
        old = _state.provider
        _state.tracer = _state.provider = None
        _enabled = False
        if old is not None:
            old.shutdown()
        if not env.read("OTEL_EXPORTER_OTLP_ENDPOINT", environ).strip():
            return False
        resource = Resource.create({"service.name": env.read("OTEL_SERVICE_NAME", environ) or "onceguard"})
        provider = TracerProvider(resource=resource)
        exporter = _exporter(environ)
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        _state.provider = provider
        _state.tracer = provider.get_tracer("onceguard")
        _enabled = True
        return True


def enabled() -> bool:
    """Whether this process records spans. (A forked worker — gunicorn, django-q — keeps its
    parent's tracer: the SDK starts the batch exporter's thread again in the child.)"""
    return _enabled


def flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered now (a command's end, tests)."""
    provider = _state.provider
    if provider is not None:
        provider.force_flush(timeout_millis)


# --- Spans (the public helpers first; their bodies, run only while tracing is on, below) -----

# What every span helper returns while tracing is off: one shared context manager yielding
# None, so the off path builds no generator (a tenth of a microsecond instead of one).
_OFF: AbstractContextManager[None] = nullcontext()
SpanContext = AbstractContextManager["trace.Span | None"]


def span(
    name: str,
    *,
    parent: str = "",
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> SpanContext:
    """A span named ``name``, current inside the block: a child of ``parent`` (a stored
    ``traceparent``) when given, else of the current span, else a new trace's root. Yields
    None while tracing is off. An exception leaving the block marks the span as an error
    (its class only: a message can carry the data the span must not)."""
    if not enabled():
        return _OFF
    return _span(name, parent=parent, kind=kind, attributes=attributes)


def server_span(*, name: str, headers: Mapping[str, str]) -> SpanContext:
    """The server span of an incoming request, continuing its ``traceparent``/``tracestate``
    (W3C Trace Context) when it sent a valid one; a new trace otherwise."""
    if not enabled():
        return _OFF
    return _server_span(name=name, headers=headers)


def operation_span(
    name: str, *, operation: Any, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> SpanContext:
    """A span about one operation (an attempt, a poll, a callback delivery), continuing the
    trace its row stored (``trace_context``) when it has one: ``onceguard.operation_id``, the
    key's HMAC and ``attributes``."""
    if not enabled():
        return _OFF
    return _operation_span(name, operation=operation, kind=kind, attributes=attributes)


def client_span(name: str, *, operation: Any) -> SpanContext:
    """A call out of the service about ``operation`` (a provider call): a client span, child of
    the current one, named by the key's HMAC; the request it makes carries its traceparent."""
    if not enabled():
        return _OFF
    return _client_span(name, operation=operation)


def _parent_context(traceparent: str) -> otel_context.Context | None:
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


@contextmanager
def _span(
    name: str,
    *,
    parent: str = "",
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[trace.Span | None]:
    tracer = _state.tracer
    assert tracer is not None
    ctx = _parent_context(parent)
    with tracer.start_as_current_span(
        name,
        context=ctx,
        kind=kind,
        attributes=dict(attributes or {}),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


@contextmanager
def _server_span(*, name: str, headers: Mapping[str, str]) -> Iterator[trace.Span | None]:
    tracer = _state.tracer
    assert tracer is not None
    carrier = {k: v for k in (TRACEPARENT, "tracestate") if (v := headers.get(k))}
    ctx = _PROPAGATOR.extract(carrier) if carrier else None
    continued = ctx is not None and trace.get_current_span(ctx).get_span_context().is_valid
    with tracer.start_as_current_span(
        name, context=ctx if continued else None, kind=SpanKind.SERVER, record_exception=False
    ) as current:
        token = otel_context.attach(otel_context.set_value(_CONTINUED, True)) if continued else None
        try:
            yield current
        finally:
            if token is not None:
                otel_context.detach(token)


# Set in the context of a server span that continued a caller's traceparent: only then does a
# claim store the trace on its row (a trace nobody outside started is not worth a column).
_CONTINUED = "onceguard.trace_continued"


def stored_context() -> str:
    """What a new operation stores as its ``trace_context``: the current span's
    ``traceparent`` when tracing is on and the trace came from outside (an incoming
    ``traceparent``, or a row that stored one); "" otherwise — nothing is written."""
    if not _enabled or not otel_context.get_value(_CONTINUED):
        return ""
    return current_traceparent()


def current_traceparent() -> str:
    """The current span's ``traceparent``, or "" outside a recording span."""
    if not _enabled:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(TRACEPARENT, "")


@contextmanager
def _operation_span(
    name: str, *, operation: Any, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> Iterator[trace.Span | None]:
    stored = getattr(operation, "trace_context", "") or ""
    values = {"onceguard.operation_id": operation.pk, **operation_attributes(operation), **dict(attributes or {})}
    with _span(name, parent=stored, kind=kind, attributes=values) as current:
        token = otel_context.attach(otel_context.set_value(_CONTINUED, True)) if stored else None
        try:
            yield current
        finally:
            if token is not None:
                otel_context.detach(token)


@contextmanager
def _client_span(name: str, *, operation: Any) -> Iterator[trace.Span | None]:
    with _span(name, kind=SpanKind.CLIENT, attributes=operation_attributes(operation)) as current:
        yield current


def key_hmac(*, tenant_id: int | None, key: str) -> str:
    """HMAC-SHA256 (hex) of the tenant and key under the service's digest key: equal for every
    span of one key, and no guess of a key (an e-mail address, an order number) can be checked
    against it without the service's key."""
    return crypto.digest(f"operation-key:{tenant_id}:{key}")[1]


def operation_attributes(operation: Any) -> dict[str, Any]:
    """The attributes that name an operation in a span: its key's HMAC, never the key."""
    key = getattr(operation, "key", "") or ""
    return {KEY_ATTRIBUTE: key_hmac(tenant_id=getattr(operation, "tenant_id", None), key=key)} if key else {}


def operation_annotate(operation: Any) -> None:
    """Name ``operation`` on the current span (the claim's or the completion's server span)."""
    if not _enabled:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes({"onceguard.operation_id": operation.pk, **operation_attributes(operation)})


def attributes_set(values: Mapping[str, Any]) -> None:
    """Add ``values`` to the current span (outcomes, statuses), when one records."""
    if not _enabled:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(dict(values))


def headers_inject(headers: MutableMapping[str, str]) -> None:
    """Put the current span's ``traceparent`` (and ``tracestate``) into outgoing ``headers``."""
    if not _enabled:
        return
    _PROPAGATOR.inject(headers)


def request_hook(request: Any) -> None:
    """httpx's request event hook: every request of the outbound client carries the current
    trace (a provider call, a callback, a lookup), unless it set its own ``traceparent``."""
    if not _enabled or TRACEPARENT in request.headers:
        return
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    request.headers.update(carrier)


# --- Reading a stored context ------------------------------------------------------------------


def trace_id_of(traceparent: str) -> str:
    """The 32-hex trace id of a stored ``traceparent``; "" when it holds none."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return ""
    try:
        int(parts[1], 16)
    except ValueError:
        return ""
    return parts[1].lower()


def trace_link(*, trace_id: str, template: str) -> str:
    """Where ``trace_id`` opens in the trace backend (``TRACE_LINK_TEMPLATE``); "" without one."""
    if not trace_id or "{trace_id}" not in template:
        return ""
    return template.replace("{trace_id}", trace_id)


configure()
