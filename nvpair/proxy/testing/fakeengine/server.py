"""What the kit's engines share: a TCP listener of engine connections, counted and closed,
and a client connection to one in memory."""

from __future__ import annotations

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime
from twisted.internet.testing import MemoryReactor, StringTransport

from nvpair.proxy.testing.fakeengine.connection import (
    EngineConnection,
    EngineFactory,
    IRequestHandler,
)


class EngineServer:
    """Listens for engine connections, counts them and closes them all; subclasses answer.

    A subclass provides ``IRequestHandler`` (its ``requestReceived``); ``reactor`` must also
    provide ``IReactorTime``.
    """

    def __init__(self, reactor: IReactorTCP) -> None:
        self.reactor = reactor
        self.clock = IReactorTime(reactor)
        self.port = 0
        self.url = ""
        self.openConnections = 0
        self._listening: IListeningPort | None = None
        self._connections: set[EngineConnection] = set()
        self._closeWaiters: list[Deferred[None]] = []

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Start listening and return the bound port."""
        factory = EngineFactory(IRequestHandler(self), self.clock)
        self._listening = self.reactor.listenTCP(port, factory, interface=interface)
        address = self._listening.getHost()
        if not isinstance(address, IPv4Address | IPv6Address):
            raise TypeError(f"not a TCP address: {address!r}")
        self.port = address.port
        self.url = f"http://{interface}:{self.port}"
        return self.port

    def stopListening(self) -> Deferred[None]:
        """Stop accepting connections (new ones are refused); open ones stay."""
        listening, self._listening = self._listening, None
        if listening is None:
            return succeed(None)
        try:
            stopped = listening.stopListening()
        except Exception:
            return fail()
        return succeed(None) if stopped is None else stopped

    def close(self) -> Deferred[None]:
        """Stop listening and abort every open connection; fires when all are gone."""
        waits = [self.stopListening()]
        if self._connections:
            d: Deferred[None] = Deferred()
            self._closeWaiters.append(d)
            waits.append(d)
            for connection in list(self._connections):
                connection.abort()
        return DeferredList(waits, fireOnOneErrback=True, consumeErrors=True).addCallback(
            lambda _: None
        )

    # -- IRequestHandler: called by the engine's connections --

    def connectionOpened(self, connection: EngineConnection) -> None:
        """Count the new connection."""
        self._connections.add(connection)
        self.openConnections += 1

    def connectionClosed(self, connection: EngineConnection) -> None:
        """Forget the connection; the last one gone fires ``close()``."""
        self._connections.discard(connection)
        self.openConnections -= 1
        if not self._connections:
            waiters, self._closeWaiters = self._closeWaiters, []
            for d in waiters:
                d.callback(None)


def memoryConnection(
    reactor: MemoryReactor, transport: StringTransport | None = None
) -> tuple[EngineConnection, StringTransport]:
    """A new client connection, on ``transport`` (a new ``StringTransport`` by default),
    to the engine that listened first on ``reactor`` (a ``MemoryReactor``: nothing is
    dialled)."""
    factory = reactor.tcpServers[0][1]
    connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    assert isinstance(connection, EngineConnection)
    transport = StringTransport() if transport is None else transport
    connection.makeConnection(transport)
    return connection, transport
