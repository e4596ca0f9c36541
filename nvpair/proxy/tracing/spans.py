"""The spans of a request over the OpenTelemetry API (imported only with ``--otel``).

One client request is a SERVER span continuing the client's ``traceparent``; under it an
``admitted`` event, a ``queue-wait`` span while the request waits for a slot, one CLIENT
span per dispatch attempt (whose context the attempt's request to the engine carries), a
``commit`` event with the time to first byte, and the ending (completed, truncated,
stalled, failed, cancelled).  Attributes are operational metadata only: method, path,
engine, model, node, status, token counts; never a header value, prompt or body (spec §9).
Times come from the request context's clock, so unit tests drive spans with ``Clock``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanKind, Status, StatusCode
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.endings import BodyEnding
from nvpair.proxy.tracing.interfaces import (
    FailedAttempt,
    IPeerTrace,
    IRequestTrace,
    ITracer,
    TracedEnd,
    TraceStart,
)
from nvpair.proxy.tracing.tracestate import validTracestate

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node

SCOPE = "nvpair-proxy"
NAME_LENGTH = 256
"""A span name's longest path part (the path is the client's): longer ones are cut."""


class HeadersGetter(Getter[Headers]):
    """Reads propagation fields from a Twisted ``Headers``; an invalid ``tracestate`` reads
    as absent (``tracestate.validTracestate``), so it is never continued or passed on."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = carrier.getRawHeaders(key.encode("latin-1"))
        if values is None:
            return None
        texts = [v.decode("latin-1") for v in values]
        return None if key == "tracestate" and not validTracestate(texts) else texts

    def keys(self, carrier: Headers) -> list[str]:
        return [name.decode("latin-1").lower() for name, _ in carrier.getAllRawHeaders()]


class HeadersSetter(Setter[Headers]):
    """Writes propagation fields into a Twisted ``Headers`` (replacing the client's)."""

    def set(self, carrier: Headers, key: str, value: str) -> None:
        carrier.setRawHeaders(key.encode("latin-1"), [value.encode("latin-1")])


GETTER = HeadersGetter()
SETTER = HeadersSetter()


def _ns(clock: IReactorTime) -> int:
    return int(clock.seconds() * 1e9)


def operationName(path: bytes) -> str | None:
    """The GenAI operation a route serves, by its path (None for other routes)."""
    if b"chat" in path or path.endswith((b"/messages", b"/responses")):
        return "chat"  # Anthropic Messages and OpenAI Responses are chat, by the conventions
    if b"embed" in path:
        return "embeddings"
    if b"complet" in path or b"generate" in path:
        return "text_completion"
    return None


def serverAttributes(address: str) -> dict[str, str | int]:
    """``server.address`` and ``server.port`` of a node address (``host:port`` or a URL)."""
    parts = urlsplit(address if "//" in address else f"//{address}")
    attributes: dict[str, str | int] = {}
    try:
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        if parts.port is not None:
            attributes["server.port"] = parts.port
    except ValueError:
        pass  # a malformed port: leave it out
    return attributes


def _inject(span: trace.Span, headers: Headers) -> None:
    """Our context in place of the client's: its ``tracestate`` goes too, and comes back
    only as the span carries it (a valid one of the trace we continue)."""
    headers.removeHeader(b"tracestate")
    propagate.inject(headers, context=trace.set_span_in_context(span), setter=SETTER)


def _named(method: str, path: str) -> str:
    """A span name: the method and the path, cut to ``NAME_LENGTH``."""
    return f"{method} {path[:NAME_LENGTH]}"


@implementer(IRequestTrace)
class RequestTrace:
    """The spans of one client request."""

    def __init__(self, tracer: trace.Tracer, clock: IReactorTime, begin: TraceStart) -> None:
        self.tracer = tracer
        self.clock = clock
        parent = propagate.extract(begin.headers, getter=GETTER)
        method = begin.method.decode("latin-1")
        path = begin.path.decode("latin-1")
        attributes: dict[str, str] = {
            "http.request.method": method,
            "url.path": path,
            "gen_ai.provider.name": begin.engineId,
            "nvpair.engine": begin.engineId,
        }
        operation = operationName(begin.path) if begin.inference else None
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
        if begin.model is not None:
            attributes["gen_ai.request.model"] = begin.model
        start = int(begin.createdAt * 1e9)
        self.span = tracer.start_span(
            _named(method, path),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=start,
        )
        self.recording = self.span.is_recording()
        self.context: Context = trace.set_span_in_context(self.span)
        self.queue: trace.Span | None = None
        self.attempt: trace.Span | None = None
        self.attempts = 0
        self.wasStalled = False
        self.carried: tuple[Headers, Headers] | None = None  # (given, sent) when unsampled
        if self.recording:
            self.span.add_event(
                "admitted",
                {"nvpair.route": "inference" if begin.inference else "verbatim"},
                timestamp=start,
            )

    def queueWaitStarted(self) -> None:
        if self.queue is None and self.recording:
            self.queue = self.tracer.start_span(
                "queue-wait", context=self.context, start_time=_ns(self.clock)
            )

    def queueWaitEnded(self, outcome: str) -> None:
        queue, self.queue = self.queue, None
        if queue is not None:
            queue.set_attribute("nvpair.queue.outcome", outcome)
            queue.end(_ns(self.clock))

    def attemptStarted(self, node: Node, headers: Headers) -> Headers:
        if not self.recording:
            # Not sampled: no child spans (they would not be either), and every attempt
            # carries the same context: one copy of the request's headers, made once.
            carried = self.carried
            if carried is None or carried[0] is not headers:
                sent = headers.copy()
                _inject(self.span, sent)
                carried = self.carried = (headers, sent)
            return carried[1]
        self._endAttempt("cancelled")
        self.attempts += 1
        attributes: dict[str, str | int] = {"nvpair.node.id": node.id}
        attributes["nvpair.attempt"] = self.attempts
        if node.addresses:
            attributes.update(serverAttributes(node.addresses[0]))
        span = self.attempt = self.tracer.start_span(
            "dispatch",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=_ns(self.clock),
        )
        headers = headers.copy()  # each attempt's own: an earlier one may still hold its copy
        _inject(span, headers)
        return headers

    def attemptFailed(self, outcome: FailedAttempt) -> None:
        attempt = self.attempt
        if attempt is None:
            return
        kind = outcome.kind.value
        attempt.set_attribute("nvpair.failure.kind", kind)
        attempt.set_attribute("error.type", kind)
        if outcome.status is not None:
            attempt.set_attribute("http.response.status_code", outcome.status)
        attempt.set_status(Status(StatusCode.ERROR))
        self._endAttempt("failed")

    def committed(self, nodeId: str, firstByte: float) -> None:
        self._endAttempt("committed")
        if self.recording:
            self.span.add_event(
                "commit",
                {"nvpair.node.id": nodeId, "nvpair.time_to_first_byte": firstByte},
                timestamp=_ns(self.clock),
            )

    def stalled(self) -> None:
        self.wasStalled = True

    def ended(self, exchange: TracedEnd) -> None:
        self.queueWaitEnded("cancelled")
        self._endAttempt("cancelled")
        span = self.span
        if self.recording:
            outcome = self._outcome(exchange)
            span.set_attribute("nvpair.outcome", outcome)
            span.set_attribute("nvpair.attempts", exchange.attempts)
            if exchange.committedStatus is not None:
                span.set_attribute("http.response.status_code", exchange.committedStatus)
            if outcome in ("failed", "truncated", "stalled"):
                span.set_status(Status(StatusCode.ERROR))
            workload = exchange.workload
            stats = None if workload is None else workload.stats
            if stats:
                for name, field in (("input", "promptTokens"), ("output", "completionTokens")):
                    count = stats.get(field)
                    if type(count) is int:
                        span.set_attribute(f"gen_ai.usage.{name}_tokens", count)
            if exchange.servedBy is not None:
                span.set_attribute("nvpair.node.id", exchange.servedBy)
        span.end(_ns(self.clock))

    def _outcome(self, exchange: TracedEnd) -> str:
        ending = exchange.ending
        if ending is BodyEnding.COMPLETE:
            return "completed"
        if ending is BodyEnding.TRUNCATED:
            return "stalled" if self.wasStalled else "truncated"
        if ending is not None or exchange.clientGone or exchange.stopping:
            return "cancelled"
        return "failed"

    def _endAttempt(self, outcome: str) -> None:
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            attempt.set_attribute("nvpair.attempt.outcome", outcome)
            attempt.end(_ns(self.clock))


@implementer(IPeerTrace)
class PeerTrace:
    """The spans of one request from a cluster peer: SERVER, and CLIENT to the backend."""

    def __init__(
        self,
        tracer: trace.Tracer,
        clock: IReactorTime,
        begin: TraceStart,
        outgoing: Headers,
        peer: str,
        backend: str,
    ) -> None:
        self.clock = clock
        method = begin.method.decode("latin-1")
        path = begin.path.decode("latin-1")
        engineId = begin.engineId
        now = _ns(clock)
        self.span = tracer.start_span(
            f"peer {_named(method, path)}",
            context=propagate.extract(begin.headers, getter=GETTER),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "nvpair.engine": engineId,
                "gen_ai.provider.name": engineId,
                "nvpair.peer": peer,
            },
            start_time=now,
        )
        self.backend = tracer.start_span(
            "backend",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes=serverAttributes(backend),
            start_time=now,
        )
        _inject(self.backend, outgoing)

    def ended(self, status: int | None, outcome: str) -> None:
        now = _ns(self.clock)
        for span in (self.backend, self.span):
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            span.set_attribute("nvpair.outcome", outcome)
            if outcome != "completed":
                span.set_status(Status(StatusCode.ERROR))
            span.end(now)


@implementer(ITracer)
class Tracer:
    """Starts request traces on an OpenTelemetry tracer; ``flush`` ends the provider."""

    def __init__(
        self,
        tracer: trace.Tracer,
        clock: IReactorTime,
        flush: Callable[[float], defer.Deferred[None]] | None = None,
    ) -> None:
        self.tracer = tracer
        self.clock = clock
        self.flush = flush

    def requestStarted(self, start: TraceStart) -> RequestTrace:
        return RequestTrace(self.tracer, self.clock, start)

    def peerStarted(
        self, start: TraceStart, outgoing: Headers, peer: str, backend: str
    ) -> PeerTrace:
        return PeerTrace(self.tracer, self.clock, start, outgoing, peer, backend)

    def shutdown(self, timeout: float) -> defer.Deferred[None]:
        if self.flush is None:
            return defer.succeed(None)
        return self.flush(timeout)
