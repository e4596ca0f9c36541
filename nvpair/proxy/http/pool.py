"""The keep-alive pool of the lean upstream client (``client``).

Idle connections are kept per key (scheme, host, port), at most ``maxPersistentPerHost``
per key, and closed after ``idleTimeout`` seconds unused by one sweep timer for the whole
pool.  A request takes the most recently used idle connection the engine has not closed
(``peek.SocketPeek``) or dials a new one.  The pool
counts the answers that had bytes after them (``answersOverrun``, read by ``/metrics``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import cast

from twisted.internet import defer
from twisted.internet.error import NotConnectingError
from twisted.internet.interfaces import (
    IAddress,
    IConnector,
    IDelayedCall,
    IReactorTCP,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import ClientFactory, Factory
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.interfaces import ConnectionState, IConnectionPool, IPooledConnection

IDLE = ConnectionState.IDLE
DEAD = ConnectionState.DEAD


class _ConnectionFactory(Factory):
    """Builds the connection for one dial."""

    noisy = False

    def __init__(self, pool: IConnectionPool, key: Hashable) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: IAddress | None) -> HTTPClientConnection:
        return HTTPClientConnection(self._pool, self._key)


class DirectTCP:
    """A dial to an IP literal straight through ``reactor.connectTCP``.

    Unlike an endpoint it wraps nothing: the connection is the transport's own protocol, and
    a dial leaves no per-connection wrapper objects behind (memory per held stream).  A
    failed dial fails with the reactor's ``ConnectError`` (refused, timed out, ...).
    """

    __slots__ = ("reactor", "host", "port", "timeout")

    def __init__(self, reactor: IReactorTCP, host: str, port: int, timeout: float) -> None:
        self.reactor = reactor
        self.host = host
        self.port = port
        self.timeout = timeout

    def dial(self, pool: IConnectionPool, key: Hashable) -> defer.Deferred[HTTPClientConnection]:
        """Connect; fires with the connection once made, or fails with the dial's error."""
        factory = _DirectFactory(pool, key)
        d = factory.deferred
        assert d is not None  # handed on only once the dial ends
        factory.connector = self.reactor.connectTCP(
            self.host, self.port, factory, timeout=self.timeout
        )
        return d


class _DirectFactory(ClientFactory):
    """The factory of one direct dial: builds the connection, reports the dial's end."""

    noisy = False

    def __init__(self, pool: IConnectionPool, key: Hashable) -> None:
        self._pool = pool
        self._key = key
        # The dial's Deferred; None once handed on (to the connection, or failed).
        self.deferred: defer.Deferred[HTTPClientConnection] | None = defer.Deferred(self._cancel)
        self.connector: IConnector | None = None

    def buildProtocol(self, addr: IAddress | None) -> HTTPClientConnection:
        conn = HTTPClientConnection(self._pool, self._key)
        conn.whenMade, self.deferred = self.deferred, None
        return conn

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        d, self.deferred = self.deferred, None
        self.connector = None
        if d is not None and not d.called:
            d.errback(reason)

    def _cancel(self, d: defer.Deferred[HTTPClientConnection]) -> None:
        connector, self.connector = self.connector, None
        if connector is not None:
            try:
                connector.stopConnecting()
            except NotConnectingError:
                pass  # connected meanwhile: the pool releases or aborts the connection


@implementer(IConnectionPool)
class ConnectionPool:
    """Keep-alive connections per key, at most ``maxPersistentPerHost`` idle per key, each
    closed after ``idleTimeout`` seconds unused (one sweep timer for the whole pool)."""

    def __init__(
        self, reactor: IReactorTime, maxPersistentPerHost: int = 64, idleTimeout: float = 90
    ) -> None:
        self._reactor = reactor
        self.maxPersistentPerHost = maxPersistentPerHost
        self.idleTimeout = idleTimeout
        self._connections: dict[Hashable, list[IPooledConnection]] = {}
        self._sweep: IDelayedCall | None = None
        # Answers that had bytes after them (their connections were closed): ``/metrics``.
        self.answersOverrun = 0

    def request(
        self,
        key: Hashable,
        endpoint: Callable[[], IStreamClientEndpoint | DirectTCP],
        data: bytes,
        method: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        """Send ``data`` over an idle connection for ``key`` or a new one from ``endpoint()``.

        An idle connection whose engine already closed it (its end waiting in the socket,
        not read yet: llama-server closes after a streamed answer though it says
        keep-alive) is dropped, not used: a request sent on it would be lost."""
        idle = self._connections.get(key)
        while idle:
            conn = idle.pop()
            if not idle:
                del self._connections[key]
            peek = conn.peek
            if peek is not None and peek.closed():
                conn.abort()
                idle = self._connections.get(key)
                continue
            d: defer.Deferred[IResponse] = defer.Deferred(_cancelSent(conn))
            if connected is not None:
                connected()
            conn.send(data, method, d)
            return d
        return self._dial(key, endpoint(), data, method, connected)

    def _dial(
        self,
        key: Hashable,
        endpoint: IStreamClientEndpoint | DirectTCP,
        data: bytes,
        method: bytes,
        connected: Callable[[], None] | None,
    ) -> defer.Deferred[IResponse]:
        sent: list[HTTPClientConnection] = []

        def cancel(d: defer.Deferred[IResponse]) -> None:
            if sent:
                sent[0].abort()
            else:
                dialling.cancel()

        d: defer.Deferred[IResponse] = defer.Deferred(cancel)
        dialling: defer.Deferred[HTTPClientConnection]
        if isinstance(endpoint, DirectTCP):
            dialling = endpoint.dial(self, key)
        else:
            # The endpoint fires with the protocol our factory built (a TLS endpoint with
            # the protocol it wraps).
            dialling = cast(
                "defer.Deferred[HTTPClientConnection]",
                endpoint.connect(_ConnectionFactory(self, key)),
            )

        def dialled(conn: HTTPClientConnection) -> None:
            if d.called:
                self.release(conn)  # the request was cancelled meanwhile
                return
            if connected is not None:
                connected()
            if d.called:
                self.release(conn)
                return
            sent.append(conn)
            conn.send(data, method, d)

        def failed(failure: Failure) -> None:
            if not d.called:
                d.errback(failure)

        dialling.addCallbacks(dialled, failed)
        return d

    def release(self, conn: IPooledConnection) -> None:
        """A connection finished a response and can be reused (or is one too many)."""
        if conn.state is DEAD:
            return
        conn.state = IDLE
        idle = self._connections.setdefault(conn.key, [])
        if len(idle) >= self.maxPersistentPerHost:
            if not idle:
                del self._connections[conn.key]  # a cap of 0: nothing is kept
            conn.state = DEAD
            assert conn.transport is not None
            conn.transport.loseConnection()
            return
        conn.idleSince = self._reactor.seconds()
        idle.append(conn)
        if self._sweep is None and self.idleTimeout > 0:
            self._sweep = self._reactor.callLater(self.idleTimeout, self._expire)

    def connectionCounts(self) -> tuple[int, int]:
        """(idle connections held, keys with at least one) -- for the metrics."""
        idle = self._connections
        return sum(len(conns) for conns in idle.values()), len(idle)

    def lost(self, conn: IPooledConnection) -> None:
        """A connection closed; forget it if it was idle."""
        idle = self._connections.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._connections[conn.key]

    def bytesAfterAnswer(self, conn: IPooledConnection) -> None:
        """``conn`` had bytes after a complete answer (it is closing, never pooled)."""
        self.answersOverrun += 1

    def _expire(self) -> None:
        self._sweep = None
        now = self._reactor.seconds()
        oldest: float | None = None
        for idle in list(self._connections.values()):
            for conn in list(idle):
                if now - conn.idleSince >= self.idleTimeout:
                    conn.state = DEAD
                    self.lost(conn)
                    if conn.transport is not None:
                        conn.transport.loseConnection()
                elif oldest is None or conn.idleSince < oldest:
                    oldest = conn.idleSince
        if oldest is not None:
            self._sweep = self._reactor.callLater(
                max(oldest + self.idleTimeout - now, 0.0), self._expire
            )

    def closeCachedConnections(self) -> defer.Deferred[None]:
        """Close every idle connection; fires when they are closed."""
        waiting = []
        for idle in list(self._connections.values()):
            for conn in list(idle):
                waiting.append(conn.whenClosed())
                conn.state = DEAD
                if conn.transport is not None:
                    conn.transport.loseConnection()
        self._connections.clear()
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
        done: defer.Deferred[list[None]] = defer.gatherResults(waiting)
        return done.addCallback(lambda _: None)


def _cancelSent(conn: IPooledConnection) -> Callable[[defer.Deferred[IResponse]], None]:
    def cancel(d: defer.Deferred[IResponse]) -> None:
        conn.abort()

    return cancel
