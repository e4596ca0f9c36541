"""The spans of one request (``tracing.spans``) on a Clock, captured by the SDK's in-memory
exporter: their shape, their times, their attributes, and what they never carry."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.tracing.interfaces import IPeerTrace, IRequestTrace, ITracer, TraceStart
from nvpair.proxy.tracing.spans import operationName
from tests.support.cases.spancase import (
    CLIENT_SPAN,
    CLIENT_TRACE,
    SECRET,
    TRACEPARENT,
    SpanCase,
    parentOf,
)
from tests.support.exchangecase import SSE, USAGE
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, startExchange
from tests.tracing.spankit import ALWAYS_OFF, SpanCapture

ANSWER = b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % SECRET.encode()


def spanId(span: ReadableSpan) -> int:
    """The span's own id."""
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def headerValue(headers: Any, name: bytes) -> bytes:
    """The one value of header ``name``."""
    values = headers.getRawHeaders(name)
    assert values is not None and len(values) == 1, values
    value: bytes = values[0]
    return value


def spanIds(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


class RequestSpanTests(SpanCase):
    """A request is one SERVER span with a CLIENT span per attempt under it."""

    def test_interfaces(self) -> None:
        """The tracer and its traces provide the seam's interfaces."""
        self.assertTrue(verifyObject(ITracer, self.capture.tracer))
        ex, _ = startExchange(self.context, self.facade)
        self.assertTrue(verifyObject(IRequestTrace, ex.trace))
        client = FakeRequest()
        begin = TraceStart(client.method, client.path, client.requestHeaders, "llamacpp")
        peer = self.capture.tracer.peerStarted(
            begin, FakeRequest().requestHeaders, "n2", "http://127.0.0.1:1"
        )
        self.assertTrue(verifyObject(IPeerTrace, peer))

    def test_committedStream(self) -> None:
        """A stream committed on A: server and dispatch spans with their times from the
        clock, the commit event with the time to first byte, the GenAI attributes, the
        token counts of the answer's usage, and the engine called with the dispatch span's
        context."""
        self.clock.advance(100)
        self.start()
        call = self.upstream.last()
        self.clock.advance(0.25)
        response = call.respond(200)
        response.send(SSE)
        self.clock.advance(1.0)
        response.send(USAGE)
        response.end()
        server = self.capture.server()
        [dispatch] = self.capture.named("dispatch")
        self.assertEqual(server.kind, SpanKind.SERVER)
        self.assertEqual(dispatch.kind, SpanKind.CLIENT)
        self.assertEqual(server.name, "POST /v1/chat/completions")
        self.assertIsNone(server.parent, "no traceparent from the client: a new trace")
        assert dispatch.parent is not None
        self.assertEqual(dispatch.parent.span_id, spanId(server))
        self.assertEqual((server.start_time, server.end_time), (100 * 10**9, int(101.25e9)))
        self.assertEqual((dispatch.start_time, dispatch.end_time), (100 * 10**9, int(100.25e9)))
        attributes = dict(server.attributes or {})
        self.assertEqual(attributes["http.request.method"], "POST")
        self.assertEqual(attributes["url.path"], "/v1/chat/completions")
        self.assertEqual(attributes["gen_ai.request.model"], "m1")
        self.assertEqual(attributes["gen_ai.provider.name"], "llamacpp")
        self.assertEqual(attributes["gen_ai.operation.name"], "chat")
        self.assertEqual(attributes["gen_ai.usage.input_tokens"], 3)
        self.assertEqual(attributes["gen_ai.usage.output_tokens"], 2)
        self.assertEqual(attributes["nvpair.outcome"], "completed")
        self.assertEqual(attributes["nvpair.attempts"], 1)
        self.assertEqual(attributes["http.response.status_code"], 200)
        self.assertEqual(attributes["nvpair.node.id"], "A")
        self.assertEqual(server.status.status_code, StatusCode.UNSET)
        events = {e.name: e for e in server.events}
        self.assertEqual(set(events), {"admitted", "commit"})
        commit = events["commit"]
        self.assertEqual(dict(commit.attributes or {})["nvpair.node.id"], "A")
        self.assertAlmostEqual(dict(commit.attributes or {})["nvpair.time_to_first_byte"], 0.25)
        self.assertEqual(commit.timestamp, int(100.25e9))
        d = dict(dispatch.attributes or {})
        self.assertEqual(d["nvpair.node.id"], "A")
        self.assertEqual(d["nvpair.attempt.outcome"], "committed")
        self.assertEqual(d["server.address"], "A".lower())
        traceparent = headerValue(call.headers, b"traceparent")
        traceId, sentSpan, flags = parentOf(traceparent)
        self.assertEqual((traceId, sentSpan), spanIds(dispatch))
        self.assertEqual(int(flags, 16) & 1, 1, "sampled")

    def test_failover(self) -> None:
        """A refuses, B serves: two dispatch spans under the one server span, the first
        failed with its kind, each engine call carrying its own span's context."""
        self.start()
        first = self.upstream.last()
        first.refuse()
        second = self.upstream.last()
        second.respond(200).send(SSE)
        second.response.end() if second.response else None
        spans = self.capture.named("dispatch")
        self.assertEqual(len(spans), 2)
        server = self.capture.server()
        serverId = spanId(server)
        failed, served = spans
        for span in spans:
            assert span.parent is not None
            self.assertEqual(span.parent.span_id, serverId)
        f = dict(failed.attributes or {})
        self.assertEqual(
            (f["nvpair.node.id"], f["nvpair.attempt.outcome"], f["nvpair.failure.kind"]),
            ("A", "failed", "transport"),
        )
        self.assertEqual(f["error.type"], "transport")
        self.assertEqual(failed.status.status_code, StatusCode.ERROR)
        s = dict(served.attributes or {})
        self.assertEqual((s["nvpair.node.id"], s["nvpair.attempt.outcome"]), ("B", "committed"))
        self.assertEqual((f["nvpair.attempt"], s["nvpair.attempt"]), (1, 2))
        for call, span in ((first, failed), (second, served)):
            traceparent = headerValue(call.headers, b"traceparent")
            self.assertEqual(parentOf(traceparent)[:2], spanIds(span))
        self.assertEqual(dict(server.attributes or {})["nvpair.attempts"], 2)

    def test_retryableStatusRecorded(self) -> None:
        """A 503 from A: its dispatch span names the status; B's commit follows."""
        self.start()
        self.upstream.last().respond(503)
        self.upstream.last().respond(200).send(SSE)
        failed = self.capture.named("dispatch")[0]
        self.assertEqual(dict(failed.attributes or {})["http.response.status_code"], 503)
        self.assertEqual(dict(failed.attributes or {})["nvpair.failure.kind"], "status")

    def test_continuesClientTrace(self) -> None:
        """The client's traceparent is continued, its tracestate passed to the engine."""
        self.start(
            {
                b"traceparent": [TRACEPARENT],
                b"tracestate": [b"vendor=abc"],
                b"content-type": [b"application/json"],
            }
        )
        call = self.upstream.last()
        response = call.respond(200)
        response.send(SSE)
        response.end()
        server = self.capture.server()
        self.assertEqual(spanIds(server)[0], CLIENT_TRACE)
        assert server.parent is not None
        self.assertEqual(f"{server.parent.span_id:016x}", CLIENT_SPAN)
        self.assertEqual(call.headers.getRawHeaders(b"tracestate"), [b"vendor=abc"])
        traceparent = headerValue(call.headers, b"traceparent")
        self.assertEqual(parentOf(traceparent)[0], CLIENT_TRACE)
        self.assertNotEqual(parentOf(traceparent)[1], CLIENT_SPAN, "the proxy's own span")

    def test_allFail(self) -> None:
        """Every attempt refused: the server span ends failed, in error."""
        self.start()
        for _ in range(10):
            pending = self.upstream.pending()
            if not pending:
                self.clock.advance(10)
                pending = self.upstream.pending()
            if not pending:
                break
            pending[0].refuse()
        server = self.capture.server()
        self.assertEqual(dict(server.attributes or {})["nvpair.outcome"], "failed")
        self.assertEqual(server.status.status_code, StatusCode.ERROR)
        self.assertTrue(all(s.end_time is not None for s in self.capture.spans()))

    def test_clientGoneBeforeCommit(self) -> None:
        """The client leaves while A is dialled: the attempt and the request end cancelled."""
        request = self.start()
        request.lose()
        [dispatch] = self.capture.named("dispatch")
        self.assertEqual(dict(dispatch.attributes or {})["nvpair.attempt.outcome"], "cancelled")
        server = self.capture.server()
        self.assertEqual(dict(server.attributes or {})["nvpair.outcome"], "cancelled")

    def test_truncated(self) -> None:
        """The engine's body breaks after the commit: the request ends truncated."""
        self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        response.fail()
        server = self.capture.server()
        self.assertEqual(dict(server.attributes or {})["nvpair.outcome"], "truncated")
        self.assertEqual(server.status.status_code, StatusCode.ERROR)

    def test_noBodyInSpans(self) -> None:
        """Neither the prompt nor the answer appears anywhere in the exported spans."""
        self.start()
        response = self.upstream.last().respond(200)
        response.send(ANSWER)
        response.send(USAGE)
        response.end()
        exported = "".join(s.to_json() for s in self.capture.spans())
        self.assertIn("m1", exported)
        self.assertNotIn(SECRET, exported)
        self.assertNotIn("messages", exported)


class StallSpanTests(SpanCase):
    """A stream cut by its stall watch ends ``stalled``."""

    settings = {"streamIdleTimeout": 10.0}

    def test_stalled(self) -> None:
        """Silent past the idle timeout: the server span ends stalled, in error."""
        self.start()
        self.upstream.last().respond(200).send(SSE)
        for _ in range(300):
            self.clock.advance(0.05)
        self.clock.advance(0)
        server = self.capture.server()
        self.assertEqual(dict(server.attributes or {})["nvpair.outcome"], "stalled")
        self.assertEqual(server.status.status_code, StatusCode.ERROR)


class QueueWaitTests(SpanCase):
    """The queue-wait API a queue calls on ``exchange.trace``."""

    def test_queueWait(self) -> None:
        """Started and ended: a child span of the request as long as the wait, with its
        outcome; a second end is a no-op."""
        ex, request = startExchange(self.context, self.facade)
        trace = ex.trace
        assert trace is not None
        self.clock.advance(5)
        trace.queueWaitStarted()
        self.clock.advance(2)
        trace.queueWaitEnded("dispatched")
        trace.queueWaitEnded("dispatched")
        [wait] = self.capture.named("queue-wait")
        self.assertEqual(wait.end_time - wait.start_time, 2 * 10**9)  # type: ignore[operator]
        self.assertEqual(dict(wait.attributes or {})["nvpair.queue.outcome"], "dispatched")
        assert wait.parent is not None
        request.lose()
        self.assertEqual(wait.parent.span_id, spanId(self.capture.server()))

    def test_openWaitEndsWithRequest(self) -> None:
        """A wait still open when the request ends is ended ``cancelled``."""
        ex, request = startExchange(self.context, self.facade)
        assert ex.trace is not None
        ex.trace.queueWaitStarted()
        request.lose()
        [wait] = self.capture.named("queue-wait")
        self.assertEqual(dict(wait.attributes or {})["nvpair.queue.outcome"], "cancelled")


class UnsampledTests(SynchronousTestCase):
    """Not sampled: nothing exported, the trace still continued to the engine."""

    def test_unsampled(self) -> None:
        """With the sampler off no span is exported, and the engine gets the client's trace
        id with the not-sampled flag."""
        context = FakeContext()
        capture = SpanCapture(context.clock, ALWAYS_OFF)
        context.tracer = capture.tracer
        facade = makeFacade(context.clock, [node("A")])
        request = FakeRequest(headers={b"traceparent": [TRACEPARENT.replace(b"-01", b"-00")]})
        startExchange(context, facade, request)
        call = context.upstream.last()
        call.respond(200).send(SSE)
        call.response.end() if call.response else None
        self.assertEqual(capture.spans(), [])
        traceparent = headerValue(call.headers, b"traceparent")
        self.assertEqual(parentOf(traceparent)[0], CLIENT_TRACE)
        self.assertEqual(int(parentOf(traceparent)[2], 16) & 1, 0, "not sampled")


class PeerSpanTests(SynchronousTestCase):
    """A peer request: a SERVER span continuing the routing node's attempt, a CLIENT span to
    the local backend whose context the backend call carries."""

    def test_peerSpans(self) -> None:
        """The two spans, their parents, the outgoing context and the ending."""
        context = FakeContext()
        capture = SpanCapture(context.clock)
        request = FakeRequest(headers={b"traceparent": [TRACEPARENT]})
        headers = FakeRequest().requestHeaders
        begin = TraceStart(request.method, request.path, request.requestHeaders, "ollama")
        trace = capture.tracer.peerStarted(begin, headers, "node-2", "http://127.0.0.1:11434")
        context.clock.advance(3)
        trace.ended(200, "completed")
        server = capture.server()
        [backend] = capture.named("backend")
        self.assertEqual(spanIds(server)[0], CLIENT_TRACE)
        assert server.parent is not None and backend.parent is not None
        self.assertEqual(f"{server.parent.span_id:016x}", CLIENT_SPAN)
        self.assertEqual(backend.parent.span_id, spanId(server))
        b = dict(backend.attributes or {})
        self.assertEqual((b["server.address"], b["server.port"]), ("127.0.0.1", 11434))
        self.assertEqual(dict(server.attributes or {})["nvpair.peer"], "node-2")
        self.assertEqual(dict(server.attributes or {})["http.response.status_code"], 200)
        traceparent = headerValue(headers, b"traceparent")
        self.assertEqual(parentOf(traceparent)[:2], spanIds(backend))
        self.assertEqual(server.end_time - server.start_time, 3 * 10**9)  # type: ignore[operator]


class OperationNameTests(SynchronousTestCase):
    """The GenAI operation a route serves, by its path."""

    def test_agentsRoutesAreChat(self) -> None:
        """Anthropic Messages and OpenAI Responses are chat, as the chat routes are."""
        for path in (b"/v1/chat/completions", b"/api/chat", b"/v1/messages", b"/v1/responses"):
            self.assertEqual(operationName(path), "chat")
        self.assertEqual(operationName(b"/v1/embeddings"), "embeddings")
        self.assertEqual(operationName(b"/api/generate"), "text_completion")
        self.assertIsNone(operationName(b"/v1/messages/count_tokens"))
