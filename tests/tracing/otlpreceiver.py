"""A tiny OTLP/HTTP trace receiver on 127.0.0.1 for the integration tests: it answers every
``POST /v1/traces`` with 200, decodes the protobuf export with ``opentelemetry.proto`` and
keeps each span with its resource's service name; the raw bodies are kept too."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site


@attrs.frozen
class ReceivedSpan:
    """One exported span, its ids as hex, its attributes as plain values."""

    service: str
    name: str
    kind: int
    traceId: str
    spanId: str
    parentId: str
    attributes: dict[str, Any]
    events: tuple[str, ...]


def _value(v: Any) -> Any:
    field = v.WhichOneof("value")
    return getattr(v, field) if field is not None else None


class _Traces(Resource):
    isLeaf = True

    def __init__(self, receiver: OTLPReceiver) -> None:
        super().__init__()
        self.receiver = receiver

    def render_POST(self, request: Request) -> bytes:
        assert request.content is not None
        body = request.content.read()
        if request.getHeader(b"content-encoding") == b"gzip":
            body = gzip.decompress(body)
        self.receiver.received(body, request.uri)
        request.setHeader(b"content-type", b"application/x-protobuf")
        answer: bytes = ExportTraceServiceRequest().SerializeToString()
        return answer


class OTLPReceiver:
    """Collects exported spans; ``waitFor`` fires once a predicate holds over them."""

    def __init__(self, test: TestCase, reactor: Any) -> None:
        self.reactor = reactor
        self.bodies: list[bytes] = []
        self.paths: list[bytes] = []
        self.spans: list[ReceivedSpan] = []
        self._waiters: list[tuple[Callable[[list[ReceivedSpan]], bool], defer.Deferred[Any]]] = []
        self.port: IListeningPort = reactor.listenTCP(0, Site(_Traces(self)), interface="127.0.0.1")
        test.addCleanup(self.port.stopListening)

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port.getHost().port}"  # type: ignore[attr-defined]

    def received(self, body: bytes, path: bytes) -> None:
        self.bodies.append(body)
        self.paths.append(path)
        export = ExportTraceServiceRequest.FromString(body)
        for resourceSpans in export.resource_spans:
            service = ""
            for attribute in resourceSpans.resource.attributes:
                if attribute.key == "service.name":
                    service = str(_value(attribute.value))
            for scopeSpans in resourceSpans.scope_spans:
                for span in scopeSpans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service,
                            span.name,
                            span.kind,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in span.attributes},
                            tuple(e.name for e in span.events),
                        )
                    )
        waiters, self._waiters = self._waiters, []
        for predicate, d in waiters:
            if predicate(self.spans):
                d.callback(list(self.spans))
            else:
                self._waiters.append((predicate, d))

    def waitFor(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> defer.Deferred[list[ReceivedSpan]]:
        """The spans so far once ``predicate`` holds over them (within ``timeout`` seconds)."""
        if predicate(self.spans):
            return defer.succeed(list(self.spans))
        d: defer.Deferred[list[ReceivedSpan]] = defer.Deferred()
        self._waiters.append((predicate, d))
        return d.addTimeout(timeout, self.reactor)

    def environ(self, service: str, delayMs: int = 50) -> dict[str, str]:
        """The ``OTEL_*`` environment of a proxy exporting here, sampling everything."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": service,
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            "OTEL_BSP_SCHEDULE_DELAY": str(delayMs),
        }


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    """The spans called ``name``."""
    return [s for s in spans if s.name == name]


SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
CLIENT = 3  # Span.SpanKind.SPAN_KIND_CLIENT
