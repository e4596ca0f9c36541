"""Unit tests of the lean upstream HTTP/1.1 client's connections and pool
(``nvpair.proxy.http.client``, ``nvpair.proxy.http.pool``): one write per request,
keep-alive reuse, the per-key cap, idle expiry, cancellation, lost connections, the body's
flow control, closing the pool, and ``DirectTCP`` dials. How answers are read is in
``test_httpclient_framing``."""

from __future__ import annotations

import select
import socket

from twisted.internet import defer
from twisted.internet.error import (
    ConnectError,
    ConnectionDone,
    ConnectionRefusedError,
    TimeoutError,
)
from twisted.internet.interfaces import ISystemHandle
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.http import peek
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.framing import serializeRequest
from nvpair.proxy.http.peek import SocketPeek, socketPeek
from nvpair.proxy.http.pool import ConnectionPool, DirectTCP
from nvpair.proxy.testing.wire import TCPStringTransport
from tests.http.httpkit import KEY, PEER, Body, ClientCase


class Socket:
    """What a socket's ``recv(1, MSG_PEEK | MSG_DONTWAIT)`` finds: ``waiting`` bytes (b""
    once the peer closed), or ``error`` raised; what its poll set finds follows (nothing
    to read while ``recv`` would raise ``BlockingIOError``)."""

    def __init__(self) -> None:
        self.waiting = b""
        self.error: OSError | None = BlockingIOError()
        self.peeks: list[int] = []
        self.polls = 0

    def fileno(self) -> int:
        return 7

    def recv(self, size: int, flags: int) -> bytes:
        self.peeks.append(flags)
        if self.error is not None:
            raise self.error
        return self.waiting[:size]


class FakePoll:
    """``select.poll`` over the ``Socket`` fakes (each registered by its fd)."""

    sockets: dict[int, Socket] = {}

    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []

    def register(self, fd: int, eventmask: int = 0, /) -> None:
        self.registered.append((fd, eventmask))

    def poll(self, timeout: float | None = None, /) -> list[tuple[int, int]]:
        assert timeout == 0, "the pool never waits"
        ready = []
        for fd, mask in self.registered:
            sock = self.sockets[fd]
            sock.polls += 1
            if not isinstance(sock.error, BlockingIOError):
                ready.append((fd, mask))
        return ready


@implementer(ISystemHandle)
class SocketTransport(TCPStringTransport):
    """A test transport with a socket to peek at."""

    def __init__(self) -> None:
        super().__init__()
        self.socket = Socket()
        FakePoll.sockets[self.socket.fileno()] = self.socket

    def getHandle(self) -> Socket:
        return self.socket


class PeerClosedTests(ClientCase):
    """An idle connection the engine already closed (its end not read yet) is dropped, not
    used: llama-server closes after a streamed answer though it says keep-alive, and a
    request sent in that instant was lost (502 upstream_unreachable)."""

    def setUp(self) -> None:
        super().setUp()
        self.endpoint.transportType = SocketTransport
        self.patch(peek, "POLL", FakePoll)
        self.addCleanup(FakePoll.sockets.clear)

    def pooled(self) -> SocketTransport:
        _, _, transport = self.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        assert isinstance(transport, SocketTransport)
        return transport

    def test_aliveReused(self) -> None:
        """Nothing waiting on its socket: reused, no new dial, and no ``recv`` (the poll
        alone says so)."""
        transport = self.pooled()
        self.send()
        self.assertEqual(len(self.endpoint.dials), 1)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(transport.socket.polls, 1)
        self.assertEqual(transport.socket.peeks, [])

    def dropped(self, error: OSError | None) -> None:
        transport = self.pooled()
        transport.socket.error = error
        d = self.send()
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.socket.peeks, [socket.MSG_PEEK | socket.MSG_DONTWAIT])
        conn, fresh = self.endpoint.complete()
        self.assertIn(b"POST /v1/x", fresh.value())
        conn.dataReceived(b"HTTP/1.1 204 No Content\r\n\r\n")
        self.assertEqual(self.successResultOf(d).code, 204)

    def test_closedDropped(self) -> None:
        """Its end waiting (a peek reads nothing but the close): dropped, and the request
        dials a new connection."""
        self.dropped(None)

    def test_resetDropped(self) -> None:
        """Reset: the same."""
        self.dropped(ConnectionResetError())

    def test_bytesWaitingNotClosed(self) -> None:
        """Bytes waiting are no close (the connection's reader deals with them)."""
        transport = self.pooled()
        transport.socket.error = None
        transport.socket.waiting = b"x"
        found = socketPeek(transport)
        assert found is not None
        self.assertFalse(found.closed())

    def test_readableButNothingThere(self) -> None:
        """A poll that says readable while ``recv`` finds nothing yet: open."""
        sock = Socket()
        self.assertFalse(SocketPeek(lambda timeout: [(7, 1)], sock.recv).closed())

    def test_noSocket(self) -> None:
        """A transport with no socket to ask is taken as open (no peek at all)."""
        self.assertIsNone(socketPeek(TCPStringTransport()))
        self.assertIsNone(socketPeek(None))

    def test_pollRegistersTheSocket(self) -> None:
        """The poll set made for a connection holds its socket's fd, for reading."""
        made: list[FakePoll] = []

        def poll() -> FakePoll:
            made.append(FakePoll())
            return made[-1]

        self.patch(peek, "POLL", poll)
        transport = SocketTransport()
        found = socketPeek(transport)
        assert found is not None
        self.assertEqual([p.registered for p in made], [[(7, select.POLLIN)]])
        self.assertFalse(found.closed())
        self.assertEqual(transport.socket.polls, 1)


class ClientTests(ClientCase):
    """One request per write, keep-alive pooling, cancellation and loss."""

    def test_requestWrittenOnce(self) -> None:
        """The whole request (head and body) goes out in one write, with Host and length."""
        d = self.send()
        _, transport = self.endpoint.complete()
        self.assertEqual(
            transport.value(),
            b"POST /v1/x HTTP/1.1\r\nHost: e:1\r\nX-A: 1\r\nContent-Length: 2\r\n\r\n{}",
        )
        self.assertNoResult(d)

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

    def pooledAfter(self, head: bytes, body: bytes) -> bool:
        """Whether the connection that carried an answer with ``head`` and ``body`` is
        pooled (a second request goes over it) rather than closed at the answer's end."""
        _, ended, transport = self.respond(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n" + body)
        assert ended.reason is not None
        self.assertIsInstance(ended.reason.value, ResponseDone)
        self.assertEqual(b"".join(ended.data), b"ok")
        pooled = not transport.disconnecting
        self.assertEqual(self.pool.connectionCounts(), (1, 1) if pooled else (0, 0))
        self.send()
        self.assertEqual(len(self.endpoint.dials), 1 if pooled else 2)
        return pooled

    def test_llamaCppClosesAfterChunked(self) -> None:
        """llama.cpp's server closes after every chunked (streamed) answer though it says
        keep-alive, a moment later: such a connection is closed at the answer's end, never
        pooled (a request sent on it in that moment was lost)."""
        chunked = b"Transfer-Encoding: chunked\r\n"
        llama = b"Server: llama.cpp\r\nKeep-Alive: timeout=5, max=100\r\n"
        self.assertFalse(self.pooledAfter(llama + chunked, b"2\r\nok\r\n0\r\n\r\n"))

    def test_llamaCppKeptAfterLength(self) -> None:
        """Its answers with a length are pooled as any."""
        self.assertTrue(self.pooledAfter(b"Server: llama.cpp\r\nContent-Length: 2\r\n", b"ok"))

    def test_otherKeptAfterChunked(self) -> None:
        """Another engine's chunked answer is pooled."""
        head = b"Server: Node\r\nTransfer-Encoding: chunked\r\n"
        self.assertTrue(self.pooledAfter(head, b"2\r\nok\r\n0\r\n\r\n"))

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

    def test_connectionClose(self) -> None:
        """A response with Connection: close is not pooled."""
        _, _, transport = self.respond(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx"
        )
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.pool._connections, {})

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
        conn = factory.buildProtocol(PEER)
        assert isinstance(conn, HTTPClientConnection)
        conn.makeConnection(TCPStringTransport())
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
