"""Unit tests of one attempt and the relay helpers (spec §5.1-§5.3, protocol §4)."""

from __future__ import annotations

from typing import cast

from twisted.internet.error import ConnectError, TimeoutError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from zope.interface.verify import verifyObject

from nvpair.proxy.dispatch.attempt import discard, retryableStatus
from nvpair.proxy.dispatch.relay import (
    ClientFlow,
    adoptResponseHeaders,
    copyResponseHeaders,
    forwardHeaders,
)
from nvpair.proxy.dispatch.upstream import Upstream, addressesFor, splitHostPort
from nvpair.proxy.interfaces import IConnectingReactor, IUpstream
from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.testing.upstreamspy import BodyTransport, FakeResponse, UpstreamSpy
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, startExchange


class RetryableTests(SynchronousTestCase):
    """The §5.4 classification of statuses before commit."""

    def test_table(self) -> None:
        """404 only on inference; 408, 429, 5xx always; nothing else."""
        for status in range(100, 600):
            expected = status >= 500 or status in (408, 429)
            self.assertEqual(retryableStatus(status, False), expected, status)
            self.assertEqual(retryableStatus(status, True), expected or status == 404, status)


class AddressTests(SynchronousTestCase):
    """Reaching a node through its addresses (protocol §4)."""

    def setUp(self) -> None:
        self.context = FakeContext(dialTimeout=10.0)
        self.clock = self.context.clock
        self.upstream = self.context.upstream
        self.facade = makeFacade(
            self.clock, [node("A", addresses=("http://a1", "http://a2", "http://a3")), node("B")]
        )

    def test_addressesInOrderUntilOneConnects(self) -> None:
        """A refused address moves to the next one of the same node, within one attempt."""
        ex, request = startExchange(self.context, self.facade)
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(
            [c.address for c in self.upstream.calls], ["http://a1", "http://a2", "http://a3"]
        )
        self.upstream.last().answer(200, b"x")
        self.assertEqual(self.facade.confirmed["A"], "http://a3")
        self.assertEqual(len(self.context.record.failedAttempts), 0, "one attempt")

    def test_confirmedAddressFirst(self) -> None:
        """The remembered address is tried first."""
        self.facade.confirmed["A"] = "http://a2"
        startExchange(self.context, self.facade)
        self.assertEqual(self.upstream.last().address, "http://a2")

    def test_dialTimeoutIsTransport(self) -> None:
        """A dial that times out on every address is a transport failure (502 when final)."""
        self.context = FakeContext(maxDispatchAttempts=1)
        self.upstream = self.context.upstream
        facade = makeFacade(self.context.clock, [node("A")])
        ex, request = startExchange(self.context, facade)
        self.upstream.last().deferred.errback(TimeoutError())
        self.assertEqual(request.code, 502)
        self.assertEqual(self.context.record.failedAttempts[-1].kind, "transport")

    def test_addressesFor(self) -> None:
        """Self uses the local backend (none → no address); others keep order, confirmed first."""
        a = node("A", addresses=("x:1", "http://y"))
        self.assertEqual(addressesFor(a, "http://l", None), ("x:1", "http://y"))
        self.assertEqual(addressesFor(a, None, "http://y"), ("http://y", "x:1"))
        self.assertEqual(addressesFor(a, None, "gone"), ("x:1", "http://y"))
        self.assertEqual(addressesFor(a, None, "x:1"), ("x:1", "http://y"))
        s = node("S", isSelf=True)
        self.assertEqual(addressesFor(s, "http://l", None), ("http://l",))
        self.assertEqual(addressesFor(s, None, None), ())
        # The node's order is never changed in place: a confirmed address only reorders a copy.
        self.assertEqual(a.addresses, ("x:1", "http://y"))
        dup = node("D", addresses=("x:1", "y:2", "y:2"))
        self.assertEqual(addressesFor(dup, None, "y:2"), ("y:2", "x:1", "y:2"))

    def test_splitHostPort(self) -> None:
        """host:port and [v6]:port parse; anything else is refused."""
        self.assertEqual(splitHostPort("10.0.0.1:80"), ("10.0.0.1", 80))
        self.assertEqual(splitHostPort("[::1]:8080"), ("::1", 8080))
        for bad in ("nohost", ":80", "h:", "h:x"):
            self.assertRaises(ValueError, splitHostPort, bad)

    def test_peerWithoutMembershipFailsAtTransport(self) -> None:
        """A host:port address while not a cluster member fails like an unreachable node."""
        upstream = Upstream(cast(IConnectingReactor, Clock()), 1.0)
        d = upstream.request(node("P"), "10.0.0.9:1", b"POST", b"/", Headers(), b"")
        self.failureResultOf(d, ConnectError)

    def test_interfaces(self) -> None:
        """The real and the fake upstream provide IUpstream."""
        verifyObject(IUpstream, UpstreamSpy(Clock()))
        verifyObject(IUpstream, Upstream(cast(IConnectingReactor, Clock()), 1.0))


class HeadersTests(SynchronousTestCase):
    """Header handling both ways."""

    def test_forwardDropsHopByHop(self) -> None:
        """Connection-scoped headers, the ones Connection names, Host and Expect are dropped."""
        incoming = Headers(
            {
                b"Connection": [b"x-a, Keep-Alive"],
                b"X-A": [b"1"],
                b"Keep-Alive": [b"1"],
                b"Host": [b"h"],
                b"TE": [b"t"],
                b"Transfer-Encoding": [b"chunked"],
                b"Content-Length": [b"3"],
                b"Upgrade": [b"ws"],
                b"Proxy-Authorization": [b"p"],
                b"Authorization": [b"Bearer z"],
                b"X-Keep": [b"k"],
            }
        )
        out = forwardHeaders(incoming)
        self.assertEqual(
            sorted(n.lower() for n, _ in out.getAllRawHeaders()), [b"authorization", b"x-keep"]
        )

    def test_copyResponse(self) -> None:
        """Response hop-by-hop headers are dropped; Content-Length comes from the length."""
        source = Headers(
            {
                b"Connection": [b"close"],
                b"Content-Type": [b"a/b"],
                b"Transfer-Encoding": [b"chunked"],
                b"Date": [b"d"],
                b"Server": [b"engine"],
                b"Access-Control-Allow-Origin": [b"*"],
            }
        )
        target = Headers({b"server": [b"twisted"], b"date": [b"now"]})
        copyResponseHeaders(source, target, 12)
        got = {n.lower(): v for n, v in target.getAllRawHeaders()}
        self.assertEqual(
            got,
            {
                b"content-type": [b"a/b"],
                b"date": [b"d"],
                b"server": [b"engine"],
                b"access-control-allow-origin": [b"*"],
                b"content-length": [b"12"],
            },
        )

    def test_adoptResponse(self) -> None:
        """Adopting gives the client response what copying would (hop-by-hop dropped, the
        engine's Server and Date, the client's other fields kept unless the engine sent
        them, Content-Length from the length), and the engine's Headers object itself."""

        def source() -> Headers:
            return Headers(
                {
                    b"Connection": [b"close"],
                    b"Content-Type": [b"a/b"],
                    b"Transfer-Encoding": [b"chunked"],
                    b"Server": [b"engine"],
                    b"Trailer": [b"x"],
                    b"Vary": [b"Origin"],
                }
            )

        def target() -> Headers:
            return Headers(
                {
                    b"server": [b"proxy"],
                    b"date": [b"now"],
                    b"vary": [b"mine"],
                    b"x-proxy": [b"kept"],
                }
            )

        copied = target()
        copyResponseHeaders(source(), copied, 12)
        engine = source()
        request = FakeRequest()
        request.responseHeaders = target()
        adoptResponseHeaders(engine, request, 12)
        self.assertIs(request.responseHeaders, engine)
        self.assertEqual(sorted(engine.getAllRawHeaders()), sorted(copied.getAllRawHeaders()))
        self.assertEqual(
            sorted(n for n, _ in engine.getAllRawHeaders()),
            [b"Content-Length", b"Content-Type", b"Server", b"Vary", b"X-Proxy"],
        )
        self.assertEqual(engine.getRawHeaders(b"vary"), [b"Origin"])

    def test_contentLengthPassedThrough(self) -> None:
        """A known upstream length is the client's Content-Length."""
        context = FakeContext()
        facade = makeFacade(context.clock, [node("A")])
        ex, request = startExchange(context, facade)
        response = context.upstream.last().respond(200, length=4)
        response.send(b"abcd")
        response.end()
        self.assertEqual(request.header(b"content-length"), [b"4"])
        self.assertEqual(request.body, b"abcd")


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class MalformedUpstreamTests(SynchronousTestCase):
    """An engine answer that breaks HTTP/1.1 framing, read by the real upstream client: a
    transport failure before commit, a visible truncation after it (issue 15)."""

    def test_beforeCommitRetriedElsewhere(self) -> None:
        """A broken chunk size before the first body byte fails A's attempt at the
        transport; B's answer is the client's, and A's connection is aborted."""
        context = FakeContext()
        facade = makeFacade(context.clock, [node("A"), node("B")])
        ex, request = startExchange(context, facade)
        conn = context.upstream.last().respondRaw(_CHUNKED_HEAD, b"zz\r\nhello\r\n")
        self.assertTrue(conn.transport.disconnecting)  # type: ignore[union-attr]
        self.assertEqual(context.record.failedAttempts[0].kind, "transport")
        self.assertIsNone(request.code)
        self.assertEqual(context.upstream.last().nodeId, "B")
        context.upstream.last().answer(200, b"ok")
        self.assertEqual((request.code, request.body), (200, b"ok"))
        self.assertEqual(request.header(b"x-nvpair-node"), [b"B"])

    def test_finalAttemptAnswers502(self) -> None:
        """`Content-Length: +256` on the final attempt: 502 upstream_unreachable, no 200."""
        context = FakeContext(maxDispatchAttempts=1)
        facade = makeFacade(context.clock, [node("A")])
        ex, request = startExchange(context, facade)
        context.upstream.last().respondRaw(
            b"HTTP/1.1 200 OK\r\nContent-Length: +256\r\n\r\n" + b"x" * 256
        )
        self.assertEqual(request.code, 502)
        self.assertIn(b"upstream_unreachable", request.body)
        self.assertNotIn(b"xxx", request.body)

    def test_afterCommitVisibleTruncation(self) -> None:
        """A broken chunk after the first bytes were relayed: what was relayed stays, the
        client connection is closed without the response's end, the engine's aborted."""
        context = FakeContext()
        facade = makeFacade(context.clock, [node("A"), node("B")])
        ex, request = startExchange(context, facade)
        conn = context.upstream.last().respondRaw(_CHUNKED_HEAD + b"5\r\nhello\r\n")
        self.assertEqual((request.code, request.body), (200, b"hello"))
        conn.dataReceived(b"zz\r\n")
        self.assertTrue(conn.transport.disconnecting)  # type: ignore[union-attr]
        self.assertTrue(request.closed)
        self.assertFalse(request.finished)
        self.assertEqual(request.body, b"hello")
        self.assertEqual(context.upstream.nodesCalled(), ["A"])


class ClientFlowTests(SynchronousTestCase):
    """The producer the client sees: backpressure and the dead-client deadline."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.upstream = BodyTransport(FakeResponse(self.clock, 200))
        self.dead: list[bool] = []
        self.flow = ClientFlow(self.upstream, self.clock, 5.0, lambda: self.dead.append(True))

    def test_pauseResumeForwarded(self) -> None:
        """Pause and resume reach the upstream read."""
        self.flow.pauseProducing()
        self.assertTrue(self.upstream.paused)
        self.flow.resumeProducing()
        self.assertFalse(self.upstream.paused)
        self.clock.advance(100)
        self.assertEqual(self.dead, [])

    def test_deadlineWhilePaused(self) -> None:
        """Paused for the whole write deadline: the client is declared dead, once."""
        self.flow.pauseProducing()
        self.clock.advance(4.9)
        self.flow.pauseProducing()
        self.clock.advance(0.1)
        self.assertEqual(self.dead, [True])
        self.clock.advance(100)
        self.assertEqual(self.dead, [True])

    def test_cancelStopsDeadline(self) -> None:
        """A finished stream disarms the deadline; stopProducing stops the upstream."""
        self.flow.pauseProducing()
        self.flow.cancel()
        self.clock.advance(100)
        self.assertEqual(self.dead, [])
        self.flow.stopProducing()
        self.assertTrue(self.upstream.stopped)

    def test_zeroDisables(self) -> None:
        """A write timeout of 0 never cuts the client."""
        flow = ClientFlow(self.upstream, self.clock, 0.0, lambda: self.dead.append(True))
        flow.pauseProducing()
        self.clock.advance(10000)
        self.assertEqual(self.dead, [])


class DiscardTests(SynchronousTestCase):
    """Unwanted bodies are drained within bounds, so connections can be reused."""

    def test_smallBodyDrained(self) -> None:
        """A small retryable body is read to its end, and the drain timer is cleared."""
        clock = Clock()
        response = FakeResponse(clock, 503)
        discard(response, clock)
        response.send(b"x" * 100)
        response.end()
        self.assertFalse(response.transport.stopped)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_largeBodyStopped(self) -> None:
        """A body over the limit is cut."""
        clock = Clock()
        response = FakeResponse(clock, 503)
        discard(response, clock, limit=10)
        response.send(b"x" * 11)
        self.assertTrue(response.transport.stopped)

    def test_endlessBodyTimedOut(self) -> None:
        """A body that never ends is cut after 10 s."""
        clock = Clock()
        response = FakeResponse(clock, 503)
        discard(response, clock)
        clock.advance(10)
        self.assertTrue(response.transport.stopped)


class RaceTests(SynchronousTestCase):
    """Commit and cancellation are one claim (§5.3)."""

    def setUp(self) -> None:
        self.context = FakeContext()
        self.facade = makeFacade(self.context.clock, [node("A"), node("B")])
        self.upstream = self.context.upstream

    def test_byteAfterClientCancelIgnored(self) -> None:
        """A byte that arrives after the request was cancelled commits nothing."""
        ex, request = startExchange(self.context, self.facade)
        response = self.upstream.last().respond(200)
        request.lose()
        response.send(b"late")
        self.assertIsNone(request.code)
        self.assertEqual(request.written, [])
        self.assertEqual(len(self.upstream.calls), 1)

    def test_responseAfterCancelDiscarded(self) -> None:
        """A retryable answer whose body is being drained does not block the next attempt."""
        ex, request = startExchange(self.context, self.facade)
        first = self.upstream.last().respond(503)
        self.assertEqual(len(self.upstream.calls), 2)
        first.send(b"busy")
        first.end()
        self.upstream.last().answer(200, b"ok")
        self.assertEqual(request.body, b"ok")

    def test_cancelledAttemptNoSecondResult(self) -> None:
        """The watcher cancels a pending attempt; a later answer to it is ignored."""
        ex, request = startExchange(self.context, self.facade)
        first = self.upstream.calls[0]
        from tests.support.fakeupstream import setNodes

        setNodes(self.facade, [node("B")])
        self.assertTrue(first.cancelled)
        self.upstream.last().answer(200, b"b")
        self.assertEqual(request.body, b"b")
        self.assertEqual(self.context.record.commits, ["B"])
