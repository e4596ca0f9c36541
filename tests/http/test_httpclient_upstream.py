"""Unit tests of ``Upstream`` (request validation, targets, peers over TLS through the
lean client) and of the client side's seams: its fakes and its own objects provide the
interfaces they stand for."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import cast

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import (
    IAddress,
    IHostnameResolver,
    IHostResolution,
    IProtocol,
    IPushProducer,
    IReactorPluggableNameResolver,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.internet.ssl import optionsForClientTLS
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.framing import serializeRequest
from nvpair.proxy.http.interfaces import IBodyConnection, IConnectionPool, IPooledConnection
from nvpair.proxy.http.pool import ConnectionPool
from nvpair.proxy.http.response import Response
from nvpair.proxy.interfaces import IClusterTrust, IConnectingReactor
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.testing.wire import TCPStringTransport
from tests.http.httpkit import CLOSED, KEY, PEER, Body, FakeEndpoint


@implementer(IHostResolution)
class _Resolution:
    """One finished resolution of a name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:
        pass


@implementer(IHostnameResolver)
class LiteralResolver:
    """Resolves an IPv4 literal at once, as the reactor's own resolver would."""

    def resolveHostName(
        self,
        receiver: IResolutionReceiver,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Sequence[type[IAddress]] | None = None,
        transportSemantics: str = "TCP",
    ) -> IHostResolution:
        resolution = _Resolution(hostName)
        receiver.resolutionBegan(resolution)
        receiver.addressResolved(IPv4Address("TCP", hostName, portNumber))
        receiver.resolutionComplete()
        return resolution


@implementer(IReactorPluggableNameResolver)
class ResolvingReactor(MemoryReactorClock):
    """A memory reactor with a name resolver (``MemoryReactor`` has one of its own only
    from Twisted 25.5 on; this suite also runs on the 24.7 floor)."""

    def __init__(self) -> None:
        super().__init__()
        self.nameResolver = LiteralResolver()

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        previous, self.nameResolver = self.nameResolver, resolver
        return previous


class UpstreamTests(SynchronousTestCase):
    """Upstream validates and serializes requests for plaintext nodes and peers."""

    def test_invalidURIRefused(self) -> None:
        """A request target with control characters fails before anything is sent."""
        upstream = Upstream(cast(IConnectingReactor, Clock()), 1.0)
        d = upstream.request(None, "http://127.0.0.1:1", b"GET", b"/a\x00b", Headers(), b"")
        self.failureResultOf(d, ValueError)

    def test_invalidMethodRefused(self) -> None:
        """A method that is not an HTTP token fails before anything is sent."""
        upstream = Upstream(cast(IConnectingReactor, Clock()), 1.0)
        d = upstream.request(None, "http://127.0.0.1:1", b"G T", b"/", Headers(), b"")
        self.failureResultOf(d, ValueError)

    def test_peerOverTheLeanClient(self) -> None:
        """A peer request goes over the same pool and client as plaintext ones, through a
        TLS endpoint (dialled with the dial timeout), with Host naming the peer's address."""
        reactor = ResolvingReactor()
        trust = SimpleNamespace(
            clientCreatorFor=lambda nodeId: optionsForClientTLS("b"),
            pinFor=lambda nodeId: "pin",
            nodeId="node-a",
            fingerprint="fp",
        )
        upstream = Upstream(cast(IConnectingReactor, reactor), 7.0, cast(IClusterTrust, trust))
        d = upstream.request(
            Node("node-b", False, (), frozenset()),
            "127.0.0.1:4000",
            b"GET",
            b"/v1/models",
            Headers(),
            b"",
        )
        self.assertNoResult(d)
        host, port, factory, timeout, _ = reactor.tcpClients[0]
        self.assertEqual((host, port, timeout), ("127.0.0.1", 4000, 7.0))
        wire = TCPStringTransport()
        protocol = factory.buildProtocol(PEER)
        assert protocol is not None
        protocol.makeConnection(wire)
        self.assertEqual(wire.value()[:1], b"\x16")  # a TLS handshake record: ClientHello
        self.assertEqual(upstream._peer("node-b", "[::1]:4000").host, b"[::1]:4000")

    def test_hostAndPrefix(self) -> None:
        """The Host header omits port 80 and brackets IPv6; the address path prefixes."""
        upstream = Upstream(cast(IConnectingReactor, Clock()), 1.0)
        target = upstream._target("http://[::1]:9000/base")
        self.assertEqual((target.host, target.prefix), (b"[::1]:9000", b"/base"))
        self.assertEqual(upstream._target("http://h").host, b"h")


@implementer(IConnectionPool)
class RecordingPool:
    """A pool that records what its connections report."""

    def __init__(self) -> None:
        self.released: list[IPooledConnection] = []
        self.lostConns: list[IPooledConnection] = []
        self.overrun: list[IPooledConnection] = []

    def release(self, conn: IPooledConnection) -> None:
        self.released.append(conn)

    def lost(self, conn: IPooledConnection) -> None:
        self.lostConns.append(conn)

    def bytesAfterAnswer(self, conn: IPooledConnection) -> None:
        self.overrun.append(conn)


class SeamTests(SynchronousTestCase):
    """The client side's fakes (this module's and ``httpkit``'s) and its own objects
    provide the interfaces they stand for."""

    def test_fakesProvideTheirInterfaces(self) -> None:
        """The endpoint, resolver, reactor, body protocol and pool fakes are what they
        claim to be."""
        verifyObject(IStreamClientEndpoint, FakeEndpoint())
        verifyObject(IHostnameResolver, LiteralResolver())
        verifyObject(IHostResolution, _Resolution("e"))
        verifyObject(IReactorPluggableNameResolver, ResolvingReactor())
        verifyObject(IProtocol, Body())
        verifyObject(IConnectionPool, RecordingPool())

    def test_clientSideProvidesItsSeams(self) -> None:
        """The pool, a connection, a response and its body's transport provide what their
        callees expect of them."""
        pool = ConnectionPool(Clock())
        endpoint = FakeEndpoint()
        data = serializeRequest(b"GET", b"/", b"e:1", Headers(), None)
        d = pool.request(KEY, endpoint, data, b"GET")
        conn, _ = endpoint.complete()
        conn.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n")
        response = self.successResultOf(d)
        verifyObject(IConnectionPool, pool)
        verifyObject(IPooledConnection, conn)
        verifyObject(IBodyConnection, conn)
        verifyObject(IResponse, response)
        assert isinstance(response, Response)
        verifyObject(IPushProducer, response.transport)

    def test_connectionReportsToItsPool(self) -> None:
        """A connection hands itself back to whichever pool made it once a response ended
        as framed, and reports its loss."""
        pool = RecordingPool()
        conn = HTTPClientConnection(pool, KEY)
        conn.makeConnection(TCPStringTransport())
        d: defer.Deferred[IResponse] = defer.Deferred()
        conn.send(serializeRequest(b"GET", b"/", b"e:1", Headers(), None), b"GET", d)
        conn.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.successResultOf(d).deliverBody(Body())
        self.assertEqual(pool.released, [conn])
        conn.connectionLost(CLOSED)
        self.assertEqual(pool.lostConns, [conn])
