"""Traces end to end: real proxy processes exporting over OTLP/HTTP to a receiver on
127.0.0.1, fake engines behind them (a failover, one trace across two cluster proxies, the
flush at stop)."""

from __future__ import annotations

from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers

from nvpair.proxy.testing.fakeengine import Status
from tests.support.clusterfixture import ENGINE, ClusterNode, chat
from tests.support.harness import startEngine
from tests.support.standaloneharness import StandaloneProxy, backendUp
from tests.tracing.otlpreceiver import CLIENT, SERVER, OTLPReceiver, ReceivedSpan, named

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SECRET = "never-export-this-prompt"
BODY = {"model": "m1", "messages": [{"role": "user", "content": SECRET}]}


def _d(coro: Any) -> defer.Deferred[Any]:
    return defer.Deferred.fromCoroutine(coro)


def spanOf(header: str) -> tuple[str, str]:
    """(trace id, span id) of a ``traceparent`` value."""
    _, traceId, spanId, _ = header.split("-")
    return traceId, spanId


def serverEnded(spans: list[ReceivedSpan]) -> bool:
    return any(s.kind == SERVER and "nvpair.outcome" in s.attributes for s in spans)


class StandaloneExportTests(TestCase):
    """One standalone proxy with ``--otel`` and two engines."""

    timeout = 90

    async def fleet(self, receiver: OTLPReceiver, delayMs: int = 50) -> Any:
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m1"], name="B")
        proxy = StandaloneProxy(
            self,
            reactor,
            ("llamacpp",),
            [("llamacpp", a.url), ("llamacpp", b.url)],
            extra=("--otel", "--affinity", "off"),
            env=receiver.environ("proxy-under-test", delayMs),
        )
        await proxy.start()
        await proxy.waitForLog(backendUp(a.url))
        await proxy.waitForLog(backendUp(b.url))
        return proxy, a, b

    @defer.inlineCallbacks
    def test_failover(self):  # type: ignore[no-untyped-def]
        """The first engine answers 503, the second serves: one SERVER span continuing the
        client's trace, two CLIENT attempt spans under it (failed, committed), each engine
        called with its own attempt's context; no prompt text in anything exported."""
        receiver = OTLPReceiver(self, reactor)
        proxy, a, b = yield _d(self.fleet(receiver))
        a.script(Status(503))
        response = yield treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions",
            json=BODY,
            headers=Headers({b"traceparent": [TRACEPARENT.encode()]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual(response.code, 200)
        spans = yield receiver.waitFor(serverEnded)
        [server] = [s for s in spans if s.kind == SERVER]
        self.assertEqual(server.service, "proxy-under-test")
        self.assertEqual((server.traceId, server.parentId), (CLIENT_TRACE, CLIENT_SPAN))
        self.assertEqual(server.attributes["nvpair.outcome"], "completed")
        self.assertEqual(server.attributes["gen_ai.request.model"], "m1")
        self.assertEqual(server.attributes["nvpair.attempts"], 2)
        self.assertIn("commit", server.events)
        attempts = named(spans, "dispatch")
        self.assertEqual(len(attempts), 2)
        for span in attempts:
            self.assertEqual(
                (span.kind, span.traceId, span.parentId), (CLIENT, CLIENT_TRACE, server.spanId)
            )
        failed, served = sorted(attempts, key=lambda s: s.attributes["nvpair.attempt"])
        self.assertEqual(failed.attributes["nvpair.failure.kind"], "status")
        self.assertEqual(failed.attributes["http.response.status_code"], 503)
        self.assertEqual(served.attributes["nvpair.attempt.outcome"], "committed")
        [toA] = [r for r in a.requests if r.path == "/v1/chat/completions"]
        [toB] = [r for r in b.requests if r.path == "/v1/chat/completions"]
        self.assertEqual(spanOf(toA.headers["traceparent"][0]), (CLIENT_TRACE, failed.spanId))
        self.assertEqual(spanOf(toB.headers["traceparent"][0]), (CLIENT_TRACE, served.spanId))
        for body in receiver.bodies:
            self.assertNotIn(SECRET.encode(), body)
        self.assertEqual(set(receiver.paths), {b"/v1/traces"})

    @defer.inlineCallbacks
    def test_flushedAtStop(self):  # type: ignore[no-untyped-def]
        """With a batch delay far longer than the test, the spans still arrive: the stop
        exports what is buffered (and the process exits 0 in time)."""
        receiver = OTLPReceiver(self, reactor)
        proxy, a, b = yield _d(self.fleet(receiver, delayMs=600_000))
        response = yield treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions", json=BODY, persistent=False
        )
        yield response.content()
        self.assertEqual(receiver.spans, [])
        code = yield proxy.stop()
        self.assertEqual(code, 0)
        self.assertTrue(serverEnded(receiver.spans), receiver.spans)


class ClusterExportTests(TestCase):
    """Two cluster members exporting to one receiver: one request through both is one trace."""

    timeout = 120

    @defer.inlineCallbacks
    def test_oneTraceAcrossPeers(self):  # type: ignore[no-untyped-def]
        """A routes to B over mTLS: A's SERVER and attempt spans, B's peer SERVER span whose
        parent is A's attempt, B's backend CLIENT span, all in the client's trace; B's
        engine is called with B's backend span's context."""
        receiver = OTLPReceiver(self, reactor)
        a = ClusterNode(
            self, reactor, "node-a", ["m-a"], argv=("--otel",), env=receiver.environ("proxy-a")
        )
        b = ClusterNode(
            self, reactor, "node-b", ["m-b"], argv=("--otel",), env=receiver.environ("proxy-b")
        )
        yield defer.gatherResults([_d(a.start(pins=[b])), _d(b.start(pins=[a]))])
        yield a.proxy.nodes(ENGINE, [a.selfNode(), b.peerNode()])
        response = yield treq.post(
            f"http://127.0.0.1:{a.port}/v1/chat/completions",
            json=chat("m-b"),
            headers=Headers({b"traceparent": [TRACEPARENT.encode()]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual(response.code, 200)

        def complete(spans: list[ReceivedSpan]) -> bool:
            services = {
                s.service for s in spans if s.kind == SERVER and "nvpair.outcome" in s.attributes
            }
            return services == {"proxy-a", "proxy-b"}

        spans = yield receiver.waitFor(complete)
        self.assertEqual({s.traceId for s in spans}, {CLIENT_TRACE}, "one trace")
        [serverA] = [s for s in spans if s.service == "proxy-a" and s.kind == SERVER]
        [attemptA] = [s for s in spans if s.service == "proxy-a" and s.name == "dispatch"]
        [serverB] = [s for s in spans if s.service == "proxy-b" and s.kind == SERVER]
        [backendB] = [s for s in spans if s.service == "proxy-b" and s.name == "backend"]
        self.assertEqual(serverA.parentId, CLIENT_SPAN)
        self.assertEqual(attemptA.parentId, serverA.spanId)
        self.assertEqual(attemptA.attributes["nvpair.node.id"], "node-b")
        self.assertEqual(serverB.parentId, attemptA.spanId)
        self.assertEqual(serverB.attributes["nvpair.peer"], "node-a")
        self.assertEqual(backendB.parentId, serverB.spanId)
        assert b.engine is not None
        [received] = [r for r in b.engine.requests if r.path == "/v1/chat/completions"]
        self.assertEqual(
            spanOf(received.headers["traceparent"][0]), (CLIENT_TRACE, backendB.spanId)
        )
