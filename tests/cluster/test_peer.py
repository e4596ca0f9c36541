"""Tests for nvpair.proxy.cluster.peer (the peer site's front door) and the peer path of upstream.

The peer site is a real ``FacadeSite`` with a ``PeerDoor`` over an in-memory transport; the
trust and the upstream are fakes, so every step (headers, chunks, flow control, losses)
is driven by hand on a ``Clock``.
"""

from __future__ import annotations

import json
import tempfile
from types import SimpleNamespace
from typing import Any, cast

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectError, ConnectionRefusedError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface.verify import verifyObject

from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.cluster.peer import PeerDoor
from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.engines import ENGINES
from nvpair.proxy.http.site import FacadeSite
from nvpair.proxy.interfaces import IClusterTrust, IConnectingReactor, IPeerTrust, IUpstream
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.certs import makeNodeCert, writeClusterDir, writePins
from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.testing.upstreamspy import FakeResponse, UpstreamSpy
from tests.support.fakes.peertrust import FakeTrust

LOCAL = "http://127.0.0.1:11435"
BODY = b'{"model": "m1", "stream": true}'


class FakesTests(SynchronousTestCase):
    """The fakes provide the interfaces they stand in for; so does the real trust."""

    def test_fakes(self) -> None:
        """Trust, upstream, response and its body transport."""
        self.assertTrue(verifyObject(IClusterTrust, FakeTrust()))
        self.assertTrue(verifyObject(IUpstream, UpstreamSpy(Clock())))
        response = FakeResponse(Clock(), 200)
        self.assertTrue(verifyObject(IResponse, response))
        self.assertTrue(verifyObject(IPushProducer, response.transport))

    def test_clusterTrust(self) -> None:
        """``ClusterTrust`` is what the peer door asks about each connection."""
        trust = ClusterTrust(None, MemoryReactorClock(), lambda m: None)
        self.assertTrue(verifyObject(IPeerTrust, trust))
        self.assertTrue(verifyObject(IClusterTrust, trust))


class PeerDoorTests(SynchronousTestCase):
    """A pinned peer's request goes to the local backend, streamed, never routed."""

    def setUp(self) -> None:
        self.trust = FakeTrust()
        self.context = FakeContext(trust=self.trust)
        self.facade = SimpleNamespace(engine=ENGINES["llamacpp"], localBackend=LOCAL)
        site = FacadeSite(
            PeerDoor(self.context, self.facade), self.context.clock, 1 << 20, 30.0, 65536
        )
        self.channel = site.buildProtocol(IPv4Address("TCP", "10.203.0.2", 40000))
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "10.203.0.2", 40000))
        self.channel.makeConnection(self.transport)

    def send(self, body: bytes = BODY, extra: bytes = b"") -> None:
        self.channel.dataReceived(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: b:1\r\n"
            b"Connection: keep-alive\r\nX-Custom: yes\r\n"
            + extra
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )

    def respond(
        self, headers: dict[bytes, list[bytes]] | None = None, length: int | None = None
    ) -> FakeResponse:
        return self.context.upstream.last().respond(200, headers, length, b"OK")

    def test_forwardsVerbatimToLocalBackend(self) -> None:
        """Method, target, end-to-end headers and body go to the local backend as sent."""
        self.send()
        [call] = self.context.upstream.calls
        self.assertEqual(
            (call.address, call.method, call.path, call.body),
            (LOCAL, b"POST", b"/v1/chat/completions?x=1", BODY),
        )
        self.assertEqual(call.headers.getRawHeaders(b"x-custom"), [b"yes"])
        self.assertFalse(call.headers.hasHeader(b"connection"))
        self.assertFalse(call.headers.hasHeader(b"host"))
        self.assertEqual(self.trust.asked, [self.transport])

    def test_headersAtOnceThenStream(self) -> None:
        """Headers are written when they arrive; chunks follow as received; the end finishes."""
        self.send()
        response = self.respond()
        head = self.transport.value()
        self.assertTrue(head.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertIn(b"Content-Type: text/event-stream", head)
        self.assertNotIn(b"X-Nvpair", head)
        self.assertTrue(head.endswith(b"\r\n\r\n"), "nothing of the body yet")
        self.transport.clear()
        response.send(b"data: 1\n\n")
        self.assertEqual(self.transport.value(), b"9\r\ndata: 1\n\n\r\n")
        response.end()
        self.assertTrue(self.transport.value().endswith(b"0\r\n\r\n"))
        self.assertFalse(self.transport.disconnecting)
        self.assertEqual(self.context.exchanges, set())

    def test_contentLengthPassedThrough(self) -> None:
        """A known upstream length becomes the client's Content-Length."""
        self.send()
        response = self.respond({b"content-type": [b"application/json"]}, 2)
        response.send(b"{}")
        response.end()
        self.assertIn(b"Content-Length: 2\r\n", self.transport.value())
        self.assertTrue(self.transport.value().endswith(b"\r\n\r\n{}"))

    def clientProducer(self) -> IPushProducer:
        """The producer the peer's connection was given (the forward's flow control)."""
        producer: IPushProducer | None = self.transport.producer
        assert producer is not None
        return producer

    def test_backpressure(self) -> None:
        """A client that stops reading pauses the upstream read; resuming resumes it."""
        self.send()
        response = self.respond()
        self.clientProducer().pauseProducing()
        self.assertTrue(response.transport.paused)
        self.clientProducer().resumeProducing()
        self.assertFalse(response.transport.paused)

    def test_deadClientCutOff(self) -> None:
        """A client paused past the write deadline is cut off and the upstream stopped."""
        self.send()
        response = self.respond()
        self.clientProducer().pauseProducing()
        self.context.clock.advance(61)
        self.assertTrue(self.transport.disconnecting)
        self.channel.connectionLost(Failure(ConnectionRefusedError()))
        self.assertTrue(response.transport.stopped)

    def test_truncatedBodyAbortsClient(self) -> None:
        """An upstream that dies mid-body makes the client see a truncated response."""
        self.send()
        response = self.respond()
        response.send(b"data: 1\n\n")
        response.fail()
        self.assertTrue(self.transport.disconnected)
        self.assertFalse(self.transport.value().endswith(b"0\r\n\r\n"))

    def test_clientGoneBeforeHeaders(self) -> None:
        """A client that leaves before the upstream answers cancels the upstream request."""
        self.send()
        self.channel.connectionLost(Failure(ConnectionRefusedError()))
        self.assertEqual([c.cancelled for c in self.context.upstream.calls], [True])
        self.assertEqual(self.context.exchanges, set())

    def test_clientGoneDuringBody(self) -> None:
        """A client that leaves mid-stream stops the upstream body."""
        self.send()
        response = self.respond()
        self.channel.connectionLost(Failure(ConnectionRefusedError()))
        self.assertTrue(response.transport.stopped)
        self.context.clock.advance(0)  # the stopped body ends a turn later, as a closed socket
        self.assertEqual(self.context.exchanges, set())

    def test_noLocalBackend(self) -> None:
        """Without a local backend a peer gets 502 in the engine's error shape, nothing sent."""
        self.facade.localBackend = None
        self.send()
        self.assertEqual(self.context.upstream.calls, [])
        self.assertEqual(self.context.errors, [(502, "upstream_unreachable")])
        raw = self.transport.value()
        self.assertTrue(raw.startswith(b"HTTP/1.1 502 "))
        doc = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        self.assertEqual(doc["error"]["code"], "upstream_unreachable")

    def test_backendFailure(self) -> None:
        """A local backend that fails at the transport answers 502 upstream_unreachable."""
        self.send()
        self.context.upstream.last().refuse()
        self.assertEqual(self.context.errors, [(502, "upstream_unreachable")])
        self.assertEqual(self.context.exchanges, set())

    def test_unpinnedPeerAborted(self) -> None:
        """A connection whose peer is no longer pinned is aborted without an HTTP answer."""
        self.trust.pinned = None
        self.send()
        self.assertEqual(self.context.upstream.calls, [])
        self.assertTrue(self.transport.disconnected)
        self.assertEqual(self.transport.value(), b"")

    def test_pinRemovedOnKeptAliveConnection(self) -> None:
        """The pin is checked per request: a kept-alive connection is cut once it is gone."""
        self.send()
        response = self.respond(None, 0)
        response.end()
        self.assertFalse(self.transport.disconnecting)
        self.trust.pinned = None
        self.transport.clear()
        self.send()
        self.assertEqual(len(self.context.upstream.calls), 1)
        self.assertTrue(self.transport.disconnected)
        self.assertEqual(self.transport.value(), b"")

    def test_rotatedCertificateCutsConnection(self) -> None:
        """A connection made under this node's previous certificate is cut on its next request."""
        self.trust.current = False
        self.send()
        self.assertEqual(self.context.upstream.calls, [])
        self.assertTrue(self.transport.disconnected)

    def test_tooLarge(self) -> None:
        """A peer's oversized body gets 413 like any other request."""
        self.channel.site.maxBody = 4
        self.send()
        self.assertEqual(self.context.errors, [(413, "body_too_large")])
        self.assertEqual(self.context.upstream.calls, [])

    def test_shutdownCutsPeer(self) -> None:
        """Process shutdown aborts an in-flight peer request (which stops its upstream)."""
        self.send()
        response = self.respond()
        [forward] = self.context.exchanges
        forward.shutdown()
        self.assertTrue(self.transport.disconnected)
        self.channel.connectionLost(Failure(ConnectionRefusedError()))
        self.assertTrue(response.transport.stopped)


class PeerUpstreamTests(SynchronousTestCase):
    """The client side: peers are reached only as a member, with pinned, keyed connections."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, self.dir, True)
        self.reactor = MemoryReactorClock()
        self.trust = ClusterTrust(self.dir, self.reactor, lambda m: None)
        self.upstream = Upstream(cast(IConnectingReactor, self.reactor), 10.0, self.trust)
        self.node = Node("node-b", False, (), frozenset())

    def request(self) -> defer.Deferred[IResponse]:
        return self.upstream.request(
            self.node, "127.0.0.1:4000", b"GET", b"/v1/models", Headers(), b""
        )

    def test_notMemberFailsAtTransport(self) -> None:
        """Not a member: a peer address fails with a ConnectError and nothing is dialled."""
        self.trust.reload()
        failure = self.failureResultOf(self.request(), ConnectError)
        self.assertIn("not a cluster member", str(failure.value))
        self.assertEqual(self.reactor.tcpClients, [])

    def test_noPinFailsAtTransport(self) -> None:
        """A member without a pin for the node fails with a ConnectError, nothing dialled."""
        cert, key, _ = makeNodeCert("node-a")
        writeClusterDir(self.dir, "node-a", cert, key, {})
        self.trust.reload()
        self.failureResultOf(self.request(), ConnectError)
        self.assertEqual(self.reactor.tcpClients, [])

    def test_poolKeyFollowsPin(self) -> None:
        """Pooled peer connections are keyed by node id and pin: a new pin never reuses one."""
        cert, key, _ = makeNodeCert("node-a")
        writeClusterDir(self.dir, "node-a", cert, key, {"node-b": "ab" * 32})
        self.trust.reload()
        keys: list[Any] = []

        def request(key: Any, *args: Any) -> defer.Deferred[Any]:
            keys.append(key)
            return defer.Deferred()

        self.patch(self.upstream.pool, "request", request)
        self.request()
        self.request()
        writePins(self.dir, {"node-b": "cd" * 32})
        self.trust.reload()
        self.request()
        self.assertEqual(keys[0], keys[1])
        self.assertNotEqual(keys[1], keys[2])
        self.assertIn("node-b", keys[2])
