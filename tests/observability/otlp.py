"""A real OTLP/HTTP trace receiver on loopback: it accepts the protobuf POSTs of
``/v1/traces`` exactly as a collector does and decodes them with the opentelemetry-proto
classes, keeping every raw byte it was sent (where a leaked key would be found)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.loopback import LoopbackServer, QuietHandler


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    service_name: str


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.bodies.append(raw)
                    receiver.paths.append(self.path)
                    receiver.content_types.append(self.headers.get("Content-Type", ""))
                self.answer(
                    200, ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
                )

        self.server = LoopbackServer(Handler).start()
        self.url = self.server.url

    def spans(self) -> list[ReceivedSpan]:
        out = []
        with self.lock:
            bodies = list(self.bodies)
        for raw in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(raw)
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                kind=s.kind,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                service_name=str(resource.get("service.name", "")),
                            )
                        )
        return out

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def everything(self) -> bytes:
        with self.lock:
            return b"".join(self.bodies)

    def close(self) -> None:
        self.server.stop()
