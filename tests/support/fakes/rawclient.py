"""A raw TCP client of the real process: it writes what it is given, records what it
receives and when its connection ends, and can hold its reads."""

from __future__ import annotations

from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IPushProducer


class RawClient(protocol.Protocol):
    """A raw TCP client: records what it receives and when its connection ends."""

    def __init__(self, reading: bool = True) -> None:
        self.received = b""
        self.reading = reading
        self.lost: defer.Deferred[None] = defer.Deferred()
        self.made: defer.Deferred[None] = defer.Deferred()
        self.gone = False

    def connectionMade(self) -> None:
        if not self.reading:
            IPushProducer(self.transport).pauseProducing()
        self.made.callback(None)

    def send(self, data: bytes) -> None:
        """Write ``data`` on the connection."""
        assert self.transport is not None
        self.transport.write(data)

    def readAgain(self) -> None:
        """Read again after ``reading=False`` held the connection's reads."""
        IPushProducer(self.transport).resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: object = None) -> None:
        self.gone = True
        self.lost.callback(None)


def connect(port: int, client: RawClient) -> defer.Deferred[RawClient]:
    """Connect ``client`` to 127.0.0.1:port."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    connected: defer.Deferred[RawClient] = connectProtocol(endpoint, client)
    return connected
