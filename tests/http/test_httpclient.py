"""Unit tests of the lean upstream HTTP/1.1 client (``nvpair.proxy.http.client``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import (
    ConnectError,
    ConnectionDone,
    ConnectionRefusedError,
    TimeoutError,
)
from twisted.internet.interfaces import (
    IAddress,
    IHostnameResolver,
    IHostResolution,
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IReactorPluggableNameResolver,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import optionsForClientTLS
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.http.client import HTTPClientConnection, serializeRequest
from nvpair.proxy.http.framing import MAX_BODY_OVERHEAD, MAX_HEAD
from nvpair.proxy.http.interfaces import IBodyConnection, IConnectionPool, IPooledConnection
from nvpair.proxy.http.pool import ConnectionPool, DirectTCP
from nvpair.proxy.http.response import Response
from nvpair.proxy.routing.nodes import Node


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


def frame(payload: bytes, size: bytes | None = None) -> bytes:
    """One chunk: its size line (``size`` as given, else lower-case hex), data and CRLF."""
    return b"%s\r\n%s\r\n" % (b"%x" % len(payload) if size is None else size, payload)


def sseBody(events: int = 50) -> tuple[bytes, bytes]:
    """A streamed chat answer as an engine frames it: the chunked body and its payload."""
    pieces = [
        b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"},"finish_reason":null}]}\n\n' % i
        for i in range(events)
    ]
    pieces.append(b"data: [DONE]\n\n")
    return b"".join(frame(p) for p in pieces) + b"0\r\n\r\n", b"".join(pieces)


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` cut at ``points`` (any order, repeats allowed: empty reads)."""
    bounds = [0, *sorted(p % (len(raw) + 1) for p in points), len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


_SIZES = st.one_of(st.integers(1, 20), st.sampled_from([0xBA, 0xFF, 0x100, 0x1FF]))
_DATA = st.sampled_from(b"a\r\n;0")


@st.composite
def chunkedBodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A valid chunked body (sizes in any hex form, extensions, trailers) and its payload."""
    raw, payload = [], []
    for size in draw(st.lists(_SIZES, max_size=12)):
        pattern = bytes(draw(st.lists(_DATA, min_size=1, max_size=6)))
        data = (pattern * size)[:size]
        line = draw(st.sampled_from([b"%x", b"%X", b"0%x"])) % size
        line += draw(st.sampled_from([b""] * 4 + [b";a=b", b";x"]))
        raw.append(line + b"\r\n" + data + b"\r\n")
        payload.append(data)
    raw.append(b"0\r\n" + draw(st.sampled_from([b"", b"T: 1\r\n", b"A: b\r\nC: d\r\n"])) + b"\r\n")
    return b"".join(raw), b"".join(payload)


_PEER = IPv4Address("TCP", "127.0.0.1", 8081)


@implementer(IStreamClientEndpoint)
class FakeEndpoint:
    """An endpoint whose dials the test completes (or fails) by hand."""

    def __init__(self) -> None:
        self.dials: list[tuple[IProtocolFactory, defer.Deferred[IProtocol]]] = []
        self.transports: list[StringTransport] = []
        self.conns: list[HTTPClientConnection] = []

    def __call__(self) -> FakeEndpoint:
        return self

    def connect(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        d: defer.Deferred[IProtocol] = defer.Deferred()
        self.dials.append((protocolFactory, d))
        return d

    def complete(self, index: int = -1) -> tuple[HTTPClientConnection, StringTransport]:
        factory, d = self.dials[index]
        conn = factory.buildProtocol(_PEER)
        assert isinstance(conn, HTTPClientConnection)
        transport = StringTransport()
        conn.makeConnection(transport)
        self.transports.append(transport)
        self.conns.append(conn)
        d.callback(conn)
        return conn, transport


_CLOSED = Failure(ConnectionDone())


class Body(Protocol):
    """Collects a body and how it ended."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.reason: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self.reason = reason


KEY = ("http", b"e", 1)


class ClientTests(SynchronousTestCase):
    """One request per write, byte-level framing, keep-alive pooling."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.pool = ConnectionPool(self.clock, maxPersistentPerHost=2, idleTimeout=90)
        self.endpoint = FakeEndpoint()

    def send(
        self, method: bytes = b"POST", body: bytes | None = b"{}"
    ) -> defer.Deferred[IResponse]:
        data = serializeRequest(method, b"/v1/x", b"e:1", Headers({b"X-A": [b"1"]}), body)
        return self.pool.request(KEY, self.endpoint, data, method)

    def respond(
        self, raw: bytes, method: bytes = b"POST"
    ) -> tuple[IResponse, Body, StringTransport]:
        d = self.send(method)
        conn, transport = self.endpoint.complete()
        conn.dataReceived(raw)
        response = self.successResultOf(d)
        body = Body()
        response.deliverBody(body)
        return response, body, transport

    def test_requestWrittenOnce(self) -> None:
        """The whole request (head and body) goes out in one write, with Host and length."""
        d = self.send()
        _, transport = self.endpoint.complete()
        self.assertEqual(
            transport.value(),
            b"POST /v1/x HTTP/1.1\r\nHost: e:1\r\nX-A: 1\r\nContent-Length: 2\r\n\r\n{}",
        )
        self.assertNoResult(d)

    def test_contentLength(self) -> None:
        """A Content-Length body is delivered whole, ends clean and the connection is pooled."""
        response, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-B: y\r\n\r\nhello"
        )
        self.assertEqual((response.code, response.phrase, response.length), (200, b"OK", 5))
        self.assertEqual(response.headers.getRawHeaders(b"x-b"), [b"y"])
        self.assertIsNone(response.headers.getRawHeaders(b"content-length"))
        self.assertEqual(b"".join(body.data), b"hello")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(len(self.pool._connections[KEY]), 1)
        self.assertFalse(transport.disconnecting)

    def test_chunkedAcrossBoundaries(self) -> None:
        """Chunk sizes, payloads and CRLFs split anywhere decode to the same body."""
        d = self.send()
        conn, _ = self.endpoint.complete()
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"
        )
        body = Body()
        for i in range(len(raw)):
            conn.dataReceived(raw[i : i + 1])
            if i == raw.index(b"\r\n\r\n") + 3:
                response = self.successResultOf(d)
                self.assertIs(response.length, UNKNOWN_LENGTH)
                response.deliverBody(body)
        self.assertEqual(b"".join(body.data), b"hello world")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(len(self.pool._connections[KEY]), 1)

    def test_chunksOfOneReadCoalesced(self) -> None:
        """The chunk payloads of one read reach the body protocol as one dataReceived."""
        _, body, _ = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n"
        )
        self.assertEqual(body.data, [b"abcd"])
        self.assertIsNone(body.reason)

    def test_keepAliveReuse(self) -> None:
        """A second request goes over the pooled connection: no new dial."""
        _, _, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        transport.clear()
        connected: list[bool] = []
        data = serializeRequest(b"GET", b"/", b"e:1", Headers(), None)
        d = self.pool.request(KEY, self.endpoint, data, b"GET", lambda: connected.append(True))
        self.assertEqual(len(self.endpoint.dials), 1)
        self.assertEqual(connected, [True])
        self.assertEqual(transport.value(), b"GET / HTTP/1.1\r\nHost: e:1\r\n\r\n")
        self.assertNoResult(d)

    def test_poolCap(self) -> None:
        """At most maxPersistentPerHost idle connections are kept per key; extra ones close."""
        ds = [self.send() for _ in range(3)]
        conns = [self.endpoint.complete(i) for i in range(3)]
        for (conn, _), d in zip(conns, ds, strict=True):
            conn.dataReceived(b"HTTP/1.1 204 No Content\r\n\r\n")
            self.successResultOf(d)
        self.assertEqual(len(self.pool._connections[KEY]), 2)
        self.assertEqual([t.disconnecting for _, t in conns], [False, False, True])

    def test_idleExpiry(self) -> None:
        """An idle connection is closed after the idle timeout."""
        _, _, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        self.clock.advance(89)
        self.assertFalse(transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool._connections, {})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancelAborts(self) -> None:
        """Cancelling a request waiting for its response aborts the connection."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(transport.disconnecting)
        conn.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.pool._connections, {})

    def test_cancelWhileDialling(self) -> None:
        """Cancelling during the dial cancels the dial."""
        d = self.send()
        _, dial = self.endpoint.dials[0]
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(dial.called)

    def test_dialFailure(self) -> None:
        """A failed dial fails the request with the dial's error."""
        d = self.send()
        self.endpoint.dials[0][1].errback(ConnectionRefusedError())
        self.failureResultOf(d, ConnectionRefusedError)

    def test_lostBeforeResponse(self) -> None:
        """A connection lost before a response fails the request."""
        d = self.send()
        conn, _ = self.endpoint.complete()
        conn.dataReceived(b"HTTP/1.1 200")
        conn.connectionLost(Failure(ConnectionDone()))
        self.failureResultOf(d)

    def test_earlyCloseContentLength(self) -> None:
        """A body cut short of its Content-Length ends as ResponseFailed."""
        _, body, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhel")
        self.connectionOf(transport).connectionLost(Failure(ConnectionDone()))
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertEqual(body.data, [b"hel"])

    def test_closeDelimited(self) -> None:
        """A body without length ends at close as PotentialDataLoss and is not pooled."""
        response, body, transport = self.respond(b"HTTP/1.1 200 OK\r\n\r\nabc")
        self.assertIs(response.length, UNKNOWN_LENGTH)
        self.connectionOf(transport).connectionLost(Failure(ConnectionDone()))
        assert body.reason is not None
        self.assertTrue(body.reason.check(PotentialDataLoss))
        self.assertEqual(self.pool._connections, {})

    def test_noBodyResponses(self) -> None:
        """204 and 304 answers have no body and keep the connection; a 304's length is the
        engine's Content-Length, a 204 has none."""
        for raw, length in (
            (b"HTTP/1.1 204 No Content\r\n\r\n", UNKNOWN_LENGTH),
            (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", 7),
        ):
            self.pool._connections.clear()
            response, body, transport = self.respond(raw, b"GET")
            self.assertEqual(response.length, length)
            self.assertEqual(body.data, [])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertFalse(transport.disconnecting)
            self.assertEqual(self.pool.connectionCounts(), (1, 1))

    def test_headAnswerCarriesTheEnginesLength(self) -> None:
        """A HEAD answer ends at its head with the engine's Content-Length as its length
        (not 0); llhttp would wait for a body, so the connection is closed, not pooled."""
        for raw, length, xb in (
            (b"HTTP/1.1 200 OK\r\nContent-Length: 256\r\nX-B: y\r\n\r\n", 256, [b"y"]),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", UNKNOWN_LENGTH, None),
        ):
            response, body, transport = self.respond(raw, b"HEAD")
            self.assertEqual((response.code, response.length), (200, length))
            self.assertEqual(response.headers.getRawHeaders(b"x-b"), xb)
            self.assertIsNone(response.headers.getRawHeaders(b"content-length"))
            self.assertEqual(body.data, [])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertTrue(transport.disconnecting)
            self.assertEqual(self.pool.connectionCounts(), (0, 0))

    def test_connectionClose(self) -> None:
        """A response with Connection: close is not pooled."""
        _, _, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx"
        )
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool._connections, {})

    def test_interimSkipped(self) -> None:
        """A 1xx interim answer is skipped."""
        response, body, _ = self.respond(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(body.data, [b"x"])

    def test_flowControlAndStop(self) -> None:
        """The body transport pauses and resumes the read; stopping it aborts the connection."""
        response, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"
        )
        body.transport.pauseProducing()  # type: ignore[union-attr]
        self.assertEqual(transport.producerState, "paused")
        body.transport.resumeProducing()  # type: ignore[union-attr]
        self.assertEqual(transport.producerState, "producing")
        body.transport.stopProducing()  # type: ignore[union-attr]
        self.assertTrue(transport.disconnecting)
        self.connectionOf(transport).connectionLost(Failure(ConnectionDone()))
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))

    def test_inertAfterEnd(self) -> None:
        """A late pause from a finished body does not touch the reused connection."""
        response, body, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        body.transport.pauseProducing()  # type: ignore[union-attr]
        body.transport.stopProducing()  # type: ignore[union-attr]
        self.assertEqual(transport.producerState, "producing")
        self.assertFalse(transport.disconnecting)

    def test_bufferedUntilDelivered(self) -> None:
        """Body bytes that arrive before deliverBody are held (read paused), then delivered."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        response = self.successResultOf(d)
        conn.dataReceived(b"cd")
        body = Body()
        response.deliverBody(body)
        self.assertEqual(b"".join(body.data), b"abcd")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(transport.producerState, "producing")

    def test_badChunkSize(self) -> None:
        """A malformed chunk size after the head was handed out fails the body and aborts
        the connection; in the head's own read it fails the request instead."""
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        _, body, transport = self.respond(head)
        self.connectionOf(transport).dataReceived(b"zz\r\n")
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertTrue(transport.disconnecting)
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(head + b"zz\r\n")
        self.failureResultOf(d, ResponseFailed)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool.connectionCounts(), (0, 0))

    def test_badStatusLine(self) -> None:
        """A response that is not HTTP fails the request."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(b"SSH-2.0-x\r\n\r\n")
        self.failureResultOf(d, ResponseFailed)
        self.assertTrue(transport.disconnecting)

    def test_closeCachedConnections(self) -> None:
        """Closing the pool closes idle connections and fires once they are gone."""
        _, _, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        conn = self.connectionOf(transport)
        d = self.pool.closeCachedConnections()
        self.assertTrue(transport.disconnecting)
        self.assertNoResult(d)
        conn.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(d)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_sseBodyInOneRead(self) -> None:
        """A 50-event chunked stream arriving with its head in one read reaches the body
        protocol as one dataReceived, ends clean and the connection is pooled."""
        raw, payload = sseBody()
        for _ in range(2):  # the second time over the pooled connection
            self.pool._connections.clear()
            _, body, transport = self.respond(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + raw
            )
            self.assertEqual(body.data, [payload])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone))
            self.assertEqual(self.pool._connections[KEY], [self.connectionOf(transport)])

    def test_everyCutOfAJsonAnswer(self) -> None:
        """A head and Content-Length body cut into two reads anywhere: the same answer."""
        raw = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10"
            b'\r\nX-B: y\r\n\r\n{"a": "b"}'
        )
        for at in range(len(raw) + 1):
            self.pool._connections.clear()
            d = self.send()
            conn, transport = self.endpoint.complete()
            conn.dataReceived(raw[:at])
            conn.dataReceived(raw[at:])
            response = self.successResultOf(d)
            body = Body()
            response.deliverBody(body)
            self.assertEqual((response.code, response.length), (200, 10))
            self.assertEqual(response.headers.getRawHeaders(b"x-b"), [b"y"])
            self.assertEqual(b"".join(body.data), b'{"a": "b"}')
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseDone), at)
            self.assertEqual(self.pool._connections[KEY], [conn])

    @settings(max_examples=100)
    @given(chunkedBodies(), st.lists(st.integers(0, 10_000), max_size=6))
    def test_chunkedCutsProperty(self, chunked: tuple[bytes, bytes], points: list[int]) -> None:
        """A chunked answer cut anywhere: its payload, at most one dataReceived per read, a
        clean end and the connection pooled."""
        raw, payload = chunked
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + raw
        self.pool._connections.clear()
        d = self.send()
        conn, _ = self.endpoint.complete()
        body = Body()
        d.addCallback(lambda response: response.deliverBody(body))
        reads = cut(raw, points)
        for piece in reads:
            conn.dataReceived(piece)
        self.assertEqual(b"".join(body.data), payload)
        self.assertLessEqual(len(body.data), len(reads))
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertEqual(self.pool._connections[KEY], [conn])

    def test_bytesAfterTheBodyClose(self) -> None:
        """Bytes after a chunked body's end (nobody asked for them): the body ends clean but
        the connection is closed, not pooled."""
        _, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\nX"
        )
        self.assertEqual(body.data, [b"ab"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseDone))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool._connections, {})

    def test_headTooLarge(self) -> None:
        """A head growing past MAX_HEAD without its end fails the request and aborts."""
        d = self.send()
        conn, transport = self.endpoint.complete()
        conn.dataReceived(b"HTTP/1.1 200 OK\r\n")
        self.assertNoResult(d)
        conn.dataReceived(b"X-A: " + b"a" * MAX_HEAD)
        failure = self.failureResultOf(d, ResponseFailed)
        self.assertIn("too large", str(failure.value.reasons[0].value))
        self.assertTrue(transport.disconnecting)

    def test_framingWithoutPayloadBounded(self) -> None:
        """Framing bytes (a chunk extension, trailers) growing past MAX_BODY_OVERHEAD
        without a payload byte fail the body and abort the connection."""
        for tail in (b"1;" + b"a" * MAX_BODY_OVERHEAD, b"0\r\nT: " + b"a" * MAX_BODY_OVERHEAD):
            _, body, transport = self.respond(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n"
            )
            self.connectionOf(transport).dataReceived(tail[:1000])
            self.assertIsNone(body.reason)
            self.connectionOf(transport).dataReceived(tail[1000:])
            assert body.reason is not None
            self.assertTrue(body.reason.check(ResponseFailed))
            self.assertEqual(body.data, [b"x"])
            self.assertTrue(transport.disconnecting)

    def test_errorDropsTheFailingRead(self) -> None:
        """A framing error fails the body; payload of the failing read is not delivered."""
        _, body, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        )
        self.connectionOf(transport).dataReceived(b"1\r\nc\r\n1\r\nxY\r\n")
        self.assertEqual(body.data, [b"ab"])
        assert body.reason is not None
        self.assertTrue(body.reason.check(ResponseFailed))
        self.assertTrue(transport.disconnecting)

    def connectionOf(self, transport: StringTransport) -> HTTPClientConnection:
        """The connection that ``transport`` carries."""
        return self.endpoint.conns[self.endpoint.transports.index(transport)]


class UpstreamTests(SynchronousTestCase):
    """Upstream validates and serializes requests for plaintext nodes and peers."""

    def test_invalidURIRefused(self) -> None:
        """A request target with control characters fails before anything is sent."""
        upstream = Upstream(Clock(), 1.0)
        d = upstream.request(None, "http://127.0.0.1:1", b"GET", b"/a\x00b", Headers(), b"")
        self.failureResultOf(d, ValueError)

    def test_invalidMethodRefused(self) -> None:
        """A method that is not an HTTP token fails before anything is sent."""
        upstream = Upstream(Clock(), 1.0)
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
        upstream = Upstream(reactor, 7.0, trust)
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
        wire = StringTransport()
        protocol = factory.buildProtocol(_PEER)
        assert protocol is not None
        protocol.makeConnection(wire)
        self.assertEqual(wire.value()[:1], b"\x16")  # a TLS handshake record: ClientHello
        self.assertEqual(upstream._peer("node-b", "[::1]:4000").host, b"[::1]:4000")

    def test_hostAndPrefix(self) -> None:
        """The Host header omits port 80 and brackets IPv6; the address path prefixes."""
        upstream = Upstream(Clock(), 1.0)
        target = upstream._target("http://[::1]:9000/base")
        self.assertEqual((target.host, target.prefix), (b"[::1]:9000", b"/base"))
        self.assertEqual(upstream._target("http://h").host, b"h")


class DirectDialTests(SynchronousTestCase):
    """IP-literal upstreams are dialled with ``connectTCP``: success, failure, cancel."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.pool = ConnectionPool(self.reactor, maxPersistentPerHost=2, idleTimeout=90)
        self.dial = DirectTCP(self.reactor, "127.0.0.1", 8081, 7.0)

    def test_connectsWithTheDialTimeout(self) -> None:
        """The dial goes to the address with the dial timeout; the connection it makes is
        the transport's own protocol and fires the dial."""
        d = self.dial.dial(self.pool, KEY)
        host, port, factory, timeout, _ = self.reactor.tcpClients[0]
        self.assertEqual((host, port, timeout), ("127.0.0.1", 8081, 7.0))
        self.assertNoResult(d)
        conn = factory.buildProtocol(_PEER)
        assert isinstance(conn, HTTPClientConnection)
        conn.makeConnection(StringTransport())
        self.assertIs(self.successResultOf(d), conn)

    def test_failureIsAConnectError(self) -> None:
        """A refused or timed-out dial fails with the reactor's ConnectError subclass, so
        the next address is tried and the attempt counts it as a transport failure."""
        for error in (ConnectionRefusedError(), TimeoutError()):
            d = self.dial.dial(self.pool, KEY)
            factory = self.reactor.tcpClients[-1][2]
            factory.clientConnectionFailed(self.reactor.connectors[-1], Failure(error))
            failure = self.failureResultOf(d, ConnectError)
            self.assertIs(failure.value, error)

    def test_cancelStopsConnecting(self) -> None:
        """Cancelling a dial in progress stops the connector."""
        d = self.dial.dial(self.pool, KEY)
        connector = self.reactor.connectors[-1]
        stopped: list[bool] = []
        connector.stopConnecting = lambda: stopped.append(True)
        d.cancel()
        self.assertEqual(stopped, [True])
        self.failureResultOf(d, defer.CancelledError)


@implementer(IConnectionPool)
class RecordingPool:
    """A pool that records what its connections report."""

    def __init__(self) -> None:
        self.released: list[IPooledConnection] = []
        self.lostConns: list[IPooledConnection] = []

    def release(self, conn: IPooledConnection) -> None:
        self.released.append(conn)

    def lost(self, conn: IPooledConnection) -> None:
        self.lostConns.append(conn)


class SeamTests(SynchronousTestCase):
    """The fakes of this module, and the client side's own objects, provide the interfaces
    they stand for."""

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
        conn.makeConnection(StringTransport())
        d: defer.Deferred[IResponse] = defer.Deferred()
        conn.send(serializeRequest(b"GET", b"/", b"e:1", Headers(), None), b"GET", d)
        conn.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.successResultOf(d).deliverBody(Body())
        self.assertEqual(pool.released, [conn])
        conn.connectionLost(_CLOSED)
        self.assertEqual(pool.lostConns, [conn])
